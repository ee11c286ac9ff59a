package controllers

// Planner tests: whole sequences run in the simulated world of
// replicagroup_plansim_test.go, checked step by step.

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

func TestPlanSettledGroupIsIdle(t *testing.T) {
	w := newSimGroup(t, 3, 9)
	expectSteps(t, w.run(5), "Idle")
}

func TestPlanBootstrap(t *testing.T) {
	w := newSimGroup(t, 3)
	w.finalizer = false
	w.gid = 0
	w.phase = ""
	w.sts = -1
	w.pods = map[int]*simPod{}
	w.pvcs = map[int]uint64{}
	w.config = &shardkvpb.Config{Num: 0, Shards: make([]uint64, 8)}

	if st := nextStep(w.observe()); st.Kind != stepAddFinalizer {
		t.Fatalf("first step %s, want AddFinalizer", st)
	}
	w.finalizer = true
	if st := nextStep(w.observe()); st.Kind != stepAllocateGroupID {
		t.Fatalf("second step %s, want AllocateGroupID", st)
	}
	w.gid = 7
	w.phase = "Pending"
	if st := nextStep(w.observe()); st.Kind != stepWait || st.Reason != reasonCreating {
		t.Fatalf("without a StatefulSet: %s", st)
	}
	// The StatefulSet starts 3 pods; they bootstrap ids 1..3 from --peers
	// but have not elected a leader yet.
	w.sts = 3
	for i := range 3 {
		w.pvcs[i] = uint64(i + 1)
		w.startPod(i)
	}
	w.leaderID = 0
	if st := nextStep(w.observe()); st.Kind != stepWait || st.Reason != reasonNoLeader {
		t.Fatalf("before a leader: %s", st)
	}
	w.leaderID = 1
	// No quorum reachable: only the leader answers.
	w.pods[1].down, w.pods[2].down = true, true
	if st := nextStep(w.observe()); st.Kind != stepWait || st.Reason != reasonWaitingForQuorum {
		t.Fatalf("without a quorum: %s", st)
	}
	w.pods[1].down = false
	cfgBefore := w.config
	w.config = nil
	if st := nextStep(w.observe()); st.Kind != stepWait || st.Reason != reasonControllerUnreachable {
		t.Fatalf("controller unreachable: %s", st)
	}
	w.config = cfgBefore
	w.pods[2].down = false
	expectSteps(t, w.run(10), "Join(1,2,3) Idle")
	if st := nextStep(w.observe()); st.Kind != stepIdle {
		t.Fatalf("after join: %s", st)
	}
}

func TestPlanScaleOut(t *testing.T) {
	w := newSimGroup(t, 3, 9)
	w.desired = 5
	steps := w.run(40)
	expectSteps(t, steps,
		"ScaleStatefulSet(4) AddLearner(101@3) Promote(101) Join(1,2,3,101) "+
			"ScaleStatefulSet(5) AddLearner(102@4) Promote(102) Join(1,2,3,101,102) Idle")
	// Each learner was promoted only after catching up.
	var reasons []string
	for _, s := range steps {
		if s.Kind == stepWait {
			reasons = append(reasons, s.Reason)
		}
	}
	if !slices.Contains(reasons, reasonLearnerCatchingUp) || !slices.Contains(reasons, reasonWaitingForPod) {
		t.Fatalf("waits %v: want the new pod and the learner's catch-up waited for", reasons)
	}
}

func TestPlanScaleOutFromOne(t *testing.T) {
	w := newSimGroup(t, 1, 9)
	w.desired = 3
	w.lag = false
	expectSteps(t, w.run(40),
		"ScaleStatefulSet(2) AddLearner(101@1) Promote(101) Join(1,101) "+
			"ScaleStatefulSet(3) AddLearner(102@2) Promote(102) Join(1,101,102) Idle")
}

func TestPlanScaleInLeaderLast(t *testing.T) {
	// Leader at the highest ordinal: leadership moves before its removal.
	w := newSimGroup(t, 5, 9)
	w.leaderID = 5
	w.members[1].Match = w.commit - 10 // ordinal 1 less caught up than 2 and 3
	w.desired = 3
	expectSteps(t, w.run(40),
		"TransferLeader(1) RemoveMember(5) Join(1,2,3,4) ScaleStatefulSet(4) "+
			"RemoveMember(4) Join(1,2,3) ScaleStatefulSet(3) Idle")
	if w.leaderID != 1 {
		t.Fatalf("leader %d", w.leaderID)
	}
	// Retained volumes stay.
	if len(w.pvcs) != 5 {
		t.Fatalf("pvcs %v, want all 5 retained", w.pvcs)
	}
}

