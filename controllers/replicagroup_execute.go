package controllers

// Executing the ReplicaGroup planner's step: Kubernetes writes (finalizer,
// group id, StatefulSet size, pod and claim deletions, each checked
// against what it was planned on) and data-plane calls (membership
// changes on the leader, Join and Leave on the controller).

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// execute runs one step. done means the pass is over (res, err are its
// result: the object changed under us, or it is gone); otherwise the
// status is recorded next, with err if the step failed.
func (r *ReplicaGroupReconciler) execute(ctx context.Context, rg *shardkvv1.ReplicaGroup, sm *shardkvv1.ShardMap,
	sts *appsv1.StatefulSet, o *observed, st step) (done bool, res ctrl.Result, err error) {
	switch st.Kind {
	case stepAddFinalizer:
		controllerutil.AddFinalizer(rg, Finalizer)
		if rg.Annotations == nil {
			rg.Annotations = map[string]string{}
		}
		if _, ok := rg.Annotations[AnnotationBootstrapReplicas]; !ok {
			rg.Annotations[AnnotationBootstrapReplicas] = strconv.Itoa(int(defaultReplicas(rg)))
		}
		if err := r.Update(ctx, rg); err != nil {
			res, err := r.retryConflict(err)
			return true, res, err
		}
		return true, ctrl.Result{RequeueAfter: time.Millisecond}, nil

	case stepAllocateGroupID:
		return r.allocateGroupID(ctx, rg, sm)

	case stepScaleStatefulSet:
		if sts == nil {
			return false, ctrl.Result{}, errors.New("no StatefulSet")
		}
		patch := client.MergeFromWithOptions(sts.DeepCopy(), client.MergeFromWithOptimisticLock{})
		sts.Spec.Replicas = &st.Replicas
		return false, ctrl.Result{}, staleOnConflict(r.Patch(ctx, sts, patch))

	case stepAddLearner, stepPromote, stepRemoveMember, stepTransferLeader:
		lp := o.pod(o.LeaderOrdinal)
		var podObj *corev1.Pod
		if r.DialPodIPs {
			podObj = &corev1.Pod{}
			if err := r.Get(ctx, types.NamespacedName{Namespace: rg.Namespace, Name: lp.Name}, podObj); err != nil {
				return false, ctrl.Result{}, err
			}
		}
		addr := r.replicaAddr(rg, o.LeaderOrdinal, podObj)
		api, err := r.DataPlane.Replica(o.creds, addr)
		if err != nil {
			return false, ctrl.Result{}, err
		}
		cctx, cancel := callCtx(ctx, r.CallTimeout)
		defer cancel()
		switch st.Kind {
		case stepAddLearner:
			err = api.AddLearner(cctx, st.ID, podGRPCAddr(rg.Name, st.Ordinal, rg.Namespace))
		case stepPromote:
			err = api.Promote(cctx, st.ID)
		case stepRemoveMember:
			err = api.RemoveMember(cctx, st.ID)
		case stepTransferLeader:
			err = api.TransferLeader(cctx, st.ID)
		}
		return false, ctrl.Result{}, err

	case stepJoin:
		api, err := r.ctrlerAPI(ctx, sm)
		if err != nil {
			return false, ctrl.Result{}, err
		}
		cctx, cancel := callCtx(ctx, r.CallTimeout)
		defer cancel()
		cfg, err := api.Join(cctx, &shardkvpb.Group{Gid: o.GroupID, Servers: st.Servers, Weight: o.Weight})
		if err != nil {
			return false, ctrl.Result{}, err
		}
		o.Config = cfg
		if rg.Status.Phase == "" || rg.Status.Phase == shardkvv1.PhasePending {
			rg.Status.Phase = shardkvv1.PhaseJoining
		}
		return false, ctrl.Result{}, nil

	case stepLeave:
		api, err := r.ctrlerAPI(ctx, sm)
		if err != nil {
			return false, ctrl.Result{}, err
		}
		cctx, cancel := callCtx(ctx, r.CallTimeout)
		defer cancel()
		cfg, err := api.Leave(cctx, o.GroupID)
		if err != nil {
			return false, ctrl.Result{}, err
		}
		o.Config = cfg
		rg.Status.Phase = shardkvv1.PhaseDraining
		return false, ctrl.Result{}, nil

	case stepRestartPod:
		// Checked against the API server, not the cache: right after a
		// restart the cache may still show the pod as it was (not yet
		// terminating), and deleting it again would be a second
		// RestartPod for one restart (an e2e RollingUpdate saw 4 for a
		// group of 3).
		p := o.pod(st.Ordinal)
		fresh := &corev1.Pod{}
		if err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: rg.Namespace, Name: p.Name}, fresh); err != nil {
			if apierrors.IsNotFound(err) {
				return false, ctrl.Result{}, errStale
			}
			return false, ctrl.Result{}, err
		}
		if fresh.UID != p.UID || !fresh.DeletionTimestamp.IsZero() {
			return false, ctrl.Result{}, errStale
		}
		return false, ctrl.Result{}, r.deletePod(ctx, rg, p)

	case stepRecreateReplica:
		return false, ctrl.Result{}, recreateReplica(ctx, r.Client, r.APIReader, rg.Namespace, rg.Name, o.pod(st.Ordinal))

	case stepDeletePVC:
		// Only if, in the API server's view, the set no longer reaches
		// the ordinal and its pod is gone.
		freshSts := &appsv1.StatefulSet{}
		if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(rg), freshSts); err != nil && !apierrors.IsNotFound(err) {
			return false, ctrl.Result{}, err
		} else if err == nil && freshSts.Spec.Replicas != nil && int(*freshSts.Spec.Replicas) > st.Ordinal {
			return false, ctrl.Result{}, errStale
		}
		err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: rg.Namespace, Name: o.podName(st.Ordinal)}, &corev1.Pod{})
		if err == nil {
			return false, ctrl.Result{}, errStale
		} else if !apierrors.IsNotFound(err) {
			return false, ctrl.Result{}, err
		}
		return false, ctrl.Result{}, r.deletePVC(ctx, rg, st.Ordinal, o.PVCUIDs[st.Ordinal])

	case stepTakeRollSlot:
		if err := r.takeRollSlot(ctx, rg, sm, o.UpdateRevision); errors.Is(err, errStale) {
			return true, ctrl.Result{RequeueAfter: r.requeueShort()}, nil
		} else if err != nil {
			res, err := r.retryConflict(err)
			return true, res, err
		}
		r.Recorder.Eventf(rg, nil, corev1.EventTypeNormal, reasonRollingUpdate, string(st.Kind), "%s", st.Message)
		return true, ctrl.Result{RequeueAfter: time.Millisecond}, nil

	case stepReleaseRollSlot:
		if err := r.releaseRollSlot(ctx, rg); err != nil {
			res, err := r.retryConflict(err)
			return true, res, err
		}
		r.Recorder.Eventf(rg, nil, corev1.EventTypeNormal, reasonRollingUpdate, string(st.Kind), "%s", st.Message)
		return true, ctrl.Result{RequeueAfter: time.Millisecond}, nil

	case stepGrowVolume:
		c := claimAt(o.Claims, st.Ordinal)
		if c == nil {
			return false, ctrl.Result{}, errStale
		}
		refused, err := growClaim(ctx, r.Client, rg.Namespace, *c, storageSize(o.Storage))
		if refused != "" {
			// Not tried again until the spec changes (refusedResize).
			o.ResizeRefused = refused
		} else if err == nil {
			r.Recorder.Eventf(rg, nil, corev1.EventTypeNormal, reasonGrowVolume, reasonGrowVolume, "%s", st.Message)
		}
		return false, ctrl.Result{}, err

	case stepFinalize:
		if o.PVCRetentionDelete {
			// Claims retained from a deleted group of the same name were
			// never this group's: they stay.
			for _, ord := range o.ownPVCs() {
				if err := r.deletePVC(ctx, rg, ord, o.PVCUIDs[ord]); err != nil {
					return false, ctrl.Result{}, err
				}
			}
		}
		r.Recorder.Eventf(rg, nil, corev1.EventTypeNormal, string(st.Kind), string(st.Kind), "%s", st.Message)
		// Record the end in status (best effort), then let the object go.
		if rg.Status.GroupID != 0 && rg.Status.Phase != "" && rg.Status.Phase != shardkvv1.PhasePending {
			rg.Status.Phase = shardkvv1.PhaseLeft
		}
		setCondition(rg, shardkvv1.ConditionDraining, metav1.ConditionTrue, st.Reason, st.Message)
		if err := r.Status().Update(ctx, rg); err != nil && !apierrors.IsNotFound(err) {
			res, err := r.retryConflict(err)
			return true, res, err
		}
		controllerutil.RemoveFinalizer(rg, Finalizer)
		if err := r.Update(ctx, rg); err != nil && !apierrors.IsNotFound(err) {
			res, err := r.retryConflict(err)
			return true, res, err
		}
		return true, ctrl.Result{}, nil
	}
	return false, ctrl.Result{}, fmt.Errorf("unknown step %s", st.Kind)
}

