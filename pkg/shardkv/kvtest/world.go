// Package kvtest runs a whole shardkv cluster in one process for tests: a
// controller group and data groups of real replicas (badger, gRPC on
// loopback), with fault injection on Raft traffic (rgtest.Network) and on
// client and group-to-group RPCs (Faults).
package kvtest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardkv/shardkv/pkg/client"
	"github.com/shardkv/shardkv/pkg/ctrler"
	"github.com/shardkv/shardkv/pkg/ctrler/ctrlerclient"
	"github.com/shardkv/shardkv/pkg/raftgroup"
	"github.com/shardkv/shardkv/pkg/raftgroup/rgtest"
	"github.com/shardkv/shardkv/pkg/shardkv"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Faults injects failures into KV RPCs (client calls and group-to-group
// shard transfer) on the server side: a dropped request never runs; a
// dropped reply runs but the caller sees an error, as if the reply was lost.
type Faults struct {
	mu        sync.Mutex
	dropReq   float64
	dropReply float64
	maxDelay  time.Duration
	rng       *rand.Rand
	refuse    func(req any) bool
}

// Refuse makes every KV request for which refuse returns true fail as
// lost, until Refuse(nil).
func (f *Faults) Refuse(refuse func(req any) bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.refuse = refuse
}

func (f *Faults) refused(req any) bool {
	f.mu.Lock()
	r := f.refuse
	f.mu.Unlock()
	return r != nil && r(req)
}

// Set changes the fault rates.
func (f *Faults) Set(dropReq, dropReply float64, maxDelay time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.dropReq, f.dropReply, f.maxDelay = dropReq, dropReply, maxDelay
}

func (f *Faults) roll() (dropReq, dropReply bool, delay time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.rng == nil {
		f.rng = rand.New(rand.NewPCG(rand.Uint64(), 1))
	}
	dropReq = f.dropReq > 0 && f.rng.Float64() < f.dropReq
	dropReply = f.dropReply > 0 && f.rng.Float64() < f.dropReply
	if f.maxDelay > 0 {
		delay = time.Duration(f.rng.Int64N(int64(f.maxDelay)))
	}
	return
}

var errLost = status.Error(codes.Unavailable, "injected fault: message lost")

func isKV(method string) bool { return strings.HasPrefix(method, "/shardkv.v1.KV/") }

func (f *Faults) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if !isKV(info.FullMethod) {
		return h(ctx, req)
	}
	dropReq, dropReply, delay := f.roll()
	time.Sleep(delay)
	if dropReq || f.refused(req) {
		return nil, errLost
	}
	rep, err := h(ctx, req)
	if dropReply {
		return nil, errLost
	}
	return rep, err
}

func (f *Faults) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if !isKV(info.FullMethod) {
		return h(srv, ss)
	}
	dropReq, _, delay := f.roll()
	time.Sleep(delay)
	if dropReq {
		return errLost
	}
	return h(srv, &faultyStream{ServerStream: ss, f: f})
}

// faultyStream cuts a stream short at random (a lost chunk).
type faultyStream struct {
	grpc.ServerStream
	f *Faults
}

func (s *faultyStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if s.f.refused(m) {
		return errLost
	}
	return nil
}

func (s *faultyStream) SendMsg(m any) error {
	_, drop, delay := s.f.roll()
	time.Sleep(delay)
	if drop {
		return errLost
	}
	return s.ServerStream.SendMsg(m)
}

// World is a cluster: a controller group and data groups.
type World struct {
	t       testing.TB
	Shards  int
	Ctrler  *rgtest.Cluster
	Groups  map[uint64]*rgtest.Cluster
	Faults  *Faults
	admin   *ctrlerclient.Client
	cfg     Options
	mu      sync.Mutex
	servers map[string]func() // cluster/replica -> stop
	sms     map[string]*shardkv.StateMachine
	resp    map[string]string // "g<gid>/<id>" -> RESP address
	groups  map[string]*shardkv.Group
}

// Options tune a World.
type Options struct {
	Shards   int // default 16
	Replicas int // per group, default 3
	// RaftConfig adjusts every data-group replica (e.g. snapshot thresholds).
	RaftConfig func(*raftgroup.Config)
	// RESP, if set, starts a protocol front end (pkg/resp) for every data-group
	// replica on addr (stable across the replica's restarts; it is the
	// replica's advertised RESP address) and returns its stop function.
	RESP func(addr string, g *shardkv.Group) (stop func())
	// MigrateBytesPerSec is every data group's copy rate limit (0: none).
	MigrateBytesPerSec int64
	// CompactEvery is the controller's history compaction interval
	// (ctrler.ServerConfig.CompactEvery; default its own).
	CompactEvery time.Duration
}

