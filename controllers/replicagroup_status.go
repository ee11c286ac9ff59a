package controllers

// The ReplicaGroup's status: members, leader, phase and shards from the
// observation, and conditions from the planned step.

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

func setCondition(rg *shardkvv1.ReplicaGroup, typ string, status metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&rg.Status.Conditions, metav1.Condition{
		Type: typ, Status: status, Reason: reason, Message: msg, ObservedGeneration: rg.Generation,
	})
}

// finishStatus records what the pass saw and did, and picks the requeue.
func (r *ReplicaGroupReconciler) finishStatus(ctx context.Context, rg *shardkvv1.ReplicaGroup, o *observed, st step, execErr error) (ctrl.Result, error) {
	before := rg.Status.DeepCopy()
	prevDraining, prevProgressing, prevStorage := "", "", ""
	if c := meta.FindStatusCondition(rg.Status.Conditions, shardkvv1.ConditionDraining); c != nil {
		prevDraining = c.Reason
	}
	if c := meta.FindStatusCondition(rg.Status.Conditions, shardkvv1.ConditionProgressing); c != nil {
		prevProgressing = c.Reason
	}
	if c := meta.FindStatusCondition(rg.Status.Conditions, shardkvv1.ConditionStorageApplied); c != nil {
		prevStorage = c.Reason
	}
	r.computeStatus(rg, o, st, execErr)

	// A refusal that waits for the user is told once, when it starts.
	switch {
	case st.Reason == reasonLastGroupHoldsData && prevDraining != reasonLastGroupHoldsData:
		r.Recorder.Eventf(rg, nil, corev1.EventTypeWarning, reasonLastGroupHoldsData, "Drain", "%s", st.Message)
	case st.Reason == reasonRetainedVolumes && prevProgressing != reasonRetainedVolumes:
		r.Recorder.Eventf(rg, nil, corev1.EventTypeWarning, reasonRetainedVolumes, "CreateStatefulSet", "%s", st.Message)
	}
	if c := meta.FindStatusCondition(rg.Status.Conditions, shardkvv1.ConditionStorageApplied); c != nil && c.Reason != prevStorage &&
		(c.Reason == reasonStorageResizeRefused || c.Reason == reasonStorageShrink || c.Reason == reasonStorageClassImmutable) {
		r.Recorder.Eventf(rg, nil, corev1.EventTypeWarning, c.Reason, "ResizeVolume", "%s", c.Message)
	}
	if !equality.Semantic.DeepEqual(before, &rg.Status) {
		if err := r.Status().Update(ctx, rg); err != nil {
			if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
				return ctrl.Result{RequeueAfter: r.requeueShort()}, nil
			}
			return ctrl.Result{}, err
		}
	}
	switch {
	case execErr != nil:
		return ctrl.Result{RequeueAfter: r.requeueShort()}, nil
	case st.Kind == stepIdle:
		return ctrl.Result{RequeueAfter: r.requeueIdle()}, nil
	case st.Kind == stepWait && (st.Reason == reasonPaused || st.Reason == reasonShardMapNotFound || st.Reason == reasonClusterDeleting || st.Reason == "NoImage"):
		return ctrl.Result{RequeueAfter: r.requeueIdle()}, nil
	case st.Kind == stepWait && (st.Reason == reasonLastGroupHoldsData || st.Reason == reasonRetainedVolumes):
		// Another group joining, or the user deleting the claims (neither
		// watched), lifts the refusal.
		return ctrl.Result{RequeueAfter: max(r.requeueShort(), r.requeueIdle()/6)}, nil
	}
	return ctrl.Result{RequeueAfter: r.requeueShort()}, nil
}

