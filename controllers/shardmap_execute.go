package controllers

// Executing the ShardMap planner's step: one object write, one pod
// deletion, or one Move/Unpin, each told in an Event.

import (
	"context"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
)

// smOutcome is what executing a step did.
type smOutcome struct {
	// Progress is the Progressing condition of the step, taken or failed.
	Progress smCondition
	// Err is a failed data-plane step (or NetworkPolicy write): returned
	// after the status is written, so retries back off (the queue's rate
	// limiter).
	Err error
	// Degraded is set when the step failed in a way the Degraded
	// condition tells (a NetworkPolicy the API server refused).
	Degraded smCondition
}

func objectsUpdated(format string, args ...any) smOutcome {
	return smOutcome{Progress: smCondition{metav1.ConditionTrue, ReasonObjectsUpdated, fmt.Sprintf(format, args...)}}
}

// execute takes step st. An error (an API write failed) ends the pass
// before the status is written; a failed Move or Unpin is the outcome's Err.
func (r *ShardMapReconciler) execute(ctx context.Context, sm *shardkvv1.ShardMap, o *smObserved, api ControllerAPI, st smStep) (smOutcome, error) {
	name := CtrlerName(sm.Name)
	action := string(st.Kind)
	switch st.Kind {
	case smStepTLS:
		return r.executeTLS(ctx, sm, o, st.TLS)
	case smStepSetUsers:
		return r.applyUsers(ctx, sm, o, api), nil
	case smStepCreateStatefulSet:
		if err := createOwned(ctx, r.Client, r.Scheme, sm, o.WantSts); err != nil {
			return smOutcome{}, err
		}
		r.event(sm, corev1.EventTypeNormal, "Created", action, "created StatefulSet %s (%d controller replicas)", name, o.Bootstrap)
		return objectsUpdated("created StatefulSet %s", name), nil

	case smStepUpdateStatefulSet:
		// Only the mutable fields; the selector, service name, policy and
		// claim templates are fixed at creation.
		sts, want := o.Sts.DeepCopy(), o.WantSts
		sts.Spec.Replicas = want.Spec.Replicas
		sts.Spec.Template = want.Spec.Template
		sts.Spec.UpdateStrategy = want.Spec.UpdateStrategy
		if err := r.updateSpec(ctx, sts, want); err != nil {
			return smOutcome{}, err
		}
		r.event(sm, corev1.EventTypeNormal, "Updated", action, "updated StatefulSet %s; pods are rolled one at a time", name)
		return objectsUpdated("updated StatefulSet %s", name), nil

	case smStepCreateService:
		if err := createOwned(ctx, r.Client, r.Scheme, sm, o.WantSvc); err != nil {
			return smOutcome{}, err
		}
		r.event(sm, corev1.EventTypeNormal, "Created", action, "created headless Service %s", name)
		return objectsUpdated("created Service %s", name), nil

	case smStepUpdateService:
		svc, want := o.Svc.DeepCopy(), o.WantSvc
		svc.Spec.Ports, svc.Spec.Selector, svc.Spec.PublishNotReadyAddresses = want.Spec.Ports, want.Spec.Selector, true
		if err := r.updateSpec(ctx, svc, want); err != nil {
			return smOutcome{}, err
		}
		r.event(sm, corev1.EventTypeNormal, "Updated", action, "updated Service %s", name)
		return objectsUpdated("updated Service %s", name), nil

	case smStepCreatePDB:
		if err := createOwned(ctx, r.Client, r.Scheme, sm, o.WantPDB); err != nil {
			return smOutcome{}, err
		}
		r.event(sm, corev1.EventTypeNormal, "Created", action, "created PodDisruptionBudget %s (minAvailable %s)", name, o.WantPDB.Spec.MinAvailable.String())
		return objectsUpdated("created PodDisruptionBudget %s", name), nil

	case smStepUpdatePDB:
		pdb, want := o.PDB.DeepCopy(), o.WantPDB
		pdb.Spec.MinAvailable, pdb.Spec.MaxUnavailable, pdb.Spec.Selector = want.Spec.MinAvailable, nil, want.Spec.Selector
		if err := r.updateSpec(ctx, pdb, want); err != nil {
			return smOutcome{}, err
		}
		r.event(sm, corev1.EventTypeNormal, "Updated", action, "updated PodDisruptionBudget %s", name)
		return objectsUpdated("updated PodDisruptionBudget %s", name), nil

	case smStepDeletePod:
		return r.rollPod(ctx, sm, o, st)

	case smStepGrowVolume:
		c := claimAt(o.Claims, st.Ordinal)
		if c == nil {
			return smOutcome{}, fmt.Errorf("claim of controller pod %d not observed", st.Ordinal)
		}
		size := storageSize(o.Storage)
		refused, err := growClaim(ctx, r.Client, sm.Namespace, *c, size)
		if err != nil || refused != "" {
			// A refusal is not tried again until the spec changes.
			o.ResizeRefused = refused
			return smOutcome{}, err
		}
		msg := fmt.Sprintf("growing volume %s from %s to %s", c.Name, c.Request.String(), size.String())
		r.event(sm, corev1.EventTypeNormal, reasonGrowVolume, "GrowVolume", "%s", msg)
		return objectsUpdated("%s", msg), nil

	case smStepMove, smStepUnpin:
		return r.applyMove(ctx, sm, o, api, st), nil

	case smStepCreateNetPol, smStepUpdateNetPol, smStepDeleteNetPol:
		return r.executeNetworkPolicy(ctx, sm, o, st)

	case smStepCtrlerAddLearner, smStepCtrlerPromote, smStepCtrlerRemoveMember, smStepCtrlerTransferLeader:
		return r.executeCtrlerMember(ctx, sm, o, st), nil

	case smStepScaleStatefulSet:
		// The spec hash follows the size, so the next pass sees the set
		// as wanted at that size.
		sts, want := o.Sts.DeepCopy(), r.desiredCtrlerSts(sm, o.Bootstrap, st.Replicas)
		sts.Spec.Replicas = want.Spec.Replicas
		if err := r.updateSpec(ctx, sts, want); err != nil {
			return smOutcome{}, err
		}
		r.event(sm, corev1.EventTypeNormal, ReasonResizingController, action, "%s", st.Object)
		return smOutcome{Progress: smCondition{metav1.ConditionTrue, ReasonResizingController, st.Object}}, nil

	case smStepDeleteClaim:
		return r.deleteRemovedClaim(ctx, sm, o, st)

	case smStepCtrlerRecreate:
		if err := recreateReplica(ctx, r.Client, r.apiReader(), sm.Namespace, CtrlerName(sm.Name), o.Pods[st.Ordinal]); err != nil {
			return smOutcome{}, err
		}
		r.event(sm, corev1.EventTypeNormal, st.Reason, string(st.Kind), "%s", st.Object)
		return smOutcome{Progress: smCondition{metav1.ConditionTrue, st.Reason, st.Object}}, nil
	}
	return smOutcome{}, fmt.Errorf("unknown step %s", st)
}

