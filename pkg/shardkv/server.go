package shardkv

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/shardkv/shardkv/pkg/ctrler/ctrlerclient"
	"github.com/shardkv/shardkv/pkg/grpcdial"
	"github.com/shardkv/shardkv/pkg/raftgroup"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
)

// GroupConfig configures a data group replica's service.
type GroupConfig struct {
	// Ctrler is the controller client (the group watches configs and
	// reports its status through it).
	Ctrler *ctrlerclient.Client
	// RESPAddr is this replica's advertised Redis address, if it serves one.
	RESPAddr string
	// MaxValueBytes bounds one value (default 512 KiB); MaxKeyBytes one key
	// (default 64 KiB).
	MaxValueBytes, MaxKeyBytes int
	// PullConcurrency bounds shards pulled at once from one source group
	// (default 4). Per source, so that a source that is down (its pulls
	// retry until it is back) never holds up the shards of the others.
	PullConcurrency int
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

	connMu  sync.Mutex
	conns   map[string]*grpc.ClientConn
	leaders map[uint64]string // gid -> last known leader address

	knownMu sync.Mutex
	known   map[uint64]*shardkvpb.Config // configs from the controller, ahead of ours

	respMu      sync.Mutex
	respLeaders map[uint64]uint64 // other groups' leaders (controller status)

	stopc chan struct{}
	wg    sync.WaitGroup
}

// NewGroup starts the group's background loop.
func NewGroup(cfg GroupConfig, r *raftgroup.Replica, sm *StateMachine) *Group {
	if cfg.MaxValueBytes == 0 {
		cfg.MaxValueBytes = 512 << 10
	}
	if cfg.MaxKeyBytes == 0 {
		cfg.MaxKeyBytes = 64 << 10
	}
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
	g := &Group{cfg: cfg, r: r, sm: sm, log: cfg.Logger.With("gid", sm.gid), conns: map[string]*grpc.ClientConn{},
		leaders: map[uint64]string{}, known: map[uint64]*shardkvpb.Config{}, stopc: make(chan struct{})}
	g.wg.Add(1)
	go g.run()
	if cfg.RESPAddr != "" {
		g.wg.Add(1)
		go g.refreshLeaders()
	}
	return g
}

// Register adds the KV service to s.
func (g *Group) Register(s *grpc.Server) { shardkvpb.RegisterKVServer(s, g) }

// Stop ends the background loop and closes peer connections.
func (g *Group) Stop() {
	close(g.stopc)
	g.wg.Wait()
	g.connMu.Lock()
	for _, c := range g.conns {
		c.Close()
	}
	g.conns = map[string]*grpc.ClientConn{}
	g.connMu.Unlock()
}

// --- errors ---

func codeErr(code Code, s int, conf uint64) error {
	meta := map[string]string{"config_num": strconv.FormatUint(conf, 10), "shard": strconv.Itoa(s)}
	switch code {
	case WrongGroup:
		return shardkvpb.Error(codes.FailedPrecondition, shardkvpb.ReasonWrongGroup, fmt.Sprintf("shard %d is not served by this group in config %d", s, conf), meta)
	case NotReady:
		return shardkvpb.Error(codes.Unavailable, shardkvpb.ReasonNotReady, fmt.Sprintf("shard %d is still arriving (config %d)", s, conf), meta)
	case ResultForgotten:
		return shardkvpb.Error(codes.Aborted, shardkvpb.ReasonResultForgotten, fmt.Sprintf("shard %d: the session no longer remembers this write's result; it may or may not have been applied", s), meta)
	}
	return nil
}

func invalid(format string, a ...any) error {
	return shardkvpb.Error(codes.InvalidArgument, shardkvpb.ReasonInvalid, fmt.Sprintf(format, a...), nil)
}

func (g *Group) checkOp(op *shardkvpb.WriteOp) error {
	if op == nil {
		return invalid("missing write op")
	}
	if len(op.Key) > g.cfg.MaxKeyBytes {
		return shardkvpb.Error(codes.InvalidArgument, shardkvpb.ReasonTooLarge, fmt.Sprintf("key of %d bytes exceeds the limit of %d", len(op.Key), g.cfg.MaxKeyBytes), nil)
	}
	if len(op.Value) > g.cfg.MaxValueBytes || len(op.Expect) > g.cfg.MaxValueBytes {
		return shardkvpb.Error(codes.InvalidArgument, shardkvpb.ReasonTooLarge, fmt.Sprintf("value of %d bytes exceeds the limit of %d", max(len(op.Value), len(op.Expect)), g.cfg.MaxValueBytes), nil)
	}
	if op.Kind > shardkvpb.WriteOp_PERSIST {
		return invalid("unknown write kind %d", op.Kind)
	}
	return nil
}