// A scale-in is done when the removed pods are gone, not when the
// StatefulSet is shrunk: until then the plan waits, so Ready stays false.
func TestPlanScaleInWaitsForTerminatingPods(t *testing.T) {
	w := newSimGroup(t, 4, 9)
	w.desired = 3
	expectSteps(t, w.run(20), "RemoveMember(4) Join(1,2,3) ScaleStatefulSet(3) Idle")
	w.pods[3] = &simPod{exists: true, ready: false, id: 4, removed: true, rev: w.updateRev} // still terminating
	st := nextStep(w.observe())
	if st.Kind != stepWait || st.Reason != reasonWaitingForPod || !strings.Contains(st.Message, "rg-3") {
		t.Fatalf("with pod 3 terminating: %s, want a wait for it", st)
	}
	w.pods[3].exists = false
	if st := nextStep(w.observe()); st.Kind != stepIdle {
		t.Fatalf("after pod 3 is gone: %s", st)
	}
}

func TestPlanScaleInTransferTarget(t *testing.T) {
	// The most caught-up voter that stays takes over.
	w := newSimGroup(t, 5, 9)
	w.leaderID = 5
	w.members[0].Match = w.commit - 5
	w.members[1].Match = w.commit - 1
	w.members[2].Match = w.commit - 2
	w.members[3].Match = w.commit // ordinal 3 leaves next: not preferred
	w.desired = 3
	st := nextStep(w.observe())
	if st.Kind != stepTransferLeader || st.ID != 2 {
		t.Fatalf("step %s, want TransferLeader(2)", st)
	}
}

func TestPlanScaleInDeletesPVCs(t *testing.T) {
	w := newSimGroup(t, 4, 9)
	w.retention = true
	w.desired = 2
	expectSteps(t, w.run(40),
		"RemoveMember(4) Join(1,2,3) ScaleStatefulSet(3) DeletePVC(3) "+
			"RemoveMember(3) Join(1,2) ScaleStatefulSet(2) DeletePVC(2) Idle")
}

func TestPlanSetShrunkByHandKeepsClaims(t *testing.T) {
	// Someone scaled the StatefulSet to 0 (kubectl scale statefulset):
	// under pvcRetention Delete the claims it no longer reaches are still
	// the group's data, not a finished scale-in's leftovers.
	w := newSimGroup(t, 1, 9)
	w.retention = true
	w.sts = 0
	w.pods = map[int]*simPod{}
	if st := nextStep(w.observe()); st.Kind == stepDeletePVC {
		t.Fatalf("step %s: deletes the claim of a replica the spec still wants", st)
	}
}

func TestPlanScaleInKeepsQuorum(t *testing.T) {
	w := newSimGroup(t, 3, 9)
	w.desired = 2
	w.pods[1].down = true // voter 2 does not answer
	st := nextStep(w.observe())
	if st.Kind != stepWait || st.Reason != reasonWaitingForQuorum {
		t.Fatalf("step %s, want a wait for quorum (removing 3 would leave 1 healthy of 2)", st)
	}
	// A dead member being removed never costs the quorum.
	w.pods[1].down = false
	w.pods[2].down = true
	if st := nextStep(w.observe()); st.Kind != stepRemoveMember || st.ID != 3 {
		t.Fatalf("step %s, want RemoveMember(3)", st)
	}
}

func TestPlanScaleInLeaderWithoutTarget(t *testing.T) {
	w := newSimGroup(t, 2, 9)
	w.leaderID = 2
	w.desired = 1
	w.pods[0].down = true
	if st := nextStep(w.observe()); st.Kind != stepWait || st.Reason != reasonWaitingForQuorum {
		t.Fatalf("step %s, want a wait: no voter to take over", st)
	}
}

