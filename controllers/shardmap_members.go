package controllers

// The controller group's membership: a controller pod that runs under an
// id the group does not have gets that id added in place of the one the
// group lists at the pod's address.
//
// A replica started with --id=auto and an empty data dir bootstraps as the
// initial member its --peers entry names, unless a peer says the group has
// already held an election: then it cannot tell a late first start from a
// lost disk, and starts with a fresh id, waiting to be added
// (pkg/node resolveAutoID). That happens to a controller pod that starts
// a second or two after the other two have elected a leader (the e2e saw
// it), or whose volume was lost. Nothing added it: the group ran on two of
// three voters for good, the pod answered every linearizable read with
// "read index: context deadline exceeded" (no leader), and a client that
// tried that replica first with a short deadline got nothing. ReplicaGroups
// replace such a replica (replicagroup_plan.go); this does the same for
// the controller group, one call per pass: AddLearner, then Promote once
// it has caught up, then RemoveMember of the old id.

import (
	"cmp"
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// Steps on the controller group's membership (smStep.Ordinal is the pod,
// smStep.Member the id added, promoted or removed).
const (
	smStepCtrlerAddLearner   smStepKind = "AddLearner"
	smStepCtrlerPromote      smStepKind = "Promote"
	smStepCtrlerRemoveMember smStepKind = "RemoveMember"
	// TransferLeader: smStep.Member is the replica handed the leadership.
	smStepCtrlerTransferLeader smStepKind = "TransferLeader"
)

// ReasonReplacingCtrlerReplica (Progressing): a controller pod runs under
// an id the group does not list yet; the message says which step.
const ReasonReplacingCtrlerReplica = "ReplacingControllerReplica"

// observeCtrlerMembers asks each running controller pod which replica it
// runs (o.CtrlerPods, by ordinal), once the controller answered
// (o.Cluster). A pod that does not answer is left out.
func (r *ShardMapReconciler) observeCtrlerMembers(ctx context.Context, sm *shardkvv1.ShardMap, o *smObserved, pods []corev1.Pod) {
	if o.Cluster == nil || ctrlerMembersSettled(o) {
		return
	}
	// The controller answered, so the cluster's credentials (TLS) are there.
	creds, err := r.Credentials.For(sm)
	if err != nil {
		return
	}
	o.CtrlerPods = map[int]*shardkvpb.MemberStatus{}
	o.ctrlerPodObjs = map[int]*corev1.Pod{}
	for i := range pods {
		p := &pods[i]
		ord := podOrdinal(CtrlerName(sm.Name), p.Name)
		if ord >= 0 && p.DeletionTimestamp.IsZero() {
			o.ctrlerPodObjs[ord] = p
		}
		// Running, not ready: a replica waiting to be added is not ready
		// (readiness is Raft health) and is the one to ask.
		if ord < 0 || ord >= int(o.Size) || !p.DeletionTimestamp.IsZero() || p.Status.Phase != corev1.PodRunning {
			continue
		}
		addr := r.ctrlerPodDialAddr(sm, ord, p)
		if addr == "" {
			continue
		}
		api, err := r.DataPlane.Replica(creds, addr)
		if err != nil {
			continue
		}
		cctx, cancel := callCtx(ctx, r.CallTimeout)
		st, err := api.Status(cctx)
		cancel()
		if err == nil && st != nil {
			o.CtrlerPods[ord] = st
		}
	}
}

// ctrlerMembersSettled reports, from the leader's membership alone, that
// no pod needs asking which replica it runs: one voter at each pod's
// address, the leader or heard from lately (a pod running another id
// leaves the old one silent). A status not from the leader settles
// nothing either way, and planCtrlerMembers acts only on the leader's.
func ctrlerMembersSettled(o *smObserved) bool {
	leader := o.Cluster.GetController()
	if leader.GetLeader() == 0 || leader.GetId() != leader.GetLeader() {
		return true
	}
	for ord := range int(o.Size) {
		at := ctrlerMembersAt(o, leader, ord)
		if len(at) != 1 || at[0].GetLearner() {
			return false
		}
		if m := at[0]; m.GetId() != leader.GetLeader() && !ctrlerHeard(m) {
			return false
		}
	}
	return true
}

// ctrlerPodDialAddr is where the operator dials controller pod ord (""
// if it cannot yet).
func (r *ShardMapReconciler) ctrlerPodDialAddr(sm *shardkvv1.ShardMap, ord int, p *corev1.Pod) string {
	return podDialAddr(r.DialPodIPs, CtrlerName(sm.Name), ord, sm.Namespace, p)
}

// planCtrlerMembers is the next membership call that puts the replica each
// controller pod runs in place of the id the group lists at the pod's
// address: AddLearner (the pod's id is not a member), Promote (a learner
// that has caught up), RemoveMember (the old id, once the new one votes).
// One pod at a time; a learner still catching up is a wait.
func planCtrlerMembers(o *smObserved, pl *smPlan) (smStep, bool) {
	leader := o.Cluster.GetController()
	if leader == nil || leader.GetLeader() == 0 || leader.GetId() != leader.GetLeader() || len(o.CtrlerPods) == 0 {
		return smStep{}, false
	}
	for ord := range int(o.Size) {
		st := o.CtrlerPods[ord]
		if st == nil || st.GetId() == 0 {
			continue
		}
		addr := podGRPCAddr(CtrlerName(o.Name), ord, o.Namespace)
		var self, old *shardkvpb.Member
		for _, m := range leader.GetMembers() {
			switch {
			case m.GetId() == st.GetId():
				self = m
			case m.GetAddr() == addr:
				old = m
			}
		}
		pod := podNameAt(o, ord)
		switch {
		case self == nil && old == nil:
			// Not a replacement (the pod's address is not in the
			// group): nothing this knows how to do.
			continue
		case self == nil:
			return smStep{Kind: smStepCtrlerAddLearner, Ordinal: ord, Member: st.GetId(),
				Object: fmt.Sprintf("controller pod %s runs replica %d, which the group does not have (it lists replica %d at %s): adding it as a learner",
					pod, st.GetId(), old.GetId(), addr)}, true
		case self.GetLearner():
			if self.GetMatch() == 0 || self.GetMatch()+maxCatchUpLag < leader.GetCommit() {
				pl.wait(ReasonReplacingCtrlerReplica, "controller replica %d (%s) is catching up: replicated %d of %d",
					st.GetId(), pod, self.GetMatch(), leader.GetCommit())
				return smStep{}, false
			}
			return smStep{Kind: smStepCtrlerPromote, Ordinal: ord, Member: st.GetId(),
				Object: fmt.Sprintf("promoting controller replica %d (%s) to voter", st.GetId(), pod)}, true
		case old != nil:
			return smStep{Kind: smStepCtrlerRemoveMember, Ordinal: ord, Member: old.GetId(),
				Object: fmt.Sprintf("removing controller replica %d: pod %s runs replica %d in its place", old.GetId(), pod, st.GetId())}, true
		}
	}
	return smStep{}, false
}

// executeCtrlerMember makes the membership call st names on the
// controller group's leader (a replacement's, a resize's or a roll's). A
// failure is the outcome's Err (retried with backoff).
func (r *ShardMapReconciler) executeCtrlerMember(ctx context.Context, sm *shardkvv1.ShardMap, o *smObserved, st smStep) smOutcome {
	reason := cmp.Or(st.Reason, ReasonReplacingCtrlerReplica)
	progress := smCondition{metav1.ConditionTrue, reason, st.Object}
	fail := func(err error) smOutcome {
		r.event(sm, corev1.EventTypeWarning, reason, string(st.Kind), "%s: %v", st.Object, err)
		return smOutcome{Progress: smCondition{metav1.ConditionTrue, reason, fmt.Sprintf("%s: %v", st.Object, err)},
			Err: fmt.Errorf("%s controller replica %d: %w", st.Kind, st.Member, err)}
	}
	lord := o.leaderOrdinal()
	var leaderPod *corev1.Pod
	if lord >= 0 {
		leaderPod = o.ctrlerPodObjs[lord]
	}
	addr := r.ctrlerPodDialAddr(sm, lord, leaderPod)
	if lord < 0 || addr == "" {
		return fail(fmt.Errorf("the controller leader's pod is not known (%s)", o.Cluster.GetController().GetAddr()))
	}
	creds, err := r.Credentials.For(sm)
	if err != nil {
		return fail(err)
	}
	api, err := r.DataPlane.Replica(creds, addr)
	if err != nil {
		return fail(err)
	}
	cctx, cancel := callCtx(ctx, r.CallTimeout)
	defer cancel()
	switch st.Kind {
	case smStepCtrlerAddLearner:
		err = api.AddLearner(cctx, st.Member, podGRPCAddr(CtrlerName(sm.Name), st.Ordinal, sm.Namespace))
	case smStepCtrlerPromote:
		err = api.Promote(cctx, st.Member)
	case smStepCtrlerRemoveMember:
		err = api.RemoveMember(cctx, st.Member)
	case smStepCtrlerTransferLeader:
		err = api.TransferLeader(cctx, st.Member)
	default:
		err = fmt.Errorf("unknown step %s", st)
	}
	if err != nil {
		return fail(err)
	}
	r.event(sm, corev1.EventTypeNormal, string(st.Kind), string(st.Kind), "%s", st.Object)
	return smOutcome{Progress: progress}
}
