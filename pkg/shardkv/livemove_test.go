package shardkv_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardkv/shardkv/pkg/client"
	"github.com/shardkv/shardkv/pkg/kvcheck"
	"github.com/shardkv/shardkv/pkg/routing"
	"github.com/shardkv/shardkv/pkg/shardkv"
	"github.com/shardkv/shardkv/pkg/shardkv/kvtest"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// Live migration (pre-copy, docs/shardkv.md): the target copies a shard
// while its source serves it, and only the cut-over freezes it.

// fillShard writes n keys of shard s (100-byte values) through the client.
func fillShard(t *testing.T, c *client.Client, s, nshards, n int) []string {
	t.Helper()
	var keys []string
	batch := map[string]string{}
	flush := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := c.MultiPut(ctx, batch); err != nil {
			t.Fatalf("fill: %v", err)
		}
		clear(batch)
	}
	for i := 0; len(keys) < n; i++ {
		k := fmt.Sprintf("fill-%d", i)
		if routing.ShardOf([]byte(k), nshards) != s {
			continue
		}
		keys = append(keys, k)
		batch[k] = strings.Repeat("v", 90) + fmt.Sprintf("%010d", i)
		if len(batch) == 500 {
			flush()
		}
	}
	if len(batch) > 0 {
		flush()
	}
	return keys
}

// shardState is shard s's state on the first running replica of gid that
// has one other than NotOwned (NotOwned if none).
func shardState(w *kvtest.World, gid uint64, s int) shardkv.ShardMeta {
	for _, id := range w.Groups[gid].IDs() {
		if sm := w.SM(gid, id); sm != nil {
			if m := sm.Shard(s); m.State != shardkv.NotOwned {
				return m
			}
		}
	}
	return shardkv.ShardMeta{}
}

// waitFor polls cond every 2 ms until it holds or timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) bool {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(2 * time.Millisecond)
	}
	return true
}

// twoGroupWorld starts groups 100 and 101 of a world of nshards shards,
// 101 joining once 100 holds them all, and returns the world, a client and
// a shard that 100 kept.
func twoGroupWorld(t *testing.T, nshards int) (*kvtest.World, *client.Client, int) {
	t.Helper()
	w := kvtest.New(t, kvtest.Options{Shards: nshards})
	w.StartGroup(100)
	w.StartGroup(101)
	w.Join(100)
	w.WaitSettled(30 * time.Second)
	w.Join(101)
	conf := w.WaitSettled(60 * time.Second)
	for s, g := range conf.Shards {
		if g == 100 {
			return w, w.Client(), s
		}
	}
	t.Fatalf("config %d leaves group 100 no shard", conf.Num)
	return nil, nil, 0
}

func latestConfig(t *testing.T, w *kvtest.World) *shardkvpb.Config {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := w.Admin().Query(ctx, -1)
	if err != nil {
		t.Fatalf("query: %v", err)
	}
	return c
}

