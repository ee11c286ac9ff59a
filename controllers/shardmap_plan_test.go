package controllers

// ShardMap planner tests: observations built by hand (no Kubernetes), each
// step choice and each wait with its reason, and whole sequences (creating
// the objects, rolling the pods) by applying each step to the observation
// as the cluster would.

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// settledSM is ShardMap demo in namespace ns as a settled cluster sees it:
// 3 controller pods at revision r1, every object as the spec asks, the
// controller answering with its leader on pod leader, groups a (gid 1)
// and b (gid 2) owning 8 shards, no pins.
func settledSM(leader int) *smObserved {
	sm := &shardkvv1.ShardMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "demo"}, Spec: shardkvv1.ShardMapSpec{
		Shards: 8, Controller: shardkvv1.ControllerSpec{Replicas: 3, Storage: shardkvv1.StorageSpec{Size: resource.MustParse("256Mi")}}}}
	r := &ShardMapReconciler{DefaultImage: "shardkv:test"}
	o := &smObserved{Name: "demo", Namespace: "ns", Replicas: 3, Bootstrap: 3, Size: 3, Storage: sm.Spec.Controller.Storage,
		WantSts: r.desiredCtrlerSts(sm, 3, 3), WantSvc: desiredCtrlerService(sm), WantPDB: desiredCtrlerPDB(sm, 3),
		Pods: map[int]*podView{}}
	o.Sts, o.Svc, o.PDB = o.WantSts.DeepCopy(), o.WantSvc.DeepCopy(), o.WantPDB.DeepCopy()
	o.Sts.Generation = 2
	o.Sts.Status.ObservedGeneration, o.Sts.Status.ReadyReplicas = 2, 3
	o.Sts.Status.CurrentRevision, o.Sts.Status.UpdateRevision = "r1", "r1"
	for i := range 3 {
		name := fmt.Sprintf("demo-ctrler-%d", i)
		o.Pods[i] = &podView{Ordinal: i, Name: name, UID: types.UID("uid-" + name), Exists: true, Ready: true, Revision: "r1"}
	}
	var members []*shardkvpb.Member
	for i := range 3 {
		members = append(members, &shardkvpb.Member{Id: uint64(i + 1), Addr: podGRPCAddr("demo-ctrler", i, "ns"), Match: 100, HeardMsAgo: ptr.To[uint64](50)})
	}
	o.Cluster = &shardkvpb.ClusterStatus{
		Controller: &shardkvpb.MemberStatus{Id: uint64(leader + 1), Leader: uint64(leader + 1), Role: "leader", Commit: 100,
			Addr: fmt.Sprintf("demo-ctrler-%d.demo-ctrler.ns.svc:7000", leader), Members: members},
		Latest: &shardkvpb.Config{Num: 4, Shards: []uint64{1, 1, 1, 1, 2, 2, 2, 2}, Groups: []*shardkvpb.Group{smGroup(1), smGroup(2)}},
	}
	o.Groups = map[string]*shardkvv1.ReplicaGroup{}
	for name, gid := range map[string]int64{"a": 1, "b": 2} {
		o.Groups[name] = &shardkvv1.ReplicaGroup{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
			Spec: shardkvv1.ReplicaGroupSpec{ShardMap: "demo"}, Status: shardkvv1.ReplicaGroupStatus{GroupID: gid}}
	}
	return o
}

// unreachable: the controller was not reached.
func (o *smObserved) unreachable(err string) *smObserved {
	o.Cluster, o.ClusterErr = nil, errors.New(err)
	return o
}

// newRevision: the StatefulSet's template changed (revision r2), no pod
// is at it yet.
func (o *smObserved) newRevision() *smObserved {
	o.Sts.Status.UpdateRevision = "r2"
	return o
}

