package controllers

import (
	"testing"

	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// A controller pod that runs a fresh id (a late first start, or a lost
// disk) replaces the id the group lists at its address: AddLearner, a wait
// while it catches up, Promote, RemoveMember of the old id; then nothing.
func TestPlanCtrlerMembers(t *testing.T) {
	addr := func(ord int) string { return podGRPCAddr(CtrlerName("demo"), ord, "ns") }
	const fresh = 846399503690589
	obs := func(members []*shardkvpb.Member, pod0 uint64) *smObserved {
		return &smObserved{
			Name: "demo", Namespace: "ns", Bootstrap: 3, Replicas: 3, Size: 3,
			Cluster: &shardkvpb.ClusterStatus{Controller: &shardkvpb.MemberStatus{
				Id: 2, Leader: 2, Addr: addr(1), Commit: 5000, Members: members}},
			CtrlerPods: map[int]*shardkvpb.MemberStatus{0: {Id: pod0}, 1: {Id: 2}, 2: {Id: 3}},
		}
	}
	voters := []*shardkvpb.Member{{Id: 1, Addr: addr(0)}, {Id: 2, Addr: addr(1), Match: 5000}, {Id: 3, Addr: addr(2), Match: 5000}}
	for _, tc := range []struct {
		name    string
		members []*shardkvpb.Member
		pod0    uint64
		want    smStepKind
		id      uint64
		wait    bool
	}{
		{"all in place", voters, 1, smStepNone, 0, false},
		{"fresh id not a member", voters, fresh, smStepCtrlerAddLearner, fresh, false},
		{"learner catching up", append(voters[:3:3], &shardkvpb.Member{Id: fresh, Addr: addr(0), Learner: true, Match: 10}), fresh, smStepNone, 0, true},
		{"learner caught up", append(voters[:3:3], &shardkvpb.Member{Id: fresh, Addr: addr(0), Learner: true, Match: 4990}), fresh, smStepCtrlerPromote, fresh, false},
		{"new voter, old still listed", append(voters[:3:3], &shardkvpb.Member{Id: fresh, Addr: addr(0), Match: 5000}), fresh, smStepCtrlerRemoveMember, 1, false},
		{"replaced", []*shardkvpb.Member{{Id: fresh, Addr: addr(0), Match: 5000}, voters[1], voters[2]}, fresh, smStepNone, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var pl smPlan
			st, ok := planCtrlerMembers(obs(tc.members, tc.pod0), &pl)
			if st.Kind != tc.want || ok != (tc.want != smStepNone) || st.Member != tc.id {
				t.Fatalf("step %v (ok %v), want %s(%d)", st, ok, tc.want, tc.id)
			}
			if (pl.Wait.Reason == ReasonReplacingCtrlerReplica) != tc.wait {
				t.Fatalf("wait %+v, want a wait: %v", pl.Wait, tc.wait)
			}
		})
	}
}

// The controller pods are asked which replica they run only when the
// leader's membership leaves it open.
func TestCtrlerMembersSettled(t *testing.T) {
	addr := func(ord int) string { return podGRPCAddr(CtrlerName("demo"), ord, "ns") }
	ms := func(v uint64) *uint64 { return &v }
	obs := func(self, leader uint64, members ...*shardkvpb.Member) *smObserved {
		return &smObserved{Name: "demo", Namespace: "ns", Bootstrap: 3, Size: 3,
			Cluster: &shardkvpb.ClusterStatus{Controller: &shardkvpb.MemberStatus{Id: self, Leader: leader, Members: members}}}
	}
	lead := &shardkvpb.Member{Id: 2, Addr: addr(1)}
	heard0 := &shardkvpb.Member{Id: 1, Addr: addr(0), HeardMsAgo: ms(100)}
	heard2 := &shardkvpb.Member{Id: 3, Addr: addr(2), HeardMsAgo: ms(100)}
	for _, tc := range []struct {
		name string
		o    *smObserved
		want bool
	}{
		{"every member heard", obs(2, 2, heard0, lead, heard2), true},
		{"not the leader's status", obs(1, 2, lead), true},
		{"no leader", obs(1, 0, lead), true},
		{"a member silent", obs(2, 2, &shardkvpb.Member{Id: 1, Addr: addr(0), HeardMsAgo: ms(5000)}, lead, heard2), false},
		{"a member never heard", obs(2, 2, &shardkvpb.Member{Id: 1, Addr: addr(0)}, lead, heard2), false},
		{"no member at a pod", obs(2, 2, lead, heard2), false},
		{"a learner at a pod", obs(2, 2, heard0, &shardkvpb.Member{Id: 9, Addr: addr(0), Learner: true, HeardMsAgo: ms(1)}, lead, heard2), false},
	} {
		if got := ctrlerMembersSettled(tc.o); got != tc.want {
			t.Errorf("%s: settled %v, want %v", tc.name, got, tc.want)
		}
	}
}
