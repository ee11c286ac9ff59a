package shardkv_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/shardkv/shardkv/pkg/client"
	"github.com/shardkv/shardkv/pkg/raftgroup"
	"github.com/shardkv/shardkv/pkg/routing"
	"github.com/shardkv/shardkv/pkg/shardkv"
	"github.com/shardkv/shardkv/pkg/shardkv/kvtest"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"google.golang.org/protobuf/proto"
)

// Scenario tests: whole-cluster behaviour under group outages, long join and
// leave sequences, constant snapshots, replicas that miss config changes,
// and concurrent appenders across all of it. Every test ends by checking the
// data. Deadlines only bound waits; nothing asserts on timing.

// scKV is a test's model of the expected data and the client that checks it.
type scKV struct {
	t    *testing.T
	c    *client.Client
	want map[string]string
}

func scOpCtx(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), d)
}

func (m *scKV) put(k, v string) {
	m.t.Helper()
	ctx, cancel := scOpCtx(30 * time.Second)
	defer cancel()
	if err := m.c.Put(ctx, k, v); err != nil {
		m.t.Fatalf("put %s: %v", k, err)
	}
	m.want[k] = v
}

func (m *scKV) appendAll(step string) {
	m.t.Helper()
	for _, k := range slices.Sorted(maps.Keys(m.want)) {
		ctx, cancel := scOpCtx(30 * time.Second)
		err := m.c.Append(ctx, k, "+")
		cancel()
		if err != nil {
			m.t.Fatalf("%s: append %s: %v", step, k, err)
		}
		m.want[k] += "+"
	}
}

func (m *scKV) checkAll(step string) {
	m.t.Helper()
	for _, k := range slices.Sorted(maps.Keys(m.want)) {
		ctx, cancel := scOpCtx(30 * time.Second)
		got, ok, err := m.c.Get(ctx, k)
		cancel()
		if err != nil || !ok || got != m.want[k] {
			m.t.Fatalf("%s: Get(%s) = %q found=%v err=%v, want %q", step, k, got, ok, err, m.want[k])
		}
	}
}

// step runs a change, then appends to every key and reads every key back.
func (m *scKV) step(name string, f func()) {
	m.t.Helper()
	start := time.Now()
	f()
	m.appendAll(name)
	m.checkAll(name)
	m.t.Logf("step %q: %v", name, time.Since(start).Round(time.Millisecond))
}

// scReadIndex runs r.ReadIndex, retrying while it reports "not executed"
// (one round gives up after a few election timeouts, e.g. while a leader is
// being elected; like the KV service's clients, the test then retries).
func scReadIndex(t *testing.T, r *raftgroup.Replica) error {
	ctx, cancel := scOpCtx(20 * time.Second)
	defer cancel()
	for {
		err := r.ReadIndex(ctx)
		if err == nil || !raftgroup.IsNotExecuted(err) || ctx.Err() != nil {
			return err
		}
		st := r.Status()
		t.Logf("g%d/%d: ReadIndex: %v (retrying; %s, leader %d, term %d, commit %d, applied %d)", st.GroupID, st.ID, err, st.Role, st.Leader, st.Term, st.Commit, st.Applied)
		time.Sleep(20 * time.Millisecond)
	}
}