// --- client API ---

// Get reads linearizably on any replica (ReadIndex, then local state).
func (g *Group) Get(ctx context.Context, req *shardkvpb.GetRequest) (*shardkvpb.GetReply, error) {
	if s, code := g.sm.route(req.Key); code != OK {
		return nil, codeErr(code, s, g.sm.Config().Num)
	}
	if err := g.r.ReadIndex(ctx); err != nil {
		return nil, raftgroup.GRPCError(err)
	}
	v, found, code, err := g.sm.Get(req.Key, time.Now().UnixMilli())
	if err != nil {
		return nil, status(err)
	}
	if code != OK {
		return nil, codeErr(code, 0, g.sm.Config().Num)
	}
	return &shardkvpb.GetReply{Value: v, Found: found}, nil
}

func status(err error) error {
	return shardkvpb.Error(codes.Internal, shardkvpb.ReasonNotExecuted, err.Error(), nil)
}

// MultiGet reads several keys of this group after one ReadIndex.
func (g *Group) MultiGet(ctx context.Context, req *shardkvpb.MultiGetRequest) (*shardkvpb.MultiGetReply, error) {
	for _, k := range req.Keys {
		if s, code := g.sm.route(k); code != OK {
			return nil, codeErr(code, s, g.sm.Config().Num)
		}
	}
	if err := g.r.ReadIndex(ctx); err != nil {
		return nil, raftgroup.GRPCError(err)
	}
	out := &shardkvpb.MultiGetReply{}
	now := time.Now().UnixMilli()
	for _, k := range req.Keys {
		v, found, code, err := g.sm.Get(k, now)
		if err != nil {
			return nil, status(err)
		}
		if code != OK {
			s, _ := g.sm.route(k)
			return nil, codeErr(code, s, g.sm.Config().Num)
		}
		out.Values = append(out.Values, &shardkvpb.GetReply{Value: v, Found: found})
	}
	return out, nil
}

// propose runs a group command through the log.
func (g *Group) propose(ctx context.Context, cmd *shardkvpb.GroupCommand) (any, error) {
	b, err := proto.Marshal(cmd)
	if err != nil {
		return nil, err
	}
	return g.r.Propose(ctx, b)
}

// Write applies one mutation through the log.
func (g *Group) Write(ctx context.Context, req *shardkvpb.WriteRequest) (*shardkvpb.WriteReply, error) {
	if err := g.checkOp(req.Op); err != nil {
		return nil, err
	}
	if s, code := g.sm.route(req.Op.Key); code != OK {
		return nil, codeErr(code, s, g.sm.Config().Num)
	}
	v, err := g.propose(ctx, &shardkvpb.GroupCommand{Writes: []*shardkvpb.WriteOp{req.Op}})
	if err != nil {
		return nil, raftgroup.GRPCError(err)
	}
	res, ok := v.([]OpResult)
	if !ok || len(res) != 1 {
		return nil, status(fmt.Errorf("unexpected apply result %T", v))
	}
	if res[0].Code != OK {
		s, _ := g.sm.route(req.Op.Key)
		return nil, codeErr(res[0].Code, s, g.sm.Config().Num)
	}
	return &shardkvpb.WriteReply{Result: res[0].Result}, nil
}

// MultiWrite applies several mutations as one log entry. Ops the group
// cannot execute (wrong group, not ready) are marked in their result.
func (g *Group) MultiWrite(ctx context.Context, req *shardkvpb.MultiWriteRequest) (*shardkvpb.MultiWriteReply, error) {
	for _, op := range req.Ops {
		if err := g.checkOp(op); err != nil {
			return nil, err
		}
	}
	v, err := g.propose(ctx, &shardkvpb.GroupCommand{Writes: req.Ops})
	if err != nil {
		return nil, raftgroup.GRPCError(err)
	}
	res, ok := v.([]OpResult)
	if !ok || len(res) != len(req.Ops) {
		return nil, status(fmt.Errorf("unexpected apply result %T", v))
	}
	out := &shardkvpb.MultiWriteReply{}
	for _, r := range res {
		switch r.Code {
		case OK:
			out.Results = append(out.Results, r.Result)
		case WrongGroup:
			out.Results = append(out.Results, &shardkvpb.WriteResult{NotExecuted: shardkvpb.ReasonWrongGroup})
		case NotReady:
			out.Results = append(out.Results, &shardkvpb.WriteResult{NotExecuted: shardkvpb.ReasonNotReady})
		case ResultForgotten:
			out.Results = append(out.Results, &shardkvpb.WriteResult{NotExecuted: shardkvpb.ReasonResultForgotten})
		}
	}
	return out, nil
}

