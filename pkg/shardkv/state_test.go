package shardkv

import (
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/shardkv/shardkv/pkg/raftgroup"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"google.golang.org/protobuf/proto"
)

// smHarness drives a StateMachine directly through Apply on a real badger DB.
type smHarness struct {
	t     testing.TB
	sm    *StateMachine
	index uint64
	now   time.Time
}

func newSMHarness(t *testing.T) *smHarness {
	db, err := badger.Open(badger.DefaultOptions(t.TempDir()).WithLogger(nil).WithMemTableSize(16 << 20)) // raftgroup's: the write budget assumes its limits
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	sm := NewStateMachine(7)
	if _, err := sm.Open(db); err != nil {
		t.Fatal(err)
	}
	h := &smHarness{t: t, sm: sm, now: time.Unix(1_800_000_000, 0)}
	// Config 1: group 7 owns all 4 shards.
	h.apply(&shardkvpb.GroupCommand{NextConfig: &shardkvpb.Config{Num: 1, Shards: []uint64{7, 7, 7, 7},
		Groups: []*shardkvpb.Group{{Gid: 7, Servers: []*shardkvpb.Server{{Id: 1, Addr: "a:1"}}}}}})
	return h
}

// finishCopy applies the last round of changes of shard s's copy for
// config num, empty (the frozen source had no changes since the snapshot),
// which ends it: the shard is served (Acking).
func (h *smHarness) finishCopy(s int, num uint64) {
	h.t.Helper()
	m := h.sm.Shard(s)
	if res := h.apply(&shardkvpb.GroupCommand{Insert: &shardkvpb.InsertChunk{Shard: uint32(s), ConfigNum: num, Delta: true,
		Cursor: m.Cursor, NextCursor: m.Cursor, CaughtUp: true, Last: true}}); res != nil {
		h.t.Fatalf("last round of shard %d: %v (shard %v)", s, res, m)
	}
	if m := h.sm.Shard(s); m.State != Acking {
		h.t.Fatalf("shard %d after its last round: %v, want Acking", s, m)
	}
}

// copyingSnapshot: the shard's copy is still in its snapshot phase.
func copyingSnapshot(m ShardMeta) bool { return m.State == Pulling && !m.Delta }

func (h *smHarness) apply(cmd *shardkvpb.GroupCommand) any {
	h.t.Helper()
	b, err := proto.Marshal(cmd)
	if err != nil {
		h.t.Fatal(err)
	}
	h.index++
	ents := []raftgroup.Entry{{Index: h.index, Term: 1, Time: h.now, Cmd: b}}
	if err := raftgroup.ApplyAlone(h.sm, h.sm.store.DB(), ents); err != nil {
		h.t.Fatal(err)
	}
	return ents[0].Result
}

func (h *smHarness) write(op *shardkvpb.WriteOp) OpResult {
	h.t.Helper()
	res, ok := h.apply(&shardkvpb.GroupCommand{Writes: []*shardkvpb.WriteOp{op}}).([]OpResult)
	if !ok || len(res) != 1 {
		h.t.Fatalf("unexpected result %v", res)
	}
	return res[0]
}

func appendOp(key, val string, client, seq, ack uint64) *shardkvpb.WriteOp {
	return &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_APPEND, Key: []byte(key), Value: []byte(val),
		Session: &shardkvpb.Session{ClientId: client, Seq: seq, Ack: ack}}
}

func (h *smHarness) get(key string) string {
	h.t.Helper()
	v, _, code, err := h.sm.Get([]byte(key), h.now.UnixMilli())
	if err != nil || code != OK {
		h.t.Fatalf("get %s: %v %v", key, code, err)
	}
	return string(v)
}

