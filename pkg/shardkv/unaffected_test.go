package shardkv_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/shardkv/shardkv/pkg/client"
	"github.com/shardkv/shardkv/pkg/routing"
	"github.com/shardkv/shardkv/pkg/shardkv"
	"github.com/shardkv/shardkv/pkg/shardkv/kvtest"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// uaKeysPerShard returns one key per shard, by shard.
func uaKeysPerShard(prefix string, nshards int) []string {
	keys := make([]string, nshards)
	found := 0
	for i := 0; found < nshards; i++ {
		k := fmt.Sprintf("%s-%d", prefix, i)
		if s := routing.ShardOf([]byte(k), nshards); keys[s] == "" {
			keys[s] = k
			found++
		}
	}
	return keys
}

// uaLeaderSM returns the state machine of gid's current leader.
func uaLeaderSM(t *testing.T, w *kvtest.World, gid uint64) *shardkv.StateMachine {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if id := w.Groups[gid].Leader(); id != 0 {
			if sm := w.SM(gid, id); sm != nil {
				return sm
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("group %d has no leader", gid)
	return nil
}

// uaWriteAll writes and reads back want[k]+suffix for each key, each call
// bounded by timeout; it returns the first failure.
func uaWriteAll(c *client.Client, keys []string, want map[string]string, suffix string, timeout time.Duration) error {
	for _, k := range keys {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		err := c.Append(ctx, k, suffix)
		if err == nil {
			want[k] += suffix
			var got string
			var ok bool
			got, ok, err = c.Get(ctx, k)
			if err == nil && (!ok || got != want[k]) {
				err = fmt.Errorf("read %q (found %v), want %q", got, ok, want[k])
			}
		}
		cancel()
		if err != nil {
			return fmt.Errorf("key %s: %w", k, err)
		}
	}
	return nil
}

// TestDeadSourceLeavesOtherShardsServing: a config change whose source
// group is down (every replica crashed) stalls the shards it gives away, and
// only those: every other shard keeps serving reads and writes during the
// stall, on the groups that receive the dead group's shards too. The
// stalled moves stay announced (their targets cannot copy from the dead
// group, so the controller does not cut them over).
func TestDeadSourceLeavesOtherShardsServing(t *testing.T) {
	const nshards = 16
	w := kvtest.New(t, kvtest.Options{Shards: nshards})
	for _, g := range []uint64{100, 101, 102} {
		w.StartGroup(g)
	}
	w.Join(100, 101, 102)
	before := w.WaitSettled(30 * time.Second)
	keys := uaKeysPerShard("dead-src", nshards)
	c := w.Client()
	want := map[string]string{}
	if err := uaWriteAll(c, keys, want, "a", 10*time.Second); err != nil {
		t.Fatal(err)
	}

	w.StopGroup(101)
	after := w.Leave(101)
	var stalled, live []int
	var liveKeys []string
	for s := range nshards {
		switch {
		case before.Shards[s] == 101:
			stalled = append(stalled, s)
		default:
			live = append(live, s)
			liveKeys = append(liveKeys, keys[s])
			if after.Shards[s] != before.Shards[s] {
				t.Fatalf("shard %d moved from %d to %d, want only group 101's shards to move", s, before.Shards[s], after.Shards[s])
			}
		}
	}
	t.Logf("config %d -> %d: shards %v stall (source 101 is down), shards %v must keep serving", before.Num, after.Num, stalled, live)
	if len(stalled) == 0 || len(live) == 0 {
		t.Fatalf("placement gave group 101 %d shards of %d; the test needs both kinds", len(stalled), nshards)
	}

	// Both receivers reach the new config and wait on the dead group.
	deadline := time.Now().Add(20 * time.Second)
	for _, gid := range []uint64{100, 102} {
		for {
			sm := uaLeaderSM(t, w, gid)
			if sm.Config().Num == after.Num {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("group %d did not reach config %d: %s", gid, after.Num, w.Describe())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	// During the stall (3 s, several rounds), every other shard serves.
	stallEnd := time.Now().Add(3 * time.Second)
	rounds := 0
	for time.Now().Before(stallEnd) || rounds < 3 {
		if err := uaWriteAll(c, liveKeys, want, fmt.Sprint(rounds%10), 5*time.Second); err != nil {
			t.Fatalf("round %d, while group 101 is down: %v (%s)", rounds, err, w.Describe())
		}
		rounds++
	}
	// The stalled shards really are stalled: announced, their copies
	// from 101 not caught up.
	for _, s := range stalled {
		to := uaTarget(after, s)
		m := uaLeaderSM(t, w, to).Shard(s)
		if m.State != shardkv.PreCopying || m.Peer != 101 || m.CaughtUp {
			t.Fatalf("shard %d on group %d is %+v, want PreCopying from 101, not caught up, while 101 is down", s, to, m)
		}
	}
	if now := latestConfig(t, w); len(now.Moves) != len(stalled) {
		t.Fatalf("config %d plans %d moves, want the %d stalled ones still announced", now.Num, len(now.Moves), len(stalled))
	}
	t.Logf("%d rounds of writes and reads on %d live shards during the stall", rounds, len(live))

	// Once 101 is back, the stalled shards arrive with their data.
	w.RestartGroup(101)
	w.WaitSettled(60 * time.Second)
	if err := uaWriteAll(c, keys, want, "z", 20*time.Second); err != nil {
		t.Fatalf("after group 101 came back: %v", err)
	}
}

// TestLiveSourceServedDespiteDeadSource: a new group that receives shards
// from a live group and from a dead one serves the live group's shards
// quickly ("within about a second"; asserted with a generous bound), while
// the dead group's shards wait. With 64 shards the new group pulls more
// shards from the dead group than it pulls at once (PullConcurrency 4), and
// the dead group's come first in shard order, the order pulls start in.
func TestLiveSourceServedDespiteDeadSource(t *testing.T) {
	const (
		nshards = 64
		bound   = 5 * time.Second
	)
	w := kvtest.New(t, kvtest.Options{Shards: nshards})
	for _, g := range []uint64{100, 101, 102} {
		w.StartGroup(g)
	}
	w.Join(100, 101)
	before := w.WaitSettled(30 * time.Second)
	keys := uaKeysPerShard("live-src", nshards)
	c := w.Client()
	want := map[string]string{}
	if err := uaWriteAll(c, keys, want, "a", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	// Group 102's replicas see the configs before the join (a fresh group
	// steps through them), so the measured time is the move itself.
	uaLeaderSM(t, w, 102)

	// Group 100 holds the lower shards (the placement keeps ranges), so
	// the shards it gives away sort before group 101's.
	const dead, live = 100, 101
	w.StopGroup(dead)
	start := time.Now()
	after := w.Join(102)
	joinTook := time.Since(start)
	var fromLive, fromDead []int
	for s := range nshards {
		if uaTarget(after, s) != 102 {
			continue
		}
		if before.Shards[s] == live {
			fromLive = append(fromLive, s)
		} else {
			fromDead = append(fromDead, s)
		}
	}
	t.Logf("config %d: group 102 gets %d shards from live group %d %v and %d from dead group %d %v",
		after.Num, len(fromLive), live, fromLive, len(fromDead), dead, fromDead)
	if len(fromLive) == 0 || len(fromDead) < 4 || fromDead[3] > fromLive[0] {
		t.Fatalf("placement gave group 102 shards %v from the live group and %v from the dead one; the test needs some from the live group and at least 4 from the dead one, sorting first",
			fromLive, fromDead)
	}

	var took time.Duration
	for {
		sm := uaLeaderSM(t, w, 102)
		served := 0
		for _, s := range fromLive {
			if m := sm.Shard(s); sm.Config().Num >= after.Num && (m.State == shardkv.Acking || m.State == shardkv.Serving) {
				served++
			}
		}
		if served == len(fromLive) {
			took = time.Since(start)
			break
		}
		if time.Since(start) > bound {
			t.Fatalf("group 102 serves %d of the %d shards from the live group after %v (bound %v): %s", served, len(fromLive), time.Since(start), bound, w.Describe())
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Logf("group 102 serves all %d shards from the live group %v after the join request (the join itself took %v)", len(fromLive), took.Round(time.Millisecond), joinTook.Round(time.Millisecond))

	// Through the client: the moved shards have their data and take writes.
	var liveKeys []string
	for _, s := range fromLive {
		liveKeys = append(liveKeys, keys[s])
	}
	if err := uaWriteAll(c, liveKeys, want, "b", 5*time.Second); err != nil {
		t.Fatalf("shards moved from the live group: %v", err)
	}
	sm := uaLeaderSM(t, w, 102)
	for _, s := range fromDead {
		if m := sm.Shard(s); m.State != shardkv.PreCopying || m.CaughtUp {
			t.Fatalf("shard %d from the dead group is %+v on 102, want PreCopying, not caught up", s, m)
		}
	}

	w.RestartGroup(dead)
	w.WaitSettled(60 * time.Second)
	if err := uaWriteAll(c, keys, want, "z", 20*time.Second); err != nil {
		t.Fatalf("after group %d came back: %v", dead, err)
	}
}

// uaTarget is where shard s is going in conf: its planned move's target,
// else its owner.
func uaTarget(conf *shardkvpb.Config, s int) uint64 {
	for _, mv := range conf.Moves {
		if int(mv.Shard) == s {
			return mv.ToGid
		}
	}
	return conf.Shards[s]
}
