package ctrler_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/shardkv/shardkv/pkg/ctrler"
	"github.com/shardkv/shardkv/pkg/ctrler/ctrlerclient"
	"github.com/shardkv/shardkv/pkg/raftgroup"
	"github.com/shardkv/shardkv/pkg/raftgroup/rgtest"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
)

type ctrlCluster struct {
	*rgtest.Cluster
	mu      sync.Mutex
	servers map[uint64]*ctrler.Server
}

func newCtrlCluster(t testing.TB, n, shards int, strategy string, cfg func(*raftgroup.Config)) *ctrlCluster {
	t.Helper()
	cc := &ctrlCluster{servers: map[uint64]*ctrler.Server{}}
	cc.Cluster = rgtest.NewCluster(t, n, rgtest.Options{
		NewSM:  func(uint64) raftgroup.StateMachine { return ctrler.NewStateMachine() },
		Config: cfg,
		Register: func(id uint64, s *grpc.Server, r *raftgroup.Replica, sm raftgroup.StateMachine) {
			srv := ctrler.NewServer(ctrler.ServerConfig{Shards: shards, Placement: strategy, CompactEvery: 200 * time.Millisecond, Logger: rgtest.Logger()}, r, sm.(*ctrler.StateMachine))
			srv.Register(s)
			cc.mu.Lock()
			cc.servers[id] = srv
			cc.mu.Unlock()
		},
		OnCrash: func(id uint64) {
			cc.mu.Lock()
			srv := cc.servers[id]
			delete(cc.servers, id)
			cc.mu.Unlock()
			if srv != nil {
				srv.Stop()
			}
		},
	})
	return cc
}

func (cc *ctrlCluster) addrs() []string {
	var out []string
	for _, id := range cc.IDs() {
		out = append(out, cc.Nodes[id].Addr)
	}
	return out
}

func (cc *ctrlCluster) client(t *testing.T) *ctrlerclient.Client {
	t.Helper()
	c, err := ctrlerclient.New(cc.addrs())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func (cc *ctrlCluster) sm(id uint64) *ctrler.StateMachine {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if nd := cc.Nodes[id]; nd != nil && nd.Replica != nil {
		return nd.SM.(*ctrler.StateMachine)
	}
	return nil
}

func group(gid uint64, servers ...string) *shardkvpb.Group {
	g := &shardkvpb.Group{Gid: gid}
	for i, a := range servers {
		g.Servers = append(g.Servers, &shardkvpb.Server{Id: uint64(i + 1), Addr: a})
	}
	if len(servers) == 0 {
		g.Servers = []*shardkvpb.Server{{Id: 1, Addr: fmt.Sprintf("g%d-1:7000", gid)}}
	}
	return g
}

func ctx(t *testing.T, d time.Duration) context.Context {
	c, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return c
}

func counts(c *shardkvpb.Config) map[uint64]int {
	m := map[uint64]int{}
	for _, g := range c.Shards {
		m[g]++
	}
	return m
}

func checkBalanced(t *testing.T, c *shardkvpb.Config) {
	t.Helper()
	m := counts(c)
	if len(c.Groups) == 0 {
		if m[0] != len(c.Shards) {
			t.Fatalf("config %d: no groups but shards owned: %v", c.Num, m)
		}
		return
	}
	lo, hi := len(c.Shards), 0
	for _, g := range c.Groups {
		lo, hi = min(lo, m[g.Gid]), max(hi, m[g.Gid])
	}
	if hi-lo > 1 || m[0] != 0 {
		t.Fatalf("config %d unbalanced: %v", c.Num, m)
	}
}

// reportCaughtUp sends, for each target gid of moves, the report a target
// group sends once its pre-copy of each of them has caught up.
func reportCaughtUp(t *testing.T, cx context.Context, c *ctrlerclient.Client, configNum uint64, moves []*shardkvpb.PlannedMove) {
	t.Helper()
	reports := map[uint64]*shardkvpb.GroupReport{}
	var gids []uint64
	for _, m := range moves {
		r := reports[m.ToGid]
		if r == nil {
			r = &shardkvpb.GroupReport{Gid: m.ToGid, LeaderId: 1, LeaderAddr: fmt.Sprintf("g%d-1:7000", m.ToGid), ConfigNum: configNum}
			reports[m.ToGid] = r
			gids = append(gids, m.ToGid)
		}
		r.Shards = append(r.Shards, &shardkvpb.ShardState{Shard: m.Shard, State: ctrler.PreCopyState, ConfigNum: m.SinceConfig,
			PeerGid: m.FromGid, Phase: "delta", CaughtUp: true})
	}
	slices.Sort(gids)
	for _, gid := range gids {
		if _, err := c.Report(cx, reports[gid]); err != nil {
			t.Fatal(err)
		}
	}
}

// cutOverAll plays the target of every planned move: it reports each as
// caught up until the controller leader has cut them all over, and
// returns the latest config, which plans nothing. Its reports say their
// group applied no config (0), so they never let history be compacted.
func cutOverAll(t *testing.T, cx context.Context, c *ctrlerclient.Client) *shardkvpb.Config {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		latest, err := c.Query(cx, -1)
		if err != nil {
			t.Fatal(err)
		}
		if len(latest.Moves) == 0 {
			return latest
		}
		if time.Now().After(deadline) {
			t.Fatalf("planned moves never cut over: %v", latest.Moves)
		}
		reportCaughtUp(t, cx, c, 0, latest.Moves)
		time.Sleep(50 * time.Millisecond)
	}
}

