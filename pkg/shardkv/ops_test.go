package shardkv

import (
	"bytes"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/shardkv/shardkv/pkg/routing"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

func op(kind shardkvpb.WriteOp_Kind, key string, f ...func(*shardkvpb.WriteOp)) *shardkvpb.WriteOp {
	o := &shardkvpb.WriteOp{Kind: kind, Key: []byte(key)}
	for _, fn := range f {
		fn(o)
	}
	return o
}

func val(v string) func(*shardkvpb.WriteOp) {
	return func(o *shardkvpb.WriteOp) { o.Value = []byte(v) }
}
func exp(ms int64) func(*shardkvpb.WriteOp) { return func(o *shardkvpb.WriteOp) { o.ExpireAtMs = ms } }
func cond(c shardkvpb.WriteOp_Cond) func(*shardkvpb.WriteOp) {
	return func(o *shardkvpb.WriteOp) { o.Cond = c }
}
func delta(d int64) func(*shardkvpb.WriteOp) { return func(o *shardkvpb.WriteOp) { o.Delta = d } }

func (h *smHarness) entry(key string) ValueEntry {
	h.t.Helper()
	e, code, err := h.sm.getEntry([]byte(key), h.now.UnixMilli())
	if err != nil || code != OK {
		h.t.Fatalf("get %s: %v %v", key, code, err)
	}
	return e
}

func TestRedisOps(t *testing.T) {
	h := newSMHarness(t)
	now := h.now.UnixMilli()
	P, A, D, I, F, E, X := shardkvpb.WriteOp_PUT, shardkvpb.WriteOp_APPEND, shardkvpb.WriteOp_DELETE, shardkvpb.WriteOp_INCR,
		shardkvpb.WriteOp_INCR_FLOAT, shardkvpb.WriteOp_EXPIRE, shardkvpb.WriteOp_PERSIST
	check := func(name string, r OpResult, ok bool, errText string) *shardkvpb.WriteResult {
		t.Helper()
		if r.Code != OK || r.Result.Ok != ok || r.Result.Error != errText {
			t.Fatalf("%s: got code %v ok=%v err=%q, want ok=%v err=%q", name, r.Code, r.Result.GetOk(), r.Result.GetError(), ok, errText)
		}
		return r.Result
	}
	// SET NX / XX.
	check("xx on absent", h.write(op(P, "k", val("1"), cond(shardkvpb.WriteOp_IF_PRESENT))), false, "")
	check("nx on absent", h.write(op(P, "k", val("1"), cond(shardkvpb.WriteOp_IF_ABSENT))), true, "")
	check("nx on present", h.write(op(P, "k", val("2"), cond(shardkvpb.WriteOp_IF_ABSENT))), false, "")
	if h.get("k") != "1" {
		t.Fatal("SET NX overwrote")
	}
	// INCR family.
	if r := check("incr", h.write(op(I, "k", delta(41))), true, ""); r.Num != 42 || h.get("k") != "42" {
		t.Fatalf("incr: %d %q", r.Num, h.get("k"))
	}
	check("incr overflow", h.write(op(I, "k", delta(1<<62), func(o *shardkvpb.WriteOp) { o.Delta = 9223372036854775807 })), false, errOverflow)
	h.write(op(P, "s", val("abc")))
	check("incr non-int", h.write(op(I, "s", delta(1))), false, errNotInteger)
	h.write(op(P, "s", val(" 1")))
	check("incr spaced int", h.write(op(I, "s", delta(1))), false, errNotInteger)
	if r := check("incr absent", h.write(op(I, "new", delta(-5))), true, ""); r.Num != -5 {
		t.Fatalf("incr on absent: %d", r.Num)
	}
	if r := check("incrbyfloat", h.write(op(F, "f", val("10.5"))), true, ""); string(r.Value) != "10.5" {
		t.Fatalf("incrbyfloat: %q", r.Value)
	}
	if r := check("incrbyfloat 2", h.write(op(F, "f", val("0.1"))), true, ""); string(r.Value) != "10.6" {
		t.Fatalf("incrbyfloat: %q", r.Value)
	}
	if r := check("incrbyfloat 0.2", h.write(op(F, "g", val("0.1"))), true, ""); string(r.Value) != "0.1" {
		t.Fatalf("incrbyfloat: %q", r.Value)
	}
	if r := check("incrbyfloat 0.1+0.2", h.write(op(F, "g", val("0.2"))), true, ""); string(r.Value) != "0.3" {
		t.Fatalf("incrbyfloat 0.1+0.2 = %q, want 0.3 as Redis shows it", r.Value)
	}
	if r := check("incrbyfloat 17 digits", h.write(op(F, "h", val("1.2345678901234567"))), true, ""); string(r.Value) != "1.2345678901234567" {
		t.Fatalf("incrbyfloat kept %q, want all 17 digits", r.Value)
	}
	if r := check("incrbyfloat large", h.write(op(F, "h2", val("1e20"))), true, ""); string(r.Value) != "100000000000000000000" {
		t.Fatalf("incrbyfloat 1e20 = %q, want no exponent", r.Value)
	}
	check("incrbyfloat on text", h.write(op(F, "s", val("1"))), false, errNotFloat)
	check("incrbyfloat to inf", h.write(op(F, "f", val("1e308"), func(o *shardkvpb.WriteOp) {})), true, "")
	check("incrbyfloat to inf 2", h.write(op(F, "f", val("1.7e308"))), false, errNaN)
	h.write(op(P, "inf", val("inf")))
	check("incrbyfloat on inf", h.write(op(F, "inf", val("1"))), false, errNaN)
	check("incrbyfloat by inf", h.write(op(F, "f", val("inf"))), false, errNaN)
	check("incrbyfloat by nan", h.write(op(F, "f", val("nan"))), false, errNotFloat)
	// APPEND keeps the TTL; PUT without KEEPTTL drops it; PUT with KEEPTTL keeps it.
	h.write(op(P, "t", val("a"), exp(now+60_000)))
	if r := check("append", h.write(op(A, "t", val("bc"))), true, ""); r.Num != 3 || h.entry("t").ExpireAtMs != now+60_000 {
		t.Fatalf("append: len %d expiry %d", r.Num, h.entry("t").ExpireAtMs)
	}
	h.write(op(P, "t", val("x"), func(o *shardkvpb.WriteOp) { o.KeepTtl = true }))
	if h.entry("t").ExpireAtMs != now+60_000 {
		t.Fatal("SET KEEPTTL dropped the expiry")
	}
	h.write(op(P, "t", val("y")))
	if h.entry("t").ExpireAtMs != 0 {
		t.Fatal("SET kept the expiry")
	}
	// EXPIRE conditions: no expiry counts as infinite.
	check("expire xx without ttl", h.write(op(E, "t", exp(now+5000), cond(shardkvpb.WriteOp_IF_PRESENT))), false, "")
	check("expire gt without ttl", h.write(op(E, "t", exp(now+5000), cond(shardkvpb.WriteOp_IF_GREATER))), false, "")
	check("expire xx lt without ttl", h.write(op(E, "t", exp(now+5000), cond(shardkvpb.WriteOp_IF_PRESENT_LESS))), false, "")
	check("expire lt without ttl", h.write(op(E, "t", exp(now+5000), cond(shardkvpb.WriteOp_IF_LESS))), true, "")
	check("expire xx lt larger", h.write(op(E, "t", exp(now+6000), cond(shardkvpb.WriteOp_IF_PRESENT_LESS))), false, "")
	check("expire xx lt smaller", h.write(op(E, "t", exp(now+5000-1), cond(shardkvpb.WriteOp_IF_PRESENT_LESS))), true, "")
	check("expire back", h.write(op(E, "t", exp(now+5000))), true, "")
	check("expire nx with ttl", h.write(op(E, "t", exp(now+9000), cond(shardkvpb.WriteOp_IF_ABSENT))), false, "")
	check("expire gt smaller", h.write(op(E, "t", exp(now+4000), cond(shardkvpb.WriteOp_IF_GREATER))), false, "")
	check("expire gt larger", h.write(op(E, "t", exp(now+8000), cond(shardkvpb.WriteOp_IF_GREATER))), true, "")
	if h.entry("t").ExpireAtMs != now+8000 {
		t.Fatal("EXPIRE GT did not set the expiry")
	}
	check("expire absent", h.write(op(E, "nope", exp(now+8000))), false, "")
	check("persist", h.write(op(X, "t")), true, "")
	check("persist again", h.write(op(X, "t")), false, "")
	// EXPIRE in the past deletes at once.
	check("expire past", h.write(op(E, "t", exp(now-1))), true, "")
	if h.entry("t").Found {
		t.Fatal("key expired in the past still visible")
	}
	check("delete absent", h.write(op(D, "t")), false, "")
}

// TestKeysExpireThroughTheLog: an expired key is invisible at once, and an
// expire_keys entry deletes it and its index entry, in served shards only.
func TestKeysExpireThroughTheLog(t *testing.T) {
	h := newSMHarness(t)
	now := h.now.UnixMilli()
	h.write(op(shardkvpb.WriteOp_PUT, "short", val("v"), exp(now+1000)))
	h.write(op(shardkvpb.WriteOp_PUT, "long", val("v"), exp(now+60_000)))
	h.write(op(shardkvpb.WriteOp_PUT, "forever", val("v")))
	if h.sm.expiryDue(now) {
		t.Fatal("expiry due before any key expired")
	}
	if n := h.apply(&shardkvpb.GroupCommand{ExpireKeys: true}); n != 0 {
		t.Fatalf("expired %v keys early", n)
	}
	h.now = h.now.Add(1500 * time.Millisecond)
	if h.entry("short").Found {
		t.Fatal("expired key visible")
	}
	s := shardOf(h, "short")
	if !hasKey(t, h.sm, dataKey(s, []byte("short"))) {
		t.Fatal("expired key deleted without a log entry")
	}
	if !h.sm.expiryDue(h.now.UnixMilli()) {
		t.Fatal("expiry not due")
	}
	if n := h.apply(&shardkvpb.GroupCommand{ExpireKeys: true}); n != 1 {
		t.Fatalf("expired %v keys, want 1", n)
	}
	if hasKey(t, h.sm, expiresKey(now+1000, s, []byte("short"))) {
		t.Fatal("expiry index entry left behind")
	}
	if !hasKey(t, h.sm, tombstoneKey(s, []byte("short"))) {
		t.Fatal("expired key left no tombstone")
	}
	if h.sm.expiryDue(h.now.UnixMilli()) {
		t.Fatal("expiry still due")
	}
	// Overwriting a key moves its index entry.
	h.write(op(shardkvpb.WriteOp_PUT, "long", val("w"), exp(now+2000)))
	if hasKey(t, h.sm, expiresKey(now+60_000, shardOf(h, "long"), []byte("long"))) {
		t.Fatal("overwrite left the old expiry index entry")
	}
	if !hasKey(t, h.sm, expiresKey(now+2000, shardOf(h, "long"), []byte("long"))) {
		t.Fatal("overwrite did not index the new expiry")
	}
	h.now = h.now.Add(time.Second)
	if n := h.apply(&shardkvpb.GroupCommand{ExpireKeys: true}); n != 1 || h.entry("long").Found || !h.entry("forever").Found {
		t.Fatalf("expired %v; long found %v, forever found %v", n, h.entry("long").Found, h.entry("forever").Found)
	}
}

// TestRelativeTTLAtApply: a relative expiry (ttl_ms) becomes absolute
// from the entry's log time, whatever clock the proposer had; a
// non-positive one on EXPIRE deletes the key.
func TestRelativeTTLAtApply(t *testing.T) {
	h := newSMHarness(t)
	ms := func(v int64) func(*shardkvpb.WriteOp) { return func(o *shardkvpb.WriteOp) { o.TtlMs = &v } }
	h.write(op(shardkvpb.WriteOp_PUT, "k", val("v"), ms(1500)))
	if e := h.entry("k"); e.ExpireAtMs != h.now.UnixMilli()+1500 {
		t.Fatalf("PUT ttl 1500 at %d: expiry %d", h.now.UnixMilli(), e.ExpireAtMs)
	}
	h.now = h.now.Add(time.Second)
	h.write(op(shardkvpb.WriteOp_EXPIRE, "k", ms(60_000), cond(shardkvpb.WriteOp_IF_GREATER)))
	if e := h.entry("k"); e.ExpireAtMs != h.now.UnixMilli()+60_000 {
		t.Fatalf("EXPIRE GT ttl 60000 at %d: expiry %d", h.now.UnixMilli(), e.ExpireAtMs)
	}
	if r := h.write(op(shardkvpb.WriteOp_EXPIRE, "k", ms(-1))); !r.Result.Ok {
		t.Fatal("EXPIRE -1 refused")
	}
	if e, code, err := h.sm.GetEntry([]byte("k")); err != nil || code != OK || e.Found {
		t.Fatalf("EXPIRE -1 left the key: %+v %v %v", e, code, err)
	}
}

// TestChunkRaisesLogClock: an installed chunk carries its source's log
// clock, and ours moves up to it, never back: a key the source saw
// expired is not live here.
func TestChunkRaisesLogClock(t *testing.T) {
	h := pullingHarness(t)
	key := []byte("k")
	for i := 0; routing.ShardOf(key, 4) != 3; i++ {
		key = fmt.Appendf(nil, "k%d", i)
	}
	ahead := h.now.Add(time.Minute) // the source's log clock
	res := h.apply(&shardkvpb.GroupCommand{Insert: &shardkvpb.InsertChunk{Shard: 3, ConfigNum: 2, Last: true, TotalKeys: 1, LogTimeNs: ahead.UnixNano(),
		Kvs: []*shardkvpb.KeyValue{{Key: dataKey(3, key), Record: record{ExpireAtMs: h.now.Add(30 * time.Second).UnixMilli(), Value: []byte("v")}.encode()}}}})
	if res != nil {
		t.Fatalf("insert: %v", res)
	}
	if got := h.sm.LogTime(); !got.Equal(ahead) {
		t.Fatalf("log clock %v after a chunk from %v", got, ahead)
	}
	h.finishCopy(3, 2)
	h.apply(&shardkvpb.GroupCommand{ExpireKeys: true}) // an entry with the older time
	if got := h.sm.LogTime(); !got.Equal(ahead) {
		t.Fatalf("log clock went back to %v", got)
	}
	if e, code, err := h.sm.GetEntry(key); err != nil || code != OK || e.Found {
		t.Fatalf("key expired at its source is live here: %+v %v %v", e, code, err)
	}
}

// TestAppendEncodesInPlace: APPEND's record encodes into the buffer it
// was built in (one copy of the value per APPEND, not two), and the bytes
// decode to the old value, then the appended one, with the old expiry and
// the new index; the old record's bytes are untouched.
func TestAppendEncodesInPlace(t *testing.T) {
	stored := record{Index: 3, ExpireAtMs: 5000, Value: []byte("hello ")}.encode()
	before := slices.Clone(stored)
	old, err := decodeRecord(stored)
	if err != nil {
		t.Fatal(err)
	}
	res := &shardkvpb.WriteResult{}
	next, err := applyOp(&shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_APPEND, Key: []byte("k"), Value: []byte("world")}, &old, true, 1000, 1<<20, res)
	if err != nil || next == nil || !res.Ok || res.Num != 11 {
		t.Fatalf("APPEND: %+v, %v, %+v", next, err, res)
	}
	next.Index = 9
	enc := next.encode()
	if &enc[recordHeader] != &next.Value[0] {
		t.Errorf("APPEND's record was copied to encode it")
	}
	got, err := decodeRecord(enc)
	if err != nil || string(got.Value) != "hello world" || got.Index != 9 || got.ExpireAtMs != 5000 || got.Tombstone {
		t.Errorf("decoded %+v, %v; want hello world, index 9, expiry 5000", got, err)
	}
	if !bytes.Equal(stored, before) {
		t.Errorf("the old record's bytes changed: %q -> %q", before, stored)
	}
	// A record whose Value is not in its framed buffer is copied.
	r := record{Value: []byte("x"), framed: make([]byte, recordHeader+1)}
	if enc := r.encode(); &enc[recordHeader] == &r.framed[recordHeader] || string(enc[recordHeader:]) != "x" {
		t.Errorf("encode used a framed buffer that does not hold Value: %q", enc)
	}
}
