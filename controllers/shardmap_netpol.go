package controllers

// The cluster's NetworkPolicies (networkpolicy.go) in the ShardMap's pass:
// observed with its other objects, planned first (before the controller
// group's StatefulSet, so its pods do not start unprotected), one create,
// update or delete per pass like every object step. A failed write is a
// Warning Event and the condition Degraded NetworkPolicyFailed (Progressing
// says the same); the pass is retried with backoff and the cluster's later
// steps wait for it.

import (
	"context"
	"fmt"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
)

// +kubebuilder:rbac:groups=networking.k8s.io,resources=networkpolicies,verbs=list;watch;create;update;delete

// Steps on the cluster's NetworkPolicies (smStep.Object names the policy).
const (
	smStepCreateNetPol smStepKind = "CreateNetworkPolicy"
	smStepUpdateNetPol smStepKind = "UpdateNetworkPolicy"
	smStepDeleteNetPol smStepKind = "DeleteNetworkPolicy"
)

// ReasonNetworkPolicyFailed (Degraded, Progressing): writing a
// NetworkPolicy failed; the message has the API server's error.
const ReasonNetworkPolicyFailed = "NetworkPolicyFailed"

// operatorNamespace is the namespace whose operator pods the policies
// admit: OperatorNamespace, else the pod's own ("" outside a pod).
func (r *ShardMapReconciler) operatorNamespace() string {
	if r.OperatorNamespace != "" {
		return r.OperatorNamespace
	}
	return podNamespace()
}

// observeNetworkPolicies fills o's NetPols, NetPolConflicts and
// WantNetPols.
func (r *ShardMapReconciler) observeNetworkPolicies(ctx context.Context, sm *shardkvv1.ShardMap, o *smObserved) error {
	o.WantNetPols = desiredNetworkPolicies(sm, r.operatorNamespace())
	o.NetPols = map[string]*networkingv1.NetworkPolicy{}
	for _, name := range []string{CtrlerName(sm.Name), DataNetPolName(sm.Name)} {
		np := &networkingv1.NetworkPolicy{}
		conflict := false
		found, err := r.getOwned(ctx, sm, client.ObjectKey{Namespace: sm.Namespace, Name: name}, np, &conflict)
		if err != nil {
			return err
		}
		if found {
			o.NetPols[name] = np
		}
		if conflict {
			o.NetPolConflicts = append(o.NetPolConflicts, name)
		}
	}
	return nil
}

// planNetworkPolicies is the first policy to create, update (its spec
// hash differs) or delete (owned, not wanted), in name order; a policy of
// the name that this ShardMap does not own is left alone and Degraded.
func planNetworkPolicies(o *smObserved, pl *smPlan) (smStep, bool) {
	names := slices.Sorted(maps.Keys(o.WantNetPols))
	for name := range o.NetPols {
		if o.WantNetPols[name] == nil {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	for _, name := range names {
		want, have := o.WantNetPols[name], o.NetPols[name]
		switch {
		case slices.Contains(o.NetPolConflicts, name):
			if want != nil {
				pl.degraded(ReasonConflict, "NetworkPolicy %s exists and is not owned by this ShardMap", name)
			}
		case want != nil && have == nil:
			return smStep{Kind: smStepCreateNetPol, Object: name}, true
		case want != nil && have.Annotations[annotationSpecHash] != want.Annotations[annotationSpecHash]:
			return smStep{Kind: smStepUpdateNetPol, Object: name}, true
		case want == nil && have != nil:
			return smStep{Kind: smStepDeleteNetPol, Object: name}, true
		}
	}
	return smStep{}, false
}

// executeNetworkPolicy takes a NetworkPolicy step. A write the API server
// refuses (other than a conflict, retried at once) is the outcome's Err,
// with an Event and the Degraded condition.
func (r *ShardMapReconciler) executeNetworkPolicy(ctx context.Context, sm *shardkvv1.ShardMap, o *smObserved, st smStep) (smOutcome, error) {
	name, action := st.Object, string(st.Kind)
	want, have := o.WantNetPols[name], o.NetPols[name]
	var (
		err          error
		verb, reason string
		obj          client.Object
	)
	switch st.Kind {
	case smStepCreateNetPol:
		verb, reason, obj = "create", "Created", want.DeepCopy()
		err = createOwned(ctx, r.Client, r.Scheme, sm, obj)
	case smStepUpdateNetPol:
		np := have.DeepCopy()
		np.Spec = *want.Spec.DeepCopy()
		verb, reason, obj = "update", "Updated", np
		err = r.updateSpec(ctx, np, want)
	case smStepDeleteNetPol:
		verb, reason, obj = "delete", "Deleted", have
		uid := have.UID
		err = client.IgnoreNotFound(r.Delete(ctx, have, client.Preconditions{UID: &uid}))
	default:
		return smOutcome{}, fmt.Errorf("unknown step %s", st)
	}
	if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) {
		return smOutcome{}, err // the cache is behind: start over
	}
	if err != nil {
		msg := fmt.Sprintf("cannot %s NetworkPolicy %s: %v", verb, name, err)
		r.eventRelated(sm, obj, corev1.EventTypeWarning, ReasonNetworkPolicyFailed, action, "%s", msg)
		c := smCondition{metav1.ConditionTrue, ReasonNetworkPolicyFailed, msg + " (retried with backoff; the ShardMap's later steps wait: objects, rolls, spec.moves)"}
		return smOutcome{Progress: c, Degraded: c, Err: fmt.Errorf("%s NetworkPolicy %s: %w", verb, name, err)}, nil
	}
	what := "who may reach the pods: spec.network"
	if st.Kind == smStepDeleteNetPol {
		what = "spec.network.policies is Disabled"
	}
	r.eventRelated(sm, obj, corev1.EventTypeNormal, reason, action, "%sd NetworkPolicy %s (%s)", verb, name, what)
	return objectsUpdated("%sd NetworkPolicy %s", verb, name), nil
}