// checkPlansOnly checks that next hands no shard over (owners as in prev)
// and plans moves only as ok allows.
func checkPlansOnly(t *testing.T, prev, next *shardkvpb.Config, ok func(m *shardkvpb.PlannedMove) bool) {
	t.Helper()
	if !slices.Equal(prev.Shards, next.Shards) {
		t.Fatalf("config %d handed shards over at once: %v -> %v", next.Num, prev.Shards, next.Shards)
	}
	for _, m := range next.Moves {
		if !ok(m) {
			t.Fatalf("config %d plans %v", next.Num, m)
		}
	}
}

// appendNew appends the configs made since the last in history.
func appendNew(t *testing.T, cx context.Context, c *ctrlerclient.Client, history []*shardkvpb.Config) []*shardkvpb.Config {
	t.Helper()
	latest, err := c.Query(cx, -1)
	if err != nil {
		t.Fatal(err)
	}
	for n := history[len(history)-1].Num + 1; n <= latest.Num; n++ {
		conf, err := c.Query(cx, int64(n))
		if err != nil {
			t.Fatal(err)
		}
		history = append(history, conf)
	}
	return history
}

func TestHistorySurvivesRestart(t *testing.T) {
	cc := newCtrlCluster(t, 3, 16, "balanced", nil)
	c := cc.client(t)
	cx := ctx(t, 30*time.Second)
	var history []*shardkvpb.Config
	c0, err := c.Query(cx, 0)
	if err != nil {
		t.Fatal(err)
	}
	history = append(history, c0)
	for gid := uint64(1); gid <= 5; gid++ {
		conf, err := c.Join(cx, group(gid))
		if err != nil {
			t.Fatal(err)
		}
		history = append(history, conf)
		checkBalanced(t, cutOverAll(t, cx, c))
		history = appendNew(t, cx, c, history)
	}
	conf, err := c.Leave(cx, 2, 4)
	if err != nil {
		t.Fatal(err)
	}
	history = append(history, conf)
	conf, err = c.Move(cx, 3, 5)
	if err != nil {
		t.Fatal(err)
	}
	history = append(history, conf)
	checkBalanced(t, cutOverAll(t, cx, c))
	history = appendNew(t, cx, c, history)
	if conf := history[len(history)-1]; len(conf.Groups) != 3 || conf.Shards[3] != 5 {
		t.Fatalf("after the leave and the move were cut over: %v", conf)
	}
	for i, h := range history {
		if h.Num != uint64(i) {
			t.Fatalf("history[%d] has num %d", i, h.Num)
		}
	}
	check := func(when string) {
		for _, h := range history {
			got, err := c.Query(cx, int64(h.Num))
			if err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(got, h) {
				t.Fatalf("%s: Query(%d) = %v, want %v", when, h.Num, got, h)
			}
		}
		for _, n := range []int64{-1, 1000} {
			got, err := c.Query(cx, n)
			if err != nil || !proto.Equal(got, history[len(history)-1]) {
				t.Fatalf("%s: Query(%d) = %v, %v; want the latest", when, n, got, err)
			}
		}
	}
	check("before restart")
	for _, id := range cc.IDs() {
		cc.Crash(id)
	}
	for _, id := range cc.IDs() {
		cc.Start(id)
	}
	check("after all replicas restarted")
}