func TestPlanScaleOutDuringScaleIn(t *testing.T) {
	t.Run("back up after the removal", func(t *testing.T) {
		w := newSimGroup(t, 5, 9)
		w.desired = 3
		w.lag = false
		// First step of the scale-in runs: member 5 is removed ...
		if st := nextStep(w.observe()); st.String() != "RemoveMember(5)" {
			t.Fatalf("first step %s", st)
		}
		w.apply(nextStep(w.observe()))
		// ... then the spec goes back up to 5 before the shrink. The pod
		// at ordinal 4 runs the removed replica 5: it gets a fresh volume
		// and joins under a new id.
		w.desired = 5
		expectSteps(t, w.run(40), "Join(1,2,3,4) RecreateReplica(4) AddLearner(101@4) Promote(101) Join(1,2,3,4,101) Idle")
	})
	t.Run("shrink finishes, then grows", func(t *testing.T) {
		w := newSimGroup(t, 5, 9)
		w.desired = 3
		w.lag = false
		w.apply(nextStep(w.observe())) // RemoveMember(5)
		w.apply(nextStep(w.observe())) // Join(1,2,3,4)
		if st := nextStep(w.observe()); st.String() != "ScaleStatefulSet(4)" {
			t.Fatalf("third step %s", st)
		}
		w.apply(nextStep(w.observe()))
		// Up again to 5: the retained volume of ordinal 4 holds removed
		// replica 5, so it is recreated before the pod joins.
		w.desired = 5
		expectSteps(t, w.run(40), "ScaleStatefulSet(5) RecreateReplica(4) AddLearner(101@4) Promote(101) Join(1,2,3,4,101) Idle")
	})
	t.Run("down while a learner catches up", func(t *testing.T) {
		w := newSimGroup(t, 3, 9)
		w.desired = 4
		w.apply(nextStep(w.observe())) // ScaleStatefulSet(4)
		w.apply(nextStep(w.observe())) // wait: pod 3 starts
		if st := nextStep(w.observe()); st.String() != "AddLearner(101@3)" {
			t.Fatalf("step %s", st)
		}
		w.apply(nextStep(w.observe()))
		// Spec back to 3 before the learner caught up: it is removed,
		// not promoted.
		w.desired = 3
		expectSteps(t, w.run(40), "RemoveMember(101) ScaleStatefulSet(3) Idle")
	})
}

func TestPlanLostDisk(t *testing.T) {
	w := newSimGroup(t, 3, 9)
	// Pod 1 lost its volume: --id=auto found id 2 still a member, so it
	// runs under a fresh id and waits to be added.
	w.pvcs[1] = 0
	w.startPod(1)
	expectSteps(t, w.run(40), "RemoveMember(2) Join(1,3) AddLearner(101@1) Promote(101) Join(1,3,101) Idle")
}

func TestPlanStaleFollower(t *testing.T) {
	// A pod runs a replica the leader no longer lists, without knowing
	// it was removed.
	w := newSimGroup(t, 3, 9)
	w.members = slices.DeleteFunc(w.members, func(m memberView) bool { return m.ID == 3 })
	w.config.Groups[0].Servers = w.observe().servers()
	o := w.observe()
	o.Pods[2].Status.Role = "follower"
	if st := nextStep(o); st.String() != "RecreateReplica(2)" {
		t.Fatalf("step %s, want RecreateReplica(2)", st)
	}
	// Not while the leader has not applied all it committed: its view
	// of the membership may be behind.
	o = w.observe()
	o.Pods[2].Status.Role = "follower"
	o.Leader.Applied = o.Leader.Commit - 1
	if st := nextStep(o); st.Kind != stepWait {
		t.Fatalf("step %s, want a wait", st)
	}
}

func TestPlanRollingUpdate(t *testing.T) {
	w := newSimGroup(t, 3, 9)
	w.updateRev = "rev2"
	w.restartDelay = 2
	steps := w.run(40)
	expectSteps(t, steps, "TakeRollSlot RestartPod(2) RestartPod(1) TransferLeader(2) RestartPod(0) ReleaseRollSlot Idle")
	// Each restart waited (the slot's release too) for the previous pod to come back.
	for i, s := range steps {
		if s.Kind == stepRestartPod && i+1 < len(steps) && steps[i+1].Kind != stepWait { // the slot is released only once the last pod is back
			t.Fatalf("step after %s is %s, want a wait: %s", s, steps[i+1], stepsString(steps))
		}
	}
	for ord, p := range w.pods {
		if p.rev != "rev2" {
			t.Fatalf("pod %d at %s", ord, p.rev)
		}
	}
}

