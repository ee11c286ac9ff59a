package controllers

// Resizing the controller group (spec.controller.replicas), one safe step
// per pass, as a data group scales (replicagroup_plan.go):
//
//   - grow: with every member caught up, the StatefulSet grows to the new
//     size at once. Its new pods are not in --peers (the bootstrap size,
//     fixed), so each starts empty with a fresh id and asks to join; each
//     is added as a learner, then promoted once caught up
//     (planCtrlerMembers), one at a time.
//   - shrink: the members of the highest ordinals leave first, one per
//     pass, each only while the rest keep a healthy majority; a leader
//     among them hands leadership to a caught-up member that stays first.
//     Then the StatefulSet shrinks, and once their pods are gone the
//     removed replicas' volumes are deleted: a removed replica can never
//     serve again, and a later grow must start those pods empty.
//
// Data pods keep their --ctrler list (the bootstrap size's addresses):
// replicas beyond it are reached through leader hints, so a resize rolls
// no data pod.

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// ReasonResizingController (Progressing): spec.controller.replicas is
// being applied; the message says which step, or what it waits for.
const ReasonResizingController = "ResizingController"

// ctrlerLeaderView is the controller leader's own status, with the
// group's membership (nil: the status is not the leader's, or lists no
// members).
func ctrlerLeaderView(o *smObserved) *shardkvpb.MemberStatus {
	l := o.Cluster.GetController()
	if l.GetLeader() == 0 || l.GetId() != l.GetLeader() || len(l.GetMembers()) == 0 {
		return nil
	}
	return l
}

func ctrlerVoters(leader *shardkvpb.MemberStatus) []*shardkvpb.Member {
	var out []*shardkvpb.Member
	for _, m := range leader.GetMembers() {
		if !m.GetLearner() {
			out = append(out, m)
		}
	}
	return out
}

// ctrlerMembersAt are the members the leader lists at pod ord's address.
func ctrlerMembersAt(o *smObserved, leader *shardkvpb.MemberStatus, ord int) []*shardkvpb.Member {
	addr := podGRPCAddr(CtrlerName(o.Name), ord, o.Namespace)
	var out []*shardkvpb.Member
	for _, m := range leader.GetMembers() {
		if m.GetAddr() == addr {
			out = append(out, m)
		}
	}
	return out
}

// ctrlerAddrOrdinal is the ordinal of the controller pod at addr (its
// DNS name; -1: none).
func ctrlerAddrOrdinal(o *smObserved, addr string) int {
	host, _, ok := strings.Cut(addr, ".")
	if !ok {
		return -1
	}
	return podOrdinal(CtrlerName(o.Name), host)
}

// ctrlerHeard: the leader heard from member m within maxSilence.
func ctrlerHeard(m *shardkvpb.Member) bool {
	return m.HeardMsAgo != nil && time.Duration(m.GetHeardMsAgo())*time.Millisecond <= maxSilence
}

// ctrlerHealthy: the member leads, or the leader heard from it lately and
// its log is within maxCatchUpLag of the leader's commit.
func ctrlerHealthy(leader *shardkvpb.MemberStatus, m *shardkvpb.Member) bool {
	if m.GetId() == leader.GetLeader() {
		return true
	}
	return ctrlerHeard(m) && m.GetMatch() > 0 && m.GetMatch()+maxCatchUpLag >= leader.GetCommit()
}

// ctrlerHealthyVoters counts the healthy voters other than except.
func ctrlerHealthyVoters(leader *shardkvpb.MemberStatus, except uint64) int {
	n := 0
	for _, m := range ctrlerVoters(leader) {
		if m.GetId() != except && ctrlerHealthy(leader, m) {
			n++
		}
	}
	return n
}

// ctrlerTransferTarget is the healthy voter, other than the leader, at a
// pod below limit to hand the leadership to: preferably one whose pod is
// at revision (if set), then the most caught up. nil: none.
func ctrlerTransferTarget(o *smObserved, leader *shardkvpb.MemberStatus, limit int, revision string) (*shardkvpb.Member, int) {
	type cand struct {
		m   *shardkvpb.Member
		ord int
		new bool
	}
	var cs []cand
	for _, m := range ctrlerVoters(leader) {
		ord := ctrlerAddrOrdinal(o, m.GetAddr())
		if m.GetId() == leader.GetLeader() || ord < 0 || ord >= limit || !ctrlerHealthy(leader, m) {
			continue
		}
		p := o.Pods[ord]
		if !p.present() {
			continue
		}
		cs = append(cs, cand{m, ord, revision != "" && p.Revision == revision})
	}
	if len(cs) == 0 {
		return nil, -1
	}
	best := slices.MinFunc(cs, func(a, b cand) int {
		if a.new != b.new {
			if a.new {
				return -1
			}
			return 1
		}
		return cmp.Or(cmp.Compare(b.m.GetMatch(), a.m.GetMatch()), cmp.Compare(a.ord, b.ord))
	})
	return best.m, best.ord
}

// podNameAt is controller pod ord's name.
func podNameAt(o *smObserved, ord int) string {
	return fmt.Sprintf("%s-%d", CtrlerName(o.Name), ord)
}

