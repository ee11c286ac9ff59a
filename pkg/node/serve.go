package node

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/shardkv/shardkv/internal/durable"
	"github.com/shardkv/shardkv/pkg/ctrler"
	"github.com/shardkv/shardkv/pkg/ctrler/ctrlerclient"
	"github.com/shardkv/shardkv/pkg/grpcdial"
	"github.com/shardkv/shardkv/pkg/mtls"
	"github.com/shardkv/shardkv/pkg/raftgroup"
	"github.com/shardkv/shardkv/pkg/resp"
	"github.com/shardkv/shardkv/pkg/shardkv"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"google.golang.org/grpc"
)

// CtrlerGroupID is the Raft group id of the controller group (data groups
// use their gid, which is never 0).
const CtrlerGroupID = 0

// ShutdownTimeout bounds a graceful stop after SIGTERM.
const ShutdownTimeout = 10 * time.Second

// NewLogger returns a structured logger at the given level.
func NewLogger(level string, w *os.File) *slog.Logger {
	var l slog.Level
	_ = l.UnmarshalText([]byte(level))
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l}))
}

// identity is what a data dir was created for. On restart, what is on disk
// wins over flags; flags that contradict it get a warning, or an error where
// going on would be unsafe.
type identity struct {
	Role      string `json:"role"`
	Group     uint64 `json:"group,omitempty"`
	ID        uint64 `json:"id"`
	Shards    int    `json:"shards,omitempty"`
	Placement string `json:"placement,omitempty"`
	Created   string `json:"created"`
}

func checkIdentity(o *Options, log *slog.Logger) (fresh bool, err error) {
	if err := durable.MkdirAll(o.DataDir, 0o750); err != nil {
		return false, fmt.Errorf("data dir: %w", err)
	}
	path := filepath.Join(o.DataDir, "node.json")
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		entries, _ := os.ReadDir(o.DataDir)
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), ".node.json.tmp-") {
				// A first start cut short before node.json was in place.
				os.Remove(filepath.Join(o.DataDir, e.Name()))
				continue
			}
			if e.Name() != "node.json" {
				return false, fmt.Errorf("data dir %s is not empty but has no node.json: refusing to guess what it holds", o.DataDir)
			}
		}
		id := identity{Role: o.Role, Group: o.Group, ID: o.ID, Created: time.Now().UTC().Format(time.RFC3339)}
		if o.Role == "ctrler" {
			id.Shards, id.Placement = o.Shards, o.Placement
		}
		b, _ := json.MarshalIndent(id, "", "  ")
		if err := durable.WriteFile(path, append(b, '\n'), 0o640); err != nil {
			return false, err
		}
		return true, nil
	}
	if err != nil {
		return false, err
	}
	var id identity
	if err := json.Unmarshal(b, &id); err != nil {
		return false, fmt.Errorf("%s: %w", path, err)
	}
	if id.Role != o.Role || id.Group != o.Group || id.ID != o.ID {
		return false, fmt.Errorf("data dir %s belongs to role=%s group=%d id=%d, not role=%s group=%d id=%d",
			o.DataDir, id.Role, id.Group, id.ID, o.Role, o.Group, o.ID)
	}
	if o.Role == "ctrler" && (id.Shards != o.Shards || id.Placement != o.Placement) {
		log.Warn("flags differ from the cluster's creation; what is on disk wins",
			"shards_flag", o.Shards, "shards", id.Shards, "placement_flag", o.Placement, "placement", id.Placement)
	}
	if len(o.Peers) > 0 {
		log.Info("restarting on an existing data dir: --peers is ignored")
	}
	return false, nil
}