func TestBadInputLeavesConfigUnchanged(t *testing.T) {
	cc := newCtrlCluster(t, 3, 16, "balanced", nil)
	c := cc.client(t)
	cx := ctx(t, 30*time.Second)
	if _, err := c.Join(cx, group(1), group(2)); err != nil {
		t.Fatal(err)
	}
	before, _ := c.Query(cx, -1)
	bad := []struct {
		name string
		call func() error
	}{
		{"gid 0", func() error { _, err := c.Join(cx, group(0)); return err }},
		{"empty server list", func() error { _, err := c.Join(cx, &shardkvpb.Group{Gid: 7}); return err }},
		{"server id 0", func() error {
			_, err := c.Join(cx, &shardkvpb.Group{Gid: 7, Servers: []*shardkvpb.Server{{Id: 0, Addr: "x:1"}}})
			return err
		}},
		{"leave unknown gid", func() error { _, err := c.Leave(cx, 9); return err }},
		{"leave everyone", func() error { _, err := c.Leave(cx, 1, 2); return err }},
		{"move to unknown gid", func() error { _, err := c.Move(cx, 1, 9); return err }},
		{"move shard out of range", func() error { _, err := c.Move(cx, 16, 1); return err }},
		{"move negative shard", func() error { _, err := c.Move(cx, -1, 1); return err }},
		{"unpin unpinned shard", func() error { _, err := c.Unpin(cx, 3); return err }},
	}
	for _, b := range bad {
		err := b.call()
		if err == nil || !ctrlerclient.IsRefused(err) {
			t.Fatalf("%s: got %v, want a refusal", b.name, err)
		}
		t.Logf("%s: %v", b.name, err)
		after, _ := c.Query(cx, -1)
		if !proto.Equal(before, after) {
			t.Fatalf("%s changed the config: %v -> %v", b.name, before, after)
		}
	}
	// Join of an existing gid with the same servers changes nothing; with
	// new servers it updates them without moving shards.
	same, err := c.Join(cx, group(1))
	if err != nil || same.Num != before.Num {
		t.Fatalf("re-join with the same servers: %v, %v (want config %d)", same, err, before.Num)
	}
	upd, err := c.Join(cx, group(1, "new-a:1", "new-b:1"))
	if err != nil {
		t.Fatal(err)
	}
	if upd.Num != before.Num+1 || !slices.Equal(upd.Shards, before.Shards) || len(upd.Groups[0].Servers) != 2 || upd.Groups[0].Servers[1].Addr != "new-b:1" {
		t.Fatalf("address update: got %v", upd)
	}
}

