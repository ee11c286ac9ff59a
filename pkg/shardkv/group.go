package shardkv

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardkv/shardkv/pkg/ctrler/ctrlerclient"
	"github.com/shardkv/shardkv/pkg/grpcdial"
	"github.com/shardkv/shardkv/pkg/raftgroup"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// GroupConfig configures a data group replica's service.
type GroupConfig struct {
	// Ctrler is the controller client (the group watches configs and
	// reports its status through it).
	Ctrler *ctrlerclient.Client
	// TrackLeaders keeps every group's leader as the controller last heard
	// of it (soft state, polled once a second), for front ends that send
	// their clients to another group's leader (Topology, refusals). The
	// node sets it when it serves a client protocol other than gRPC.
	TrackLeaders bool
	// MaxValueBytes bounds one value (default DefaultMaxValueBytes, at most
	// MaxValueBytesLimit, and at most what the replica's entry limit
	// carries: see EntryBytesFor), APPEND's result included; MaxKeyBytes one
	// key (default and maximum MaxKeyBytesLimit, 64,989 bytes: every stored
	// form of the key must fit badger's 65,000).
	MaxValueBytes, MaxKeyBytes int
	// PullConcurrency bounds shards pulled at once from one source group
	// (default 4). Per source, so that a source that is down (its pulls
	// retry until it is back) never holds up the shards of the others.
	PullConcurrency int
	// MigrateBytesPerSec limits the bytes per second this group copies in
	// (every shard it pulls, together; 0: no limit), so that a large move
	// does not starve foreground traffic. The last round of a move, which
	// the shard's writes wait for, is not limited.
	MigrateBytesPerSec int64
	// ReportEvery is the heartbeat period to the controller (default 500ms).
	ReportEvery time.Duration
	// ExpireEvery is how often the leader proposes session and tombstone
	// expiry (default 30s).
	ExpireEvery time.Duration
	// ExpireKeysEvery is how often the leader checks for keys past their
	// expiry and proposes their deletion (default 100ms, as Redis's active
	// expiry cycle). Expired keys are invisible at once either way.
	ExpireKeysEvery time.Duration
	// DialOptions for group-to-group calls (default: insecure).
	DialOptions []grpc.DialOption
	Logger      *slog.Logger
}

// Group serves one data-group replica: the KV API, the shard-transfer API,
// and, while it leads, the loop that steps configs and moves shards.
type Group struct {
	shardkvpb.UnimplementedKVServer
	cfg GroupConfig
	r   *raftgroup.Replica
	sm  *StateMachine
	log *slog.Logger

	pool  *grpcdial.Pool   // connections to other groups' replicas
	peers *grpcdial.Caller // leader-first calls to a group, by gid

	copyRate  *copyThrottle // nil: no copy rate limit
	copyRates copyRates     // measured copy rates, for status

	knownMu sync.Mutex
	known   map[uint64]*shardkvpb.Config // configs from the controller, ahead of ours
	newest  *shardkvpb.Config            // the newest config the controller announced
	// announced wakes the leader's run loop when a config arrives: a
	// cut-over's barrier starts when the source steps, so the step should
	// not wait for the next tick.
	announced chan struct{}

	// finals are the copies whose last round this leader has put in its
	// log (shard -> config); finalc is closed and replaced when one is
	// added. Writes held behind the barrier may go into the log right
	// behind that entry rather than after it applies: the apply of each
	// write decides again, and refuses one that finds the shard still
	// arriving (the last round failed).
	finalMu sync.Mutex
	finals  map[int]uint64
	finalc  chan struct{}

	heardMu sync.Mutex
	heard   map[uint64]uint64 // gid -> leader replica, as the controller last heard

	users atomic.Pointer[shardkvpb.UsersReply] // users.go

	ctx  context.Context // cancelled by Stop
	stop context.CancelFunc
	wg   sync.WaitGroup
}