// New starts a controller group (3 replicas); data groups start with StartGroup.
func New(t testing.TB, o Options) *World {
	if o.Shards == 0 {
		o.Shards = 16
	}
	if o.Replicas == 0 {
		o.Replicas = 3
	}
	w := &World{t: t, Shards: o.Shards, Groups: map[uint64]*rgtest.Cluster{}, Faults: &Faults{}, cfg: o,
		servers: map[string]func(){}, sms: map[string]*shardkv.StateMachine{},
		resp: map[string]string{}, groups: map[string]*shardkv.Group{}}
	w.Ctrler = rgtest.NewCluster(t, 3, rgtest.Options{
		GroupID: 1 << 40,
		NewSM:   func(uint64) raftgroup.StateMachine { return ctrler.NewStateMachine() },
		Register: func(id uint64, s *grpc.Server, r *raftgroup.Replica, sm raftgroup.StateMachine) {
			srv := ctrler.NewServer(ctrler.ServerConfig{Shards: o.Shards, CompactEvery: o.CompactEvery, Logger: rgtest.Logger()}, r, sm.(*ctrler.StateMachine))
			srv.Register(s)
			w.setStop(fmt.Sprintf("c/%d", id), srv.Stop)
		},
		OnCrash: func(id uint64) { w.stop(fmt.Sprintf("c/%d", id)) },
	})
	var err error
	if w.admin, err = ctrlerclient.New(w.CtrlerAddrs()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.admin.Close() })
	return w
}

func (w *World) setStop(name string, f func()) {
	w.mu.Lock()
	w.servers[name] = f
	w.mu.Unlock()
}

func (w *World) stop(name string) {
	w.mu.Lock()
	f := w.servers[name]
	delete(w.servers, name)
	w.mu.Unlock()
	if f != nil {
		f()
	}
}

// CtrlerAddrs are the controller replicas' addresses.
func (w *World) CtrlerAddrs() []string {
	var out []string
	for _, id := range w.Ctrler.IDs() {
		out = append(out, w.Ctrler.Nodes[id].Addr)
	}
	return out
}

// StartGroup starts data group gid (not yet joined).
func (w *World) StartGroup(gid uint64) *rgtest.Cluster {
	w.t.Helper()
	ctrl, err := ctrlerclient.New(w.CtrlerAddrs())
	if err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(func() { ctrl.Close() })
	g := rgtest.NewCluster(w.t, w.cfg.Replicas, rgtest.Options{
		GroupID: gid,
		NewSM:   func(uint64) raftgroup.StateMachine { return shardkv.NewStateMachine(gid) },
		Config: func(c *raftgroup.Config) {
			if w.cfg.RESP != nil {
				// As pkg/node: the engine reports the RESP address it is told.
				addr := w.RESPAddr(gid, c.ID)
				c.AnnotateStatus = func(st *shardkvpb.MemberStatus) { st.RespAddr = addr }
			}
			if w.cfg.RaftConfig != nil {
				w.cfg.RaftConfig(c)
			}
		},
		ServerOptions: []grpc.ServerOption{grpc.ChainUnaryInterceptor(w.Faults.unary), grpc.ChainStreamInterceptor(w.Faults.stream)},
		Register: func(id uint64, s *grpc.Server, r *raftgroup.Replica, sm raftgroup.StateMachine) {
			name := fmt.Sprintf("g%d/%d", gid, id)
			respAddr := w.RESPAddr(gid, id)
			gc := shardkv.GroupConfig{Ctrler: ctrl, TrackLeaders: w.cfg.RESP != nil, ReportEvery: 200 * time.Millisecond, ExpireEvery: time.Second,
				ExpireKeysEvery: 100 * time.Millisecond, MigrateBytesPerSec: w.cfg.MigrateBytesPerSec, Logger: rgtest.Logger().With("gid", gid, "replica", id)}
			grp := shardkv.NewGroup(gc, r, sm.(*shardkv.StateMachine))
			grp.Register(s)
			stopRESP := func() {}
			if w.cfg.RESP != nil {
				stopRESP = w.cfg.RESP(respAddr, grp)
			}
			w.mu.Lock()
			w.sms[name] = sm.(*shardkv.StateMachine)
			w.groups[name] = grp
			w.mu.Unlock()
			w.setStop(name, func() { stopRESP(); grp.Stop() })
		},
		OnCrash: func(id uint64) { w.stop(fmt.Sprintf("g%d/%d", gid, id)) },
	})
	w.mu.Lock()
	w.Groups[gid] = g
	w.mu.Unlock()
	return g
}

