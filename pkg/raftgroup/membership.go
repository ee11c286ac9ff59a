package raftgroup

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// AddLearner adds a non-voting member. It receives the log (or a snapshot)
// but does not count toward quorum until promoted, so a new, empty replica
// never weakens the group while it catches up.
func (r *Replica) AddLearner(ctx context.Context, id uint64, addr string) error {
	if id == 0 || addr == "" {
		return notExecuted("add learner: need a replica id >= 1 and an address")
	}
	return r.changeMembership(ctx, pb.ConfChangeAddLearnerNode, id, addr, func(cs *pb.ConfState) error {
		if slices.Contains(cs.GetVoters(), id) || slices.Contains(cs.GetLearners(), id) {
			return fmt.Errorf("replica %d is already a member", id)
		}
		return nil
	})
}

// Promote turns a learner into a voter.
func (r *Replica) Promote(ctx context.Context, id uint64) error {
	return r.changeMembership(ctx, pb.ConfChangeAddNode, id, r.memberAddr(id), func(cs *pb.ConfState) error {
		if slices.Contains(cs.GetVoters(), id) {
			return fmt.Errorf("replica %d is already a voter", id)
		}
		if !slices.Contains(cs.GetLearners(), id) {
			return fmt.Errorf("replica %d is not a learner; add it as a learner first", id)
		}
		return nil
	})
}

// RemoveMember removes a voter or learner. Removing the leader is refused:
// transfer leadership first. Removing a voter that would leave the group
// without a voter is refused too.
func (r *Replica) RemoveMember(ctx context.Context, id uint64) error {
	return r.changeMembership(ctx, pb.ConfChangeRemoveNode, id, "", func(cs *pb.ConfState) error {
		isVoter := slices.Contains(cs.GetVoters(), id)
		if !isVoter && !slices.Contains(cs.GetLearners(), id) {
			return fmt.Errorf("replica %d is not a member", id)
		}
		if id == r.cfg.ID {
			return fmt.Errorf("replica %d is the leader: transfer leadership before removing it", id)
		}
		if isVoter && len(cs.GetVoters()) == 1 {
			return fmt.Errorf("replica %d is the last voter", id)
		}
		return nil
	})
}

func (r *Replica) changeMembership(ctx context.Context, typ pb.ConfChangeType, id uint64, addr string, check func(*pb.ConfState) error) error {
	r.confMu.Lock()
	defer r.confMu.Unlock()
	if !r.IsLeader() {
		return r.notLeader()
	}
	// Raft accepts one membership change at a time and silently turns a
	// second one into a no-op: wait until everything in our log is applied,
	// which includes any change a previous leader left pending.
	last, _ := r.store.LastIndex()
	if err := r.WaitApplied(ctx, last); err != nil {
		return notExecuted("waiting for pending entries to apply: %v", err)
	}
	// raft's own applied index moves only when the Ready loop calls Advance,
	// just after we see the entries applied; raft checks that one.
	for r.node.Status().Applied < last {
		select {
		case <-ctx.Done():
			return notExecuted("waiting for raft to acknowledge applied entries: %v", ctx.Err())
		case <-r.donec:
			return notExecuted("%v", ErrStopped)
		case <-time.After(time.Millisecond):
		}
	}
	r.membersMu.RLock()
	cs := proto.Clone(r.conf).(*pb.ConfState)
	r.membersMu.RUnlock()
	if len(cs.GetVotersOutgoing()) > 0 {
		return notExecuted("a joint membership change is still in progress")
	}
	if err := check(cs); err != nil {
		return fmt.Errorf("%w: %w", shardkvpb.ErrNotExecuted, err)
	}
	pid, w := r.props.register()
	cc := &pb.ConfChangeV2{
		Changes: []*pb.ConfChangeSingle{{Type: typ.Enum(), NodeId: proto.Uint64(id)}},
		Context: encodeHeader(header{id: pid, time: r.stampNow()}, []byte(addr)),
	}
	if err := r.node.ProposeConfChange(ctx, cc); err != nil {
		r.props.cancel(pid)
		if errors.Is(err, raft.ErrProposalDropped) {
			return r.notLeader()
		}
		return outcomeUnknown("propose membership change: %v", err)
	}
	_, err := r.waitResult(ctx, pid, w)
	if err == nil {
		r.log.Info("membership changed", "change", typ.String(), "replica", id, "addr", addr)
	}
	return err
}