// updateSpec writes have, whose spec now holds want's mutable fields, with
// want's spec hash and labels.
func (r *ShardMapReconciler) updateSpec(ctx context.Context, have, want client.Object) error {
	setAnnotation(have, annotationSpecHash, want.GetAnnotations()[annotationSpecHash])
	have.SetLabels(want.GetLabels())
	return r.Update(ctx, have)
}

// rollPod deletes the outdated controller pod st names, only if it is
// still the pod observed.
func (r *ShardMapReconciler) rollPod(ctx context.Context, sm *shardkvv1.ShardMap, o *smObserved, st smStep) (smOutcome, error) {
	p := o.Pods[st.Ordinal]
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: sm.Namespace, Name: p.Name, UID: p.UID}}
	if err := client.IgnoreNotFound(r.Delete(ctx, pod, client.Preconditions{UID: &p.UID})); err != nil {
		return smOutcome{}, err
	}
	role := "follower"
	if st.Leader {
		role = "leader"
	}
	r.eventRelated(sm, pod, corev1.EventTypeNormal, "RollingPod", string(st.Kind), "deleting controller pod %s (%s) to update it from revision %s to %s",
		p.Name, role, p.Revision, o.Sts.Status.UpdateRevision)
	return smOutcome{Progress: smCondition{metav1.ConditionTrue, ReasonRollingPods,
		fmt.Sprintf("updating controller pod %s (%d of %d left)", p.Name, st.Outdated, o.Size)}}, nil
}