// expectPlan checks the step, the wait (reason and a part of its
// message; "" none) and the Degraded reason ("" none).
func expectPlan(t *testing.T, pl smPlan, step, waitReason, waitSub, degReason string) {
	t.Helper()
	if got := pl.Step.String(); got != step {
		t.Errorf("step %s, want %s", got, step)
	}
	if pl.Wait.Reason != waitReason || !strings.Contains(pl.Wait.Message, waitSub) {
		t.Errorf("wait %s %q, want %s containing %q", pl.Wait.Reason, pl.Wait.Message, waitReason, waitSub)
	}
	if waitReason != "" && pl.Wait.Status != metav1.ConditionTrue && waitReason != ReasonPaused {
		t.Errorf("wait %s has status %s, want True", pl.Wait.Reason, pl.Wait.Status)
	}
	if pl.Degraded.Reason != degReason {
		t.Errorf("degraded %s %q, want %q", pl.Degraded.Reason, pl.Degraded.Message, degReason)
	}
}

func TestPlanShardMapSettled(t *testing.T) {
	expectPlan(t, planShardMap(settledSM(0)), "None", "", "", "")
}

// TestPlanShardMapCreatesObjects: a new cluster's objects, one per pass,
// the StatefulSet first; nothing else waits while the controller is away.
func TestPlanShardMapCreatesObjects(t *testing.T) {
	o := settledSM(0).unreachable("0/3 controller pods ready (2 needed for a quorum)")
	o.Sts, o.Svc, o.PDB, o.Pods = nil, nil, nil, map[int]*podView{}
	var steps []string
	for range 5 {
		pl := planShardMap(o)
		if pl.Wait.Reason != "" || pl.Degraded.Reason != "" {
			t.Fatalf("after %v: wait %+v degraded %+v", steps, pl.Wait, pl.Degraded)
		}
		steps = append(steps, pl.Step.String())
		switch pl.Step.Kind {
		case smStepCreateStatefulSet:
			o.Sts = o.WantSts.DeepCopy()
		case smStepCreateService:
			o.Svc = o.WantSvc.DeepCopy()
		case smStepCreatePDB:
			o.PDB = o.WantPDB.DeepCopy()
		}
		if pl.Step.Kind == smStepNone {
			break
		}
	}
	if want := []string{"CreateStatefulSet", "CreateService", "CreatePodDisruptionBudget", "None"}; !slices.Equal(steps, want) {
		t.Errorf("steps %v, want %v", steps, want)
	}
}

// TestPlanShardMapUpdatesObjects: an object whose spec hash differs from
// the spec's is updated, the StatefulSet first, before any pod is rolled.
func TestPlanShardMapUpdatesObjects(t *testing.T) {
	stale := func(o *smObserved) {
		o.Sts.Annotations[annotationSpecHash] = "old"
		o.Svc.Annotations[annotationSpecHash] = "old"
		o.PDB.Annotations[annotationSpecHash] = "old"
	}
	o := settledSM(0).newRevision()
	stale(o)
	expectPlan(t, planShardMap(o), "UpdateStatefulSet", "", "", "")
	o.Sts.Annotations[annotationSpecHash] = o.WantSts.Annotations[annotationSpecHash]
	expectPlan(t, planShardMap(o), "UpdateService", "", "", "")
	o.Svc.Annotations[annotationSpecHash] = o.WantSvc.Annotations[annotationSpecHash]
	expectPlan(t, planShardMap(o), "UpdatePodDisruptionBudget", "", "", "")
	o.PDB.Annotations[annotationSpecHash] = o.WantPDB.Annotations[annotationSpecHash]
	expectPlan(t, planShardMap(o), "DeletePod(2)", "", "", "")
}