func TestPlanRollingUpdateWaitsForHealth(t *testing.T) {
	w := newSimGroup(t, 3, 9)
	w.updateRev = "rev2"
	w.pods[0].rev = "rev2"
	w.pods[1].ready = false
	if st := nextStep(w.observe()); st.Kind != stepWait || st.Reason != reasonWaitingForRollout {
		t.Fatalf("step %s, want a wait for pod 1", st)
	}
	w.pods[1].ready = true
	w.members[1].Match = w.commit - maxCatchUpLag - 1
	if st := nextStep(w.observe()); st.Kind != stepWait || st.Reason != reasonWaitingForRollout {
		t.Fatalf("step %s, want a wait for member 2 to catch up", st)
	}
}

// A follower that just restarted keeps, on the leader, the match index it
// had before; the next pod restarts only once the follower and the leader
// hear each other again (else the leader is left without a quorum).
func TestPlanRollingUpdateWaitsForContact(t *testing.T) {
	w := newSimGroup(t, 3, 9)
	w.updateRev = "rev2"
	w.pods[2].rev = "rev2" // restarted first (the highest follower)
	w.rollSlot = true
	w.pods[2].lonely = true
	if st := nextStep(w.observe()); st.Kind != stepWait || st.Reason != reasonWaitingForRollout || !strings.Contains(st.Message, "rg-2") {
		t.Fatalf("step %s, want a wait for pod 2 to hear from the leader", st)
	}
	w.pods[2].lonely = false
	long, short := uint64(5000), uint64(50)
	w.pods[2].heardMs = &long
	if st := nextStep(w.observe()); st.Kind != stepWait || !strings.Contains(st.Message, "rg-2") {
		t.Fatalf("step %s, want a wait for the leader to hear from pod 2", st)
	}
	w.pods[2].heardMs = &short
	if st := nextStep(w.observe()); st.Kind != stepRestartPod || st.Ordinal != 1 {
		t.Fatalf("step %s, want RestartPod(1)", st)
	}
}

func TestPlanRollingUpdateSingleReplica(t *testing.T) {
	w := newSimGroup(t, 1, 9)
	w.updateRev = "rev2"
	expectSteps(t, w.run(10), "TakeRollSlot RestartPod(0) ReleaseRollSlot Idle")
}

// TestPlanRollWaitsForSlot: a group rolls only with its cluster's roll
// slot, and keeps rolling once it has it.
func TestPlanRollWaitsForSlot(t *testing.T) {
	w := newSimGroup(t, 3, 9)
	w.updateRev = "rev2"
	w.rollBlocked = "group b is rolling (one group of a cluster at a time)"
	st := nextStep(w.observe())
	if st.Kind != stepWait || st.Reason != reasonWaitingForRollSlot || st.Message != "rolling update of 3 pods waits: group b is rolling (one group of a cluster at a time)" {
		t.Fatalf("step %s %q, want the slot wait", st, st.Message)
	}
	w.rollBlocked = ""
	for _, want := range []stepKind{stepTakeRollSlot, stepRestartPod} {
		st := nextStep(w.observe())
		if st.Kind != want {
			t.Fatalf("step %s, want %s", st, want)
		}
		w.apply(st)
	}
	// Held: what would block taking it does not stop the roll.
	w.rollBlocked = "the controller group rolls first: 2 of its 3 pods updated, 3 ready"
	expectSteps(t, w.run(30), "RestartPod(1) TransferLeader(2) RestartPod(0) ReleaseRollSlot Idle")
}

// TestPlanClusterDeleting: a group of a ShardMap being deleted changes
// nothing until it is deleted too.
func TestPlanClusterDeleting(t *testing.T) {
	w := newSimGroup(t, 3, 9)
	w.clusterDeleting = true
	w.desired = 5
	if st := nextStep(w.observe()); st.Kind != stepWait || st.Reason != reasonClusterDeleting {
		t.Fatalf("step %s %q, want the ClusterDeleting wait", st, st.Message)
	}
}