// TestLiveMoveServesDuringCopy: a moved shard is announced, copied while
// its source keeps taking writes (PreCopying on the target, in snapshot
// and then delta phase), cut over, and served by the target with every
// write, the ones made during the copy included; the move's write pause is
// measured and kept. With a stop-and-copy move none of this happens: the
// owner changes in the very config the move makes.
func TestLiveMoveServesDuringCopy(t *testing.T) {
	const nshards = 8
	w, c, s := twoGroupWorld(t, nshards)
	keys := fillShard(t, c, s, nshards, 3000)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	announced, err := w.Admin().Move(ctx, s, 101)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	if announced.Shards[s] != 100 || len(announced.Moves) != 1 || announced.Moves[0].ToGid != 101 {
		t.Fatalf("the move's config %d: owner %d, moves %v; want the move announced, the owner unchanged", announced.Num, announced.Shards[s], announced.Moves)
	}
	// While the target copies, the source still takes writes.
	var wrote []string
	sawSnapshot, sawDelta := false, false
	done := waitFor(t, 60*time.Second, "cut-over", func() bool {
		m := shardState(w, 101, s)
		switch {
		case m.State == shardkv.PreCopying && !m.Delta:
			sawSnapshot = true
		case m.State == shardkv.PreCopying && m.Delta:
			sawDelta = true
		}
		if m.State == shardkv.PreCopying && len(wrote) < 50 {
			k := keys[len(wrote)]
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			err := c.Put(ctx, k, "during-copy")
			cancel()
			if err != nil {
				t.Fatalf("write during the copy: %v", err)
			}
			wrote = append(wrote, k)
		}
		return m.State == shardkv.Serving || m.State == shardkv.Acking
	})
	if !done {
		t.Fatalf("the move did not finish: %s", w.Describe())
	}
	if !sawSnapshot && !sawDelta {
		t.Fatal("the target never showed a pre-copy")
	}
	if len(wrote) == 0 {
		t.Fatal("no write went through while the target copied")
	}
	final := w.WaitSettled(60 * time.Second)
	if final.Shards[s] != 101 || len(final.Moves) != 0 {
		t.Fatalf("after the move: owner %d, moves %v", final.Shards[s], final.Moves)
	}
	m := shardState(w, 101, s)
	if m.PauseUs == 0 {
		t.Fatalf("no write pause kept after the move: %+v", m)
	}
	t.Logf("pre-copy phases seen: snapshot %v, delta %v; %d writes during the copy; write pause %d us", sawSnapshot, sawDelta, len(wrote), m.PauseUs)
	ctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got, err := c.MultiGet(ctx, keys)
	if err != nil {
		t.Fatal(err)
	}
	for i, k := range keys {
		if (i < len(wrote) && got[k] != "during-copy") || (i >= len(wrote) && !strings.HasPrefix(got[k], strings.Repeat("v", 90))) {
			t.Fatalf("key %s after the move: %q", k, got[k])
		}
	}
	if n, _ := w.SM(100, w.Groups[100].IDs()[0]).CountKeys(s); n != 0 {
		waitFor(t, 30*time.Second, "GC", func() bool { n, _ := w.SM(100, w.Groups[100].IDs()[0]).CountKeys(s); return n == 0 })
	}

	// Stop-and-copy: the owner changes at once.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel2()
	back, err := w.Admin().MoveStopAndCopy(ctx2, s, 100)
	if err != nil {
		t.Fatal(err)
	}
	if back.Shards[s] != 100 || len(back.Moves) != 0 {
		t.Fatalf("stop-and-copy move: owner %d, moves %v", back.Shards[s], back.Moves)
	}
	w.WaitSettled(60 * time.Second)
}

// TestLiveMoveCancel: a move cancelled halfway (moved back to its owner)
// discards the target's copy and the source's change index, and the shard
// was served by its source throughout. The copy rate limit keeps the copy
// going long enough to cancel it.
func TestLiveMoveCancel(t *testing.T) {
	const nshards = 8
	w := kvtest.New(t, kvtest.Options{Shards: nshards, MigrateBytesPerSec: 40 << 10})
	w.StartGroup(100)
	w.StartGroup(101)
	w.Join(100)
	w.WaitSettled(30 * time.Second)
	c := w.Client()
	keys := fillShard(t, c, 0, nshards, 2000)
	w.Join(101)
	w.WaitSettled(60 * time.Second)
	conf := latestConfig(t, w)
	s, src, dst := 0, conf.Shards[0], uint64(201)-conf.Shards[0]
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := w.Admin().Move(ctx, s, dst); err != nil {
		t.Fatal(err)
	}
	if !waitFor(t, 30*time.Second, "pre-copy", func() bool { return shardState(w, dst, s).State == shardkv.PreCopying }) {
		t.Fatalf("no pre-copy: %s", w.Describe())
	}
	// Writes during the copy, recorded in the source's change index.
	for i := range 20 {
		if err := c.Put(ctx, keys[i], "x"); err != nil {
			t.Fatal(err)
		}
	}
	cancelled, err := w.Admin().Move(ctx, s, src) // back to its owner: cancel
	if err != nil {
		t.Fatal(err)
	}
	if cancelled.Shards[s] != src || len(cancelled.Moves) != 0 {
		t.Fatalf("cancelled move's config: owner %d, moves %v", cancelled.Shards[s], cancelled.Moves)
	}
	if !waitFor(t, 60*time.Second, "discard", func() bool {
		m := shardState(w, dst, s)
		sm := shardState(w, src, s)
		return m.State == shardkv.NotOwned && sm.State == shardkv.Serving && sm.TrackFrom == 0 && sm.TrimBelow == 0
	}) {
		t.Fatalf("the cancelled move was not cleaned up: target %v, source %+v", shardState(w, dst, s), shardState(w, src, s))
	}
	for _, id := range w.Groups[dst].IDs() {
		if n, _ := w.SM(dst, id).CountKeys(s); n != 0 {
			t.Fatalf("target replica %d keeps %d keys of the discarded copy", id, n)
		}
	}
	for _, id := range w.Groups[src].IDs() {
		if n := w.SM(src, id).CountChanges(s); n != 0 {
			t.Fatalf("source replica %d keeps %d change index entries after the cancel", id, n)
		}
	}
	got, err := c.MultiGet(ctx, keys[:40])
	if err != nil {
		t.Fatal(err)
	}
	for i, k := range keys[:40] {
		if (i < 20) != (got[k] == "x") {
			t.Fatalf("key %s after the cancel: %q", k, got[k])
		}
	}
}