func TestPlanShardMapDegraded(t *testing.T) {
	// A StatefulSet of that name this ShardMap does not own: no object is
	// touched, and without a StatefulSet there is no quorum to reach.
	o := settledSM(0).unreachable("0/3 controller pods ready (2 needed for a quorum)")
	o.Sts, o.StsConflict, o.Svc = nil, true, nil
	o.Moves = []shardkvv1.ShardMove{{Shard: 0, Group: "b"}}
	expectPlan(t, planShardMap(o), "None", ReasonWaitingForMoves, "spec.moves wait for the controller: 0/3 controller pods ready", ReasonConflict)
	if pl := planShardMap(o); !strings.Contains(pl.Degraded.Message, "StatefulSet demo-ctrler exists and is not owned by this ShardMap") {
		t.Errorf("degraded %q", pl.Degraded.Message)
	}

	// A resize is applied (shardmap_resize_test.go), not refused.
	o = settledSM(0)
	o.Replicas = 5
	expectPlan(t, planShardMap(o), "ScaleStatefulSet(5)", "", "", "")

	// Volumes grow, one claim per pass, after the template; what cannot
	// be applied is said.
	o = settledSM(0)
	for i := range 3 {
		o.Claims = append(o.Claims, claimView{Name: pvcName("demo-ctrler", i), Ordinal: i, Request: resource.MustParse("256Mi"),
			Capacity: resource.MustParse("256Mi"), Bound: true})
	}
	o.Storage.Size = resource.MustParse("512Mi")
	o.Sts.Annotations[annotationSpecHash] = "old"
	expectPlan(t, planShardMap(o), "UpdateStatefulSet", "", "", "")
	o.Sts.Annotations[annotationSpecHash] = o.WantSts.Annotations[annotationSpecHash]
	expectPlan(t, planShardMap(o), "GrowVolume(0)", "", "", "")
	o.Claims[0].Request = resource.MustParse("512Mi")
	expectPlan(t, planShardMap(o), "GrowVolume(1)", "", "", "")
	o.ResizeRefused = "refused by the API server"
	expectPlan(t, planShardMap(o), "None", "", "", reasonStorageResizeRefused)
	o.ResizeRefused = ""
	o.Storage.Size = resource.MustParse("128Mi")
	pl := planShardMap(o)
	expectPlan(t, pl, "None", "", "", reasonStorageShrink)
	if want := "spec.controller.storage.size 128Mi is below the size of volumes data-demo-ctrler-0 (512Mi)"; !strings.Contains(pl.Degraded.Message, want) {
		t.Errorf("degraded %q, want %q", pl.Degraded.Message, want)
	}
	class := "fast"
	o.Storage = shardkvv1.StorageSpec{Size: resource.MustParse("256Mi"), StorageClassName: &class}
	expectPlan(t, planShardMap(o), "None", "", "", reasonStorageClassImmutable)

	// A foreign Service or PDB is said (the later one when both are) and
	// left alone; the other objects go on.
	o = settledSM(0)
	o.Svc, o.SvcConflict, o.PDB = nil, true, nil
	expectPlan(t, planShardMap(o), "CreatePodDisruptionBudget", "", "", ReasonConflict)
	o.PDBConflict = true
	pl = planShardMap(o)
	expectPlan(t, pl, "None", "", "", ReasonConflict)
	if !strings.Contains(pl.Degraded.Message, "PodDisruptionBudget demo-ctrler exists") {
		t.Errorf("degraded %q", pl.Degraded.Message)
	}
}

// TestPlanShardMapPaused: nothing changes, whatever waits; what cannot be
// applied is still said.
func TestPlanShardMapPaused(t *testing.T) {
	o := settledSM(0).newRevision()
	o.Paused = true
	o.Svc = nil
	o.Sts.Annotations[annotationSpecHash] = "old"
	o.Moves = []shardkvv1.ShardMove{{Shard: 0, Group: "b"}}
	o.Replicas = 5
	pl := planShardMap(o)
	expectPlan(t, pl, "None", ReasonPaused, "spec.paused is set", "")
	if pl.Wait.Status != metav1.ConditionFalse {
		t.Errorf("paused: Progressing %s, want False", pl.Wait.Status)
	}
}

