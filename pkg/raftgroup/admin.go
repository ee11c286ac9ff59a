package raftgroup

import (
	"context"

	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// RegisterGRPC registers the replica's Raft transport and Admin services on
// s. The process serves both, and its own client APIs, on one listener;
// create s with ServerOptions().
func (r *Replica) RegisterGRPC(s *grpc.Server) {
	shardkvpb.RegisterRaftServer(s, &raftServer{r: r})
	shardkvpb.RegisterAdminServer(s, &adminServer{r: r})
}

type adminServer struct {
	shardkvpb.UnimplementedAdminServer
	r *Replica
}

// StatusProto converts Status to its wire form.
func (r *Replica) StatusProto() *shardkvpb.MemberStatus {
	st := r.Status()
	m := r.Metrics()
	out := &shardkvpb.MemberStatus{
		GroupId: st.GroupID, Id: st.ID, Addr: st.Addr, Role: st.Role, Leader: st.Leader, LeaderAddr: st.LeaderAddr,
		Term: st.Term, Commit: st.Commit, Applied: st.Applied, SnapshotIndex: st.SnapshotIndex,
		FirstIndex: st.FirstIndex, LastIndex: st.LastIndex,
		Counters: &shardkvpb.Counters{
			Proposals: m.Proposals.Load(), ProposalsFailed: m.ProposalsFailed.Load(), Fsyncs: m.Fsyncs.Load(),
			ReadIndexRounds: m.ReadIndexRounds.Load(), ReadIndexReads: m.ReadIndexReads.Load(),
			SnapshotsSent: m.SnapshotsSent.Load(), SnapshotsReceived: m.SnapshotsReceived.Load(),
			MessagesDropped: m.MessagesDropped.Load(), AppliedEntries: m.AppliedEntries.Load(),
		},
	}
	out.Members = membersProto(st.Members)
	if r.cfg.AnnotateStatus != nil {
		r.cfg.AnnotateStatus(out)
	}
	return out
}

func membersProto(ms []Member) []*shardkvpb.Member {
	var out []*shardkvpb.Member
	for _, m := range ms {
		pm := &shardkvpb.Member{Id: m.ID, Addr: m.Addr, Learner: m.Learner, Match: m.Match}
		if m.HeardAgo >= 0 {
			pm.HeardMsAgo = proto.Uint64(uint64(m.HeardAgo.Milliseconds()))
		}
		out = append(out, pm)
	}
	return out
}

func (a *adminServer) Status(context.Context, *shardkvpb.StatusRequest) (*shardkvpb.MemberStatus, error) {
	return a.r.StatusProto(), nil
}

func (a *adminServer) membership(err error) (*shardkvpb.MembershipResponse, error) {
	if err != nil {
		return nil, GRPCError(err)
	}
	return &shardkvpb.MembershipResponse{Members: membersProto(a.r.Status().Members)}, nil
}

func (a *adminServer) AddLearner(ctx context.Context, req *shardkvpb.AddLearnerRequest) (*shardkvpb.MembershipResponse, error) {
	return a.membership(a.r.AddLearner(ctx, req.Id, req.Addr))
}

func (a *adminServer) Promote(ctx context.Context, req *shardkvpb.PromoteRequest) (*shardkvpb.MembershipResponse, error) {
	return a.membership(a.r.Promote(ctx, req.Id))
}

func (a *adminServer) RemoveMember(ctx context.Context, req *shardkvpb.RemoveMemberRequest) (*shardkvpb.MembershipResponse, error) {
	return a.membership(a.r.RemoveMember(ctx, req.Id))
}

func (a *adminServer) TransferLeader(ctx context.Context, req *shardkvpb.TransferLeaderRequest) (*shardkvpb.TransferLeaderResponse, error) {
	if err := a.r.TransferLeadership(ctx, req.To); err != nil {
		return nil, GRPCError(err)
	}
	return &shardkvpb.TransferLeaderResponse{Leader: req.To}, nil
}