func TestPlanPaused(t *testing.T) {
	w := newSimGroup(t, 3, 9)
	w.paused = true
	w.desired = 5
	w.updateRev = "rev2"
	if st := nextStep(w.observe()); st.Kind != stepWait || st.Reason != reasonPaused {
		t.Fatalf("step %s, want Wait(Paused)", st)
	}
	w.deleting = true
	if st := nextStep(w.observe()); st.Kind != stepWait || st.Reason != reasonPaused {
		t.Fatalf("deleting: step %s, want Wait(Paused)", st)
	}
}

func TestPlanDeletion(t *testing.T) {
	t.Run("leave, drain, finalize", func(t *testing.T) {
		w := newSimGroup(t, 3, 9)
		w.deleting = true
		if st := nextStep(w.observe()); st.Kind != stepLeave {
			t.Fatalf("step %s, want Leave", st)
		}
		// Left with planned moves: the group stays in the config, marked
		// leaving, until its last shard is cut over. Leave is not repeated.
		leaving := w.config
		w.config = &shardkvpb.Config{Num: leaving.Num + 1, Shards: leaving.Shards}
		for _, g := range leaving.Groups {
			g := &shardkvpb.Group{Gid: g.Gid, Weight: g.Weight, Servers: g.Servers, Leaving: g.Gid == w.gid}
			w.config.Groups = append(w.config.Groups, g)
		}
		st := nextStep(w.observe())
		if st.Kind != stepWait || st.Message != "group 7 is leaving: 4 of its shards are still to be copied and cut over to the other groups" {
			t.Fatalf("leaving: step %s %q, want a wait", st, st.Message)
		}
		w.config = leaving
		w.apply(step{Kind: stepLeave})
		// The controller's reports are not known yet.
		if st := nextStep(w.observe()); st.Kind != stepWait || st.Reason != reasonControllerUnreachable {
			t.Fatalf("step %s", st)
		}
		w.reports = map[uint64]*shardkvpb.GroupReport{}
		if st := nextStep(w.observe()); st.Kind != stepWait || st.Reason != reasonWaitingForDrain {
			t.Fatalf("no report: step %s", st)
		}
		w.reports[w.gid] = &shardkvpb.GroupReport{Gid: w.gid, ConfigNum: w.config.Num - 1}
		if st := nextStep(w.observe()); st.Kind != stepWait || !strings.Contains(st.Message, "applied config") {
			t.Fatalf("behind: step %s %q", st, st.Message)
		}
		w.reports[w.gid] = &shardkvpb.GroupReport{Gid: w.gid, ConfigNum: w.config.Num, Shards: []*shardkvpb.ShardState{
			{Shard: 0, State: "BePulling"}, {Shard: 2, State: "GCing"}, {Shard: 4, State: "GCing"}}}
		st = nextStep(w.observe())
		if st.Kind != stepWait || st.Message != "group 7 still holds 3 shards (1 BePulling, 2 GCing)" {
			t.Fatalf("holding: step %s %q", st, st.Message)
		}
		w.reports[w.gid].Shards = nil
		finalizeAfterLinger(t, w)
	})
	t.Run("last group is refused", func(t *testing.T) {
		w := newSimGroup(t, 3)
		w.deleting = true
		st := nextStep(w.observe())
		if st.Kind != stepWait || st.Reason != reasonLastGroupHoldsData || st.mutates() {
			t.Fatalf("step %s, want the refusal", st)
		}
	})
	t.Run("never joined", func(t *testing.T) {
		// Its leader runs: its report decides, as for any group.
		w := newSimGroup(t, 3, 9)
		w.config.Groups = w.config.Groups[1:]
		w.phase = "Pending"
		w.deleting = true
		w.reports = map[uint64]*shardkvpb.GroupReport{}
		if st := nextStep(w.observe()); st.Kind != stepWait || st.Reason != reasonWaitingForDrain {
			t.Fatalf("before its report: step %s, want a wait", st)
		}
		w.reports[w.gid] = &shardkvpb.GroupReport{Gid: w.gid, ConfigNum: w.config.Num}
		finalizeAfterLinger(t, w)
	})
	t.Run("never ran", func(t *testing.T) {
		// No pod ever ran (a bad image, say): no leader, no report and no
		// volume of its own; a retained volume of a deleted group of the
		// same name does not count.
		w := newSimGroup(t, 3, 9)
		w.config.Groups = w.config.Groups[1:]
		w.phase = "Pending"
		w.deleting = true
		w.reports = map[uint64]*shardkvpb.GroupReport{}
		w.pods = map[int]*simPod{}
		w.pvcs = map[int]uint64{0: 1}
		w.retained = map[int]bool{0: true}
		if st := nextStep(w.observe()); st.Kind != stepFinalize {
			t.Fatalf("step %s, want Finalize", st)
		}
	})
	t.Run("left out of band, status lost, shards still held", func(t *testing.T) {
		// The group left the config without the operator, and its status
		// says Pending (a lost write): its own report still holds shards
		// another group must pull, so it is not finalized.
		w := newSimGroup(t, 3, 9)
		w.config.Groups = w.config.Groups[:1]
		w.config.Groups[0].Gid = 9
		w.phase = ""
		w.deleting = true
		w.reports = map[uint64]*shardkvpb.GroupReport{w.gid: {Gid: w.gid, ConfigNum: w.config.Num,
			Shards: []*shardkvpb.ShardState{{Shard: 1, State: "BePulling"}, {Shard: 3, State: "BePulling"}}}}
		st := nextStep(w.observe())
		if st.Kind != stepWait || st.Message != "group 7 still holds 2 shards (2 BePulling)" {
			t.Fatalf("step %s %q, want a wait on the drain", st, st.Message)
		}
		// Its pods down: still no finalize while its volumes may hold data.
		delete(w.reports, w.gid)
		for _, p := range w.pods {
			p.down = true
		}
		if st := nextStep(w.observe()); st.Kind != stepWait || !strings.Contains(st.Message, "may still hold shards") {
			t.Fatalf("pods down: step %s %q, want a wait", st, st.Message)
		}
	})
	t.Run("joined but status says pending", func(t *testing.T) {
		// Join went through but the phase was not recorded: still leave.
		w := newSimGroup(t, 3, 9)
		w.phase = "Pending"
		w.deleting = true
		if st := nextStep(w.observe()); st.Kind != stepLeave {
			t.Fatalf("step %s, want Leave", st)
		}
	})
	t.Run("shardmap gone", func(t *testing.T) {
		w := newSimGroup(t, 3)
		w.smGone = true
		w.deleting = true
		if st := nextStep(w.observe()); st.Kind != stepFinalize {
			t.Fatalf("step %s, want Finalize", st)
		}
	})
	t.Run("the whole cluster deleted", func(t *testing.T) {
		// The ShardMap and every group of it: nothing to drain into.
		w := newSimGroup(t, 3, 9)
		w.clusterDeleting, w.clusterGroupsDeleting, w.deleting = true, true, true
		if st := nextStep(w.observe()); st.Kind != stepFinalize || st.Reason != reasonClusterDeleted {
			t.Fatalf("step %s %q, want Finalize ClusterDeleted", st, st.Message)
		}
	})
	t.Run("cluster deleted, other groups stay", func(t *testing.T) {
		// The others stay (for now): the group drains into them.
		w := newSimGroup(t, 3, 9)
		w.clusterDeleting, w.deleting = true, true
		if st := nextStep(w.observe()); st.Kind != stepLeave {
			t.Fatalf("step %s %q, want Leave", st, st.Message)
		}
	})
	t.Run("controller unreachable", func(t *testing.T) {
		w := newSimGroup(t, 3, 9)
		w.config = nil
		w.deleting = true
		if st := nextStep(w.observe()); st.Kind != stepWait || st.Reason != reasonControllerUnreachable {
			t.Fatalf("step %s", st)
		}
	})
	t.Run("finalizer already gone", func(t *testing.T) {
		w := newSimGroup(t, 3, 9)
		w.deleting = true
		w.finalizer = false
		if st := nextStep(w.observe()); st.Kind != stepIdle {
			t.Fatalf("step %s", st)
		}
	})
}