// TestPlanShardMapRollWaits: an outdated pod is rolled only when the
// StatefulSet controller has seen the template, every pod is ready and the
// controller answers.
func TestPlanShardMapRollWaits(t *testing.T) {
	const prefix = "3 controller pods to update; "
	cases := []struct {
		name   string
		mutate func(o *smObserved)
		want   string
	}{
		{"template not observed", func(o *smObserved) { o.Sts.Generation = 3 }, "waiting for the StatefulSet controller to see the new template"},
		{"not all ready", func(o *smObserved) { o.Sts.Status.ReadyReplicas = 2 }, "waiting for all 3 pods to be ready (2 are)"},
		{"a pod missing", func(o *smObserved) { delete(o.Pods, 0) }, "2 controller pods to update; waiting for all 3 pods to be ready (3 are)"},
		{"controller away", func(o *smObserved) { o.unreachable("connection refused") }, "waiting for the controller to answer: connection refused"},
		{"pod not ready", func(o *smObserved) { o.Pods[1].Ready = false }, "waiting for pod demo-ctrler-1 to be ready"},
		{"pod deleting", func(o *smObserved) { o.Pods[0].Deleting = true }, "waiting for pod demo-ctrler-0 to be ready"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := settledSM(1).newRevision()
			c.mutate(o)
			want := c.want
			if !strings.Contains(want, "controller pods to update") {
				want = prefix + want
			}
			pl := planShardMap(o)
			expectPlan(t, pl, "None", ReasonWaitingToRoll, want, "")
			if pl.Wait.Message != want {
				t.Errorf("message %q, want %q", pl.Wait.Message, want)
			}
		})
	}
}

// TestPlanShardMapRollOrder: one pod per pass, each back and ready before
// the next, followers from the highest ordinal down, the leader last,
// after it handed its leadership to an updated follower.
func TestPlanShardMapRollOrder(t *testing.T) {
	o := settledSM(1).newRevision()
	var order []string
	for range 10 {
		pl := planShardMap(o)
		if pl.Step.Kind == smStepNone {
			expectPlan(t, pl, "None", "", "", "")
			break
		}
		st := pl.Step
		order = append(order, st.String())
		if st.Kind == smStepCtrlerTransferLeader {
			// The leader moves to the target; its pod is a follower now.
			l := o.Cluster.Controller
			l.Id, l.Leader, l.Addr = st.Member, st.Member, podGRPCAddr("demo-ctrler", st.Ordinal, "ns")
			continue
		}
		if st.Kind != smStepDeletePod || st.Leader {
			t.Fatalf("after %v: step %+v", order, st)
		}
		// The pod goes; while others are outdated the next pass waits for it.
		p := o.Pods[st.Ordinal]
		delete(o.Pods, st.Ordinal)
		o.Sts.Status.ReadyReplicas = 2
		if len(order) < 4 {
			expectPlan(t, planShardMap(o), "None", ReasonWaitingToRoll, "waiting for all 3 pods to be ready (2 are)", "")
		}
		// It is back at the new revision.
		p.Revision = "r2"
		o.Pods[st.Ordinal] = p
		o.Sts.Status.ReadyReplicas = 3
	}
	// Both followers are updated and caught up: the lower ordinal takes over.
	if want := []string{"DeletePod(2)", "DeletePod(0)", "TransferLeader(1)", "DeletePod(1)"}; !slices.Equal(order, want) {
		t.Errorf("roll order %v, want %v", order, want)
	}

	// No follower heard from lately: the leader's pod waits.
	o = settledSM(1).newRevision()
	for _, i := range []int{0, 2} {
		o.Pods[i].Revision = "r2"
		o.Cluster.Controller.Members[i].HeardMsAgo = ptr.To[uint64](60000)
	}
	expectPlan(t, planShardMap(o), "None", ReasonWaitingToRoll, "no caught-up follower to take over from the leader, pod demo-ctrler-1", "")
	// The most caught-up follower takes over.
	o = settledSM(1).newRevision()
	o.Pods[0].Revision, o.Pods[2].Revision = "r2", "r2"
	o.Cluster.Controller.Members[0].Match = 99
	expectPlan(t, planShardMap(o), "TransferLeader(3)", "", "", "")

	// Pods beyond the set are not rolled: they wait to go.
	o = settledSM(0)
	o.Pods[3] = &podView{Ordinal: 3, Name: "demo-ctrler-3", Exists: true, Ready: true, Revision: "r0"}
	expectPlan(t, planShardMap(o), "None", ReasonResizingController, "waiting for pod demo-ctrler-3, no longer a member, to terminate", "")
}

