package shardkv_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/shardkv/shardkv/pkg/raftgroup/rgtest"
	"github.com/shardkv/shardkv/pkg/shardkv"
	"github.com/shardkv/shardkv/pkg/shardkv/kvtest"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// Clock jumps and skews, injected per replica (raftgroup.Config.Now):
// docs/time.md. Each test failed with the old handling, where entries
// carried the leader's own clock and reads judged expiry by the reading
// replica's clock.

func clockWorld(t *testing.T, shards int) (*kvtest.World, *rgtest.Clocks) {
	clocks := &rgtest.Clocks{}
	return kvtest.New(t, kvtest.Options{Shards: shards, RaftConfig: clocks.Config}), clocks
}

// sessionWrite runs op (with a client session) on gid's leader, retrying
// until it answers.
func sessionWrite(t *testing.T, w *kvtest.World, gid uint64, op *shardkvpb.WriteOp) *shardkvpb.WriteResult {
	t.Helper()
	var err error
	for range 50 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		var rep *shardkvpb.WriteReply
		rep, err = leaderGroup(t, w, gid).Write(ctx, &shardkvpb.WriteRequest{Op: op})
		cancel()
		if err == nil {
			return rep.Result
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("write %s: %v", op.Key, err)
	return nil
}

// readOn reads key on replica id of gid (follower reads allowed).
func readOn(t *testing.T, w *kvtest.World, gid, id uint64, key string) shardkv.ValueEntry {
	t.Helper()
	var err error
	for range 50 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		var out []shardkv.ValueEntry
		out, err = w.Group(gid, id).ReadKeys(ctx, [][]byte{[]byte(key)}, true, nil)
		cancel()
		if err == nil {
			return out[0]
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("read %s on g%d/%d: %v", key, gid, id, err)
	return shardkv.ValueEntry{}
}

func ttl(ms int64) *int64 { return &ms }

// TestLeaderClockJumpsAhead: the leader's clock jumps an hour ahead while
// the group runs. Client sessions are not expired (a retried write is not
// applied twice) and a key with a 30 s TTL does not expire.
func TestLeaderClockJumpsAhead(t *testing.T) {
	w, clocks := clockWorld(t, 4)
	w.StartGroup(100)
	w.Join(100)
	w.WaitSettled(20 * time.Second)
	batchWrite(t, w, &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_PUT, Key: []byte("ttl"), Value: []byte("v"), TtlMs: ttl(30_000)})
	op := &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_APPEND, Key: []byte("once"), Value: []byte("x"),
		Session: &shardkvpb.Session{ClientId: 77, Seq: 1}}
	sessionWrite(t, w, 100, op)

	l := w.Groups[100].WaitLeader(10 * time.Second)
	clocks.Get(100, l).Set(time.Hour)
	// Entries go on (the session expiry runs every second here, key
	// expiry every 100 ms), all stamped while the clock is an hour ahead.
	for i := range 30 {
		batchWrite(t, w, &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_PUT, Key: fmt.Appendf(nil, "busy-%d", i), Value: []byte("v")})
		time.Sleep(100 * time.Millisecond)
	}
	if got := w.Groups[100].Leader(); got != l {
		t.Logf("leadership moved from %d to %d", l, got)
	}
	// The client did not hear back and retries the same write.
	sessionWrite(t, w, 100, op)
	if e := readKey(t, w, "once"); string(e.Value) != "x" {
		t.Fatalf("retried write applied twice: %q (its session expired early)", e.Value)
	}
	if e := readKey(t, w, "ttl"); !e.Found {
		t.Fatal("key with a 30 s TTL expired 3 s after it was set")
	}
}

// TestNewLeaderClockBehind: a replica whose clock went back an hour
// becomes leader. A key past its expiry stays expired: on that leader,
// on the followers, for reads and for writes.
func TestNewLeaderClockBehind(t *testing.T) {
	w, clocks := clockWorld(t, 4)
	w.StartGroup(100)
	w.Join(100)
	w.WaitSettled(20 * time.Second)
	l := w.Groups[100].WaitLeader(10 * time.Second)
	var r uint64
	for _, id := range w.Groups[100].IDs() {
		if id != l {
			r = id
			break
		}
	}
	exp := time.Now().Add(1500 * time.Millisecond)
	batchWrite(t, w, &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_PUT, Key: []byte("k"), Value: []byte("v"), ExpireAtMs: exp.UnixMilli()})
	clocks.Get(100, r).Set(-time.Hour)
	deadline := time.Now().Add(10 * time.Second)
	for w.Groups[100].Leader() != r {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		if cur := w.Groups[100].Replica(w.Groups[100].WaitLeader(5 * time.Second)); cur != nil {
			_ = cur.TransferLeadership(ctx, r)
		}
		cancel()
		if time.Now().After(deadline) {
			t.Fatalf("replica %d did not take the lead", r)
		}
	}
	time.Sleep(time.Until(exp) + time.Second)
	for _, id := range w.Groups[100].IDs() {
		if id == r {
			continue
		}
		if e := readOn(t, w, 100, id, "k"); e.Found {
			t.Fatalf("follower %d: key visible %v after its expiry", id, time.Since(exp))
		}
	}
	if e := readOn(t, w, 100, r, "k"); e.Found {
		t.Fatalf("leader %d (clock 1h behind): expired key visible again", r)
	}
	res := batchWrite(t, w, &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_PUT, Key: []byte("k"), Value: []byte("new"), Cond: shardkvpb.WriteOp_IF_ABSENT})
	if !res.Ok {
		t.Fatal("SET NX refused: the write saw the expired key live")
	}
}