// resolveAutoID picks the replica id for --id=auto, the mode for pods of a
// StatefulSet, where every pod gets the same flags:
//   - a data dir that has an identity keeps it (what is on disk wins);
//   - a fresh data dir whose --advertise is one of --peers bootstraps the
//     group with that peer's id, unless the group already exists and lists
//     that id: then this is a replica whose disk was lost, which must never
//     come back under its old id (it forgot its votes and log);
//   - otherwise (a scale-out pod, or a lost disk) it takes a fresh random id
//     and starts empty as a joiner, waiting to be added (the operator adds
//     it as a learner and removes the old id).
func resolveAutoID(ctx context.Context, o *Options, groupID uint64, sec *security, log *slog.Logger) error {
	b, err := os.ReadFile(filepath.Join(o.DataDir, "node.json"))
	switch {
	case err == nil:
		var id identity
		if err := json.Unmarshal(b, &id); err != nil {
			return fmt.Errorf("%s: %w", filepath.Join(o.DataDir, "node.json"), err)
		}
		o.ID = id.ID
		// A replica that started as a joiner restarts as one (its id is
		// not among the bootstrap peers); raftgroup then resumes from its
		// state, or keeps waiting to be added.
		if !slices.ContainsFunc(o.Peers, func(p raftgroup.Peer) bool { return p.ID == o.ID }) {
			o.Join, o.Peers = true, nil
		}
		return nil
	case !errors.Is(err, os.ErrNotExist):
		return err
	}
	for _, p := range o.Peers {
		if p.Addr != o.Advertise {
			continue
		}
		o.ID = p.ID
		err := checkNotRebootstrapping(ctx, o, groupID, true, sec)
		if err == nil {
			log.Info("--id=auto: bootstrapping as an initial member", "id", o.ID)
			return nil
		}
		log.Warn("--id=auto: this replica's disk was lost; joining with a fresh id instead", "old_id", p.ID, "reason", err)
	}
	var r [8]byte
	if _, err := rand.Read(r[:]); err != nil {
		return err
	}
	// A random id below 2^53 (exact in JSON numbers) and above the small
	// ids of initial members: never reused in practice.
	o.ID = 1<<20 + binary.BigEndian.Uint64(r[:])%(1<<53-1<<20)
	o.Join, o.Peers = true, nil
	log.Info("--id=auto: starting empty with a fresh id; waiting to be added to the group", "id", o.ID)
	return nil
}

// checkNotRebootstrapping refuses to bootstrap an empty data dir into a group
// that already exists: that is a replica whose disk was lost coming back
// under its old id, which can break Raft's safety (it forgot its votes and
// log). Such a replica must join with --join and a new id. Peers that cannot
// be reached are skipped, so this is best effort.
//
// strict (--id=auto) refuses as soon as the group has held an election:
// this replica may have voted or acknowledged entries before its disk was
// lost. A late-starting initial member is then refused too and joins with a
// fresh id, which costs one membership change, never safety. Without strict,
// only a group that has run past its bootstrap entries is taken as existing,
// so a group whose replicas start one after another (node local) forms.
func checkNotRebootstrapping(ctx context.Context, o *Options, groupID uint64, strict bool, sec *security) error {
	for _, p := range o.Peers {
		if p.ID == o.ID {
			continue
		}
		conn, err := grpc.NewClient(grpcdial.Target(p.Addr), sec.dialOptions(sec.member())...)
		if err != nil {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		st, err := shardkvpb.NewAdminClient(conn).Status(cctx, &shardkvpb.StatusRequest{})
		cancel()
		conn.Close()
		if err != nil || st.GroupId != groupID {
			continue
		}
		// A new group's log starts with one membership entry per initial
		// peer; anything past that means the group already ran.
		if strict && (st.Term >= 2 || st.Leader != 0 || st.Commit > uint64(len(o.Peers))) {
			// An initial member (we are in --peers) of a group that has
			// held an election; a follower may not list members, so do not
			// wait for one that does.
			return fmt.Errorf("replica %d has an empty data dir, but group %d has already held an election (peer %d: term %d, leader %d, commit %d)",
				o.ID, groupID, p.ID, st.Term, st.Leader, st.Commit)
		}
		if st.Commit > uint64(len(o.Peers))+1 {
			for _, m := range st.Members {
				if m.Id == o.ID {
					return fmt.Errorf("replica %d has an empty data dir, but group %d already exists (peer %d is at commit %d) and still lists id %d: "+
						"a replica whose data was lost must not come back under its old id; start it with --join and a new id, then remove id %d",
						o.ID, groupID, p.ID, st.Commit, o.ID, o.ID)
				}
			}
		}
	}
	return nil
}

// Node is a running replica process.
type Node struct {
	opts    *Options
	log     *slog.Logger
	replica *raftgroup.Replica
	grpc    *grpc.Server
	http    *http.Server
	lis     net.Listener
	stop    []func()

	ctrlSM  *ctrler.StateMachine
	groupSM *shardkv.StateMachine
	group   *shardkv.Group
	resp    *resp.Server
	errs    *errorCounter

	latestSeen atomic.Uint64
	latestAt   atomic.Int64 // unix nanos of the last successful controller query
	stopping   atomic.Bool  // Shutdown has begun: /readyz says so
	ctrl       *ctrlerclient.Client
	bgCancel   context.CancelFunc
	bgWG       sync.WaitGroup
	servedGRPC chan error
	inflight   atomic.Int64 // client requests being served (see track)
	// lastClient is when the last client request arrived (unix ns; 0:
	// none yet): a KV read or write over gRPC, or Redis commands.
	lastClient atomic.Int64
}

// clientMethods are the KV calls clients make (not the groups' own
// FetchShard and ShardInstalled, nor status reads).
var clientMethods = map[string]bool{
	shardkvpb.KV_Get_FullMethodName: true, shardkvpb.KV_Write_FullMethodName: true,
	shardkvpb.KV_MultiGet_FullMethodName: true, shardkvpb.KV_MultiWrite_FullMethodName: true,
	shardkvpb.KV_GetElems_FullMethodName: true,
}

func (n *Node) clientRequest() { n.lastClient.Store(time.Now().UnixNano()) }

// annotateStatus adds the process's own facts to the replica's Admin
// status: its Redis addresses (the engine knows no Redis; kvctl looks them
// up there for a join) and how long no client has sent it anything.
func (n *Node) annotateStatus(st *shardkvpb.MemberStatus) {
	st.RespAddr, st.RespTlsAddr = n.opts.RESPAdvertise, n.opts.RESPTLSAdvertise
	if last := n.lastClient.Load(); last != 0 {
		ms := uint64(max(time.Since(time.Unix(0, last)).Milliseconds(), 0))
		st.ClientIdleMs = &ms
	}
}

// longLived are the streams that stay open for as long as the peer runs:
// Raft traffic from the other replicas and config watches. A graceful stop
// does not wait for them (they never end on their own).
var longLived = map[string]bool{
	shardkvpb.Raft_Send_FullMethodName:        true,
	shardkvpb.Controller_Watch_FullMethodName: true,
}

func (n *Node) trackUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if clientMethods[info.FullMethod] {
		n.clientRequest()
	}
	n.inflight.Add(1)
	defer n.inflight.Add(-1)
	return h(ctx, req)
}