// TestPlanShardMapMoves: spec.moves against the config's pins, one call
// per pass; the waits are said when there is no call to make.
func TestPlanShardMapMoves(t *testing.T) {
	o := settledSM(0)
	o.Moves = []shardkvv1.ShardMove{{Shard: 5, Group: "a"}, {Shard: 0, Group: "b"}}
	pl := planShardMap(o)
	expectPlan(t, pl, "Move(0,2)", "", "", "")
	if pl.Step.Group != "b" {
		t.Errorf("move to group %q, want b", pl.Step.Group)
	}
	o.Cluster.Latest.Pins = []*shardkvpb.Pin{{Shard: 0, Gid: 2}}
	expectPlan(t, planShardMap(o), "Move(5,1)", "", "", "")
	o.Cluster.Latest.Pins = append(o.Cluster.Latest.Pins, &shardkvpb.Pin{Shard: 5, Gid: 1}, &shardkvpb.Pin{Shard: 7, Gid: 1})
	pl = planShardMap(o)
	expectPlan(t, pl, "Unpin(7)", "", "", "")
	if pl.Step.GID != 1 {
		t.Errorf("unpin of a pin to gid %d, want 1", pl.Step.GID)
	}
	o.Cluster.Latest.Pins = o.Cluster.Latest.Pins[:2]
	expectPlan(t, planShardMap(o), "None", "", "", "")

	// Waits only: said. With a call to make: the call.
	o.Moves = append(o.Moves, shardkvv1.ShardMove{Shard: 2, Group: "late"})
	o.Groups["late"] = &shardkvv1.ReplicaGroup{ObjectMeta: metav1.ObjectMeta{Name: "late"}}
	expectPlan(t, planShardMap(o), "None", ReasonWaitingForMoves, "shard 2: ReplicaGroup late has no group id yet", "")
	o.Moves = append(o.Moves, shardkvv1.ShardMove{Shard: 3, Group: "b"})
	expectPlan(t, planShardMap(o), "Move(3,2)", "", "", "")

	// The controller away: the moves wait for it.
	o.unreachable("connection refused")
	expectPlan(t, planShardMap(o), "None", ReasonWaitingForMoves, "spec.moves wait for the controller: connection refused", "")
	o.Moves = nil
	expectPlan(t, planShardMap(o), "None", "", "", "")
}

// TestPlanShardMapRollAndMoves: a roll that can go goes first (the move
// is the next pass's); a roll that waits does not hold spec.moves back, and
// its wait is the one said.
func TestPlanShardMapRollAndMoves(t *testing.T) {
	o := settledSM(0).newRevision()
	o.Moves = []shardkvv1.ShardMove{{Shard: 0, Group: "b"}}
	expectPlan(t, planShardMap(o), "DeletePod(2)", "", "", "")
	o.Pods[2].Ready = false
	expectPlan(t, planShardMap(o), "Move(0,2)", ReasonWaitingToRoll, "waiting for pod demo-ctrler-2 to be ready", "")
}

// TestShardMapProgressing: the Progressing condition is the plan's wait,
// else the step taken, else UpToDate; Degraded comes and goes with the plan.
func TestShardMapProgressing(t *testing.T) {
	r := &ShardMapReconciler{}
	sm := &shardkvv1.ShardMap{ObjectMeta: metav1.ObjectMeta{Name: "demo", Generation: 3}}
	o := settledSM(0)
	done := smCondition{metav1.ConditionTrue, ReasonApplyingMoves, "pinned shard 0 to b: config 5"}
	wait := smCondition{metav1.ConditionTrue, ReasonWaitingToRoll, "1 controller pods to update; waiting for pod demo-ctrler-2 to be ready"}
	deg := smCondition{metav1.ConditionTrue, reasonStorageShrink, "volumes"}
	cases := []struct {
		pl   smPlan
		done smCondition
		want smCondition
	}{
		{smPlan{Wait: wait}, done, wait},
		{smPlan{Degraded: deg}, done, done},
		{smPlan{}, smCondition{}, smCondition{metav1.ConditionFalse, ReasonUpToDate, "the controller group and spec.moves are applied"}},
	}
	for i, c := range cases {
		got := r.setConditions(sm, o, c.pl, c.done)
		cond := meta.FindStatusCondition(sm.Status.Conditions, shardkvv1.ConditionProgressing)
		if got != c.want || cond == nil || cond.Reason != c.want.Reason || cond.Message != c.want.Message || cond.ObservedGeneration != 3 {
			t.Errorf("case %d: Progressing %+v (condition %+v), want %+v", i, got, cond, c.want)
		}
		degraded := meta.FindStatusCondition(sm.Status.Conditions, shardkvv1.ConditionDegraded)
		if (degraded != nil) != (c.pl.Degraded.Reason != "") || degraded != nil && degraded.Reason != c.pl.Degraded.Reason {
			t.Errorf("case %d: Degraded %+v, want %+v", i, degraded, c.pl.Degraded)
		}
	}

	// The controller not reached: Ready says why, by the pods' readiness.
	o.unreachable("connection refused")
	r.setConditions(sm, o, smPlan{}, smCondition{})
	if c := meta.FindStatusCondition(sm.Status.Conditions, shardkvv1.ConditionReady); c == nil || c.Reason != ReasonControllerUnavailable || c.Message != "connection refused" {
		t.Errorf("Ready %+v, want ControllerUnavailable", c)
	}
	o.Sts.Status.ReadyReplicas = 1
	r.setConditions(sm, o, smPlan{}, smCondition{})
	if c := meta.FindStatusCondition(sm.Status.Conditions, shardkvv1.ConditionBalanced); c == nil || c.Status != metav1.ConditionUnknown || c.Reason != ReasonWaitingForControllerQuorum {
		t.Errorf("Balanced %+v, want Unknown WaitingForControllerQuorum", c)
	}
}

