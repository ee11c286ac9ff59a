package controllers

// What one ShardMap pass observes (smObserved): the controller group's
// objects and pods from the cache, the cluster's ReplicaGroups, and the
// controller's own view over the data plane.

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
)

// observe gathers what the planner needs, and the controller's API for
// the executor (nil when the controller was not reached).
func (r *ShardMapReconciler) observe(ctx context.Context, sm *shardkvv1.ShardMap) (*smObserved, ControllerAPI, error) {
	o := &smObserved{
		Name: sm.Name, Namespace: sm.Namespace,
		Paused:    sm.Spec.Paused,
		Moves:     sm.Spec.Moves,
		Replicas:  smCtrlerReplicas(sm),
		Bootstrap: smCtrlerBootstrap(sm),
		Voters:    sm.Status.ControllerVoters,
		Storage:   sm.Spec.Controller.Storage,
		Pods:      map[int]*podView{},
	}
	key := client.ObjectKey{Namespace: sm.Namespace, Name: CtrlerName(sm.Name)}
	sts := &appsv1.StatefulSet{}
	found, err := r.getOwned(ctx, sm, key, sts, &o.StsConflict)
	if err != nil {
		return nil, nil, err
	}
	if found || o.StsConflict {
		// The group's size and --peers are those it was bootstrapped with.
		if n, err := strconv.Atoi(sts.Annotations[AnnotationCtrlerBootstrap]); err == nil && n > 0 {
			o.Bootstrap = int32(n)
		}
	}
	o.Size = o.Bootstrap
	if found {
		o.Sts = sts
		if sts.Spec.Replicas != nil {
			o.Size = *sts.Spec.Replicas
		}
	}
	svc := &corev1.Service{}
	if found, err := r.getOwned(ctx, sm, key, svc, &o.SvcConflict); err != nil {
		return nil, nil, err
	} else if found {
		o.Svc = svc
	}
	pdb := &policyv1.PodDisruptionBudget{}
	if found, err := r.getOwned(ctx, sm, key, pdb, &o.PDBConflict); err != nil {
		return nil, nil, err
	} else if found {
		o.PDB = pdb
	}
	o.WantSts = r.desiredCtrlerSts(sm, o.Bootstrap, o.Size)
	o.WantSvc = desiredCtrlerService(sm)
	o.WantPDB = desiredCtrlerPDB(sm, o.Size)
	if err := r.observeNetworkPolicies(ctx, sm, o); err != nil {
		return nil, nil, err
	}

	var pods corev1.PodList
	if err := r.List(ctx, &pods, client.InNamespace(sm.Namespace), client.MatchingLabels(ctrlerSelectorLabels(sm))); err != nil {
		return nil, nil, err
	}
	var claims corev1.PersistentVolumeClaimList
	if err := r.List(ctx, &claims, client.InNamespace(sm.Namespace), client.MatchingLabels(ctrlerSelectorLabels(sm))); err != nil {
		return nil, nil, err
	}
	claimOrdinal := func(name string) int { return pvcOrdinal(CtrlerName(sm.Name), name) }
	o.Claims = viewClaims(claims.Items, int(o.Size), claimOrdinal)
	o.ClaimUIDs = map[int]types.UID{}
	for _, c := range claims.Items {
		if ord := claimOrdinal(c.Name); ord >= 0 && c.DeletionTimestamp.IsZero() {
			o.ClaimUIDs[ord] = c.UID
		}
	}
	o.ResizeRefused = refusedResize(sm.Status.Conditions, sm.Generation)
	for i := range pods.Items {
		p := &pods.Items[i]
		if ord := podOrdinal(CtrlerName(sm.Name), p.Name); ord >= 0 {
			o.Pods[ord] = &podView{Ordinal: ord, Name: p.Name, UID: p.UID, Exists: true,
				Deleting: !p.DeletionTimestamp.IsZero(), Ready: podReady(p), Revision: p.Labels[stsRevisionLabel]}
		}
	}

	var rgs shardkvv1.ReplicaGroupList
	if err := r.List(ctx, &rgs, client.InNamespace(sm.Namespace)); err != nil {
		return nil, nil, err
	}
	o.Groups = map[string]*shardkvv1.ReplicaGroup{}
	for i := range rgs.Items {
		if rgs.Items[i].Spec.ShardMap == sm.Name {
			o.Groups[rgs.Items[i].Name] = &rgs.Items[i]
		}
	}

	if o.TLS, err = r.observeTLS(ctx, sm, o.Groups); err != nil {
		return nil, nil, err
	}
	api := r.observeController(ctx, sm, o, pods.Items)
	o.Users = r.observeUsers(ctx, sm, api)
	r.observeCtrlerMembers(ctx, sm, o, pods.Items)
	return o, api, nil
}