// SM returns the state machine of replica id of group gid (nil if down).
func (w *World) SM(gid, id uint64) *shardkv.StateMachine {
	if w.Groups[gid].Replica(id) == nil {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.sms[fmt.Sprintf("g%d/%d", gid, id)]
}

// Group returns the service of replica id of group gid (nil if down).
func (w *World) Group(gid, id uint64) *shardkv.Group {
	if w.Groups[gid].Replica(id) == nil {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.groups[fmt.Sprintf("g%d/%d", gid, id)]
}

// RESPAddr is the RESP address of replica id of group gid ("" unless
// Options.RESP is set). It is picked once and kept across restarts.
func (w *World) RESPAddr(gid, id uint64) string {
	if w.cfg.RESP == nil {
		return ""
	}
	name := fmt.Sprintf("g%d/%d", gid, id)
	w.mu.Lock()
	defer w.mu.Unlock()
	if a, ok := w.resp[name]; ok {
		return a
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		w.t.Fatal(err)
	}
	a := ln.Addr().String()
	ln.Close()
	w.resp[name] = a
	return a
}

// GroupSpec describes group gid for a Join.
func (w *World) GroupSpec(gid uint64) *shardkvpb.Group {
	g := &shardkvpb.Group{Gid: gid}
	for _, id := range w.Groups[gid].IDs() {
		g.Servers = append(g.Servers, &shardkvpb.Server{Id: id, Addr: w.Groups[gid].Nodes[id].Addr, RespAddr: w.RESPAddr(gid, id)})
	}
	return g
}

// Join joins groups (started with StartGroup) and returns the new config.
func (w *World) Join(gids ...uint64) *shardkvpb.Config {
	w.t.Helper()
	var specs []*shardkvpb.Group
	for _, gid := range gids {
		specs = append(specs, w.GroupSpec(gid))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conf, err := w.admin.Join(ctx, specs...)
	if err != nil {
		w.t.Fatalf("join %v: %v", gids, err)
	}
	return conf
}

// Leave removes groups and returns the new config.
func (w *World) Leave(gids ...uint64) *shardkvpb.Config {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conf, err := w.admin.Leave(ctx, gids...)
	if err != nil {
		w.t.Fatalf("leave %v: %v", gids, err)
	}
	return conf
}

// Admin is a controller client.
func (w *World) Admin() *ctrlerclient.Client { return w.admin }

// Client returns a new data client.
func (w *World) Client() *client.Client {
	w.t.Helper()
	c, err := client.New(w.CtrlerAddrs())
	if err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(func() { c.Close() })
	return c
}

// StopGroup crashes every replica of gid.
func (w *World) StopGroup(gid uint64) {
	for _, id := range w.Groups[gid].IDs() {
		w.Groups[gid].Crash(id)
	}
}

// RestartGroup starts every replica of gid again on its data dir.
func (w *World) RestartGroup(gid uint64) {
	for _, id := range w.Groups[gid].IDs() {
		w.Groups[gid].Start(id)
	}
}

// WaitSettled waits until every running group has applied the controller's
// latest config and no shard is in motion.
func (w *World) WaitSettled(timeout time.Duration) *shardkvpb.Config {
	w.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		latest, err := w.admin.Query(ctx, -1)
		cancel()
		if err == nil && w.settled(latest.Num) {
			return latest
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("cluster did not settle within %v: %s", timeout, w.Describe())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (w *World) settled(num uint64) bool {
	for gid, g := range w.Groups {
		for _, id := range g.IDs() {
			sm := w.SM(gid, id)
			if sm == nil {
				continue
			}
			if sm.Config().Num != num || !sm.Stable() {
				return false
			}
		}
	}
	return true
}

// Describe summarises every running replica's config and moving shards.
func (w *World) Describe() string {
	var b strings.Builder
	for gid, g := range w.Groups {
		for _, id := range g.IDs() {
			sm := w.SM(gid, id)
			if sm == nil {
				fmt.Fprintf(&b, "[g%d/%d down] ", gid, id)
				continue
			}
			fmt.Fprintf(&b, "[g%d/%d config %d", gid, id, sm.Config().Num)
			for s, m := range sm.Shards() {
				if m.State != shardkv.Serving {
					fmt.Fprintf(&b, " %d:%v", s, m)
				}
			}
			b.WriteString("] ")
		}
	}
	return b.String()
}