// deletePod deletes the observed pod p, only if it is still that pod.
func (r *ReplicaGroupReconciler) deletePod(ctx context.Context, rg *shardkvv1.ReplicaGroup, p *podView) error {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: rg.Namespace, Name: p.Name}}
	var opts []client.DeleteOption
	if p.UID != "" {
		opts = append(opts, client.Preconditions{UID: &p.UID})
	}
	return staleOnConflict(client.IgnoreNotFound(r.Delete(ctx, pod, opts...)))
}

// deletePVC deletes the claim of ordinal, only if it is still the claim
// with uid (when known).
func (r *ReplicaGroupReconciler) deletePVC(ctx context.Context, rg *shardkvv1.ReplicaGroup, ordinal int, uid types.UID) error {
	c := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: rg.Namespace, Name: pvcName(rg.Name, ordinal)}}
	var opts []client.DeleteOption
	if uid != "" {
		opts = append(opts, client.Preconditions{UID: &uid})
	}
	return staleOnConflict(client.IgnoreNotFound(r.Delete(ctx, c, opts...)))
}

// errStale: the step was not taken because what it was planned on has
// changed since (a newer pod or claim); the next pass plans again.
var errStale = errors.New("the observation is out of date")

func staleOnConflict(err error) error {
	if apierrors.IsConflict(err) {
		return errStale
	}
	return err
}