// getOwned reads obj at key: found if it exists and this ShardMap controls
// it; conflict if it exists and it does not.
func (r *ShardMapReconciler) getOwned(ctx context.Context, sm *shardkvv1.ShardMap, key client.ObjectKey, obj client.Object, conflict *bool) (found bool, err error) {
	switch err := r.Get(ctx, key, obj); {
	case apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, err
	}
	if !metav1.IsControlledBy(obj, sm) {
		*conflict = true
		return false, nil
	}
	return true, nil
}

// ctrlerAddrs are where the operator dials the controller group: its n
// pods' DNS names, or their IPs with DialPodIPs.
func (r *ShardMapReconciler) ctrlerAddrs(sm *shardkvv1.ShardMap, n int32, pods []corev1.Pod) ([]string, error) {
	if !r.DialPodIPs {
		return CtrlerAddrs(sm.Name, int(n), sm.Namespace), nil
	}
	out := ctrlerPodAddrs(sm.Name, pods)
	if len(out) == 0 {
		return nil, errors.New("no controller pod has an IP yet")
	}
	return out, nil
}

// observeController reads ClusterStatus when a quorum of controller pods
// runs, and makes sure the config Watch runs. It returns the controller's
// API when it answered.
func (r *ShardMapReconciler) observeController(ctx context.Context, sm *shardkvv1.ShardMap, o *smObserved, pods []corev1.Pod) ControllerAPI {
	if ready := o.readyReplicas(); ready < o.quorum() {
		o.ClusterErr = fmt.Errorf("%d/%d controller pods ready (%d needed for a quorum)", ready, o.Size, o.quorum())
		return nil
	}
	addrs, err := r.ctrlerAddrs(sm, max(o.Bootstrap, o.Size), pods)
	if err != nil {
		o.ClusterErr = err
		return nil
	}
	creds, err := r.Credentials.For(sm)
	if err != nil {
		o.ClusterErr = err
		return nil
	}
	api, err := r.DataPlane.Controller(creds, addrs)
	if err != nil {
		o.ClusterErr = err
		return nil
	}
	cctx, cancel := callCtx(ctx, r.CallTimeout)
	defer cancel()
	st, err := api.Status(cctx)
	if err != nil {
		o.ClusterErr = err
		return nil
	}
	if st.GetLatest() == nil {
		o.ClusterErr = errors.New("the controller returned no config")
		return nil
	}
	if st.GetController().GetLeader() == 0 {
		o.ClusterErr = errors.New("the controller group has no leader")
		return nil
	}
	o.Cluster = st
	if n := st.Latest.GetNum(); n > 1 && groupsBehind(st) {
		// Best effort: without it, shards whose new owner has not reported
		// yet show as Pending with no source.
		if prev, err := api.Query(cctx, int64(n-1)); err == nil {
			o.Prev = prev
		}
	}
	r.ensureWatch(client.ObjectKeyFromObject(sm), addrs, api, st.Latest.Num+1)
	return api
}