func TestPlanMoves(t *testing.T) {
	rg := func(name string, gid int64) *shardkvv1.ReplicaGroup {
		return &shardkvv1.ReplicaGroup{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: shardkvv1.ReplicaGroupStatus{GroupID: gid}}
	}
	groups := map[string]*shardkvv1.ReplicaGroup{"a": rg("a", 1), "b": rg("b", 2), "new": rg("new", 0), "gone": rg("gone", 5)}
	cfg := &shardkvpb.Config{Num: 3, Shards: make([]uint64, 8), Groups: []*shardkvpb.Group{smGroup(1), smGroup(2)},
		Pins: []*shardkvpb.Pin{{Shard: 1, Gid: 1}, {Shard: 6, Gid: 2}}}
	cases := []struct {
		moves    []shardkvv1.ShardMove
		want     string
		waitsSub string
	}{
		{nil, "unpin 1", ""},
		{[]shardkvv1.ShardMove{{Shard: 1, Group: "a"}, {Shard: 6, Group: "b"}}, "none", ""},
		{[]shardkvv1.ShardMove{{Shard: 6, Group: "b"}, {Shard: 1, Group: "b"}}, "move 1 2", ""},
		{[]shardkvv1.ShardMove{{Shard: 1, Group: "a"}, {Shard: 6, Group: "b"}, {Shard: 9, Group: "a"}}, "none", "shard 9 is out of range (8 shards)"},
		{[]shardkvv1.ShardMove{{Shard: 1, Group: "a"}, {Shard: 6, Group: "b"}, {Shard: 2, Group: "zzz"}}, "none", "ReplicaGroup zzz of this ShardMap does not exist"},
		{[]shardkvv1.ShardMove{{Shard: 1, Group: "a"}, {Shard: 6, Group: "b"}, {Shard: 2, Group: "new"}}, "none", "ReplicaGroup new has no group id yet"},
		{[]shardkvv1.ShardMove{{Shard: 1, Group: "a"}, {Shard: 2, Group: "gone"}}, "unpin 6", "ReplicaGroup gone (gid 5) has not joined yet"},
	}
	for i, c := range cases {
		step, waits := planMoves(c.moves, cfg, groups)
		got := "none"
		if step != nil && step.unpin {
			got = fmt.Sprintf("unpin %d", step.shard)
		} else if step != nil {
			got = fmt.Sprintf("move %d %d", step.shard, step.gid)
		}
		if got != c.want {
			t.Errorf("case %d: step %s, want %s", i, got, c.want)
		}
		if w := strings.Join(waits, "; "); c.waitsSub == "" && w != "" || !strings.Contains(w, c.waitsSub) {
			t.Errorf("case %d: waits %q, want %q", i, w, c.waitsSub)
		}
	}
}