func TestMinimalMovementThroughController(t *testing.T) {
	cc := newCtrlCluster(t, 3, 64, "balanced", nil)
	c := cc.client(t)
	cx := ctx(t, 60*time.Second)
	prev, _ := c.Query(cx, -1)
	var live []uint64
	for gid := uint64(1); gid <= 12; gid++ {
		conf, err := c.Join(cx, group(gid))
		if err != nil {
			t.Fatal(err)
		}
		live = append(live, gid)
		if gid > 1 {
			checkPlansOnly(t, prev, conf, func(m *shardkvpb.PlannedMove) bool { return m.ToGid == gid })
		}
		conf = cutOverAll(t, cx, c)
		checkBalanced(t, conf)
		for s := range conf.Shards {
			if conf.Shards[s] != prev.Shards[s] && conf.Shards[s] != gid {
				t.Fatalf("join %d moved shard %d from %d to %d", gid, s, prev.Shards[s], conf.Shards[s])
			}
		}
		prev = conf
	}
	rng := rand.New(rand.NewPCG(1, 2))
	rng.Shuffle(len(live), func(i, j int) { live[i], live[j] = live[j], live[i] })
	for _, gid := range live[:len(live)-1] {
		conf, err := c.Leave(cx, gid)
		if err != nil {
			t.Fatal(err)
		}
		checkPlansOnly(t, prev, conf, func(m *shardkvpb.PlannedMove) bool { return m.FromGid == gid })
		if i := slices.IndexFunc(conf.Groups, func(g *shardkvpb.Group) bool { return g.Gid == gid }); i < 0 || !conf.Groups[i].Leaving {
			t.Fatalf("leave %d: the group is not kept as leaving: %v", gid, conf.Groups)
		}
		conf = cutOverAll(t, cx, c)
		if slices.ContainsFunc(conf.Groups, func(g *shardkvpb.Group) bool { return g.Gid == gid }) {
			t.Fatalf("leave %d: the group outlived its last shard's cut-over: %v", gid, conf.Groups)
		}
		checkBalanced(t, conf)
		for s := range conf.Shards {
			if conf.Shards[s] != prev.Shards[s] && prev.Shards[s] != gid {
				t.Fatalf("leave %d moved shard %d of group %d", gid, s, prev.Shards[s])
			}
		}
		prev = conf
	}
}

func TestConcurrentClients(t *testing.T) {
	cc := newCtrlCluster(t, 3, 256, "balanced", nil)
	cx := ctx(t, 60*time.Second)
	var wg sync.WaitGroup
	errs := make(chan error, 10)
	for i := range 10 {
		wg.Add(1)
		go func(gid uint64) {
			defer wg.Done()
			c := cc.client(t)
			for _, step := range []func() error{
				func() error { _, err := c.Join(cx, group(gid+1000)); return err },
				func() error { _, err := c.Join(cx, group(gid)); return err },
				func() error { _, err := c.Leave(cx, gid+1000); return err },
			} {
				if err := step(); err != nil {
					errs <- fmt.Errorf("client %d: %w", gid, err)
					return
				}
			}
		}(uint64(i + 1))
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	conf, err := cc.client(t).Query(cx, -1)
	if err != nil {
		t.Fatal(err)
	}
	if conf.Num != 30 {
		t.Fatalf("30 mutations made %d configs", conf.Num)
	}
	conf = cutOverAll(t, cx, cc.client(t))
	var gids []uint64
	for _, g := range conf.Groups {
		gids = append(gids, g.Gid)
	}
	if !slices.Equal(gids, []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}) {
		t.Fatalf("final groups %v", gids)
	}
	checkBalanced(t, conf)
}