func TestPlanWeightChangeUpdatesController(t *testing.T) {
	w := newSimGroup(t, 3, 9)
	o := w.observe()
	o.Weight = 4
	if st := nextStep(o); st.Kind != stepJoin || st.Reason != reasonUpdateServers {
		t.Fatalf("step %s, want Join (update)", st)
	}
}

func TestPlanForeignMemberLeftAlone(t *testing.T) {
	// A member added by hand at an address that is not one of the pods:
	// neither promoted nor removed (it is reported as unhealthy).
	w := newSimGroup(t, 3, 9)
	w.members = append(w.members, memberView{ID: 50, Ordinal: -1, Learner: true, Match: w.commit})
	if st := nextStep(w.observe()); st.Kind != stepIdle {
		t.Fatalf("step %s, want Idle", st)
	}
}

// The servers in the controller's config name the Redis ports the pods
// serve, and only those: a TLS-only group's CLUSTER SLOTS over TLS must
// list its replicas, and must not send plain clients to a closed port.
func TestPlanServersNameServedRedisPorts(t *testing.T) {
	for _, tc := range []struct {
		ports         []string
		plain, secure bool
	}{
		{[]string{"resp"}, true, false},
		{[]string{"resp-tls"}, false, true},
		{[]string{"resp", "resp-tls"}, true, true},
	} {
		w := newSimGroup(t, 3, 9)
		o := w.observe()
		o.RESPPorts = tc.ports
		servers := o.servers()
		if len(servers) != 3 {
			t.Fatalf("%v: %d servers, want 3", tc.ports, len(servers))
		}
		for _, sv := range servers {
			if (sv.RespAddr != "") != tc.plain || (sv.RespTlsAddr != "") != tc.secure {
				t.Errorf("ports %v: server %d has resp %q, resp tls %q", tc.ports, sv.Id, sv.RespAddr, sv.RespTlsAddr)
			}
			if tc.secure && !strings.HasSuffix(sv.RespTlsAddr, fmt.Sprintf(":%d", RESPTLSPort)) {
				t.Errorf("server %d: resp tls %q, want port %d", sv.Id, sv.RespTlsAddr, RESPTLSPort)
			}
		}
		// A config written before (plain addresses only) is brought up
		// to date.
		if tc.secure {
			if st := nextStep(o); st.Kind != stepJoin || st.Reason != reasonUpdateServers {
				t.Errorf("ports %v: step %s, want Join (update) of the TLS addresses", tc.ports, st)
			}
		}
	}
}

