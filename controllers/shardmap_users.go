package controllers

// Redis ACL users from a Secret (spec.users): the operator keeps the users
// it manages in the controller equal to the Secret's, and every node of
// the cluster applies what the controller holds. Users made with ACL
// SETUSER are not the operator's and are left alone.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
	"github.com/shardkv/shardkv/pkg/resp/acl"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// usersObserved is what planUsers decides from.
type usersObserved struct {
	// Source names the Secret key of spec.users ("": unset).
	Source string
	// Err: the Secret could not be read or parsed; nothing is changed.
	Err error
	// Want are the Secret's users in canonical form, by name.
	Want []*shardkvpb.User
	// Have are the controller's managed users, by name; Known: read.
	Have  []*shardkvpb.User
	Known bool
}

// parseUsers reads ACL file lines into canonical users, by name. A name
// given twice is an error: either reading would be a guess.
func parseUsers(text string) ([]*shardkvpb.User, error) {
	var out []*shardkvpb.User
	seen := map[string]int{}
	for i, line := range strings.Split(text, "\n") {
		u, err := acl.ParseLine(line)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", i+1, err)
		}
		if u == nil {
			continue
		}
		if prev, dup := seen[u.Name]; dup {
			return nil, fmt.Errorf("line %d: user %s is already defined on line %d", i+1, u.Name, prev)
		}
		seen[u.Name] = i + 1
		out = append(out, &shardkvpb.User{Name: u.Name, Spec: u.Spec(), Managed: true})
	}
	slices.SortFunc(out, func(a, b *shardkvpb.User) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// observeUsers reads spec.users' Secret (uncached: the operator's cache
// holds only its own Secrets, so a change is seen on the next pass, within
// the idle resync) and, when the controller answers, its managed users.
func (r *ShardMapReconciler) observeUsers(ctx context.Context, sm *shardkvv1.ShardMap, api ControllerAPI) usersObserved {
	var o usersObserved
	if sel := sm.Spec.Users; sel != nil {
		o.Source = fmt.Sprintf("Secret %s key %s", sel.Name, sel.Key)
		reader := r.apiReader()
		s := &corev1.Secret{}
		if err := reader.Get(ctx, client.ObjectKey{Namespace: sm.Namespace, Name: sel.Name}, s); err != nil {
			o.Err = fmt.Errorf("read %s: %w", o.Source, err)
		} else if text, ok := s.Data[sel.Key]; !ok {
			o.Err = fmt.Errorf("%s: no such key", o.Source)
		} else if o.Want, o.Err = parseUsers(string(text)); o.Err != nil {
			o.Err = fmt.Errorf("%s: %w", o.Source, o.Err)
		}
	}
	if api == nil {
		return o
	}
	cctx, cancel := callCtx(ctx, r.CallTimeout)
	defer cancel()
	rep, err := api.Users(cctx)
	if err != nil {
		return o
	}
	o.Known = true
	for _, u := range rep.GetUsers() {
		if u.GetManaged() {
			o.Have = append(o.Have, u)
		}
	}
	return o
}

// planUsers is the SetUsers step when the controller's managed users differ
// from the Secret's (none when spec.users is unset: the managed users are
// removed), or nothing.
func planUsers(o *smObserved, pl *smPlan) smStep {
	u := o.Users
	if u.Err != nil {
		pl.degraded(ReasonUsersInvalid, "%v; the cluster's users are left as they are", u.Err)
		return smStep{}
	}
	if !u.Known || sameUsers(u.Want, u.Have) {
		return smStep{}
	}
	return smStep{Kind: smStepSetUsers}
}

func sameUsers(a, b []*shardkvpb.User) bool {
	return slices.EqualFunc(a, b, func(x, y *shardkvpb.User) bool { return x.GetName() == y.GetName() && x.GetSpec() == y.GetSpec() })
}

// applyUsers replaces the controller's managed users with the Secret's.
func (r *ShardMapReconciler) applyUsers(ctx context.Context, sm *shardkvv1.ShardMap, o *smObserved, api ControllerAPI) smOutcome {
	if api == nil {
		return smOutcome{Err: errors.New("the controller is not reachable")}
	}
	cctx, cancel := callCtx(ctx, r.CallTimeout)
	defer cancel()
	if _, err := api.SetUsers(cctx, &shardkvpb.SetUsersRequest{Set: o.Users.Want, ReplaceManaged: true}); err != nil {
		r.event(sm, corev1.EventTypeWarning, "UsersFailed", string(smStepSetUsers), "setting the Redis users from %s failed: %v", o.Users.Source, err)
		return smOutcome{Progress: smCondition{metav1.ConditionTrue, ReasonUsersUpdated, fmt.Sprintf("setting the Redis users failed: %v", err)}, Err: err}
	}
	names := make([]string, len(o.Users.Want))
	for i, u := range o.Users.Want {
		names[i] = u.GetName()
	}
	from := o.Users.Source
	if from == "" {
		from = "spec.users (unset: none)"
	}
	r.event(sm, corev1.EventTypeNormal, "UsersUpdated", string(smStepSetUsers), "Redis users set from %s: %v", from, names)
	return smOutcome{Progress: smCondition{metav1.ConditionTrue, ReasonUsersUpdated, fmt.Sprintf("Redis users set from %s: %v", from, names)}}
}