// replicasAgree waits until every running replica holds the same latest
// config, and returns it.
func replicasAgree(t *testing.T, cc *ctrlCluster) *shardkvpb.Config {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var confs []*shardkvpb.Config
		for _, id := range cc.IDs() {
			r := cc.Replica(id)
			if r == nil {
				continue
			}
			cx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			err := r.ReadIndex(cx)
			cancel()
			if err != nil {
				confs = nil
				break
			}
			conf, err := cc.sm(id).Config(-1)
			if err != nil {
				t.Fatal(err)
			}
			confs = append(confs, conf)
		}
		agree := len(confs) > 0
		for _, c := range confs {
			agree = agree && proto.Equal(c, confs[0])
		}
		if agree {
			return confs[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("replicas disagree: %v", confs)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestLeaderFailover(t *testing.T) {
	for _, strategy := range []string{"balanced", "consistent-hash"} {
		t.Run(strategy, func(t *testing.T) {
			cc := newCtrlCluster(t, 3, 64, strategy, nil)
			c := cc.client(t)
			cx := ctx(t, 60*time.Second)
			var last *shardkvpb.Config
			for gid := uint64(1); gid <= 6; gid++ {
				if gid == 4 {
					cc.Crash(cc.WaitLeader(5 * time.Second)) // mid-stream
				}
				conf, err := c.Join(cx, group(gid))
				if err != nil {
					t.Fatal(err)
				}
				last = conf
			}
			leader := cc.WaitLeader(5 * time.Second)
			got, _ := cc.sm(leader).Config(-1)
			if !proto.Equal(got, last) {
				t.Fatalf("new leader's latest %v, want %v", got, last)
			}
			for _, id := range cc.IDs() {
				cc.Start(id)
			}
			if _, err := c.Leave(cx, 2); err != nil {
				t.Fatal(err)
			}
			if _, err := c.Join(cx, group(7)); err != nil {
				t.Fatal(err)
			}
			agreed := replicasAgree(t, cc)
			if agreed.Num != last.Num+2 {
				t.Fatalf("agreed config %d, want %d", agreed.Num, last.Num+2)
			}
			cutOverAll(t, cx, c)
			agreed = replicasAgree(t, cc)
			if strategy == "balanced" {
				checkBalanced(t, agreed)
			}
		})
	}
}

// rawClient calls the Controller service directly, to replay requests with
// the same client id and sequence number (a reply lost in the network).
func rawClient(t *testing.T, addr string) shardkvpb.ControllerClient {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return shardkvpb.NewControllerClient(conn)
}

func TestRetriesApplyExactlyOnce(t *testing.T) {
	cc := newCtrlCluster(t, 3, 16, "balanced", nil)
	cx := ctx(t, 30*time.Second)
	leader := cc.WaitLeader(5 * time.Second)
	for !cc.sm(leader).Initialized() {
		time.Sleep(20 * time.Millisecond)
	}
	raw := rawClient(t, cc.Nodes[leader].Addr)
	join := &shardkvpb.JoinRequest{ClientId: 42, Seq: 1, Groups: []*shardkvpb.Group{group(1)}}
	first, err := raw.Join(cx, join)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		again, err := raw.Join(cx, join)
		if err != nil || !proto.Equal(again.Config, first.Config) {
			t.Fatalf("retried join: %v, %v; want %v", again, err, first.Config)
		}
	}
	// A different client joining another group, then our Move retried.
	if _, err := raw.Join(cx, &shardkvpb.JoinRequest{ClientId: 43, Seq: 1, Groups: []*shardkvpb.Group{group(2)}}); err != nil {
		t.Fatal(err)
	}
	move := &shardkvpb.MoveRequest{ClientId: 42, Seq: 2, Shard: 0, Gid: 2}
	m1, err := raw.Move(cx, move)
	if err != nil {
		t.Fatal(err)
	}
	m2, err := raw.Move(cx, move)
	if err != nil || !proto.Equal(m1.Config, m2.Config) {
		t.Fatalf("retried move: %v, %v", m2, err)
	}
	latest, _ := raw.Query(cx, &shardkvpb.QueryRequest{Num: -1})
	if latest.Num != 3 {
		t.Fatalf("3 distinct mutations (plus retries) made config %d, want 3", latest.Num)
	}
	// A refused request is remembered as refused.
	bad := &shardkvpb.LeaveRequest{ClientId: 42, Seq: 3, Gids: []uint64{99}}
	_, e1 := raw.Leave(cx, bad)
	_, e2 := raw.Leave(cx, bad)
	if !ctrlerclient.IsRefused(e1) || !ctrlerclient.IsRefused(e2) {
		t.Fatalf("refusals: %v / %v", e1, e2)
	}
	// A follower refuses mutations with a leader hint.
	for _, id := range cc.IDs() {
		if id == leader {
			continue
		}
		_, err := rawClient(t, cc.Nodes[id].Addr).Join(cx, &shardkvpb.JoinRequest{ClientId: 44, Seq: 1, Groups: []*shardkvpb.Group{group(3)}})
		hid, haddr, ok := shardkvpb.LeaderHint(err)
		if !ok || hid != leader || haddr != cc.Nodes[leader].Addr {
			t.Fatalf("follower %d: %v (hint %d %q)", id, err, hid, haddr)
		}
		break
	}
}

func TestPinsAndUnpin(t *testing.T) {
	cc := newCtrlCluster(t, 3, 16, "balanced", nil)
	c := cc.client(t)
	cx := ctx(t, 30*time.Second)
	if _, err := c.Join(cx, group(1), group(2)); err != nil {
		t.Fatal(err)
	}
	conf, err := c.Move(cx, 0, 2)
	if err != nil {
		t.Fatal(err)
	}
	if conf.Shards[0] != 1 || len(conf.Moves) != 1 || !proto.Equal(conf.Moves[0], &shardkvpb.PlannedMove{Shard: 0, FromGid: 1, ToGid: 2, SinceConfig: conf.Num}) {
		t.Fatalf("move: not planned: %v", conf)
	}
	if conf = cutOverAll(t, cx, c); conf.Shards[0] != 2 {
		t.Fatalf("move cut over: shard 0 on %d", conf.Shards[0])
	}
	if _, err = c.Join(cx, group(3)); err != nil {
		t.Fatal(err)
	}
	conf = cutOverAll(t, cx, c)
	if conf.Shards[0] != 2 {
		t.Fatalf("pin not honoured by a later join: shard 0 on %d", conf.Shards[0])
	}
	// Pinned shards are out of the balance count: the other 15 are balanced.
	m := map[uint64]int{}
	for s, g := range conf.Shards {
		if s != 0 {
			m[g]++
		}
	}
	if m[1] < 5 || m[1] > 5 || m[2] != 5 || m[3] != 5 {
		t.Fatalf("unpinned shards not balanced: %v", m)
	}
	// The pin ends when its group leaves; the group stays, leaving, until
	// its last shard is cut over.
	conf, err = c.Leave(cx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(conf.Pins) != 0 || len(conf.Groups) != 3 || !conf.Groups[1].Leaving || conf.Shards[0] != 2 {
		t.Fatalf("leave: %v", conf)
	}
	conf = cutOverAll(t, cx, c)
	if len(conf.Pins) != 0 || conf.Shards[0] == 2 || len(conf.Groups) != 2 {
		t.Fatalf("pin or group outlived the leave: %v", conf)
	}
	if _, err := c.Move(cx, 5, 3); err != nil {
		t.Fatal(err)
	}
	conf, err = c.Unpin(cx, 5)
	if err != nil || len(conf.Pins) != 0 {
		t.Fatalf("unpin: %v %v", conf, err)
	}
	checkBalanced(t, cutOverAll(t, cx, c))
}

// The leader cuts over a planned move once its target's fresh report says
// the pre-copy caught up for that very plan, and no sooner.
func TestLeaderCutsOverCaughtUpMoves(t *testing.T) {
	cc := newCtrlCluster(t, 3, 8, "balanced", nil)
	c := cc.client(t)
	cx := ctx(t, 30*time.Second)
	if _, err := c.Join(cx, group(1)); err != nil {
		t.Fatal(err)
	}
	planned, err := c.Join(cx, group(2))
	if err != nil {
		t.Fatal(err)
	}
	if len(planned.Moves) != 4 || ctrlerOwned(planned, 1) != 8 {
		t.Fatalf("join: %v", planned)
	}
	moves := planned.Moves
	state := func(m *shardkvpb.PlannedMove) *shardkvpb.ShardState {
		return &shardkvpb.ShardState{Shard: m.Shard, State: ctrler.PreCopyState, ConfigNum: m.SinceConfig, PeerGid: m.FromGid, Phase: "delta", CaughtUp: true}
	}
	send := func(states ...*shardkvpb.ShardState) {
		t.Helper()
		if _, err := c.Report(cx, &shardkvpb.GroupReport{Gid: 2, LeaderId: 1, LeaderAddr: "g2-1:7000", ConfigNum: planned.Num, Shards: states}); err != nil {
			t.Fatal(err)
		}
	}
	// Reports that do not say "caught up for this plan" cut nothing over.
	notYet := []*shardkvpb.ShardState{}
	for i, m := range moves {
		st := state(m)
		switch i {
		case 0:
			st.CaughtUp, st.Phase, st.LagEntries = false, "snapshot", 40
		case 1:
			st.PeerGid = 3
		case 2:
			st.ConfigNum = m.SinceConfig - 1
		case 3:
			st.State = "Pulling"
		}
		notYet = append(notYet, st)
	}
	for range 6 {
		send(notYet...)
		time.Sleep(100 * time.Millisecond)
	}
	// A report of the source saying its shard caught up is not the target's.
	if _, err := c.Report(cx, &shardkvpb.GroupReport{Gid: 1, LeaderId: 1, ConfigNum: planned.Num, Shards: []*shardkvpb.ShardState{state(moves[0])}}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if latest, _ := c.Query(cx, -1); latest.Num != planned.Num {
		t.Fatalf("cut over without a caught-up report: %v", latest)
	}
	// Two caught up: one cut-over config hands over those two.
	send(state(moves[0]), state(moves[1]), notYet[2])
	first := waitConfig(t, cx, c, planned.Num+1)
	want := slices.Clone(planned.Shards)
	want[moves[0].Shard], want[moves[1].Shard] = 2, 2
	if !slices.Equal(first.Shards, want) || len(first.Moves) != 2 || !proto.Equal(first.Moves[0], moves[2]) || !proto.Equal(first.Moves[1], moves[3]) {
		t.Fatalf("first cut-over: %v, want shards %v", first, want)
	}
	// The rest.
	send(state(moves[0]), state(moves[1]), state(moves[2]), state(moves[3]))
	second := waitConfig(t, cx, c, planned.Num+2)
	if ctrlerOwned(second, 2) != 4 || len(second.Moves) != 0 {
		t.Fatalf("second cut-over: %v", second)
	}
	// A stale report (plans gone) makes nothing more.
	send(state(moves[0]))
	time.Sleep(300 * time.Millisecond)
	if latest, _ := c.Query(cx, -1); latest.Num != second.Num {
		t.Fatalf("a config after the last cut-over: %v", latest)
	}
	// A report older than 2 s does not count: the target may have lost
	// its copy since (a restart, a new leader that has not caught up).
	early := &shardkvpb.ShardState{Shard: 0, State: ctrler.PreCopyState, ConfigNum: 1 << 40, PeerGid: 1, CaughtUp: true}
	send(early)
	time.Sleep(2200 * time.Millisecond)
	moved, err := c.Move(cx, 0, 2)
	if err != nil || len(moved.Moves) != 1 || moved.Moves[0].FromGid != 1 {
		t.Fatalf("move: %v %v", moved, err)
	}
	time.Sleep(400 * time.Millisecond)
	if latest, _ := c.Query(cx, -1); latest.Num != moved.Num {
		t.Fatalf("cut over on a stale report: %v", latest)
	}
	send(early)
	if got := waitConfig(t, cx, c, moved.Num+1); got.Shards[0] != 2 || len(got.Moves) != 0 {
		t.Fatalf("move cut over: %v", got)
	}
}

func ctrlerOwned(c *shardkvpb.Config, gid uint64) int {
	n := 0
	for _, g := range c.Shards {
		if g == gid {
			n++
		}
	}
	return n
}

// waitConfig waits for config num to exist and returns it.
func waitConfig(t *testing.T, cx context.Context, c *ctrlerclient.Client, num uint64) *shardkvpb.Config {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		latest, err := c.Query(cx, -1)
		if err != nil {
			t.Fatal(err)
		}
		if latest.Num >= num {
			conf, err := c.Query(cx, int64(num))
			if err != nil {
				t.Fatal(err)
			}
			return conf
		}
		if time.Now().After(deadline) {
			t.Fatalf("no config %d (latest %v)", num, latest)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestWatchDeliversEveryConfig(t *testing.T) {
	cc := newCtrlCluster(t, 3, 16, "balanced", nil)
	c := cc.client(t)
	cx := ctx(t, 30*time.Second)
	wctx, cancel := context.WithCancel(cx)
	defer cancel()
	ch := c.Watch(wctx, 0)
	for gid := uint64(1); gid <= 4; gid++ {
		if _, err := c.Join(cx, group(gid)); err != nil {
			t.Fatal(err)
		}
	}
	cc.Crash(cc.WaitLeader(5 * time.Second)) // the watch survives a failover
	if _, err := c.Leave(cx, 1); err != nil {
		t.Fatal(err)
	}
	for want := uint64(0); want <= 5; want++ {
		select {
		case conf := <-ch:
			if conf.Num != want {
				t.Fatalf("watch delivered config %d, want %d", conf.Num, want)
			}
		case <-cx.Done():
			t.Fatalf("watch stalled before config %d", want)
		}
	}
}

func TestReportsStatusAndCompaction(t *testing.T) {
	cc := newCtrlCluster(t, 3, 16, "balanced", nil)
	c := cc.client(t)
	cx := ctx(t, 30*time.Second)
	for gid := uint64(1); gid <= 3; gid++ {
		if _, err := c.Join(cx, group(gid)); err != nil {
			t.Fatal(err)
		}
	}
	// Nothing is compacted while some group has not reported.
	time.Sleep(500 * time.Millisecond)
	if _, err := c.Query(cx, 0); err != nil {
		t.Fatalf("config 0 dropped before every group reported: %v", err)
	}
	for gid := uint64(1); gid <= 3; gid++ {
		num := uint64(2)
		if gid == 3 {
			num = 3
		}
		if _, err := c.Report(cx, &shardkvpb.GroupReport{Gid: gid, LeaderId: 1, LeaderAddr: fmt.Sprintf("g%d-1:7000", gid), ConfigNum: num}); err != nil {
			t.Fatal(err)
		}
	}
	st, err := c.Status(cx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Groups) != 3 || st.Groups[0].Report.LeaderAddr != "g1-1:7000" || st.Latest.Num != 3 || st.Nshards != 16 || st.Controller.Role != "leader" {
		t.Fatalf("status: %v", st)
	}
	// Groups 1 and 2 still need config 2; configs 0 and 1 go.
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := c.Query(cx, 1)
		if err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("history never compacted")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := c.Query(cx, 1); !ctrlerclient.IsRefused(err) {
		t.Fatalf("query of a compacted config: %v", err)
	}
	for _, n := range []int64{2, 3} {
		if conf, err := c.Query(cx, n); err != nil || conf.Num != uint64(n) {
			t.Fatalf("config %d still needed: %v %v", n, conf, err)
		}
	}
}

func TestSnapshotCatchUp(t *testing.T) {
	cc := newCtrlCluster(t, 3, 16, "balanced", func(c *raftgroup.Config) {
		c.SnapshotEntries, c.TrailingEntries = 20, 5
	})
	c := cc.client(t)
	cx := ctx(t, 60*time.Second)
	leader := cc.WaitLeader(5 * time.Second)
	var lagger uint64
	for _, id := range cc.IDs() {
		if id != leader {
			lagger = id
			break
		}
	}
	cc.Crash(lagger)
	if _, err := c.Join(cx, group(100)); err != nil {
		t.Fatal(err)
	}
	for i := range 60 {
		gid := uint64(i%5 + 1)
		if i%10 < 5 {
			_, err := c.Join(cx, group(gid))
			if err != nil {
				t.Fatal(err)
			}
		} else if _, err := c.Leave(cx, gid); err != nil {
			t.Fatal(err)
		}
	}
	cc.Start(lagger)
	agreed := replicasAgree(t, cc)
	got, err := cc.sm(lagger).Config(-1)
	if err != nil || !proto.Equal(got, agreed) {
		t.Fatalf("lagging replica: %v %v", got, err)
	}
	if cc.Replica(lagger).Metrics().SnapshotsReceived.Load() == 0 {
		t.Fatal("lagging replica caught up without a snapshot; make the log shorter")
	}
	// Its history is complete too.
	for n := int64(0); n <= int64(agreed.Num); n += 7 {
		want, _ := c.Query(cx, n)
		got, err := cc.sm(lagger).Config(n)
		if err != nil || !proto.Equal(got, want) {
			t.Fatalf("history %d on the restored replica: %v %v", n, got, err)
		}
	}
}