func TestOutOfOrderSessionsApplyExactlyOnce(t *testing.T) {
	h := newSMHarness(t)
	// A pipelining client: seqs complete out of order, and each may be
	// retried (a lost reply) before or after later ones.
	for _, seq := range []uint64{3, 1, 2, 1, 3, 5, 2, 4, 5} {
		h.write(appendOp("k", string(rune('0'+seq)), 9, seq, 0))
	}
	if got := h.get("k"); got != "31254" {
		t.Fatalf("value %q, want each of 1..5 exactly once in apply order (31254)", got)
	}
	// Acknowledging 1..5 lets the group forget them; a stale duplicate of an
	// acknowledged seq changes nothing.
	h.write(appendOp("k", "6", 9, 6, 5))
	h.write(appendOp("k", "2", 9, 2, 5))
	if got := h.get("k"); got != "312546" {
		t.Fatalf("after ack: %q", got)
	}
	// Another client's seqs are independent.
	h.write(appendOp("k", "x", 10, 1, 0))
	h.write(appendOp("k", "x", 10, 1, 0))
	if got := h.get("k"); got != "312546x" {
		t.Fatalf("second client: %q", got)
	}
	// The remembered result (return_prev) is returned on a retry.
	op := &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_PUT, Key: []byte("k"), Value: []byte("new"), ReturnPrev: true,
		Session: &shardkvpb.Session{ClientId: 9, Seq: 7, Ack: 6}}
	first := h.write(op)
	h.write(&shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_PUT, Key: []byte("k"), Value: []byte("newer"), Session: &shardkvpb.Session{ClientId: 9, Seq: 8, Ack: 6}})
	again := h.write(op)
	if string(first.Result.Prev) != "312546x" || !proto.Equal(first.Result, again.Result) || h.get("k") != "newer" {
		t.Fatalf("retry of a PUT with return_prev: first %v, again %v, value %q", first.Result, again.Result, h.get("k"))
	}
}

// TestRetryKeepsTheRefusal: a retried op (its reply was lost) gets the
// result the first application had, refusals included. The session used
// to remember only ok, prev and prev_found, so a retried APPEND past the
// value limit, or INCR of a non-integer, was answered as a success.
func TestRetryKeepsTheRefusal(t *testing.T) {
	h := newSMHarness(t)
	h.write(&shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_PUT, Key: []byte("n"), Value: []byte("not a number")})
	incr := &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_INCR, Key: []byte("n"), Delta: 1,
		Session: &shardkvpb.Session{ClientId: 9, Seq: 1}}
	first := h.write(incr)
	if first.Result.GetError() != shardkvpb.OpErrNotInteger {
		t.Fatalf("INCR of a string: %v, want %s", first.Result, shardkvpb.OpErrNotInteger)
	}
	// Another op of the session in between: the retry is answered from
	// the stored record, not from the one in memory.
	h.write(appendOp("other", "x", 9, 2, 0))
	again := h.write(incr)
	if !proto.Equal(first.Result, again.Result) {
		t.Fatalf("retried INCR: %v, first answered %v", again.Result, first.Result)
	}
	// The results with a value: INCR's new value, APPEND's new length,
	// INCR_FLOAT's value.
	for i, op := range []*shardkvpb.WriteOp{
		{Kind: shardkvpb.WriteOp_INCR, Key: []byte("c"), Delta: 41},
		{Kind: shardkvpb.WriteOp_APPEND, Key: []byte("a"), Value: []byte("abc")},
		{Kind: shardkvpb.WriteOp_INCR_FLOAT, Key: []byte("f"), Value: []byte("1.5")},
	} {
		op.Session = &shardkvpb.Session{ClientId: 9, Seq: uint64(10 + i)}
		first := h.write(op)
		if first.Result.GetNum() == 0 && len(first.Result.GetValue()) == 0 {
			t.Fatalf("%v: no value in %v", op.Kind, first.Result)
		}
		h.write(appendOp("other", "y", 9, uint64(20+i), 0))
		again := h.write(op)
		if !proto.Equal(first.Result, again.Result) {
			t.Fatalf("retried %v: %v, first answered %v", op.Kind, again.Result, first.Result)
		}
	}
}