func TestPlanRetainedVolumes(t *testing.T) {
	// A re-created group (new id) finds volumes kept from a deleted group
	// of the same name: no StatefulSet yet.
	fresh := func(t *testing.T) *simWorld {
		w := newSimGroup(t, 3, 9)
		w.config.Groups = w.config.Groups[1:]
		w.phase = "Pending"
		w.sts = -1
		w.pods = map[int]*simPod{}
		w.pvcs = map[int]uint64{0: 1, 1: 2, 2: 3, 4: 5}
		w.retained = map[int]bool{0: true, 1: true, 2: true, 4: true}
		return w
	}
	t.Run("refused by default", func(t *testing.T) {
		w := fresh(t)
		st := nextStep(w.observe())
		want := "volumes data-rg-0, data-rg-1, data-rg-2, data-rg-4 are older than this ReplicaGroup"
		if st.Kind != stepWait || st.Reason != reasonRetainedVolumes || !strings.HasPrefix(st.Message, want) ||
			!strings.Contains(st.Message, "kubectl delete pvc data-rg-0 data-rg-1 data-rg-2 data-rg-4") {
			t.Fatalf("step %s %q", st, st.Message)
		}
		// Deleting it meanwhile finalizes (it never stored anything) and
		// leaves the retained volumes alone even under pvcRetention Delete.
		w.deleting = true
		w.retention = true
		w.reports = map[uint64]*shardkvpb.GroupReport{}
		o := w.observe()
		if st := nextStep(o); st.Kind != stepFinalize || len(o.ownPVCs()) != 0 {
			t.Fatalf("deleting: step %s, own claims %v", st, o.ownPVCs())
		}
	})
	t.Run("wiped with Wipe", func(t *testing.T) {
		w := fresh(t)
		w.wipe = true
		var steps []step
		for range 10 {
			st := nextStep(w.observe())
			if st.Kind != stepDeletePVC {
				break
			}
			steps = append(steps, st)
			w.apply(st)
		}
		expectSteps(t, steps, "DeletePVC(0) DeletePVC(1) DeletePVC(2) DeletePVC(4)")
		if st := nextStep(w.observe()); st.Kind != stepWait || st.Reason != reasonCreating {
			t.Fatalf("after the wipe: %s", st)
		}
	})
	t.Run("a pod already on one", func(t *testing.T) {
		// Created before the operator knew: a crash-looping pod on a
		// retained volume goes with it.
		w := newSimGroup(t, 3, 9)
		w.retained = map[int]bool{1: true}
		w.pods[1].down = true
		if st := nextStep(w.observe()); st.Kind != stepWait || st.Reason != reasonRetainedVolumes {
			t.Fatalf("refuse: %s", st)
		}
		w.wipe = true
		if st := nextStep(w.observe()); st.Kind != stepRecreateReplica || st.Ordinal != 1 {
			t.Fatalf("wipe: %s, want RecreateReplica(1)", st)
		}
	})
}