// --- shard transfer ---

// FetchShard streams a frozen (BePulling) shard to its new owner. Any replica
// that has applied the BePulling state can serve it: no write reaches a
// BePulling shard, so its data is final.
func (g *Group) FetchShard(req *shardkvpb.FetchShardRequest, stream shardkvpb.KV_FetchShardServer) error {
	s := int(req.Shard)
	m := g.sm.Shard(s)
	conf := g.sm.Config()
	switch {
	case m.State == BePulling && m.Config == req.ConfigNum:
		if m.Peer != req.Gid {
			return invalid("shard %d goes to group %d in config %d, not %d", s, m.Peer, req.ConfigNum, req.Gid)
		}
	case conf.Num < req.ConfigNum || (m.State == BePulling && m.Config < req.ConfigNum):
		return shardkvpb.Error(codes.Unavailable, shardkvpb.ReasonNotReady,
			fmt.Sprintf("this replica is at config %d; shard %d for config %d is not ready to hand off", conf.Num, s, req.ConfigNum), nil)
	default:
		return shardkvpb.Error(codes.FailedPrecondition, shardkvpb.ReasonInvalid,
			fmt.Sprintf("shard %d for config %d: this replica holds it as %v at config %d", s, req.ConfigNum, m, conf.Num), nil)
	}
	return g.sm.StreamShard(s, req.AfterKey, req.Resume, stream.Send)
}

// ShardInstalled: the new owner has the shard; start deleting our copy.
func (g *Group) ShardInstalled(ctx context.Context, req *shardkvpb.ShardInstalledRequest) (*shardkvpb.ShardInstalledReply, error) {
	s := int(req.Shard)
	m := g.sm.Shard(s)
	conf := g.sm.Config()
	switch {
	case m.State == BePulling && m.Config == req.ConfigNum:
		if _, err := g.propose(ctx, &shardkvpb.GroupCommand{Gc: &shardkvpb.ShardRef{Shard: req.Shard, ConfigNum: req.ConfigNum}}); err != nil {
			return nil, raftgroup.GRPCError(err)
		}
		return &shardkvpb.ShardInstalledReply{}, nil
	case (m.State == GCing && m.Config >= req.ConfigNum) || (m.State == NotOwned && conf.Num >= req.ConfigNum) || m.Config > req.ConfigNum:
		return &shardkvpb.ShardInstalledReply{}, nil // already handed off
	}
	if !g.r.IsLeader() {
		id, addr := g.r.Leader()
		return nil, shardkvpb.NotLeaderError("shard hand-off goes through the leader", id, addr)
	}
	return nil, shardkvpb.Error(codes.Unavailable, shardkvpb.ReasonNotReady,
		fmt.Sprintf("shard %d for config %d: at config %d, state %v", s, req.ConfigNum, conf.Num, m), nil)
}

// GroupInfo describes this replica's view of the group.
func (g *Group) GroupInfo(ctx context.Context, _ *shardkvpb.GroupInfoRequest) (*shardkvpb.GroupInfoReply, error) {
	out := &shardkvpb.GroupInfoReply{Gid: g.sm.gid, Config: g.sm.Config(), Member: g.r.StatusProto()}
	out.Shards = g.shardStates()
	return out, nil
}

func (g *Group) shardStates() []*shardkvpb.ShardState {
	shards := g.sm.Shards()
	ids := make([]int, 0, len(shards))
	for s := range shards {
		ids = append(ids, s)
	}
	slices.Sort(ids)
	var out []*shardkvpb.ShardState
	for _, s := range ids {
		m := shards[s]
		out = append(out, &shardkvpb.ShardState{Shard: uint32(s), State: string(m.State), ConfigNum: m.Config, Keys: m.Keys, Bytes: m.Bytes, PeerGid: m.Peer, TotalKeys: m.Total})
	}
	return out
}