func TestSessionsExpireByLogTime(t *testing.T) {
	h := newSMHarness(t)
	h.write(appendOp("a", "1", 5, 1, 0))
	s := shardOf(h, "a")
	if !hasKey(t, h.sm, sessionKey(s, 5)) {
		t.Fatal("no session stored")
	}
	h.now = h.now.Add(SessionTTL / 2)
	h.apply(&shardkvpb.GroupCommand{ExpireSessions: true})
	if !hasKey(t, h.sm, sessionKey(s, 5)) {
		t.Fatal("session expired before its TTL")
	}
	h.now = h.now.Add(SessionTTL)
	h.apply(&shardkvpb.GroupCommand{ExpireSessions: true})
	if hasKey(t, h.sm, sessionKey(s, 5)) {
		t.Fatal("idle session not expired after its TTL")
	}
	// A leader with a clock behind the last entry does not move log time back.
	before := h.sm.logTime
	h.now = h.now.Add(-time.Hour)
	h.write(appendOp("a", "2", 6, 1, 0))
	if h.sm.logTime != before {
		t.Fatalf("log time went back: %d -> %d", before, h.sm.logTime)
	}
}

func TestDeleteLeavesTombstoneUntilPurged(t *testing.T) {
	h := newSMHarness(t)
	h.write(&shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_PUT, Key: []byte("gone"), Value: []byte("v")})
	if r := h.write(&shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_DELETE, Key: []byte("gone")}); !r.Result.Ok {
		t.Fatal("delete of an existing key reported false")
	}
	if r := h.write(&shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_DELETE, Key: []byte("gone")}); r.Result.Ok {
		t.Fatal("delete of a deleted key reported true")
	}
	s := shardOf(h, "gone")
	if v, found, _, _ := h.sm.Get([]byte("gone"), h.now.UnixMilli()); found {
		t.Fatalf("deleted key visible: %q", v)
	}
	if !hasKey(t, h.sm, dataKey(s, []byte("gone"))) || !hasKey(t, h.sm, tombstoneKey(s, []byte("gone"))) {
		t.Fatal("delete left no tombstone (needed for changes-since-index)")
	}
	h.index += TombstoneTTL
	h.apply(&shardkvpb.GroupCommand{ExpireSessions: true})
	if hasKey(t, h.sm, dataKey(s, []byte("gone"))) || hasKey(t, h.sm, tombstoneKey(s, []byte("gone"))) {
		t.Fatal("old tombstone not purged")
	}
	// CAS on absence, then on value.
	if r := h.write(&shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_CAS, Key: []byte("c"), Value: []byte("1"), ExpectAbsent: true}); !r.Result.Ok {
		t.Fatal("cas on absent key failed")
	}
	if r := h.write(&shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_CAS, Key: []byte("c"), Value: []byte("2"), Expect: []byte("0")}); r.Result.Ok {
		t.Fatal("cas with a wrong expectation succeeded")
	}
	if r := h.write(&shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_CAS, Key: []byte("c"), Value: []byte("2"), Expect: []byte("1")}); !r.Result.Ok || h.get("c") != "2" {
		t.Fatal("cas with the right expectation failed")
	}
}

