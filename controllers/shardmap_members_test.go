package controllers

import (
	"testing"

	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// A controller pod that runs a fresh id (a late first start, or a lost
// disk) replaces the id the group lists at its address: AddLearner, a wait
// while it catches up, Promote, RemoveMember of the old id; then nothing.
func TestPlanCtrlerMembers(t *testing.T) {
	addr := func(ord int) string { return ctrlerMemberAddr("demo", "ns", ord) }
	const fresh = 846399503690589
	obs := func(members []*shardkvpb.Member, pod0 uint64) *smObserved {
		return &smObserved{
			Name: "demo", Namespace: "ns", Bootstrap: 3, Replicas: 3,
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