// --- peers ---

func (g *Group) conn(addr string) (shardkvpb.KVClient, error) {
	g.connMu.Lock()
	defer g.connMu.Unlock()
	c, ok := g.conns[addr]
	if !ok {
		var err error
		if c, err = grpc.NewClient(grpcdial.Target(addr), g.cfg.DialOptions...); err != nil {
			return nil, err
		}
		g.conns[addr] = c
	}
	return shardkvpb.NewKVClient(c), nil
}

// servers lists a group's addresses, its last known leader first.
func (g *Group) servers(gid uint64) []string {
	var addrs []string
	for _, c := range []*shardkvpb.Config{g.sm.PrevConfig(), g.sm.Config()} {
		for _, grp := range c.Groups {
			if grp.Gid == gid {
				for _, s := range grp.Servers {
					if !slices.Contains(addrs, s.Addr) {
						addrs = append(addrs, s.Addr)
					}
				}
			}
		}
	}
	g.connMu.Lock()
	lead := g.leaders[gid]
	g.connMu.Unlock()
	if i := slices.Index(addrs, lead); i > 0 {
		addrs[0], addrs[i] = addrs[i], addrs[0]
	}
	return addrs
}

func (g *Group) noteLeader(gid uint64, addr string) {
	g.connMu.Lock()
	g.leaders[gid] = addr
	g.connMu.Unlock()
}

// callGroup calls f on gid's replicas until one succeeds or all fail.
func (g *Group) callGroup(ctx context.Context, gid uint64, f func(context.Context, shardkvpb.KVClient) error) error {
	var last error = fmt.Errorf("group %d has no known servers", gid)
	tried := map[string]bool{}
	queue := g.servers(gid)
	for len(queue) > 0 && ctx.Err() == nil {
		addr := queue[0]
		queue = queue[1:]
		if tried[addr] {
			continue
		}
		tried[addr] = true
		cl, err := g.conn(addr)
		if err != nil {
			last = err
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err = f(cctx, cl)
		cancel()
		if err == nil {
			g.noteLeader(gid, addr)
			return nil
		}
		last = err
		if _, hint, ok := shardkvpb.LeaderHint(err); ok && hint != "" && !tried[hint] {
			queue = append([]string{hint}, queue...)
		}
	}
	return last
}

// --- the leader's reconciliation loop ---

// run keeps comparing the desired state (the controller's configs) with the
// actual one (the replicated shard states) and takes the next step toward
// it, as long as this replica leads. Every step is idempotent and retried
// until it takes, so lost RPCs, leader changes and restarts of either side
// only delay it.
func (g *Group) run() {
	defer g.wg.Done()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var lead struct {
		ctx    context.Context
		cancel context.CancelFunc
	}
	var (
		leading       bool
		tasks         = map[string]context.CancelFunc{}
		pullPeer      = map[string]uint64{} // running pull task -> source gid
		lastReport    time.Time
		lastExpire    = time.Now()
		lastKeyExpire time.Time
		taskDone      = make(chan string, 64)
		stepPending   bool
		stepDone      = make(chan struct{}, 1)
	)
	stopLeading := func() {
		if lead.cancel != nil {
			lead.cancel()
		}
		for _, c := range tasks {
			c()
		}
		clear(tasks)
		clear(pullPeer)
		leading = false
	}
	defer stopLeading()
	for {
		select {
		case <-g.stopc:
			return
		case <-tick.C:
		case <-g.sm.Changed():
		case name := <-taskDone:
			delete(tasks, name)
			delete(pullPeer, name)
		case <-stepDone:
			stepPending = false
		}
		if !g.r.IsLeader() {
			if leading {
				stopLeading()
			}
			continue
		}
		if !leading {
			leading = true
			lead.ctx, lead.cancel = context.WithCancel(context.Background())
			g.wg.Add(1)
			go g.watchConfigs(lead.ctx)
		}
		// Heartbeat to the controller.
		if time.Since(lastReport) >= g.cfg.ReportEvery {
			lastReport = time.Now()
			g.wg.Add(1)
			go func() {
				defer g.wg.Done()
				g.report(lead.ctx)
			}()
		}
		if _, running := tasks["expire-keys"]; !running && time.Since(lastKeyExpire) >= g.cfg.ExpireKeysEvery {
			lastKeyExpire = time.Now()
			if g.sm.expiryDue(time.Now().UnixMilli()) {
				g.spawn(lead.ctx, tasks, taskDone, "expire-keys", func(ctx context.Context) {
					ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
					defer cancel()
					g.propose(ctx, &shardkvpb.GroupCommand{ExpireKeys: true})
				})
			}
		}
		if time.Since(lastExpire) >= g.cfg.ExpireEvery {
			lastExpire = time.Now()
			g.spawn(lead.ctx, tasks, taskDone, "expire", func(ctx context.Context) {
				g.propose(ctx, &shardkvpb.GroupCommand{ExpireSessions: true})
			})
		}
		// Step to the next config when nothing is moving.
		if !stepPending && g.sm.Stable() {
			if next := g.nextKnown(); next != nil {
				stepPending = true
				g.wg.Add(1)
				go func() {
					defer g.wg.Done()
					ctx, cancel := context.WithTimeout(lead.ctx, 5*time.Second)
					defer cancel()
					res, err := g.propose(ctx, &shardkvpb.GroupCommand{NextConfig: next})
					if err == nil {
						err, _ = res.(error) // refused at apply (stale or early)
					}
					if err != nil {
						g.log.Debug("proposing next config", "num", next.Num, "err", err)
					} else {
						g.log.Info("stepped to config", "num", next.Num)
					}
					stepDone <- struct{}{}
				}()
			}
		}
		// One task per moving shard, at most PullConcurrency pulls per
		// source group.
		pulls := map[uint64]int{}
		for name := range tasks {
			if peer, ok := pullPeer[name]; ok {
				pulls[peer]++
			}
		}
		shards := g.sm.Shards()
		ids := make([]int, 0, len(shards))
		for s := range shards {
			ids = append(ids, s)
		}
		slices.Sort(ids)
		for _, s := range ids {
			m := shards[s]
			name := fmt.Sprintf("%s/%d/%d", m.State, s, m.Config)
			if _, ok := tasks[name]; ok {
				continue
			}
			switch m.State {
			case Pulling:
				if pulls[m.Peer] >= g.cfg.PullConcurrency {
					continue
				}
				pulls[m.Peer]++
				pullPeer[name] = m.Peer
				g.spawn(lead.ctx, tasks, taskDone, name, func(ctx context.Context) { g.pull(ctx, s, m) })
			case Acking:
				g.spawn(lead.ctx, tasks, taskDone, name, func(ctx context.Context) { g.confirm(ctx, s, m) })
			case GCing:
				g.spawn(lead.ctx, tasks, taskDone, name, func(ctx context.Context) { g.gc(ctx, s, m) })
			}
		}
	}
}

func (g *Group) spawn(parent context.Context, tasks map[string]context.CancelFunc, done chan<- string, name string, f func(context.Context)) {
	ctx, cancel := context.WithCancel(parent)
	tasks[name] = cancel
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		defer cancel()
		f(ctx)
		select {
		case done <- name:
		case <-g.stopc:
		}
	}()
}