func (n *Node) trackStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if !longLived[info.FullMethod] {
		n.inflight.Add(1)
		defer n.inflight.Add(-1)
	}
	return h(srv, ss)
}

// Start opens the replica and starts serving. Stop it with Shutdown.
func Start(ctx context.Context, o *Options, log *slog.Logger) (*Node, error) {
	groupID := uint64(CtrlerGroupID)
	if o.Role == "group" {
		groupID = o.Group
	}
	sec, err := loadSecurity(o, log)
	if err != nil {
		return nil, err
	}
	if o.IDAuto {
		if err := resolveAutoID(ctx, o, groupID, sec, log); err != nil {
			return nil, err
		}
	}
	log = log.With("role", o.Role, "id", o.ID)
	if o.Role == "group" {
		log = log.With("group", o.Group)
	}
	fresh, err := checkIdentity(o, log)
	if err != nil {
		return nil, err
	}
	if fresh && !o.Join && len(o.Peers) > 0 {
		if err := checkNotRebootstrapping(ctx, o, groupID, false, sec); err != nil {
			os.Remove(filepath.Join(o.DataDir, "node.json"))
			return nil, err
		}
	}
	lis, err := net.Listen("tcp", o.Listen)
	if err != nil {
		return nil, fmt.Errorf("--listen: %w", err)
	}
	n := &Node{opts: o, log: log, lis: lis, errs: newErrorCounter(), servedGRPC: make(chan error, 1)}
	// The entry limit follows from the value limit (shardkv.EntryBytesFor),
	// so that every value a write may carry also fits the log when its
	// shard moves.
	cfg := raftgroup.Config{GroupID: groupID, ID: o.ID, Addr: o.Advertise,
		Dir: filepath.Join(o.DataDir, "raft"), Peers: o.Peers, Join: o.Join, Logger: log,
		SnapshotEntries: o.SnapshotEntries, TrailingEntries: o.TrailingEntries,
		MaxCommandBytes: max(raftgroup.DefaultMaxCommandBytes, shardkv.EntryBytesFor(o.MaxValueBytes, shardkv.DefaultMaxKeyBytes)),
		PeerCredentials: sec.creds(sec.member())}
	if o.Role == "group" {
		cfg.AnnotateStatus = n.annotateStatus
	}
	var sm raftgroup.StateMachine
	if o.Role == "ctrler" {
		n.ctrlSM = ctrler.NewStateMachine()
		sm = n.ctrlSM
	} else {
		n.groupSM = shardkv.NewStateMachine(o.Group)
		sm = n.groupSM
	}
	if n.replica, err = raftgroup.Open(cfg, sm); err != nil {
		lis.Close()
		return nil, err
	}
	secOpts, secUnary, secStream := sec.serverOptions()
	n.grpc = grpc.NewServer(append(append(raftgroup.ServerOptionsFor(cfg.MaxCommandBytes), secOpts...),
		grpc.ChainUnaryInterceptor(append(secUnary, n.errs.unary, n.trackUnary)...),
		grpc.ChainStreamInterceptor(append(secStream, n.errs.stream, n.trackStream)...))...)
	n.replica.RegisterGRPC(n.grpc)
	bg, cancel := context.WithCancel(context.Background())
	n.bgCancel = cancel
	go sec.run(bg)
	if o.Role == "ctrler" {
		srv := ctrler.NewServer(ctrler.ServerConfig{Shards: o.Shards, Placement: o.Placement, Logger: log}, n.replica, n.ctrlSM)
		srv.Register(n.grpc)
		n.stop = append(n.stop, srv.Stop)
	} else {
		if n.ctrl, err = ctrlerclient.New(o.Ctrler, sec.dialOptions(mtls.Exactly(mtls.Identity{Role: mtls.RoleCtrler}))...); err != nil {
			n.replica.Close()
			lis.Close()
			return nil, err
		}
		n.group = shardkv.NewGroup(shardkv.GroupConfig{Ctrler: n.ctrl, DialOptions: sec.dialOptions(mtls.AnyGroup), TrackLeaders: o.RESP != "" || o.RESPTLS != "", MaxValueBytes: o.MaxValueBytes,
			MigrateBytesPerSec: o.MigrateBytesPerSec, ReportEvery: o.ReportEvery, Logger: log}, n.replica, n.groupSM)
		n.group.Register(n.grpc)
		n.stop = append(n.stop, n.group.Stop, func() { n.ctrl.Close() })
		if o.RESP != "" || o.RESPTLS != "" {
			var lns [2]net.Listener
			for i, l := range []struct{ flag, addr string }{{"--resp", o.RESP}, {"--resp-tls", o.RESPTLS}} {
				if l.addr == "" {
					continue
				}
				if lns[i], err = net.Listen("tcp", l.addr); err != nil {
					if lns[0] != nil {
						lns[0].Close()
					}
					n.group.Stop()
					n.ctrl.Close()
					n.replica.Close()
					lis.Close()
					return nil, fmt.Errorf("%s: %w", l.flag, err)
				}
			}
			n.resp = resp.New(resp.Config{Advertise: o.RESPAdvertise, TLSAdvertise: o.RESPTLSAdvertise, Password: o.RequirePass, MaxClients: o.RESPMaxClients, MaxRequestBytes: o.RESPMaxRequestBytes,
				MaxBulkBytes: o.RESPMaxBulkBytes, InputBudgetBytes: o.RESPInputBudget, OutputBudgetBytes: o.RESPOutputBudget, IdleTimeout: o.RESPTimeout,
				MaxValueBytes: o.MaxValueBytes, WriteTimeout: o.RESPWriteTimeout, Logger: log.With("api", "resp"), OnCommands: n.clientRequest}, n.group)
			if lns[0] != nil {
				go n.resp.Serve(lns[0])
			}
			if lns[1] != nil {
				go n.resp.ServeTLS(lns[1], sec.src.ServerConfig(map[string]tls.ClientAuthType{
					"no": tls.NoClientCert, "optional": tls.VerifyClientCertIfGiven, "yes": tls.RequireAndVerifyClientCert}[o.RESPTLSAuthClients]))
			}
			// Closed first on shutdown (n.stop runs in reverse).
			n.stop = append(n.stop, func() { n.resp.Close() })
		}
		n.bgWG.Add(1)
		go n.followController(bg)
	}
	go func() { n.servedGRPC <- n.grpc.Serve(lis) }()
	if o.HTTP != "" {
		hl, err := net.Listen("tcp", o.HTTP)
		if err != nil {
			n.Shutdown()
			return nil, fmt.Errorf("--http: %w", err)
		}
		reg := prometheus.NewRegistry()
		reg.MustRegister(&collector{n: n})
		mux := http.NewServeMux()
		guard := newHTTPGuard(o, sec != nil, log)
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
		mux.HandleFunc("/readyz", n.readyz)
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		if o.PProf {
			mux.HandleFunc("/debug/pprof/", pprof.Index)
			mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
			mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		}
		n.http = &http.Server{Handler: guard.wrap(mux), ReadHeaderTimeout: 5 * time.Second}
		if sec != nil {
			// HTTPS with the replica's certificate; a client certificate
			// is optional (the kubelet's probes have none) and, if from an
			// admin, opens every path.
			hl = tls.NewListener(hl, sec.src.ServerConfig(tls.VerifyClientCertIfGiven))
		}
		go n.http.Serve(hl)
	}
	log.Info("replica serving", "listen", o.Listen, "advertise", o.Advertise, "http", o.HTTP, "fresh", fresh, "join", o.Join)
	return n, nil
}