func TestPlanNoLeaderSaysWhyPodsFail(t *testing.T) {
	w := newSimGroup(t, 3, 9)
	for _, p := range w.pods {
		p.down = true
	}
	o := w.observe()
	o.Pods[1].Trouble = "CrashLoopBackOff (exit 1: node: data dir /data belongs to role=group group=2 id=1, not role=group group=4 id=1)"
	st := nextStep(o)
	want := "waiting for the group to elect a leader (0 of 3 pods answer); rg-1: CrashLoopBackOff (exit 1: node: data dir /data belongs to"
	if st.Reason != reasonNoLeader || !strings.HasPrefix(st.Message, want) {
		t.Fatalf("step %s %q", st, st.Message)
	}
}

// finalizeAfterLinger: a drained group (no client at its pods) lingers one
// pass, which records status.drainedAt, then is finalized.
func finalizeAfterLinger(t *testing.T, w *simWorld) {
	t.Helper()
	st := nextStep(w.observe())
	if st.Kind != stepWait || st.Reason != reasonLingering {
		t.Fatalf("drained: step %s %q, want the linger", st, st.Message)
	}
	w.apply(st)
	if st := nextStep(w.observe()); st.Kind != stepFinalize {
		t.Fatalf("drained, no client: step %s, want Finalize", st)
	}
}

func TestPlanDrainedPodsLinger(t *testing.T) {
	drained := func(t *testing.T) *simWorld {
		w := newSimGroup(t, 3, 9)
		w.config.Groups = w.config.Groups[1:]
		w.deleting = true
		w.phase = "Draining"
		w.reports = map[uint64]*shardkvpb.GroupReport{w.gid: {Gid: w.gid, ConfigNum: w.config.Num}}
		w.drainedAt = w.now.Add(-5 * time.Second)
		return w
	}
	ms := func(d time.Duration) *uint64 { v := uint64(d.Milliseconds()); return &v }

	w := drained(t)
	w.pods[1].idleMs = ms(2 * time.Second)
	w.pods[2].idleMs = ms(time.Minute)
	st := nextStep(w.observe())
	want := "group 7 is drained; its pods stay until clients have moved away (no client request for 15s, at most 1m55s more): last client request at rg-1 2s ago"
	if st.Kind != stepWait || st.Reason != reasonLingering || st.Message != want {
		t.Fatalf("a client 2s ago: step %s %q", st, st.Message)
	}
	// Quiet for drainQuiet everywhere: finalized.
	w.pods[1].idleMs = ms(drainQuiet)
	if st := nextStep(w.observe()); st.Kind != stepFinalize || st.Message != "group 7 has handed off and deleted every shard; clients moved away" {
		t.Fatalf("quiet: step %s %q", st, st.Message)
	}
	// Clients that never stop: finalized after drainLingerMax anyway.
	w = drained(t)
	w.pods[0].idleMs = ms(time.Second)
	w.drainedAt = w.now.Add(-drainLingerMax)
	if st := nextStep(w.observe()); st.Kind != stepFinalize || !strings.Contains(st.Message, "still had clients after 2m0s (rg-0 1s ago)") {
		t.Fatalf("linger bound: step %s %q", st, st.Message)
	}
}