// TransferLeadership hands leadership to another voter and waits until it
// leads. Call it on the leader; the target should be caught up.
func (r *Replica) TransferLeadership(ctx context.Context, to uint64) error {
	if !r.IsLeader() {
		return r.notLeader()
	}
	r.membersMu.RLock()
	isVoter := slices.Contains(r.conf.GetVoters(), to)
	r.membersMu.RUnlock()
	if !isVoter {
		return notExecuted("replica %d is not a voter", to)
	}
	if to == r.cfg.ID {
		return nil
	}
	r.node.TransferLeadership(ctx, r.cfg.ID, to)
	tick := time.NewTicker(r.cfg.TickInterval / 2)
	defer tick.Stop()
	// raft abandons a transfer after an election timeout (for example when
	// the target was briefly behind); ask again while we still lead.
	retry := time.Duration(r.cfg.ElectionTicks+1) * r.cfg.TickInterval
	issued := time.Now()
	for {
		if r.leader.Load() == to {
			return nil
		}
		if r.IsLeader() && time.Since(issued) > retry {
			r.node.TransferLeadership(ctx, r.cfg.ID, to)
			issued = time.Now()
		}
		select {
		case <-ctx.Done():
			return outcomeUnknown("leadership transfer to %d: %v (leader now %d)", to, ctx.Err(), r.leader.Load())
		case <-tick.C:
		case <-r.donec:
			return ErrStopped
		}
	}
}

// Member describes one member of the group.
type Member struct {
	ID      uint64
	Addr    string
	Learner bool
	Match   uint64 // leader only: replicated index
	// HeardAgo (leader only, else -1): since the last Raft message from the
	// member reached this replica (since it started, if none did).
	HeardAgo time.Duration
}

// Status is a snapshot of this replica's view of the group.
type Status struct {
	GroupID, ID, Leader                  uint64
	Addr, LeaderAddr, Role               string
	Term, Commit, Applied, SnapshotIndex uint64
	FirstIndex, LastIndex                uint64
	Members                              []Member
	// LeaderCommit is the highest commit index a leader has sent this
	// replica (its own commit on the leader): how far it is behind the
	// group, which its own Commit does not show while it lags.
	LeaderCommit uint64
	// HeardLeaderAgo is the time since the last Raft message from the
	// leader it knows (0 on the leader, -1 if it knows none).
	HeardLeaderAgo time.Duration
}

// Status reports this replica's role, indexes and the members it knows.
func (r *Replica) Status() Status {
	st := Status{GroupID: r.cfg.GroupID, ID: r.cfg.ID, Addr: r.cfg.Addr, Term: r.term.Load(),
		Commit: r.commit.Load(), Applied: r.applied.Load(), SnapshotIndex: r.store.snapshotIndex()}
	st.Leader, st.LeaderAddr = r.Leader()
	st.LeaderCommit, st.HeardLeaderAgo = max(r.leaderCommit.Load(), st.Commit), -1
	switch st.Leader {
	case 0:
	case r.cfg.ID:
		st.HeardLeaderAgo = 0
	default:
		st.HeardLeaderAgo = r.heard.ago(st.Leader)
	}
	st.FirstIndex, _ = r.store.FirstIndex()
	st.LastIndex, _ = r.store.LastIndex()
	var progress map[uint64]uint64
	leader := r.IsLeader() && !r.isClosed()
	if leader {
		progress = map[uint64]uint64{}
		for id, pr := range r.node.Status().Progress {
			progress[id] = pr.Match
		}
	}
	heard := func(id uint64) time.Duration {
		switch {
		case !leader:
			return -1
		case id == r.cfg.ID:
			return 0
		}
		return r.heard.ago(id)
	}
	r.membersMu.RLock()
	cs := r.conf
	for _, id := range cs.GetVoters() {
		st.Members = append(st.Members, Member{ID: id, Addr: r.members[id], Match: progress[id], HeardAgo: heard(id)})
	}
	for _, id := range cs.GetLearners() {
		st.Members = append(st.Members, Member{ID: id, Addr: r.members[id], Learner: true, Match: progress[id], HeardAgo: heard(id)})
	}
	isLearner := slices.Contains(cs.GetLearners(), r.cfg.ID)
	isMember := isLearner || slices.Contains(cs.GetVoters(), r.cfg.ID)
	r.membersMu.RUnlock()
	slices.SortFunc(st.Members, func(a, b Member) int { return int(a.ID) - int(b.ID) })
	switch {
	case r.removed.Load():
		st.Role = "removed"
	case !isMember:
		st.Role = "joining"
	case isLearner:
		st.Role = "learner"
	default:
		switch raft.StateType(r.stateType.Load()) {
		case raft.StateLeader:
			st.Role = "leader"
		case raft.StateCandidate, raft.StatePreCandidate:
			st.Role = "candidate"
		default:
			st.Role = "follower"
		}
	}
	return st
}

// Metrics returns the replica's cumulative counters.
func (r *Replica) Metrics() *Counters { return &r.metrics }