// retryConflict: an optimistic-concurrency conflict means the next pass
// starts from the newer object, soon; other errors go to the controller's
// backoff.
func (r *ReplicaGroupReconciler) retryConflict(err error) (ctrl.Result, error) {
	if apierrors.IsConflict(err) {
		return ctrl.Result{RequeueAfter: r.requeueShort()}, nil
	}
	return ctrl.Result{}, err
}

// ignoreConflict turns an optimistic-concurrency conflict into nil: the
// caller requeues and the next pass starts from the newer object.
func ignoreConflict(err error) error {
	if apierrors.IsConflict(err) {
		return nil
	}
	return err
}

// allocateGroupID takes the ShardMap's next group id (an optimistic update
// of its status: a conflict means another group took it, try again) and
// records it in the group's status before anything runs with it. An id
// reserved but not recorded (the second update failed) is skipped, never
// handed out twice.
func (r *ReplicaGroupReconciler) allocateGroupID(ctx context.Context, rg *shardkvv1.ReplicaGroup, sm *shardkvv1.ShardMap) (bool, ctrl.Result, error) {
	retry := ctrl.Result{RequeueAfter: 100 * time.Millisecond}
	fresh := &shardkvv1.ReplicaGroup{}
	if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(rg), fresh); err != nil {
		return true, ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if fresh.Status.GroupID != 0 {
		return true, ctrl.Result{RequeueAfter: time.Millisecond}, nil // the cache was behind
	}
	freshSM := &shardkvv1.ShardMap{}
	if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(sm), freshSM); err != nil {
		return true, ctrl.Result{}, err
	}
	gid := max(freshSM.Status.NextGroupID, 1)
	// Never below an id a group of this cluster has (in case the
	// ShardMap's counter was lost).
	var list shardkvv1.ReplicaGroupList
	if err := r.List(ctx, &list, client.InNamespace(rg.Namespace)); err != nil {
		return true, ctrl.Result{}, err
	}
	for _, other := range list.Items {
		if other.Spec.ShardMap == sm.Name && other.Status.GroupID >= gid {
			gid = other.Status.GroupID + 1
		}
	}
	freshSM.Status.NextGroupID = gid + 1
	if err := r.Status().Update(ctx, freshSM); err != nil {
		if apierrors.IsConflict(err) {
			return true, retry, nil
		}
		return true, ctrl.Result{}, err
	}
	fresh.Status.GroupID = gid
	fresh.Status.Phase = shardkvv1.PhasePending
	fresh.Status.Selector = groupSelector(fresh)
	if err := r.Status().Update(ctx, fresh); err != nil {
		if apierrors.IsConflict(err) {
			return true, retry, nil
		}
		return true, ctrl.Result{}, err
	}
	r.Recorder.Eventf(fresh, nil, corev1.EventTypeNormal, string(stepAllocateGroupID), string(stepAllocateGroupID),
		"group id %d allocated from ShardMap %s", gid, sm.Name)
	return true, ctrl.Result{RequeueAfter: time.Millisecond}, nil
}