// TestReadsAndWritesAgreeOnExpiry: a follower whose clock is a minute
// ahead. GET on every replica and SET NX on the leader decide a key's
// expiry alike, before it and after it.
func TestReadsAndWritesAgreeOnExpiry(t *testing.T) {
	w, clocks := clockWorld(t, 4)
	w.StartGroup(100)
	w.Join(100)
	w.WaitSettled(20 * time.Second)
	l := w.Groups[100].WaitLeader(10 * time.Second)
	for _, id := range w.Groups[100].IDs() {
		if id != l {
			clocks.Get(100, id).Set(time.Minute)
			break
		}
	}
	exp := time.Now().Add(3 * time.Second)
	batchWrite(t, w, &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_PUT, Key: []byte("k"), Value: []byte("v"), ExpireAtMs: exp.UnixMilli()})
	time.Sleep(500 * time.Millisecond)
	for _, id := range w.Groups[100].IDs() {
		e := readOn(t, w, 100, id, "k")
		if !e.Found {
			t.Fatalf("replica %d: key not found %v before its expiry", id, time.Until(exp))
		}
		if left := e.ExpireAtMs - e.NowMs; left <= 0 || left > 3000 {
			t.Fatalf("replica %d: %d ms left, want 1..3000", id, left)
		}
	}
	if res := batchWrite(t, w, &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_PUT, Key: []byte("k"), Value: []byte("nx"), Cond: shardkvpb.WriteOp_IF_ABSENT}); res.Ok {
		t.Fatal("SET NX succeeded on a live key")
	}
	time.Sleep(time.Until(exp) + time.Second)
	for _, id := range w.Groups[100].IDs() {
		if e := readOn(t, w, 100, id, "k"); e.Found {
			t.Fatalf("replica %d: key found %v after its expiry", id, time.Since(exp))
		}
	}
	if res := batchWrite(t, w, &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_PUT, Key: []byte("k"), Value: []byte("nx"), Cond: shardkvpb.WriteOp_IF_ABSENT}); !res.Ok {
		t.Fatal("SET NX refused on an expired key")
	}
}

// TestShardMoveCarriesTime: shards move from a group with right clocks to
// one whose clocks are all 30 s behind, frozen at the source while their
// keys expire there. No key the source saw expired is live at the new
// owner, and the others keep their expiry, not earlier.
func TestShardMoveCarriesTime(t *testing.T) {
	w, clocks := clockWorld(t, 16)
	for id := uint64(1); id <= 3; id++ {
		clocks.Get(101, id).Set(-30 * time.Second)
	}
	w.StartGroup(100)
	w.StartGroup(101)
	w.Join(100)
	w.WaitSettled(20 * time.Second)
	start := time.Now()
	shortAt, longAt := start.Add(3*time.Second), start.Add(600*time.Second)
	const n = 40
	for i := range n {
		batchWrite(t, w, &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_PUT, Key: fmt.Appendf(nil, "short-%d", i), Value: []byte("s"), ExpireAtMs: shortAt.UnixMilli()})
		batchWrite(t, w, &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_PUT, Key: fmt.Appendf(nil, "long-%d", i), Value: []byte("l"), ExpireAtMs: longAt.UnixMilli()})
	}
	// Transfers fail until the short keys have expired at the source,
	// which keeps the moving shards frozen (not expired by it).
	w.Faults.Set(1, 0, 0)
	w.Join(101)
	time.Sleep(time.Until(shortAt) + time.Second)
	w.Faults.Set(0, 0, 0)
	w.WaitSettled(30 * time.Second)
	moved := 0
	for i := range n {
		k := fmt.Sprintf("short-%d", i)
		if owner(t, w, k) == 101 {
			moved++
		}
		if e := readKey(t, w, k); e.Found {
			t.Fatalf("%s (owner %d) live %v after it expired at its source", k, owner(t, w, k), time.Since(shortAt))
		}
		k = fmt.Sprintf("long-%d", i)
		e := readKey(t, w, k)
		if !e.Found || e.ExpireAtMs != longAt.UnixMilli() {
			t.Fatalf("%s after the move: %+v, want expiry %d", k, e, longAt.UnixMilli())
		}
		if left, most := e.ExpireAtMs-e.NowMs, time.Until(longAt).Milliseconds()-2000; left < most {
			t.Fatalf("%s (owner %d): %d ms left, want at least %d", k, owner(t, w, k), left, most)
		}
	}
	if moved == 0 || moved == n {
		t.Fatalf("%d of %d keys moved; the test needs some on each side", moved, n)
	}
}