// scCheckReplicas checks, on every running replica of every group, after
// the replica's ReadIndex: the replica is at config conf with the same shard
// states as its group's other replicas, serves exactly the keys its group owns
// in conf with the expected values, and holds no data for shards it does not
// own (GC finished).
func scCheckReplicas(t *testing.T, w *kvtest.World, conf *shardkvpb.Config, want map[string]string) {
	t.Helper()
	for _, gid := range slices.Sorted(maps.Keys(w.Groups)) {
		g := w.Groups[gid]
		var refID uint64
		var refShards map[int]shardkv.ShardMeta
		for _, id := range g.IDs() {
			r := g.Replica(id)
			if r == nil {
				continue
			}
			if err := scReadIndex(t, r); err != nil {
				t.Fatalf("g%d/%d: ReadIndex: %v", gid, id, err)
			}
			sm := w.SM(gid, id)
			if sm == nil {
				t.Fatalf("g%d/%d: no state machine", gid, id)
			}
			if got := sm.Config(); !proto.Equal(got, conf) {
				t.Fatalf("g%d/%d: at config %d, want config %d (%v vs %v)", gid, id, got.Num, conf.Num, got, conf)
			}
			shards := sm.Shards()
			if refShards == nil {
				refID, refShards = id, shards
			} else if !reflect.DeepEqual(shards, refShards) {
				t.Fatalf("g%d: replica %d shard states %v differ from replica %d's %v", gid, id, shards, refID, refShards)
			}
			for s := range conf.Shards {
				m := shards[s]
				n, err := sm.CountKeys(s)
				if err != nil {
					t.Fatal(err)
				}
				if conf.Shards[s] == gid {
					if m.State != shardkv.Serving {
						t.Fatalf("g%d/%d: owns shard %d in config %d but it is %v", gid, id, s, conf.Num, m)
					}
				} else if m.State != shardkv.NotOwned || n != 0 {
					t.Fatalf("g%d/%d: shard %d belongs to g%d in config %d, yet here it is %v with %d keys", gid, id, s, conf.Shards[s], conf.Num, m, n)
				}
			}
			now := time.Now().UnixMilli()
			for k, v := range want {
				got, found, code, err := sm.Get([]byte(k), now)
				if err != nil {
					t.Fatalf("g%d/%d: Get(%s): %v", gid, id, k, err)
				}
				if routing.GroupOf([]byte(k), conf.Shards) == gid {
					if code != shardkv.OK || !found || string(got) != v {
						t.Fatalf("g%d/%d: local Get(%s) = %q found=%v code=%v, want %q", gid, id, k, got, found, code, v)
					}
				} else if code == shardkv.OK {
					t.Fatalf("g%d/%d: serves %s, which belongs to g%d in config %d", gid, id, k, routing.GroupOf([]byte(k), conf.Shards), conf.Num)
				}
			}
		}
	}
}