// TestLiveMoveSourceDown: a source group down before the cut-over leaves
// the move announced (the target cannot catch up, so the controller does
// not cut over); once the source is back the move completes.
func TestLiveMoveSourceDown(t *testing.T) {
	const nshards = 8
	w := kvtest.New(t, kvtest.Options{Shards: nshards})
	w.StartGroup(100)
	w.StartGroup(101)
	w.Join(100)
	w.WaitSettled(30 * time.Second)
	c := w.Client()
	fillShard(t, c, 1, nshards, 500)
	w.Join(101)
	w.WaitSettled(60 * time.Second)
	conf := latestConfig(t, w)
	s, src, dst := 1, conf.Shards[1], uint64(201)-conf.Shards[1]
	w.StopGroup(src)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := w.Admin().Move(ctx, s, dst); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	if now := latestConfig(t, w); now.Shards[s] != src || len(now.Moves) != 1 {
		t.Fatalf("with its source down the move was cut over: owner %d, moves %v", now.Shards[s], now.Moves)
	}
	if m := shardState(w, dst, s); m.State != shardkv.PreCopying || m.CaughtUp {
		t.Fatalf("target with its source down: %+v", m)
	}
	w.RestartGroup(src)
	if !waitFor(t, 60*time.Second, "move", func() bool { return latestConfig(t, w).Shards[s] == dst }) {
		t.Fatalf("the move did not complete once its source was back: %s", w.Describe())
	}
	w.WaitSettled(60 * time.Second)
}