// computeStatus fills rg.Status from the observation and the step.
func (r *ReplicaGroupReconciler) computeStatus(rg *shardkvv1.ReplicaGroup, o *observed, st step, execErr error) {
	s := &rg.Status
	s.ObservedGeneration = rg.Generation
	s.Selector = groupSelector(rg)
	if o == nil {
		setCondition(rg, shardkvv1.ConditionProgressing, metav1.ConditionFalse, st.Reason, st.Message)
		setCondition(rg, shardkvv1.ConditionReady, metav1.ConditionFalse, st.Reason, st.Message)
		return
	}

	// Members, leader, readiness.
	if o.Leader != nil {
		s.Leader = o.podName(o.LeaderOrdinal)
		var members []shardkvv1.Member
		for _, m := range o.Members {
			mem := shardkvv1.Member{ID: int64(m.ID), Healthy: o.healthy(m)}
			if m.Ordinal >= 0 {
				mem.Pod = o.podName(m.Ordinal)
			}
			switch {
			case m.Learner:
				mem.Role = "learner"
			case o.isLeader(m):
				mem.Role = "leader"
			default:
				mem.Role = "follower"
			}
			if m.Ordinal >= 0 {
				if p := o.pod(m.Ordinal); p.Status != nil && p.Status.Id == m.ID {
					mem.AppliedIndex = int64(p.Status.Applied)
					if p.Status.Role == "candidate" {
						mem.Role = "candidate"
					}
				}
			}
			members = append(members, mem)
		}
		slices.SortFunc(members, func(a, b shardkvv1.Member) int { return cmp.Compare(a.ID, b.ID) })
		s.Members = members
		s.Replicas = int32(len(o.voters()))
	} else {
		s.Leader = ""
		for i := range s.Members {
			s.Members[i].Healthy = false
		}
	}
	ready := int32(0)
	for i := range int(max(o.StsReplicas, 0)) {
		if p := o.pod(i); p.present() && p.Ready {
			ready++
		}
	}
	s.ReadyReplicas = ready

	// Phase and shards, from the controller's latest config.
	joined := false
	if o.Config != nil && o.GroupID != 0 {
		joined = configGroup(o.Config, o.GroupID) != nil
		s.Shards.Count, s.Shards.Ranges = shardSummary(o.Config, o.GroupID)
		switch {
		case o.Deleting:
			if !joined && s.Phase != "" && s.Phase != shardkvv1.PhasePending {
				s.Phase = shardkvv1.PhaseDraining
			}
		case joined:
			s.Phase = shardkvv1.PhaseServing
		case s.Phase == "" || s.Phase == shardkvv1.PhaseServing:
			s.Phase = shardkvv1.PhasePending
		}
		if joined {
			setCondition(rg, shardkvv1.ConditionJoined, metav1.ConditionTrue, "InConfig",
				fmt.Sprintf("group %d is in config %d with %d shards", o.GroupID, o.Config.Num, s.Shards.Count))
		} else {
			setCondition(rg, shardkvv1.ConditionJoined, metav1.ConditionFalse, "NotInConfig",
				fmt.Sprintf("group %d is not in config %d", o.GroupID, o.Config.Num))
		}
	} else if meta.FindStatusCondition(s.Conditions, shardkvv1.ConditionJoined) == nil {
		setCondition(rg, shardkvv1.ConditionJoined, metav1.ConditionUnknown, reasonControllerUnreachable, "the controller's config is not known")
	}
	if s.Phase == "" && o.GroupID != 0 {
		s.Phase = shardkvv1.PhasePending
	}
	if st.Reason == reasonLingering && s.DrainedAt == nil {
		s.DrainedAt = &metav1.Time{Time: o.Now}
	}

	// Progressing: the step in flight, or what it waits for.
	switch {
	case execErr != nil:
		setCondition(rg, shardkvv1.ConditionProgressing, metav1.ConditionTrue, "StepFailed",
			fmt.Sprintf("%s: %v (will retry)", st.Message, execErr))
	case st.Kind == stepIdle:
		setCondition(rg, shardkvv1.ConditionProgressing, metav1.ConditionFalse, reasonIdle, st.Message)
	case st.Reason == reasonPaused || st.Reason == reasonLastGroupHoldsData || st.Reason == reasonRetainedVolumes || st.Reason == reasonClusterDeleting:
		setCondition(rg, shardkvv1.ConditionProgressing, metav1.ConditionFalse, st.Reason, st.Message)
	default:
		setCondition(rg, shardkvv1.ConditionProgressing, metav1.ConditionTrue, st.Reason, st.Message)
	}

	// StorageApplied: once the group has volumes.
	if o.GroupID != 0 && o.StsReplicas >= 0 && len(o.RetainedPVCs) == 0 {
		sp := planStorage("spec.storage", o.Storage, o.Claims, o.ResizeRefused)
		setCondition(rg, shardkvv1.ConditionStorageApplied, sp.Status, sp.Reason, sp.Message)
	}

	// Draining.
	switch {
	case !o.Deleting:
		setCondition(rg, shardkvv1.ConditionDraining, metav1.ConditionFalse, "NotDeleting", "the group is not being deleted")
	case st.Reason == reasonLastGroupHoldsData || st.Reason == reasonPaused:
		setCondition(rg, shardkvv1.ConditionDraining, metav1.ConditionFalse, st.Reason, st.Message)
	default:
		setCondition(rg, shardkvv1.ConditionDraining, metav1.ConditionTrue, st.Reason, st.Message)
	}

	// Degraded: what is wrong with the group itself.
	var unhealthy []string
	for _, m := range s.Members {
		if !m.Healthy && m.Role != "learner" { // a learner catching up is progress, not damage
			unhealthy = append(unhealthy, fmt.Sprintf("%d (%s)", m.ID, m.Pod))
		}
	}
	switch {
	case o.GroupID == 0 || o.StsReplicas < 0:
		setCondition(rg, shardkvv1.ConditionDegraded, metav1.ConditionFalse, "NotStarted", "the group's pods are not created yet")
	case o.Reports[o.GroupID].GetStranded() != "":
		// It lost its state (every disk, or restored from an old copy):
		// it serves none of its shards and cannot step on by itself.
		setCondition(rg, shardkvv1.ConditionDegraded, metav1.ConditionTrue, reasonStranded, o.Reports[o.GroupID].GetStranded())
	case o.Leader == nil:
		setCondition(rg, shardkvv1.ConditionDegraded, metav1.ConditionTrue, reasonNoLeader, "no replica reports itself the group's leader")
	case len(unhealthy) > 0:
		setCondition(rg, shardkvv1.ConditionDegraded, metav1.ConditionTrue, "MembersUnhealthy",
			fmt.Sprintf("members not answering or not caught up: %v", unhealthy))
	case o.Config == nil && !o.ShardMapGone:
		setCondition(rg, shardkvv1.ConditionDegraded, metav1.ConditionTrue, reasonControllerUnreachable, "cannot reach the controller group")
	default:
		setCondition(rg, shardkvv1.ConditionDegraded, metav1.ConditionFalse, "Healthy", "every member answers and is caught up")
	}

	// Ready: serving, every member healthy, at the spec's size, at rest.
	switch {
	case o.Deleting:
		setCondition(rg, shardkvv1.ConditionReady, metav1.ConditionFalse, "Deleting", "the group is being deleted")
	case !joined:
		setCondition(rg, shardkvv1.ConditionReady, metav1.ConditionFalse, "NotJoined", st.Message)
	case o.Leader == nil || len(unhealthy) > 0:
		setCondition(rg, shardkvv1.ConditionReady, metav1.ConditionFalse, "Degraded", "not every member is healthy")
	case st.Kind != stepIdle:
		setCondition(rg, shardkvv1.ConditionReady, metav1.ConditionFalse, st.Reason, st.Message)
	default:
		setCondition(rg, shardkvv1.ConditionReady, metav1.ConditionTrue, "Serving",
			fmt.Sprintf("%d members serve %d shards", s.Replicas, s.Shards.Count))
	}
}

// shardSummary counts gid's shards in cfg and writes them as ranges
// "0-63,128-191".
func shardSummary(cfg *shardkvpb.Config, gid uint64) (int32, string) {
	var n int32
	var parts []string
	shards := cfg.GetShards()
	for i := 0; i < len(shards); {
		if shards[i] != gid || gid == 0 {
			i++
			continue
		}
		j := i
		for j+1 < len(shards) && shards[j+1] == gid {
			j++
		}
		n += int32(j - i + 1)
		if i == j {
			parts = append(parts, strconv.Itoa(i))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d", i, j))
		}
		i = j + 1
	}
	return n, strings.Join(parts, ",")
}