// NewGroup starts the group's background loops.
func NewGroup(cfg GroupConfig, r *raftgroup.Replica, sm *StateMachine) *Group {
	if cfg.MaxValueBytes <= 0 {
		cfg.MaxValueBytes = DefaultMaxValueBytes
	}
	if cfg.MaxKeyBytes <= 0 || cfg.MaxKeyBytes > MaxKeyBytesLimit {
		cfg.MaxKeyBytes = MaxKeyBytesLimit
	}
	cfg.MaxValueBytes = min(cfg.MaxValueBytes, MaxValueBytesLimit)
	if cfg.PullConcurrency == 0 {
		cfg.PullConcurrency = 4
	}
	if cfg.ReportEvery == 0 {
		cfg.ReportEvery = 500 * time.Millisecond
	}
	if cfg.ExpireEvery == 0 {
		cfg.ExpireEvery = 30 * time.Second
	}
	if cfg.ExpireKeysEvery == 0 {
		cfg.ExpireKeysEvery = 100 * time.Millisecond
	}
	if len(cfg.DialOptions) == 0 {
		cfg.DialOptions = grpcdial.Options()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	// A value the log cannot carry could be written but never moved: keep
	// the value limit within the entry limit.
	if fit := min(maxValueFor(r.MaxCommandBytes(), cfg.MaxKeyBytes), MaxValueBytesLimit); cfg.MaxValueBytes > fit {
		cfg.Logger.Warn("value limit lowered to what one log entry carries", "max_value_bytes", cfg.MaxValueBytes,
			"max_command_bytes", r.MaxCommandBytes(), "now", fit)
		cfg.MaxValueBytes = fit
	}
	cfg.DialOptions = append(slices.Clone(cfg.DialOptions), transferCallOptions(r.MaxCommandBytes()))
	g := &Group{cfg: cfg, r: r, sm: sm, log: cfg.Logger.With("gid", sm.gid), known: map[uint64]*shardkvpb.Config{}, announced: make(chan struct{}, 1), finals: map[int]uint64{}, finalc: make(chan struct{}), heard: map[uint64]uint64{},
		copyRate: newCopyThrottle(cfg.MigrateBytesPerSec)}
	g.pool = grpcdial.NewPool(cfg.DialOptions...)
	g.peers = grpcdial.NewCaller(g.pool)
	g.ctx, g.stop = context.WithCancel(context.Background())
	g.wg.Add(2)
	go g.run()
	go g.watchConfigs()
	if cfg.TrackLeaders {
		g.wg.Add(2)
		go g.trackLeaders()
		go g.trackUsers()
	}
	return g
}

// Register adds the KV service to s.
func (g *Group) Register(s *grpc.Server) { shardkvpb.RegisterKVServer(s, g) }

// Stop ends the background loops and closes peer connections.
func (g *Group) Stop() {
	g.stop()
	g.wg.Wait()
	g.pool.Close()
}

// propose runs a group command through the log.
func (g *Group) propose(ctx context.Context, cmd *shardkvpb.GroupCommand) (any, error) {
	return g.proposeNotify(ctx, cmd, nil)
}

// proposeNotify is propose; appended runs once the entry is in the
// leader's log (see raftgroup.Replica.ProposeNotify).
func (g *Group) proposeNotify(ctx context.Context, cmd *shardkvpb.GroupCommand, appended func()) (any, error) {
	b, err := proto.Marshal(cmd)
	if err != nil {
		return nil, err
	}
	return g.r.ProposeNotify(ctx, b, appended)
}

// RaftStatus is this replica's Raft status.
func (g *Group) RaftStatus() *shardkvpb.MemberStatus { return g.r.StatusProto() }

// MaxValueBytes is the group's value size limit.
func (g *Group) MaxValueBytes() int { return g.cfg.MaxValueBytes }

// MaxKeyBytes is the group's key size limit.
func (g *Group) MaxKeyBytes() int { return g.cfg.MaxKeyBytes }