// followController keeps the controller's latest config number, for
// readiness ("knows the latest config") and the logs.
func (n *Node) followController(ctx context.Context) {
	defer n.bgWG.Done()
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	for {
		qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		c, err := n.ctrl.QueryStale(qctx, -1) // a recent config is enough: no read barrier
		cancel()
		if err == nil {
			n.latestSeen.Store(c.Num)
			n.latestAt.Store(time.Now().UnixNano())
		} else if ctx.Err() == nil {
			n.log.Debug("controller unreachable", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Readiness lists the conditions /readyz waits for; empty means ready.
func (n *Node) Readiness() []string {
	var latest time.Time
	if at := n.latestAt.Load(); at != 0 {
		latest = time.Unix(0, at)
	}
	var stranded string
	if n.group != nil {
		stranded = n.group.Stranded()
	}
	return readiness(n.replica.Status(), readinessFacts{
		stopping: n.stopping.Load(), group: n.opts.Role == "group", latestConfigAt: latest, stranded: stranded,
		ctrlerUninitialized: n.opts.Role == "ctrler" && !n.ctrlSM.Initialized(), now: time.Now()})
}

// maxApplyLag is how far (in log entries) a ready replica's applied index
// may trail the leader's commit: the operator's bound for "caught up" too.
const maxApplyLag = 1000

// maxLeaderSilence is how long a ready follower may go without a message
// from its leader (heartbeats come every 100ms).
const maxLeaderSilence = 3 * time.Second

// readinessFacts are what readiness needs besides the replica's status.
type readinessFacts struct {
	stopping, group, ctrlerUninitialized bool
	latestConfigAt, now                  time.Time
	// stranded: why the group cannot step on (it lost its state), or "".
	stranded string
}

// readiness: ready means a member that follows a leader it hears from, with
// its log applied to within maxApplyLag of the leader's commit (not only of
// its own, which lags with it), and, for a data group, the latest config
// learned from the controller lately. The kubelet's readiness, and so the
// PodDisruptionBudgets, count only such replicas.
func readiness(st raftgroup.Status, f readinessFacts) []string {
	var waiting []string
	if f.stopping {
		waiting = append(waiting, "shutting down")
	}
	switch {
	case st.Role == "removed":
		waiting = append(waiting, "removed from its group")
	case st.Role == "joining":
		waiting = append(waiting, "not yet a member of its group (waiting to be added)")
	}
	switch {
	case st.Leader == 0:
		waiting = append(waiting, "no leader known")
	case st.HeardLeaderAgo > maxLeaderSilence:
		waiting = append(waiting, fmt.Sprintf("has not heard from its leader for %s", st.HeardLeaderAgo.Round(100*time.Millisecond)))
	}
	// LeaderCommit is never below the replica's own commit (raftgroup).
	if st.LeaderCommit > st.Applied+maxApplyLag || st.LeaderCommit == 0 {
		waiting = append(waiting, fmt.Sprintf("applying its log (applied %d of the leader's %d)", st.Applied, st.LeaderCommit))
	}
	if f.group && (f.latestConfigAt.IsZero() || f.now.Sub(f.latestConfigAt) > 10*time.Second) {
		waiting = append(waiting, "has not reached the controller to learn the latest config")
	}
	if f.ctrlerUninitialized {
		waiting = append(waiting, "cluster not initialised yet")
	}
	if f.stranded != "" {
		waiting = append(waiting, f.stranded)
	}
	return waiting
}

func (n *Node) readyz(w http.ResponseWriter, _ *http.Request) {
	waiting := n.Readiness()
	if len(waiting) > 0 {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintf(w, "not ready: %s\n", strings.Join(waiting, "; "))
		return
	}
	fmt.Fprintln(w, "ready")
}

// Replica returns the node's replica.
func (n *Node) Replica() *raftgroup.Replica { return n.replica }

// Shutdown stops the node gracefully: a leader first hands leadership to the
// most caught-up voter and keeps redirecting clients until the cluster's
// front ends know the new leader (handOverClients), in-flight requests
// finish (bounded), then everything closes.
func (n *Node) Shutdown() {
	n.stopping.Store(true)
	deadline := time.Now().Add(ShutdownTimeout)
	led := n.replica.IsLeader()
	if led {
		n.transferLeadership(time.Until(deadline) / 3)
	}
	// A replica that handed leadership over just before SIGTERM (an
	// operator's rolling update does) is in the same spot as one that led
	// until the new leader has reported and the front ends have polled.
	led = led || time.Since(n.replica.LedUntil()) < MaxReportEvery+handoverGrace
	n.handOverClients(deadline.Add(-3*time.Second), led)
	n.bgCancel()
	// GracefulStop refuses new requests and waits for every open stream,
	// including the Raft streams of peers and config watches, which only
	// end when the other side hangs up. So wait for the client requests in
	// flight (they may need those Raft streams to commit), then cut the
	// rest.
	done := make(chan struct{})
	go func() { n.grpc.GracefulStop(); close(done) }()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	tooLate := time.After(time.Until(deadline) - time.Second)
	idle := 0
drain:
	for {
		select {
		case <-done:
			break drain
		case <-tooLate:
			n.log.Warn("in-flight requests did not finish in time; stopping")
			n.grpc.Stop()
			break drain
		case <-tick.C:
			// Idle for a few ticks: requests already on the wire when
			// GracefulStop began have had time to show up.
			if n.inflight.Load() > 0 {
				idle = 0
			} else if idle++; idle >= 5 {
				n.grpc.Stop()
				break drain
			}
		}
	}
	if n.http != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		n.http.Shutdown(ctx)
		cancel()
	}
	for i := len(n.stop) - 1; i >= 0; i-- {
		n.stop[i]()
	}
	n.bgWG.Wait()
	if err := n.replica.Close(); err != nil {
		n.log.Error("closing replica", "err", err)
	}
	n.log.Info("replica stopped")
}

func (n *Node) transferLeadership(budget time.Duration) {
	st := n.replica.Status()
	var best uint64
	var match uint64
	for _, m := range st.Members {
		if m.ID != st.ID && !m.Learner && m.Match >= match {
			best, match = m.ID, m.Match
		}
	}
	if best == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	if err := n.replica.TransferLeadership(ctx, best); err != nil {
		n.log.Warn("leadership transfer before shutdown failed", "to", best, "err", err)
		return
	}
	n.log.Info("transferred leadership before shutdown", "to", best)
}

// Serve runs a node until ctx ends (SIGTERM), then shuts it down.
func Serve(ctx context.Context, o *Options, log *slog.Logger) error {
	n, err := Start(ctx, o, log)
	if err != nil {
		return err
	}
	var served error
	select {
	case <-ctx.Done():
	case served = <-n.servedGRPC:
		n.log.Error("gRPC server stopped", "err", served)
		served = fmt.Errorf("gRPC server stopped: %w", served)
	case <-n.replica.Done():
		n.log.Error("replica stopped on a fatal error", "err", n.replica.Err())
	}
	n.Shutdown()
	if err := n.replica.Err(); err != nil {
		return err
	}
	return served
}
