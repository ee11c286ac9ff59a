package controllers

import (
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// resizeSim plays a ShardMap's steps against a model of its controller
// group: the StatefulSet's size, its pods and claims, and the leader's
// membership. New pods start empty and ask to join with id 100+ordinal;
// learners catch up the pass after they are added; pods beyond the set
// terminate the pass after it shrinks. A pod that comes back on a claim in
// retained runs the removed replica its disk holds; recreated, it starts
// empty with id 200+ordinal.
type resizeSim struct {
	t        *testing.T
	o        *smObserved
	steps    []string
	waits    []string
	retained map[int]uint64
}

func newResizeSim(t *testing.T, size, leader int) *resizeSim {
	o := settledSM(leader)
	o.Size, o.Bootstrap, o.Replicas = int32(size), int32(size), int32(size)
	o.Sts.Spec.Replicas = ptr.To(int32(size))
	l := o.Cluster.Controller
	l.Members = nil
	o.ClaimUIDs = map[int]types.UID{}
	o.CtrlerPods = map[int]*shardkvpb.MemberStatus{}
	for i := range size {
		o.Pods[i] = &podView{Ordinal: i, Name: podNameAt(o, i), Exists: true, Ready: true, Revision: "r1"}
		l.Members = append(l.Members, &shardkvpb.Member{Id: uint64(i + 1), Addr: podGRPCAddr("demo-ctrler", i, "ns"), Match: 100, HeardMsAgo: ptr.To[uint64](50)})
		o.ClaimUIDs[i] = types.UID(pvcName("demo-ctrler", i))
		o.CtrlerPods[i] = &shardkvpb.MemberStatus{Id: uint64(i + 1), Role: "follower"}
	}
	l.Id, l.Leader, l.Addr = uint64(leader+1), uint64(leader+1), podGRPCAddr("demo-ctrler", leader, "ns")
	return &resizeSim{t: t, o: o}
}

// run plans and applies steps until the plan has neither a step nor a
// wait, and returns the steps taken.
func (s *resizeSim) run() []string {
	o, l := s.o, s.o.Cluster.Controller
	for range 50 {
		// What happened since the last pass: learners caught up, pods
		// beyond the set terminated.
		for _, m := range l.Members {
			if m.Learner && m.Match == 0 {
				m.Match, m.HeardMsAgo = 100, ptr.To[uint64](50)
			}
		}
		pl := planShardMap(o)
		if pl.Wait.Reason != "" {
			s.waits = append(s.waits, pl.Wait.Message)
		}
		st := pl.Step
		if st.Kind == smStepNone {
			if pl.Wait.Reason == "" {
				return s.steps
			}
			for ord := range o.Pods {
				if ord >= int(o.Size) {
					delete(o.Pods, ord)
					delete(o.CtrlerPods, ord)
				}
			}
			continue
		}
		s.steps = append(s.steps, st.String())
		switch st.Kind {
		case smStepScaleStatefulSet:
			for i := int(o.Size); i < int(st.Replicas); i++ {
				o.Pods[i] = &podView{Ordinal: i, Name: podNameAt(o, i), Exists: true, Revision: "r1"}
				o.CtrlerPods[i] = &shardkvpb.MemberStatus{Id: uint64(100 + i), Role: "joining"}
				if id, ok := s.retained[i]; ok {
					o.CtrlerPods[i] = &shardkvpb.MemberStatus{Id: id, Role: "removed"}
				}
				o.ClaimUIDs[i] = types.UID(pvcName("demo-ctrler", i))
			}
			o.Size = st.Replicas
			o.Sts.Spec.Replicas = ptr.To(st.Replicas)
		case smStepCtrlerAddLearner:
			l.Members = append(l.Members, &shardkvpb.Member{Id: st.Member, Addr: podGRPCAddr("demo-ctrler", st.Ordinal, "ns"), Learner: true})
			o.CtrlerPods[st.Ordinal].Role = "learner"
		case smStepCtrlerPromote:
			for _, m := range l.Members {
				if m.Id == st.Member {
					m.Learner = false
				}
			}
		case smStepCtrlerRemoveMember:
			l.Members = slices.DeleteFunc(l.Members, func(m *shardkvpb.Member) bool { return m.Id == st.Member })
		case smStepCtrlerTransferLeader:
			l.Id, l.Leader, l.Addr = st.Member, st.Member, podGRPCAddr("demo-ctrler", st.Ordinal, "ns")
		case smStepDeleteClaim:
			delete(o.ClaimUIDs, st.Ordinal)
		case smStepCtrlerRecreate:
			delete(s.retained, st.Ordinal)
			o.CtrlerPods[st.Ordinal] = &shardkvpb.MemberStatus{Id: uint64(200 + st.Ordinal), Role: "joining"}
			o.ClaimUIDs[st.Ordinal] = types.UID("new-" + pvcName("demo-ctrler", st.Ordinal))
		default:
			s.t.Fatalf("after %v: unexpected step %v", s.steps, st)
		}
		if st.Reason != ReasonResizingController && st.Kind != smStepCtrlerPromote {
			s.t.Errorf("step %v has reason %q", st, st.Reason)
		}
	}
	s.t.Fatalf("no end after %v", s.steps)
	return nil
}

// TestPlanResizeGrow: 3 to 5: the set grows at once, then each new
// replica is added as a learner and promoted, one at a time.
func TestPlanResizeGrow(t *testing.T) {
	s := newResizeSim(t, 3, 1)
	s.o.Replicas = 5
	got := s.run()
	want := []string{"ScaleStatefulSet(5)", "AddLearner(103)", "Promote(103)", "AddLearner(104)", "Promote(104)"}
	if !slices.Equal(got, want) {
		t.Fatalf("steps %v, want %v", got, want)
	}
	if n := len(ctrlerVoters(s.o.Cluster.Controller)); n != 5 {
		t.Fatalf("%d voters, want 5", n)
	}
	// Back to 3, with the leadership on a pod that goes (pod 4): it moves
	// to the most caught-up member that stays, then the highest ordinals'
	// members leave, the set shrinks, and their volumes go.
	l := s.o.Cluster.Controller
	l.Id, l.Leader, l.Addr = 104, 104, podGRPCAddr("demo-ctrler", 4, "ns")
	l.Members[2].Match = 101
	s.steps, s.o.Replicas = nil, 3
	got = s.run()
	want = []string{"TransferLeader(3)", "RemoveMember(104)", "RemoveMember(103)", "ScaleStatefulSet(3)", "DeleteClaim(3)", "DeleteClaim(4)"}
	if !slices.Equal(got, want) {
		t.Fatalf("steps %v, want %v", got, want)
	}
	if !slices.ContainsFunc(s.waits, func(w string) bool {
		return strings.Contains(w, "waiting for pod demo-ctrler-3, no longer a member, to terminate")
	}) {
		t.Errorf("no wait for the removed pods to go: %q", s.waits)
	}
	if n := len(ctrlerVoters(l)); n != 3 || len(s.o.ClaimUIDs) != 3 {
		t.Fatalf("%d voters and claims %v, want 3 of each", n, s.o.ClaimUIDs)
	}
}

// TestPlanResizeRegrowOnRetainedClaims: a grow whose new pods come back
// on the claims of replicas a shrink removed (a cache that did not yet
// list the claims when the shrink ended, or a StatefulSet scaled by hand)
// recreates each such replica with an empty volume, then adds it.
func TestPlanResizeRegrowOnRetainedClaims(t *testing.T) {
	s := newResizeSim(t, 5, 0)
	l := s.o.Cluster.Controller
	l.Members = l.Members[:3]
	s.o.Size, s.o.Sts.Spec.Replicas = 3, ptr.To[int32](3)
	s.retained = map[int]uint64{}
	for ord := 3; ord < 5; ord++ {
		s.retained[ord] = uint64(ord + 1)
		delete(s.o.Pods, ord)
		delete(s.o.CtrlerPods, ord)
		delete(s.o.ClaimUIDs, ord)
	}
	got := s.run()
	want := []string{"ScaleStatefulSet(5)", "RecreateReplica(3)", "AddLearner(203)", "Promote(203)", "RecreateReplica(4)", "AddLearner(204)", "Promote(204)"}
	if !slices.Equal(got, want) {
		t.Fatalf("steps %v, want %v", got, want)
	}
	if len(s.retained) != 0 || len(ctrlerVoters(l)) != 5 {
		t.Fatalf("retained %v, voters %v", s.retained, ctrlerVoters(l))
	}
}

// TestPlanResizeWaits: a grow waits for every member to be caught up; a
// shrink never removes a member when the rest would lack a healthy
// majority, nor moves the leadership to a member that is not caught up.
func TestPlanResizeWaits(t *testing.T) {
	s := newResizeSim(t, 3, 0)
	s.o.Replicas = 5
	s.o.Cluster.Controller.Members[1].HeardMsAgo = ptr.To[uint64](60000)
	expectPlan(t, planShardMap(s.o), "None", ReasonResizingController,
		"controller group of 3 voters, 5 wanted: waiting for pod demo-ctrler-1 to be a caught-up voter before growing", "")

	// 3 to 1 with pod 1 silent: removing pod 2's member would leave the
	// leader and a silent voter.
	s = newResizeSim(t, 3, 0)
	s.o.Replicas = 1
	s.o.Cluster.Controller.Members[1].HeardMsAgo = ptr.To[uint64](60000)
	expectPlan(t, planShardMap(s.o), "None", ReasonResizingController,
		"removing replica 3 (demo-ctrler-2) would leave 1 healthy of 2 voters, below a majority", "")

	// 3 to 1 with the leader on pod 2 and pod 0, the one that stays,
	// behind: no one to hand the leadership to.
	s = newResizeSim(t, 3, 2)
	s.o.Replicas = 1
	s.o.Cluster.Controller.Members[0].Match = 0
	expectPlan(t, planShardMap(s.o), "None", ReasonResizingController,
		"replica 3 (demo-ctrler-2) leads and no member that stays is caught up to take over", "")

	// A new pod that does not ask to join is waited for, named.
	s = newResizeSim(t, 3, 0)
	s.o.Replicas = 5
	s.o.Size = 5
	s.o.Sts.Spec.Replicas = ptr.To[int32](5)
	s.o.CtrlerPods[3] = &shardkvpb.MemberStatus{Id: 7, Role: "follower"}
	expectPlan(t, planShardMap(s.o), "None", ReasonResizingController,
		`pod demo-ctrler-3 runs replica 7 as "follower", not a member: waiting for it to ask to join`, "")
	// One that runs a removed replica is recreated only once its pod is
	// observed, and not while it goes.
	s.o.CtrlerPods[3].Role = "removed"
	expectPlan(t, planShardMap(s.o), "None", ReasonResizingController,
		`pod demo-ctrler-3 runs replica 7 as "removed", not a member: waiting for it to ask to join`, "")
	s.o.Pods[3] = &podView{Ordinal: 3, Name: "demo-ctrler-3", Exists: true, Deleting: true}
	expectPlan(t, planShardMap(s.o), "None", ReasonResizingController,
		`pod demo-ctrler-3 runs replica 7 as "removed", not a member: waiting for it to ask to join`, "")
	s.o.Pods[3].Deleting = false
	pl := planShardMap(s.o)
	expectPlan(t, pl, "RecreateReplica(3)", "", "", "")
	if want := "pod demo-ctrler-3 runs replica 7, which was removed from the group: recreating it with an empty volume"; pl.Step.Object != want || pl.Step.Reason != ReasonResizingController {
		t.Errorf("step %s %q, want %s %q", pl.Step.Reason, pl.Step.Object, ReasonResizingController, want)
	}
	delete(s.o.CtrlerPods, 3)
	expectPlan(t, planShardMap(s.o), "None", ReasonResizingController, "waiting for pod demo-ctrler-3 to start and answer", "")

	// Without the leader's view nothing moves.
	s = newResizeSim(t, 3, 0)
	s.o.Replicas = 5
	s.o.unreachable("connection refused")
	expectPlan(t, planShardMap(s.o), "None", ReasonResizingController, "waiting for the controller to answer: connection refused", "")
}
