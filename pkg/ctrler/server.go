package ctrler

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardkv/shardkv/pkg/raftgroup"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
)

// ServerConfig sets what the controller is created with. Shards and
// Placement only matter when the cluster is first initialised; afterwards
// the replicated state wins.
type ServerConfig struct {
	Shards    int
	Placement string
	// CompactEvery is how often the leader considers dropping history that
	// no group needs any more. Default 10s.
	CompactEvery time.Duration
	Logger       *slog.Logger
}

// Server serves the Controller gRPC API on one controller replica.
type Server struct {
	shardkvpb.UnimplementedControllerServer
	cfg ServerConfig
	r   *raftgroup.Replica
	sm  *StateMachine
	log *slog.Logger

	mu      sync.Mutex
	reports map[uint64]report // soft state: only meaningful on the leader
	members struct {          // latestMembers' set, for config num
		num uint64
		set map[uint64]bool
	}

	// Cut-over proposals (background goroutine only, but cutting).
	cutting   atomic.Bool // a cut-over proposal is in flight
	lastCut   string      // the last set proposed, and when
	lastCutAt time.Time

	stopc chan struct{}
	wg    sync.WaitGroup
}

type report struct {
	r  *shardkvpb.GroupReport
	at time.Time
}

// NewServer starts the controller's background work (initialisation when
// this replica leads a new cluster, history compaction) and returns the
// service. Call Stop before closing the replica.
func NewServer(cfg ServerConfig, r *raftgroup.Replica, sm *StateMachine) *Server {
	if cfg.CompactEvery == 0 {
		cfg.CompactEvery = 10 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Server{cfg: cfg, r: r, sm: sm, log: cfg.Logger, reports: map[uint64]report{}, stopc: make(chan struct{})}
	s.wg.Add(1)
	go s.background()
	return s
}

// Register adds the Controller service to g.
func (s *Server) Register(g *grpc.Server) { shardkvpb.RegisterControllerServer(g, s) }

// Stop ends background work.
func (s *Server) Stop() {
	close(s.stopc)
	s.wg.Wait()
}

func (s *Server) propose(ctx context.Context, cmd *shardkvpb.ControllerCommand) (*shardkvpb.Config, error) {
	b, err := encodeCommand(cmd)
	if err != nil {
		return nil, err
	}
	v, err := s.r.Propose(ctx, b)
	if err != nil {
		return nil, err
	}
	res, _ := v.(Result)
	if res.Err != nil {
		return res.Config, res.Err
	}
	return res.Config, nil
}

// grpcErr maps controller and engine errors to wire errors.
func grpcErr(err error) error {
	var ie *InputError
	if errors.As(err, &ie) {
		return shardkvpb.Error(codes.InvalidArgument, shardkvpb.ReasonInvalid, ie.Msg, nil)
	}
	if errors.Is(err, ErrNotInitialized) {
		return shardkvpb.Error(codes.Unavailable, shardkvpb.ReasonNotExecuted, err.Error(), nil)
	}
	if errors.Is(err, ErrCompacted) {
		return shardkvpb.Error(codes.OutOfRange, shardkvpb.ReasonInvalid, err.Error(), nil)
	}
	return raftgroup.GRPCError(err)
}

func (s *Server) mutate(ctx context.Context, cmd *shardkvpb.ControllerCommand) (*shardkvpb.ConfigReply, error) {
	// Apply refuses these too; refusing first keeps them out of the log.
	if err := checkRequest(cmd); err != nil {
		return nil, grpcErr(err)
	}
	cmd.PlanMoves = true // this controller announces moves (see nextConfig)
	c, err := s.propose(ctx, cmd)
	if err != nil {
		return nil, grpcErr(err)
	}
	return &shardkvpb.ConfigReply{Config: c}, nil
}

func (s *Server) Join(ctx context.Context, req *shardkvpb.JoinRequest) (*shardkvpb.ConfigReply, error) {
	return s.mutate(ctx, &shardkvpb.ControllerCommand{Op: &shardkvpb.ControllerCommand_Join{Join: req}})
}

func (s *Server) Leave(ctx context.Context, req *shardkvpb.LeaveRequest) (*shardkvpb.ConfigReply, error) {
	return s.mutate(ctx, &shardkvpb.ControllerCommand{Op: &shardkvpb.ControllerCommand_Leave{Leave: req}})
}

func (s *Server) Move(ctx context.Context, req *shardkvpb.MoveRequest) (*shardkvpb.ConfigReply, error) {
	return s.mutate(ctx, &shardkvpb.ControllerCommand{Op: &shardkvpb.ControllerCommand_Move{Move: req}})
}

func (s *Server) Unpin(ctx context.Context, req *shardkvpb.UnpinRequest) (*shardkvpb.ConfigReply, error) {
	return s.mutate(ctx, &shardkvpb.ControllerCommand{Op: &shardkvpb.ControllerCommand_Unpin{Unpin: req}})
}

func (s *Server) Query(ctx context.Context, req *shardkvpb.QueryRequest) (*shardkvpb.Config, error) {
	if err := s.readIndex(ctx, req.GetStale()); err != nil {
		return nil, err
	}
	c, err := s.sm.Config(req.Num)
	if err != nil {
		return nil, grpcErr(err)
	}
	return c, nil
}

// Watch streams configs from req.From on. It starts with a linearizable read,
// so the first configs sent are at least as new as any completed mutation.
func (s *Server) Watch(req *shardkvpb.WatchRequest, stream shardkvpb.Controller_WatchServer) error {
	ctx := stream.Context()
	if err := s.r.ReadIndex(ctx); err != nil {
		return grpcErr(err)
	}
	next := req.From
	for {
		changed := s.sm.Changed()
		oldest, latest := s.sm.Bounds()
		if s.sm.Initialized() {
			if next < oldest {
				next = oldest // the client missed compacted configs; it gets the oldest kept
			}
			for ; next <= latest; next++ {
				c, err := s.sm.Config(int64(next))
				if err != nil {
					return grpcErr(err)
				}
				if err := stream.Send(c); err != nil {
					return err
				}
			}
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil
		case <-s.stopc:
			return shardkvpb.Error(codes.Unavailable, shardkvpb.ReasonNotExecuted, "controller replica shutting down", nil)
		}
	}
}

func (s *Server) leaderOnly() error {
	if !s.r.IsLeader() {
		id, addr := s.r.Leader()
		return shardkvpb.NotLeaderError("group reports and status are kept by the controller leader", id, addr)
	}
	return nil
}

func (s *Server) Report(ctx context.Context, req *shardkvpb.GroupReport) (*shardkvpb.ReportReply, error) {
	if err := s.leaderOnly(); err != nil {
		return nil, err
	}
	if req.Gid == 0 {
		return nil, shardkvpb.Error(codes.InvalidArgument, shardkvpb.ReasonInvalid, "report: gid 0", nil)
	}
	if n := proto.Size(req); n > MaxReportBytes {
		return nil, shardkvpb.Error(codes.InvalidArgument, shardkvpb.ReasonInvalid, fmt.Sprintf("report: %d bytes, over the limit of %d", n, MaxReportBytes), nil)
	}
	s.keepReport(req)
	_, latest := s.sm.Bounds()
	return &shardkvpb.ReportReply{LatestConfig: latest}, nil
}

// keepReport stores req. Reports of gids in the latest config are bounded
// by MaxGroups; of others (groups about to join, or anyone's invention)
// only maxStrayReports are kept, the most recent. A member's report adds
// no stray, so only a stray's report looks at the others: scanning them
// all on every report cost O(groups²) per second of reports (0.6 ms of
// the leader's time per report at 1,000 groups).
func (s *Server) keepReport(req *shardkvpb.GroupReport) {
	members := s.latestMembers()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reports[req.Gid] = report{r: proto.Clone(req).(*shardkvpb.GroupReport), at: time.Now()}
	if members[req.Gid] {
		return
	}
	var stray []uint64
	for gid := range s.reports {
		if !members[gid] {
			stray = append(stray, gid)
		}
	}
	if len(stray) <= maxStrayReports {
		return
	}
	slices.SortFunc(stray, func(a, b uint64) int { return s.reports[a].at.Compare(s.reports[b].at) })
	for _, gid := range stray[:len(stray)-maxStrayReports] {
		delete(s.reports, gid)
	}
}

// latestMembers is the set of gids in the latest config (empty before the
// first), built once per config.
func (s *Server) latestMembers() map[uint64]bool {
	c, err := s.sm.Config(-1)
	if err != nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.members.set == nil || s.members.num != c.Num {
		set := make(map[uint64]bool, len(c.Groups))
		for _, g := range c.Groups {
			set[g.Gid] = true
		}
		s.members.num, s.members.set = c.Num, set
	}
	return s.members.set
}

func (s *Server) Status(ctx context.Context, req *shardkvpb.ClusterStatusRequest) (*shardkvpb.ClusterStatus, error) {
	if err := s.leaderOnly(); err != nil {
		return nil, err
	}
	if err := s.readIndex(ctx, req.GetStale()); err != nil {
		return nil, err
	}
	latest, err := s.sm.Config(-1)
	if err != nil {
		return nil, grpcErr(err)
	}
	oldest, _ := s.sm.Bounds()
	out := &shardkvpb.ClusterStatus{Latest: latest, Controller: s.r.StatusProto(), Nshards: uint32(s.sm.Shards()), OldestConfig: oldest}
	s.mu.Lock()
	for _, rp := range s.reports {
		out.Groups = append(out.Groups, &shardkvpb.GroupStatus{Report: rp.r, AgeMs: time.Since(rp.at).Milliseconds()})
	}
	s.mu.Unlock()
	slices.SortFunc(out.Groups, func(a, b *shardkvpb.GroupStatus) int { return cmp.Compare(a.Report.Gid, b.Report.Gid) })
	return out, nil
}

// readIndex is the linearizable read barrier, skipped for a stale read
// (pollers that need only a recent answer: each round is a heartbeat to
// every follower, and the data replicas poll every second). A stale read
// is still served by the leader only: with CheckQuorum a leader cut off
// from its quorum steps down within an election timeout, so the answer is
// that recent and "reached the controller" keeps its meaning.
func (s *Server) readIndex(ctx context.Context, stale bool) error {
	if stale {
		if !s.r.IsLeader() {
			id, addr := s.r.Leader()
			return shardkvpb.NotLeaderError("stale reads are served by the controller leader", id, addr)
		}
		return nil
	}
	if err := s.r.ReadIndex(ctx); err != nil {
		return grpcErr(err)
	}
	return nil
}