// deleteRemovedClaim deletes the claim of a controller pod a shrink
// removed, if the API server's StatefulSet (not the cache's, which may lag
// a grow) is still below its ordinal, and the claim is the one observed.
func (r *ShardMapReconciler) deleteRemovedClaim(ctx context.Context, sm *shardkvv1.ShardMap, o *smObserved, st smStep) (smOutcome, error) {
	sts := &appsv1.StatefulSet{}
	if err := r.apiReader().Get(ctx, client.ObjectKeyFromObject(o.Sts), sts); err != nil {
		return smOutcome{}, err
	}
	if sts.Spec.Replicas == nil || int(*sts.Spec.Replicas) > st.Ordinal {
		return smOutcome{}, fmt.Errorf("StatefulSet %s has %v replicas now: the claim of pod %d is in use", sts.Name, ptr.Deref(sts.Spec.Replicas, 1), st.Ordinal)
	}
	uid := o.ClaimUIDs[st.Ordinal]
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: sm.Namespace, Name: pvcName(CtrlerName(sm.Name), st.Ordinal)}}
	if err := client.IgnoreNotFound(r.Delete(ctx, pvc, client.Preconditions{UID: &uid})); err != nil {
		return smOutcome{}, err
	}
	r.event(sm, corev1.EventTypeNormal, ReasonResizingController, string(st.Kind), "%s", st.Object)
	return smOutcome{Progress: smCondition{metav1.ConditionTrue, ReasonResizingController, st.Object}}, nil
}

// applyMove makes the Move or Unpin call st names.
func (r *ShardMapReconciler) applyMove(ctx context.Context, sm *shardkvv1.ShardMap, o *smObserved, api ControllerAPI, st smStep) smOutcome {
	cctx, cancel := callCtx(ctx, r.CallTimeout)
	defer cancel()
	progress := func(format string, args ...any) smCondition {
		return smCondition{metav1.ConditionTrue, ReasonApplyingMoves, fmt.Sprintf(format, args...)}
	}
	if st.Kind == smStepUnpin {
		action := fmt.Sprintf("UnpinShard%d", st.Shard)
		cfg, err := api.Unpin(cctx, st.Shard)
		if err != nil {
			r.event(sm, corev1.EventTypeWarning, "UnpinFailed", action, "unpin shard %d: %v", st.Shard, err)
			return smOutcome{Progress: progress("unpin shard %d failed: %v", st.Shard, err), Err: fmt.Errorf("unpin shard %d: %w", st.Shard, err)}
		}
		r.event(sm, corev1.EventTypeNormal, "Unpinned", action, "unpinned shard %d (was pinned to %s; not in spec.moves): config %d",
			st.Shard, groupNamer(o.Groups)(st.GID), cfg.GetNum())
		return smOutcome{Progress: progress("unpinned shard %d: config %d", st.Shard, cfg.GetNum())}
	}
	action := fmt.Sprintf("MoveShard%d", st.Shard)
	cfg, err := api.Move(cctx, st.Shard, st.GID)
	if err != nil {
		r.event(sm, corev1.EventTypeWarning, "MoveFailed", action, "move shard %d to %s (gid %d): %v", st.Shard, st.Group, st.GID, err)
		return smOutcome{Progress: progress("move of shard %d to %s failed: %v", st.Shard, st.Group, err),
			Err: fmt.Errorf("move shard %d to %s: %w", st.Shard, st.Group, err)}
	}
	r.event(sm, corev1.EventTypeNormal, "Moved", action, "pinned shard %d to %s (gid %d): config %d", st.Shard, st.Group, st.GID, cfg.GetNum())
	return smOutcome{Progress: progress("pinned shard %d to %s: config %d", st.Shard, st.Group, cfg.GetNum())}
}