// watchConfigs keeps the controller's configs newer than ours in memory.
func (g *Group) watchConfigs(ctx context.Context) {
	defer g.wg.Done()
	if g.cfg.Ctrler == nil {
		return
	}
	for conf := range g.cfg.Ctrler.Watch(ctx, g.sm.Config().Num+1) {
		g.knownMu.Lock()
		g.known[conf.Num] = conf
		cur := g.sm.Config().Num
		for n := range g.known {
			if n <= cur {
				delete(g.known, n)
			}
		}
		g.knownMu.Unlock()
	}
}

func (g *Group) nextKnown() *shardkvpb.Config {
	cur := g.sm.Config().Num
	g.knownMu.Lock()
	defer g.knownMu.Unlock()
	if c, ok := g.known[cur+1]; ok {
		return c
	}
	if !slices.Contains(g.sm.Config().Shards, g.sm.gid) {
		// A group that owns nothing (new, or left and fell behind) may
		// start from the oldest config the controller still has (see
		// nextConfig for why that is safe).
		// Only configs ahead of ours: the watch prunes older ones only when
		// a new config arrives, and proposing one we have already applied
		// (it is refused at apply) made an idle group propose in a loop.
		var best *shardkvpb.Config
		for _, c := range g.known {
			if c.Num > cur && (best == nil || c.Num < best.Num) {
				best = c
			}
		}
		return best
	}
	return nil
}