func TestWritesCheckOwnershipAtApply(t *testing.T) {
	h := newSMHarness(t)
	h.write(&shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_PUT, Key: []byte("k"), Value: []byte("v")})
	s := shardOf(h, "k")
	shards := []uint64{7, 7, 7, 7}
	shards[s] = 8
	h.apply(&shardkvpb.GroupCommand{NextConfig: &shardkvpb.Config{Num: 2, Shards: shards}})
	if m := h.sm.Shard(s); m.State != BePulling || m.Peer != 8 {
		t.Fatalf("shard %d: %v, want BePulling to 8", s, m)
	}
	if r := h.write(appendOp("k", "x", 1, 1, 0)); r.Code != WrongGroup {
		t.Fatalf("write to a BePulling shard: %v", r)
	}
	// Not recorded as done: the same seq applies once the shard is served.
	if hasKey(t, h.sm, sessionKey(s, 1)) {
		t.Fatal("a refused write left a dedup entry")
	}
	// Steps are refused while a shard moves.
	if res := h.apply(&shardkvpb.GroupCommand{NextConfig: &shardkvpb.Config{Num: 3, Shards: []uint64{7, 7, 7, 7}}}); res == nil {
		t.Fatal("stepped to config 3 while a shard was BePulling")
	}
	h.apply(&shardkvpb.GroupCommand{Gc: &shardkvpb.ShardRef{Shard: uint32(s), ConfigNum: 2}})
	for h.sm.Shard(s).State == GCing {
		h.apply(&shardkvpb.GroupCommand{DeleteChunk: &shardkvpb.ShardRef{Shard: uint32(s), ConfigNum: 2}})
	}
	if n, _ := h.sm.CountKeys(s); n != 0 || hasKey(t, h.sm, shardPrefix(s)) {
		t.Fatalf("GC left %d keys", n)
	}
	if !h.sm.Stable() {
		t.Fatal("not stable after GC")
	}
}

func shardOf(h *smHarness, key string) int {
	s, code := h.sm.route([]byte(key))
	if code != OK {
		h.t.Fatalf("route %s: %v", key, code)
	}
	return s
}

func hasKey(t *testing.T, sm *StateMachine, prefix []byte) bool {
	found := false
	err := sm.store.DB().View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix})
		defer it.Close()
		it.Rewind()
		found = it.Valid()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return found
}

func TestIdleGroupMayJumpOverCompactedConfigs(t *testing.T) {
	h := newSMHarness(t) // config 1: group 7 owns everything
	// Config 2 hands everything to group 8; after the hand-off group 7 owns
	// nothing.
	h.apply(&shardkvpb.GroupCommand{NextConfig: &shardkvpb.Config{Num: 2, Shards: []uint64{8, 8, 8, 8}}})
	for s := range 4 {
		h.apply(&shardkvpb.GroupCommand{Gc: &shardkvpb.ShardRef{Shard: uint32(s), ConfigNum: 2}})
		for h.sm.Shard(s).State == GCing {
			h.apply(&shardkvpb.GroupCommand{DeleteChunk: &shardkvpb.ShardRef{Shard: uint32(s), ConfigNum: 2}})
		}
	}
	// Configs 3..9 were compacted while it was down: it may jump to 10,
	// where it owns nothing...
	h.apply(&shardkvpb.GroupCommand{NextConfig: &shardkvpb.Config{Num: 10, Shards: []uint64{8, 8, 9, 9}}})
	if got := h.sm.Config().Num; got != 10 {
		t.Fatalf("idle group stuck at config %d", got)
	}
	// ...but never jump into a config where it owns shards (it would not
	// know their previous owners).
	if res := h.apply(&shardkvpb.GroupCommand{NextConfig: &shardkvpb.Config{Num: 12, Shards: []uint64{7, 8, 9, 9}}}); res == nil || h.sm.Config().Num != 10 {
		t.Fatalf("jumped into a config that gives it shards: %v, now at %d", res, h.sm.Config().Num)
	}
	// Stepping normally still works, and gaining shards pulls them.
	h.apply(&shardkvpb.GroupCommand{NextConfig: &shardkvpb.Config{Num: 11, Shards: []uint64{7, 8, 9, 9}}})
	if m := h.sm.Shard(0); h.sm.Config().Num != 11 || m.State != Pulling || m.Peer != 8 {
		t.Fatalf("config %d, shard 0 %v; want 11 and Pulling from 8", h.sm.Config().Num, m)
	}
}