// TestLinearizabilityLiveMoves: porcupine-checked histories of clients
// (gets, puts, appends: exactly once) while shards move live between three
// groups, with message drops and delays, and in each move one of: the
// target's or the source's leader killed mid-copy (snapshot or rounds),
// a leader of either side killed at the cut-over, the move cancelled, a
// partition during the rounds (the target's leader isolated from its group
// and the target from the source for a second), or a group joining and
// leaving while the move copies.
func TestLinearizabilityLiveMoves(t *testing.T) {
	const nshards = 8
	// A copy rate limit stretches each copy over about a second, so that
	// the faults land in the phase they aim at.
	w := kvtest.New(t, kvtest.Options{Shards: nshards, MigrateBytesPerSec: 150 << 10})
	gids := []uint64{100, 101, 102}
	for _, g := range gids {
		w.StartGroup(g)
	}
	w.Join(100, 101, 102)
	w.WaitSettled(60 * time.Second)
	w.StartGroup(103) // joins and leaves during a move
	fc := w.Client()
	// Filler, so that copies take several chunks and rounds.
	shards := map[int]bool{}
	for _, k := range slinKeys {
		shards[routing.ShardOf([]byte(k), nshards)] = true
	}
	for s := range shards {
		fillShard(t, fc, s, nshards, 1500)
	}
	// A hash of 3,000 fields moves with lin-a's shard: its elements take
	// several chunks and are copied whole, never half.
	const bigFields = 3000
	for from := 0; from < bigFields; from += 1000 {
		var fv []string
		for i := from; i < from+1000; i++ {
			fv = append(fv, fmt.Sprint("f", i), fmt.Sprint("v", i))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if _, err := fc.HSet(ctx, "{lin-a}big", fv...); err != nil {
			t.Fatalf("fill the big hash: %v", err)
		}
		cancel()
	}

	rec := kvcheck.NewRecorder()
	var notes []kvcheck.Note
	w.Faults.Set(0.05, 0.05, 20*time.Millisecond)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range slinClients {
		c := w.Client()
		wg.Go(func() { slinClient(c, rec, i, stop) })
	}
	rng := rand.New(rand.NewPCG(rand.Uint64(), 5))
	crash := func(gid uint64) string {
		id := w.Groups[gid].Leader()
		if id == 0 {
			return "no leader"
		}
		w.Groups[gid].Crash(id)
		time.Sleep(200 * time.Millisecond)
		w.Groups[gid].Start(id)
		return fmt.Sprintf("killed %d/%d", gid, id)
	}
	var events []string
	// Each kind of fault once, then more moves while time is left.
	const kinds = 7
	deadline := time.Now().Add(25 * time.Second)
	for round := 0; round < kinds || time.Now().Before(deadline); round++ {
		key := slinKeys[rng.IntN(len(slinKeys))]
		s := routing.ShardOf([]byte(key), nshards)
		conf := latestConfig(t, w)
		src := conf.Shards[s]
		dst := gids[rng.IntN(len(gids))]
		if dst == src {
			dst = gids[(rng.IntN(2)+1+int(dst-100))%3]
		}
		start := rec.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := w.Admin().Move(ctx, s, dst)
		cancel()
		if err != nil {
			t.Fatalf("move: %v", err)
		}
		what := "none"
		switch round % kinds {
		case 0: // kill the target's leader mid-snapshot
			if waitFor(t, 10*time.Second, "", func() bool {
				m := shardState(w, dst, s)
				return m.State == shardkv.PreCopying && !m.Delta && m.Keys > 0
			}) {
				what = "mid-snapshot: " + crash(dst)
			}
		case 1: // kill the source's leader during the rounds of changes
			if waitFor(t, 10*time.Second, "", func() bool { m := shardState(w, dst, s); return m.State == shardkv.PreCopying && m.Delta }) {
				what = "mid-delta: " + crash(src)
			}
		case 2: // kill the target's leader at the cut-over
			if waitFor(t, 20*time.Second, "", func() bool { return shardState(w, dst, s).State == shardkv.Pulling }) {
				what = "mid-cut-over (target): " + crash(dst)
			}
		case 3: // kill the source's leader at the cut-over
			if waitFor(t, 20*time.Second, "", func() bool { return shardState(w, src, s).State == shardkv.BePulling }) {
				what = "mid-cut-over (source): " + crash(src)
			}
		case 4: // cancel halfway
			if waitFor(t, 10*time.Second, "", func() bool { return shardState(w, dst, s).State == shardkv.PreCopying }) {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				_, err := w.Admin().Move(ctx, s, src)
				cancel()
				if err != nil {
					t.Fatalf("cancel: %v", err)
				}
				what = "cancelled"
			}
		case 5: // a partition during the rounds of changes: the target's
			// leader cut off from its group, the target from the source
			if waitFor(t, 10*time.Second, "", func() bool { m := shardState(w, dst, s); return m.State == shardkv.PreCopying && m.Delta }) {
				g := w.Groups[dst]
				if id := g.Leader(); id != 0 {
					g.Net.Isolate(g.IDs(), id)
					w.Faults.Refuse(func(req any) bool {
						r, ok := req.(*shardkvpb.FetchShardRequest)
						return ok && r.Gid == dst
					})
					time.Sleep(time.Second)
					w.Faults.Refuse(nil)
					g.Net.Heal()
					what = fmt.Sprintf("partition mid-delta: %d/%d isolated, %d cut off from %d", dst, id, dst, src)
				}
			}
		case 6: // a join and a leave (their own planned moves) during the copy
			if waitFor(t, 10*time.Second, "", func() bool { return shardState(w, dst, s).State == shardkv.PreCopying }) {
				w.Join(103)
				time.Sleep(300 * time.Millisecond)
				w.Leave(103)
				what = "group 103 joined and left during the copy"
			}
		}
		ev := fmt.Sprintf("shard %d: %d -> %d, %s", s, src, dst, what)
		events = append(events, ev)
		notes = append(notes, kvcheck.Note{Tag: "move", Start: start, End: rec.Now(), Description: ev})
		w.WaitSettled(60 * time.Second)
	}
	close(stop)
	wg.Wait()
	t.Logf("moves:\n%s", strings.Join(events, "\n"))

	w.Faults.Set(0, 0, 0)
	w.WaitSettled(60 * time.Second)
	st := slinFinalCheck(t, fc, rec, notes)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	big, err := fc.HGetAll(ctx, "{lin-a}big")
	if err != nil || len(big) != bigFields || big["f2999"] != "v2999" {
		t.Errorf("the big hash after the moves: %d fields (f2999 %q), %v; want %d", len(big), big["f2999"], err, bigFields)
	}
	if len(events) < kinds {
		t.Errorf("only %d moves during the run", len(events))
	}
	if st.OKWrites < 50 {
		t.Errorf("only %d writes succeeded", st.OKWrites)
	}
}

// TestBarrierHoldsWritesOnTheLeaderOnly: while a cut-over's last round is
// missing (the source is frozen, the target steps but cannot fetch it),
// a write sent to a follower of the target is refused at once with
// NOT_LEADER, so that the client goes to the leader instead of waiting
// out the hold on a replica that cannot run it; the leader holds the write
// for requestHold, then refuses it as NOT_READY. Once the last round can
// be fetched, the shard is served with every key. Before followers
// stopped holding, the follower's refusal came only after the whole hold.
func TestBarrierHoldsWritesOnTheLeaderOnly(t *testing.T) {
	const nshards = 8
	w, c, s := twoGroupWorld(t, nshards)
	keys := fillShard(t, c, s, nshards, 200)

	// The last round is the delta fetch of a frozen source.
	w.Faults.Refuse(func(req any) bool {
		r, ok := req.(*shardkvpb.FetchShardRequest)
		return ok && r.Delta && !r.Precopy
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	_, err := w.Admin().Move(ctx, s, 101)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	target := w.Groups[101]
	if !waitFor(t, 60*time.Second, "barrier", func() bool {
		for _, id := range target.IDs() {
			if m := w.SM(101, id).Shard(s); m.State != shardkv.Pulling || !m.Delta {
				return false
			}
		}
		return true
	}) {
		t.Fatalf("the target did not reach its last round: %s", w.Describe())
	}
	leader := target.WaitLeader(10 * time.Second)
	var follower uint64
	for _, id := range target.IDs() {
		if id != leader {
			follower = id
			break
		}
	}
	write := func(id uint64, value string) (time.Duration, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		start := time.Now()
		_, err := w.Group(101, id).Write(ctx, &shardkvpb.WriteRequest{Op: &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_PUT, Key: []byte(keys[0]), Value: []byte(value)}})
		return time.Since(start), err
	}
	took, err := write(follower, "via-follower")
	if shardkvpb.Reason(err) != shardkvpb.ReasonNotLeader {
		t.Fatalf("a write to follower %d behind the barrier: %v; want NOT_LEADER", follower, err)
	}
	if took >= 400*time.Millisecond {
		t.Fatalf("follower %d held a write it cannot run for %v before refusing it", follower, took)
	}
	took, err = write(leader, "via-leader")
	if r := shardkvpb.Reason(err); r != shardkvpb.ReasonNotReady {
		t.Fatalf("a write to leader %d behind a barrier that does not lift: %v; want NOT_READY", leader, err)
	}
	if took < 450*time.Millisecond {
		t.Fatalf("leader %d refused after %v; want it held for the barrier's expected time first", leader, took)
	}

	w.Faults.Refuse(nil)
	final := w.WaitSettled(60 * time.Second)
	if final.Shards[s] != 101 {
		t.Fatalf("after the barrier lifted: shard %d on %d", s, final.Shards[s])
	}
	ctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Put(ctx, keys[0], "after"); err != nil {
		t.Fatal(err)
	}
	got, err := c.MultiGet(ctx, keys)
	if err != nil {
		t.Fatal(err)
	}
	for i, k := range keys {
		if (i == 0 && got[k] != "after") || (i > 0 && !strings.HasPrefix(got[k], strings.Repeat("v", 90))) {
			t.Fatalf("key %s after the move: %q", k, got[k])
		}
	}
}