// planResize is the next step of applying spec.controller.replicas
// (Replicas) to the group of Size pods, or what it waits for.
func planResize(o *smObserved, pl *smPlan) (smStep, bool) {
	if o.Sts == nil {
		return smStep{}, false
	}
	S, R := int(o.Size), int(o.Replicas)
	leader := ctrlerLeaderView(o)
	from := S
	if leader != nil {
		from = len(ctrlerVoters(leader))
	}
	wait := func(format string, args ...any) (smStep, bool) {
		pl.wait(ReasonResizingController, "controller group of %d voters, %d wanted: "+format, append([]any{from, R}, args...)...)
		return smStep{}, false
	}
	if leader == nil {
		if S != R {
			if o.Cluster == nil {
				return wait("waiting for the controller to answer: %v", o.ClusterErr)
			}
			return wait("waiting for the controller's leader")
		}
		return smStep{}, false
	}
	step := func(kind smStepKind, ord int, member uint64, format string, args ...any) (smStep, bool) {
		return smStep{Kind: kind, Ordinal: ord, Member: member, Reason: ReasonResizingController,
			Object: fmt.Sprintf(format, args...)}, true
	}

	// Shrink: the members at ordinals R and up leave, the highest first.
	if R < S {
		for ord := S - 1; ord >= R; ord-- {
			ms := ctrlerMembersAt(o, leader, ord)
			if len(ms) == 0 {
				continue
			}
			m := ms[0]
			if m.GetId() == leader.GetLeader() {
				t, tord := ctrlerTransferTarget(o, leader, R, "")
				if t == nil {
					return wait("replica %d (%s) leads and no member that stays is caught up to take over", m.GetId(), podNameAt(o, ord))
				}
				return step(smStepCtrlerTransferLeader, tord, t.GetId(),
					"resize to %d: moving the controller's leadership from %s to %s (replica %d) before removing it",
					R, podNameAt(o, ord), podNameAt(o, tord), t.GetId())
			}
			if !m.GetLearner() {
				if h, need := ctrlerHealthyVoters(leader, m.GetId()), majority(len(ctrlerVoters(leader))-1); h < need {
					return wait("removing replica %d (%s) would leave %d healthy of %d voters, below a majority",
						m.GetId(), podNameAt(o, ord), h, len(ctrlerVoters(leader))-1)
				}
			}
			return step(smStepCtrlerRemoveMember, ord, m.GetId(), "resize to %d: removing controller replica %d (%s)", R, m.GetId(), podNameAt(o, ord))
		}
		return smStep{Kind: smStepScaleStatefulSet, Replicas: int32(R), Reason: ReasonResizingController,
			Object: fmt.Sprintf("resize: shrinking the controller StatefulSet from %d to %d pods (their replicas were removed)", S, R)}, true
	}

	// Pods beyond the set go; then their volumes (the executor checks the
	// size against the API server first: the cache may lag a grow).
	for _, ord := range slices.Sorted(maps.Keys(o.Pods)) {
		if p := o.Pods[ord]; ord >= S && p.Exists {
			return wait("waiting for pod %s, no longer a member, to terminate", p.Name)
		}
	}
	for _, ord := range slices.Sorted(maps.Keys(o.ClaimUIDs)) {
		if ord >= S {
			return smStep{Kind: smStepDeleteClaim, Ordinal: ord, Reason: ReasonResizingController,
				Object: fmt.Sprintf("deleting the volume %s of removed controller replica %s", pvcName(CtrlerName(o.Name), ord), podNameAt(o, ord))}, true
		}
	}

	// Grow: once every member is caught up, the new pods start at once.
	if R > S {
		for ord := range S {
			ms := ctrlerMembersAt(o, leader, ord)
			if len(ms) != 1 || ms[0].GetLearner() || !ctrlerHealthy(leader, ms[0]) {
				return wait("waiting for pod %s to be a caught-up voter before growing", podNameAt(o, ord))
			}
		}
		return smStep{Kind: smStepScaleStatefulSet, Replicas: int32(R), Reason: ReasonResizingController,
			Object: fmt.Sprintf("resize: growing the controller StatefulSet from %d to %d pods; each new replica joins as a learner", S, R)}, true
	}

	// Pods of the set with no member at their address (a grow's): add the
	// one that asks to join, once no learner is catching up (its
	// promotion is planCtrlerMembers').
	for _, m := range leader.GetMembers() {
		if m.GetLearner() {
			return wait("waiting for learner %d to catch up and be promoted", m.GetId())
		}
	}
	for ord := range S {
		if len(ctrlerMembersAt(o, leader, ord)) > 0 {
			continue
		}
		st := o.CtrlerPods[ord]
		switch {
		case st == nil || st.GetId() == 0:
			return wait("waiting for pod %s to start and answer", podNameAt(o, ord))
		case st.GetRole() == "joining":
			return step(smStepCtrlerAddLearner, ord, st.GetId(), "resize: adding controller replica %d (%s) as a learner", st.GetId(), podNameAt(o, ord))
		case st.GetRole() == "removed" && o.Pods[ord].present():
			// A shrink removed it and a grow came back before its
			// volume went: ids are never reused, so it needs an empty one.
			return step(smStepCtrlerRecreate, ord, st.GetId(),
				"pod %s runs replica %d, which was removed from the group: recreating it with an empty volume", podNameAt(o, ord), st.GetId())
		default:
			return wait("pod %s runs replica %d as %q, not a member: waiting for it to ask to join", podNameAt(o, ord), st.GetId(), st.GetRole())
		}
	}
	return smStep{}, false
}