func backoff(ctx context.Context, d *time.Duration) bool {
	sleep := *d/2 + rand.N(*d/2+1)
	*d = min(2**d, 2*time.Second)
	select {
	case <-ctx.Done():
		return false
	case <-time.After(sleep):
		return true
	}
}

// pull fetches shard s from its previous owner and installs it through the
// log, chunk by chunk, resuming where the log says it stopped.
func (g *Group) pull(ctx context.Context, s int, m ShardMeta) {
	delay := 20 * time.Millisecond
	for ctx.Err() == nil {
		cur := g.sm.Shard(s)
		if cur.State != Pulling || cur.Config != m.Config {
			return
		}
		err := g.callGroup(ctx, m.Peer, func(cctx context.Context, cl shardkvpb.KVClient) error {
			stream, err := cl.FetchShard(cctx, &shardkvpb.FetchShardRequest{Shard: uint32(s), ConfigNum: m.Config, Gid: g.sm.gid, AfterKey: cur.Resume, Resume: cur.Resumed})
			if err != nil {
				return err
			}
			for {
				chunk, err := stream.Recv()
				if err != nil {
					return err
				}
				at := g.sm.Shard(s)
				if at.State != Pulling || at.Config != m.Config {
					return nil
				}
				pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				v, err := g.propose(pctx, &shardkvpb.GroupCommand{Insert: &shardkvpb.InsertChunk{
					Shard: uint32(s), ConfigNum: m.Config, AfterKey: at.Resume, Resume: at.Resumed,
					Kvs: chunk.Kvs, Last: chunk.Last, TotalKeys: chunk.TotalKeys}})
				cancel()
				if err != nil {
					return err
				}
				if e, ok := v.(error); ok {
					return e // stale: restart from the log's resume point
				}
				if chunk.Last {
					g.log.Info("shard installed", "shard", s, "config", m.Config, "from", m.Peer)
					return nil
				}
			}
		})
		if err == nil {
			delay = 20 * time.Millisecond
			continue
		}
		g.log.Debug("pulling shard", "shard", s, "config", m.Config, "from", m.Peer, "err", err)
		if !backoff(ctx, &delay) {
			return
		}
	}
}

// confirm tells the old owner we hold the shard, then serves it plainly.
func (g *Group) confirm(ctx context.Context, s int, m ShardMeta) {
	delay := 20 * time.Millisecond
	for ctx.Err() == nil {
		if cur := g.sm.Shard(s); cur.State != Acking || cur.Config != m.Config {
			return
		}
		err := g.callGroup(ctx, m.Peer, func(cctx context.Context, cl shardkvpb.KVClient) error {
			_, err := cl.ShardInstalled(cctx, &shardkvpb.ShardInstalledRequest{Shard: uint32(s), ConfigNum: m.Config, Gid: g.sm.gid})
			return err
		})
		if err == nil {
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, err = g.propose(pctx, &shardkvpb.GroupCommand{Acked: &shardkvpb.ShardRef{Shard: uint32(s), ConfigNum: m.Config}})
			cancel()
			if err == nil {
				return
			}
		}
		if !backoff(ctx, &delay) {
			return
		}
	}
}

// gc deletes a handed-off shard in bounded chunks through the log.
func (g *Group) gc(ctx context.Context, s int, m ShardMeta) {
	delay := 20 * time.Millisecond
	for ctx.Err() == nil {
		if cur := g.sm.Shard(s); cur.State != GCing || cur.Config != m.Config {
			return
		}
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := g.propose(pctx, &shardkvpb.GroupCommand{DeleteChunk: &shardkvpb.ShardRef{Shard: uint32(s), ConfigNum: m.Config}})
		cancel()
		if err != nil && !backoff(ctx, &delay) {
			return
		}
	}
}

// report sends the group's status to the controller leader (soft state).
func (g *Group) report(ctx context.Context) {
	if g.cfg.Ctrler == nil || ctx == nil {
		return
	}
	st := g.r.StatusProto()
	rep := &shardkvpb.GroupReport{Gid: g.sm.gid, LeaderId: st.Id, LeaderAddr: st.Addr, LeaderRespAddr: g.cfg.RESPAddr,
		Term: st.Term, ConfigNum: g.sm.Config().Num, Shards: g.shardStates(), Members: st.Members, AppliedIndex: st.Applied}
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := g.cfg.Ctrler.Report(rctx, rep); err != nil && !errors.Is(err, context.Canceled) {
		g.log.Debug("report to controller", "err", err)
	}
}