// TestScenarioGroupDown: with static shards, a group that is entirely down
// makes only its own keys time out; the other group's keys keep working, and
// after the restart every key holds exactly what was acknowledged.
func TestScenarioGroupDown(t *testing.T) {
	w := kvtest.New(t, kvtest.Options{Shards: 16})
	w.StartGroup(100)
	w.StartGroup(101)
	w.Join(100, 101)
	conf := w.WaitSettled(20 * time.Second)
	m := &scKV{t: t, c: w.Client(), want: map[string]string{}}
	owner := func(k string) uint64 { return routing.GroupOf([]byte(k), conf.Shards) }
	var down, up []string
	for i := range 40 {
		k := fmt.Sprintf("gd-%d", i)
		m.put(k, "v"+k)
		if owner(k) == 101 {
			down = append(down, k)
		} else {
			up = append(up, k)
		}
	}
	if len(down) == 0 || len(up) == 0 {
		t.Fatalf("keys not spread over both groups: %d on 101, %d on 100", len(down), len(up))
	}

	w.StopGroup(101)

	// The down group's keys: reads and writes end with the caller's deadline.
	// All at once, so the test waits for one deadline, not one per key.
	type res struct {
		op, key string
		err     error
	}
	var wg sync.WaitGroup
	results := make(chan res, 2*len(down))
	for _, k := range down {
		wg.Add(2)
		go func() {
			defer wg.Done()
			ctx, cancel := scOpCtx(1500 * time.Millisecond)
			defer cancel()
			v, ok, err := m.c.Get(ctx, k)
			if err == nil {
				err = fmt.Errorf("succeeded: %q %v", v, ok)
			}
			results <- res{"get", k, err}
		}()
		go func() {
			defer wg.Done()
			ctx, cancel := scOpCtx(1500 * time.Millisecond)
			defer cancel()
			err := m.c.Append(ctx, k, "lost")
			if err == nil {
				err = errors.New("succeeded")
			}
			results <- res{"append", k, err}
		}()
	}
	// Meanwhile the live group serves reads and writes.
	for _, k := range up {
		ctx, cancel := scOpCtx(10 * time.Second)
		err := m.c.Append(ctx, k, "+")
		cancel()
		if err != nil {
			t.Fatalf("group 101 down: append %s (group 100): %v", k, err)
		}
		m.want[k] += "+"
	}
	for _, k := range up {
		ctx, cancel := scOpCtx(10 * time.Second)
		got, ok, err := m.c.Get(ctx, k)
		cancel()
		if err != nil || !ok || got != m.want[k] {
			t.Fatalf("group 101 down: Get(%s) = %q %v %v, want %q", k, got, ok, err, m.want[k])
		}
	}
	fresh := 0
	for i := 0; fresh < 5; i++ {
		k := fmt.Sprintf("gd-new-%d", i)
		if owner(k) != 100 {
			continue
		}
		ctx, cancel := scOpCtx(10 * time.Second)
		err := m.c.Put(ctx, k, "n"+k)
		cancel()
		if err != nil {
			t.Fatalf("group 101 down: put %s (group 100): %v", k, err)
		}
		m.want[k] = "n" + k
		fresh++
	}
	wg.Wait()
	close(results)
	for r := range results {
		if !errors.Is(r.err, context.DeadlineExceeded) {
			t.Errorf("group 101 down: %s %s: got %v, want a context deadline error", r.op, r.key, r.err)
		}
		if r.op == "append" && !errors.Is(r.err, client.ErrOutcomeUnknown) {
			t.Errorf("group 101 down: append %s: got %v, want ErrOutcomeUnknown", r.key, r.err)
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	w.RestartGroup(101)
	// Every replica of 101 was down when the appends were attempted, so none
	// of them executed: the values are exactly the acknowledged ones.
	m.checkAll("after restart")
	m.appendAll("after restart")
	m.checkAll("after restart + append")
	scCheckReplicas(t, w, w.WaitSettled(20*time.Second), m.want)
}

// TestScenarioJoinLeaveSequence: a long sequence of joins and leaves (some
// several groups in one Join or Leave, a rejoin of gids that left), without
// waiting for shards to settle in between; every key reads back right and
// takes an append after every step, and at the end only owners hold data.
func TestScenarioJoinLeaveSequence(t *testing.T) {
	w := kvtest.New(t, kvtest.Options{Shards: 16})
	for gid := uint64(100); gid <= 104; gid++ {
		w.StartGroup(gid)
	}
	w.Join(100)
	w.WaitSettled(20 * time.Second)
	m := &scKV{t: t, c: w.Client(), want: map[string]string{}}
	for i := range 40 {
		k := fmt.Sprintf("jl-%d", i)
		m.put(k, "v"+k)
	}
	m.step("join 101+102", func() { w.Join(101, 102) })
	m.step("join 103", func() { w.Join(103) })
	m.step("leave 100", func() { w.Leave(100) })
	m.step("join 104", func() { w.Join(104) })
	m.step("leave 101+102", func() { w.Leave(101, 102) })
	m.step("rejoin 100", func() { w.Join(100) })
	m.step("leave 103", func() { w.Leave(103) })
	m.step("rejoin 101+102", func() { w.Join(101, 102) })
	m.step("leave 104+100", func() { w.Leave(104, 100) })
	m.step("rejoin 103, leave 101", func() { w.Join(103); w.Leave(101) })
	m.step("leave 102", func() { w.Leave(102) })
	conf := w.WaitSettled(30 * time.Second)
	if len(conf.Groups) != 1 || conf.Groups[0].Gid != 103 {
		t.Fatalf("final config %d has groups %v, want only 103", conf.Num, conf.Groups)
	}
	m.checkAll("settled")
	scCheckReplicas(t, w, conf, m.want)
}

// scRaftKeys counts the engine's keys (Raft log, hard state, markers,
// members) in a replica's badger DB.
func scRaftKeys(t *testing.T, r *raftgroup.Replica) int {
	t.Helper()
	n := 0
	err := r.DB().View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte{raftgroup.EngineKeyPrefix}})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			n++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestScenarioSnapshots: with tiny snapshot thresholds (snapshots all the
// time), joins and leaves, a replica caught up by a snapshot, and a cold
// restart of every replica of every group keep the data intact, and every
// replica's Raft log stays bounded.
func TestScenarioSnapshots(t *testing.T) {
	const snapEntries, trailing = 50, 10
	// A replica compacts when it has applied snapEntries entries past its
	// last marker and keeps trailing entries, so its log holds at most
	// trailing+snapEntries applied entries plus the ones not yet applied
	// (a handful once settled): slack 30.
	const logBound = snapEntries + trailing + 30
	w := kvtest.New(t, kvtest.Options{Shards: 16, RaftConfig: func(c *raftgroup.Config) {
		c.SnapshotEntries, c.TrailingEntries = snapEntries, trailing
	}})
	for gid := uint64(100); gid <= 102; gid++ {
		w.StartGroup(gid)
	}
	w.Join(100, 101)
	w.WaitSettled(20 * time.Second)
	m := &scKV{t: t, c: w.Client(), want: map[string]string{}}
	for i := range 60 {
		k := fmt.Sprintf("sn-%d", i)
		m.put(k, "v"+k)
	}
	m.step("join 102", func() { w.Join(102) })
	m.step("leave 100", func() { w.Leave(100) })
	m.step("rejoin 100", func() { w.Join(100) })
	m.step("leave 101", func() { w.Leave(101) })
	w.WaitSettled(30 * time.Second)

	// A follower of 102 misses more than a snapshot's worth of entries: the
	// leader's log no longer has them, so only a snapshot can catch it up.
	g := w.Groups[102]
	lead := g.WaitLeader(10 * time.Second)
	lag := g.IDs()[0]
	if lag == lead {
		lag = g.IDs()[1]
	}
	lagLast := g.Replica(lag).Status().LastIndex
	g.Crash(lag)
	for round := 0; ; round++ {
		if round == 20 {
			t.Fatalf("group 102's log never moved past index %d", lagLast)
		}
		m.appendAll(fmt.Sprintf("replica g102/%d down, round %d", lag, round))
		l := g.Leader()
		if l != 0 && g.Replica(l) != nil && g.Replica(l).Status().FirstIndex > lagLast+1 {
			break
		}
	}
	g.Start(lag)
	m.step("g102 follower back", func() {})
	scCheckReplicas(t, w, w.WaitSettled(30*time.Second), m.want)
	if n := g.Replica(lag).Metrics().SnapshotsReceived.Load(); n == 0 {
		t.Fatalf("g102/%d caught up without a snapshot", lag)
	}

	// Cold restart of everything that holds data.
	gids := slices.Sorted(maps.Keys(w.Groups))
	for _, gid := range gids {
		w.StopGroup(gid)
	}
	for _, gid := range gids {
		w.RestartGroup(gid)
	}
	m.checkAll("after cold restart")
	m.step("join 101 after restart", func() { w.Join(101) })
	// Write until every group's log is far past the bound, while every group
	// owns shards (after a leave, a group only logs its periodic expiry).
	for round := 0; ; round++ {
		short := false
		for _, gid := range gids {
			g := w.Groups[gid]
			if l := g.WaitLeader(10 * time.Second); g.Replica(l).Status().LastIndex <= 3*logBound {
				short = true
			}
		}
		if !short {
			break
		}
		if round == 30 {
			t.Fatalf("logs did not grow past %d entries", 3*logBound)
		}
		m.appendAll(fmt.Sprintf("growing the logs, round %d", round))
	}
	m.step("leave 102 after restart", func() { w.Leave(102) })
	conf := w.WaitSettled(30 * time.Second)
	m.checkAll("settled")
	scCheckReplicas(t, w, conf, m.want)

	// Raft state is bounded: every replica's log (and the engine keys in its
	// DB) stays below the bound, though the groups wrote far more entries.
	for _, gid := range gids {
		for _, id := range w.Groups[gid].IDs() {
			r := w.Groups[gid].Replica(id)
			st := r.Status()
			n := uint64(0)
			if st.LastIndex >= st.FirstIndex {
				n = st.LastIndex - st.FirstIndex + 1
			}
			keys := scRaftKeys(t, r)
			t.Logf("g%d/%d: log [%d, %d] (%d entries), snapshot at %d, %d engine keys", gid, id, st.FirstIndex, st.LastIndex, n, st.SnapshotIndex, keys)
			if st.LastIndex <= 3*logBound {
				t.Errorf("g%d/%d: log only reached index %d: too short to show compaction", gid, id, st.LastIndex)
			}
			if n > logBound {
				t.Errorf("g%d/%d: raft log holds %d entries [%d, %d], bound %d", gid, id, n, st.FirstIndex, st.LastIndex, logBound)
			}
			// Besides the log: hard state, snapshot marker, compaction
			// point, identity, removal flag, one key per member.
			if keys > logBound+16 {
				t.Errorf("g%d/%d: %d engine keys in the DB, bound %d", gid, id, keys, logBound+16)
			}
		}
	}
}

// TestScenarioMissedConfigChanges: one replica of every group is down across
// several config changes with writes; after it restarts it has caught up:
// same config, same shard states, same data as its group's other replicas
// (read from its own state after its ReadIndex). Once caught up from the
// log, once from a snapshot (the log it missed is compacted away).
func TestScenarioMissedConfigChanges(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  func(*raftgroup.Config)
	}{
		{"log", nil},
		{"snapshot", func(c *raftgroup.Config) { c.SnapshotEntries, c.TrailingEntries = 40, 5 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := kvtest.New(t, kvtest.Options{Shards: 16, RaftConfig: tc.cfg})
			for gid := uint64(100); gid <= 102; gid++ {
				w.StartGroup(gid)
			}
			w.Join(100, 101)
			w.WaitSettled(20 * time.Second)
			m := &scKV{t: t, c: w.Client(), want: map[string]string{}}
			for i := range 40 {
				k := fmt.Sprintf("mc-%d", i)
				m.put(k, "v"+k)
			}
			const down = 3
			before := map[uint64]uint64{} // the down replica's last log index
			for gid, g := range w.Groups {
				before[gid] = g.Replica(down).Status().LastIndex
				g.Crash(down)
			}
			m.step("join 102", func() { w.Join(102) })
			m.step("leave 100", func() { w.Leave(100) })
			m.step("rejoin 100", func() { w.Join(100) })
			m.step("leave 101", func() { w.Leave(101) })
			m.step("join 101", func() { w.Join(101) })
			conf := w.WaitSettled(30 * time.Second)
			if tc.cfg != nil {
				// The snapshot case must really need one.
				for gid, g := range w.Groups {
					l := g.WaitLeader(10 * time.Second)
					if first := g.Replica(l).Status().FirstIndex; first <= before[gid]+1 {
						t.Fatalf("g%d: log still starts at %d; the down replica (log up to %d) would not need a snapshot", gid, first, before[gid])
					}
				}
			}
			for _, g := range w.Groups {
				g.Start(down)
			}
			if got := w.WaitSettled(30 * time.Second); got.Num != conf.Num {
				t.Fatalf("config moved from %d to %d with no change", conf.Num, got.Num)
			}
			m.checkAll("replicas back")
			scCheckReplicas(t, w, conf, m.want)
			for gid, g := range w.Groups {
				got := g.Replica(down).Metrics().SnapshotsReceived.Load()
				if tc.cfg != nil && got == 0 {
					t.Errorf("g%d/%d caught up without a snapshot", gid, down)
				}
				if tc.cfg == nil && got != 0 {
					t.Errorf("g%d/%d received %d snapshots; it should have caught up from the log", gid, down, got)
				}
			}
		})
	}
}

// TestScenarioConcurrentAppends: ten clients append unique tokens to shared
// keys in tight loops, with injected lost requests and replies (so the client
// retries writes that did apply), while groups join and leave and every
// group restarts. At the end every acknowledged append is present exactly
// once and in its client's order, and no append is present twice.
func TestScenarioConcurrentAppends(t *testing.T) {
	w := kvtest.New(t, kvtest.Options{Shards: 16})
	for gid := uint64(100); gid <= 103; gid++ {
		w.StartGroup(gid)
	}
	w.Join(100, 101)
	w.WaitSettled(20 * time.Second)

	const nclients = 10
	keys := make([]string, 12)
	for i := range keys {
		keys[i] = fmt.Sprintf("ca-%d", i)
	}
	type attempt struct {
		n     int
		acked bool
	}
	// attempts[client][key] in the order the client made them.
	attempts := make([]map[string][]attempt, nclients)
	var failed [nclients]int
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for ci := range nclients {
		attempts[ci] = map[string][]attempt{}
		c := w.Client()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				k := keys[(ci*7+n)%len(keys)]
				ctx, cancel := scOpCtx(15 * time.Second)
				err := c.Append(ctx, k, fmt.Sprintf("%d.%d;", ci, n))
				cancel()
				attempts[ci][k] = append(attempts[ci][k], attempt{n: n, acked: err == nil})
				if err != nil {
					failed[ci]++
					t.Logf("client %d: append %d to %s: %v", ci, n, k, err)
				}
			}
		}()
	}
	pause := func() { time.Sleep(1500 * time.Millisecond) }

	w.Faults.Set(0.05, 0.1, 0)
	pause()
	w.Join(102)
	pause()
	w.Leave(100)
	pause()
	w.Join(103, 100)
	pause()
	w.Faults.Set(0, 0, 0)
	w.Leave(101)
	pause()
	// Every group restarts, all at once, while clients keep appending.
	gids := slices.Sorted(maps.Keys(w.Groups))
	for _, gid := range gids {
		w.StopGroup(gid)
	}
	time.Sleep(500 * time.Millisecond)
	for _, gid := range gids {
		w.RestartGroup(gid)
	}
	pause()
	w.Faults.Set(0.05, 0.1, 0)
	w.Join(101)
	pause()
	w.Leave(102, 103)
	pause()
	w.Faults.Set(0, 0, 0)
	close(stop)
	wg.Wait()
	conf := w.WaitSettled(30 * time.Second)

	c := w.Client()
	final := map[string]string{}
	total := 0
	for _, k := range keys {
		ctx, cancel := scOpCtx(30 * time.Second)
		v, _, err := c.Get(ctx, k)
		cancel()
		if err != nil {
			t.Fatalf("final Get(%s): %v", k, err)
		}
		final[k] = v
		// Each token: its position in the value.
		pos := map[string]int{}
		toks := strings.Split(v, ";")
		if toks[len(toks)-1] != "" {
			t.Fatalf("%s: value does not end with a token: %q", k, v)
		}
		for i, tok := range toks[:len(toks)-1] {
			if _, dup := pos[tok]; dup {
				t.Errorf("%s: append %q is present twice", k, tok)
			}
			pos[tok] = i
		}
		known := 0
		for ci := range nclients {
			last, lastN := -1, -1
			for _, a := range attempts[ci][k] {
				tok := strconv.Itoa(ci) + "." + strconv.Itoa(a.n)
				p, present := pos[tok]
				if present {
					known++
				}
				if !a.acked {
					continue
				}
				if !present {
					t.Errorf("%s: acknowledged append %q is missing", k, tok)
					continue
				}
				if p < last {
					t.Errorf("%s: client %d's append %d precedes its earlier append %d", k, ci, a.n, lastN)
				}
				last, lastN = p, a.n
				total++
			}
		}
		if known != len(pos) {
			t.Errorf("%s: %d of its %d tokens were never appended by anyone: %q", k, len(pos)-known, len(pos), v)
		}
	}
	nfailed := 0
	for _, f := range failed {
		nfailed += f
	}
	t.Logf("%d acknowledged appends checked, %d failed appends", total, nfailed)
	if total < 100 {
		t.Fatalf("only %d appends acknowledged: the clients barely ran", total)
	}
	scCheckReplicas(t, w, conf, final)
}
