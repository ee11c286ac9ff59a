package shardkv

import (
	"fmt"
	"strings"
	"testing"

	"github.com/dgraph-io/badger/v4"
	"github.com/shardkv/shardkv/pkg/routing"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

func dest(k string) func(*shardkvpb.WriteOp) {
	return func(o *shardkvpb.WriteOp) { o.Dest = []byte(k) }
}

// TestSetRange: SETRANGE pads with zero bytes, keeps the TTL, answers the
// length, and refuses a negative offset or a result over the value limit
// without writing.
func TestSetRange(t *testing.T) {
	h := newSMHarness(t)
	now := h.now.UnixMilli()
	R := shardkvpb.WriteOp_SET_RANGE
	at := func(o int64) func(*shardkvpb.WriteOp) { return delta(o) }
	if r := h.write(op(R, "a", val("xy"), at(3))); r.Result.Num != 5 || h.get("a") != "\x00\x00\x00xy" {
		t.Fatalf("on an absent key: %d %q", r.Result.Num, h.get("a"))
	}
	h.write(op(shardkvpb.WriteOp_PUT, "b", val("Hello World"), exp(now+60_000)))
	if r := h.write(op(R, "b", val("Redis"), at(6))); r.Result.Num != 11 || h.get("b") != "Hello Redis" || h.entry("b").ExpireAtMs != now+60_000 {
		t.Fatalf("overwrite: %d %q expiry %d", r.Result.Num, h.get("b"), h.entry("b").ExpireAtMs)
	}
	if r := h.write(op(R, "b", val(""), at(100))); r.Result.Num != 11 || h.get("b") != "Hello Redis" {
		t.Fatalf("an empty value changed the key: %d %q", r.Result.Num, h.get("b"))
	}
	if r := h.write(op(R, "none", val(""), at(1))); r.Result.Num != 0 || h.entry("none").Found {
		t.Fatalf("an empty value on an absent key: %d, found %v", r.Result.Num, h.entry("none").Found)
	}
	if r := h.write(op(R, "b", val("z"), at(-1))); r.Result.Error != errOffset || h.get("b") != "Hello Redis" {
		t.Fatalf("negative offset: %q %q", r.Result.Error, h.get("b"))
	}
	limit := int64(MaxValueBytesLimit) // the harness proposes no limit of its own
	if r := h.write(op(R, "b", val("zz"), at(limit-1))); r.Result.Error != errValueTooLarge || h.get("b") != "Hello Redis" {
		t.Fatalf("past the value limit: %q", r.Result.Error)
	}
	if r := h.write(op(R, "c", val("zz"), at(limit-2))); r.Result.Error != "" || r.Result.Num != limit {
		t.Fatalf("at the value limit: %q %d", r.Result.Error, r.Result.Num)
	}
}

// TestRenameCopy: RENAME moves value and expiry and deletes the source;
// RENAMENX and COPY without REPLACE leave an existing destination alone; a
// destination in another shard is refused and nothing changes.
func TestRenameCopy(t *testing.T) {
	h := newSMHarness(t)
	now := h.now.UnixMilli()
	P, RN, CP := shardkvpb.WriteOp_PUT, shardkvpb.WriteOp_RENAME, shardkvpb.WriteOp_COPY
	nx := cond(shardkvpb.WriteOp_IF_ABSENT)
	h.write(op(P, "{t}a", val("1"), exp(now+60_000)))
	if r := h.write(op(RN, "{t}a", dest("{t}b"))); !r.Result.Ok || h.entry("{t}a").Found || h.get("{t}b") != "1" || h.entry("{t}b").ExpireAtMs != now+60_000 {
		t.Fatalf("rename: %v, a found %v, b %q expiry %d", r.Result, h.entry("{t}a").Found, h.get("{t}b"), h.entry("{t}b").ExpireAtMs)
	}
	if r := h.write(op(RN, "{t}a", dest("{t}b"))); r.Result.Error != errNoSuchKey || h.get("{t}b") != "1" {
		t.Fatalf("rename of an absent key: %v", r.Result)
	}
	if r := h.write(op(RN, "{t}b", dest("{t}b"))); !r.Result.Ok || h.get("{t}b") != "1" {
		t.Fatalf("rename to itself: %v", r.Result)
	}
	if r := h.write(op(RN, "{t}b", dest("{t}b"), nx)); r.Result.Ok || r.Result.Error != "" {
		t.Fatalf("renamenx to itself: %v", r.Result)
	}
	h.write(op(P, "{t}c", val("2")))
	if r := h.write(op(RN, "{t}c", dest("{t}b"), nx)); r.Result.Ok || h.get("{t}b") != "1" || h.get("{t}c") != "2" {
		t.Fatalf("renamenx onto an existing key: %v", r.Result)
	}
	if r := h.write(op(RN, "{t}c", dest("{t}b"))); !r.Result.Ok || h.get("{t}b") != "2" || h.entry("{t}b").ExpireAtMs != 0 || h.entry("{t}c").Found {
		t.Fatalf("rename onto an existing key: %v, b %q expiry %d", r.Result, h.get("{t}b"), h.entry("{t}b").ExpireAtMs)
	}
	// COPY.
	h.write(op(P, "{t}d", val("3"), exp(now+9_000)))
	if r := h.write(op(CP, "{t}d", dest("{t}b"), nx)); r.Result.Ok || h.get("{t}b") != "2" {
		t.Fatalf("copy onto an existing key without replace: %v", r.Result)
	}
	if r := h.write(op(CP, "{t}d", dest("{t}b"))); !r.Result.Ok || h.get("{t}b") != "3" || h.get("{t}d") != "3" || h.entry("{t}b").ExpireAtMs != now+9_000 {
		t.Fatalf("copy with replace: %v, b %q expiry %d", r.Result, h.get("{t}b"), h.entry("{t}b").ExpireAtMs)
	}
	if r := h.write(op(CP, "{t}none", dest("{t}b"))); r.Result.Ok || r.Result.Error != "" || h.get("{t}b") != "3" {
		t.Fatalf("copy of an absent key: %v", r.Result)
	}
	// Another shard: refused, nothing written.
	other := ""
	for i := 0; other == ""; i++ {
		if k := fmt.Sprintf("o%d", i); routing.ShardOf([]byte(k), 4) != routing.ShardOf([]byte("{t}d"), 4) {
			other = k
		}
	}
	for _, kind := range []shardkvpb.WriteOp_Kind{RN, CP} {
		if r := h.write(op(kind, "{t}d", dest(other))); r.Result.Error != shardkvpb.OpErrCrossShard || h.entry(other).Found || h.get("{t}d") != "3" {
			t.Fatalf("%v to another shard: %v", kind, r.Result)
		}
	}
	// A destination key too long for the index: refused, nothing written.
	long := "{t}" + strings.Repeat("L", MaxKeyBytesLimit)
	if r := h.write(op(RN, "{t}d", dest(long))); r.Result.Error != shardkvpb.OpErrKeyTooLarge || h.get("{t}d") != "3" {
		t.Fatalf("rename to a key past the limit: %v", r.Result)
	}
}

// TestMSetNX: every key is set, or none when one exists (live); a key
// named twice takes its last value; a key of another shard is refused and
// nothing is written.
func TestMSetNX(t *testing.T) {
	h := newSMHarness(t)
	now := h.now.UnixMilli()
	M := shardkvpb.WriteOp_MSET_NX
	more := func(kv ...string) func(*shardkvpb.WriteOp) {
		return func(o *shardkvpb.WriteOp) {
			for i := 0; i < len(kv); i += 2 {
				o.MoreKeys = append(o.MoreKeys, []byte(kv[i]))
				o.MoreValues = append(o.MoreValues, []byte(kv[i+1]))
			}
		}
	}
	if r := h.write(op(M, "{m}a", val("1"), more("{m}b", "2", "{m}a", "3"))); !r.Result.Ok || h.get("{m}a") != "3" || h.get("{m}b") != "2" {
		t.Fatalf("all absent: %v, a %q b %q", r.Result, h.get("{m}a"), h.get("{m}b"))
	}
	if r := h.write(op(M, "{m}c", val("x"), more("{m}b", "y"))); r.Result.Ok || h.entry("{m}c").Found || h.get("{m}b") != "2" {
		t.Fatalf("one exists: %v, c found %v", r.Result, h.entry("{m}c").Found)
	}
	h.write(op(shardkvpb.WriteOp_PUT, "{m}gone", val("v"), exp(now-1)))
	if r := h.write(op(M, "{m}gone", val("new"))); !r.Result.Ok || h.get("{m}gone") != "new" || h.entry("{m}gone").ExpireAtMs != 0 {
		t.Fatalf("over an expired key: %v", r.Result)
	}
	other := ""
	for i := 0; other == ""; i++ {
		if k := fmt.Sprintf("o%d", i); routing.ShardOf([]byte(k), 4) != routing.ShardOf([]byte("{m}d"), 4) {
			other = k
		}
	}
	if r := h.write(op(M, "{m}d", val("1"), more(other, "2"))); r.Result.Error != shardkvpb.OpErrCrossShard || h.entry("{m}d").Found || h.entry(other).Found {
		t.Fatalf("another shard: %v", r.Result)
	}
}

// TestSetBit: SETBIT answers the old bit, pads with zero bytes, keeps the
// TTL, and refuses a bad offset or bit without writing.
func TestSetBit(t *testing.T) {
	h := newSMHarness(t)
	now := h.now.UnixMilli()
	B := shardkvpb.WriteOp_SET_BIT
	bit := func(b byte) func(*shardkvpb.WriteOp) { return func(o *shardkvpb.WriteOp) { o.Value = []byte{b} } }
	if r := h.write(op(B, "b", delta(9), bit(1))); !r.Result.Ok || r.Result.Num != 0 || h.get("b") != "\x00\x40" {
		t.Fatalf("set on an absent key: %v %q", r.Result, h.get("b"))
	}
	if r := h.write(op(B, "b", delta(9), bit(0))); r.Result.Num != 1 || h.get("b") != "\x00\x00" {
		t.Fatalf("clear: %v %q", r.Result, h.get("b"))
	}
	h.write(op(shardkvpb.WriteOp_PUT, "t", val("a"), exp(now+60_000)))
	if r := h.write(op(B, "t", delta(7), bit(0))); r.Result.Num != 1 || h.get("t") != "`" || h.entry("t").ExpireAtMs != now+60_000 {
		t.Fatalf("on a value with a TTL: %v %q", r.Result, h.get("t"))
	}
	for _, bad := range []*shardkvpb.WriteOp{op(B, "b", delta(-1), bit(1)), op(B, "b", delta(1), bit(2)), op(B, "b", delta(1))} {
		if r := h.write(bad); r.Result.Error != errOffset || h.get("b") != "\x00\x00" {
			t.Fatalf("bad SETBIT %v: %v", bad, r.Result)
		}
	}
	if r := h.write(op(B, "b", delta(int64(MaxValueBytesLimit)*8), bit(1))); r.Result.Error != errValueTooLarge || h.get("b") != "\x00\x00" {
		t.Fatalf("past the value limit: %v", r.Result)
	}
}

// TestPutAlreadyExpired: a PUT whose expiry is already past leaves no
// value record behind (a tombstone over a value), so DBSIZE and scans of
// live keys agree at once.
func TestPutAlreadyExpired(t *testing.T) {
	h := newSMHarness(t)
	now := h.now.UnixMilli()
	values := func() int { // what DBSIZE counts: records that are not tombstones
		t.Helper()
		n := 0
		err := h.sm.store.DB().View(func(txn *badger.Txn) error {
			it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte{'d'}})
			defer it.Close()
			for it.Rewind(); it.Valid(); it.Next() {
				if k := it.Item().Key(); len(k) < 4 || k[3] != tagData {
					continue
				}
				rec, err := itemHeader(it.Item())
				if err != nil {
					return err
				}
				if !rec.Tombstone {
					n++
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if r := h.write(op(shardkvpb.WriteOp_PUT, "gone", val("v"), exp(now-1))); !r.Result.Ok || values() != 0 || h.entry("gone").Found {
		t.Fatalf("PUT with a past expiry: %v, %d value records", r.Result, values())
	}
	h.write(op(shardkvpb.WriteOp_PUT, "gone", val("v")))
	h.write(op(shardkvpb.WriteOp_PUT, "gone", val("w"), exp(now)))
	if n := values(); n != 0 || h.entry("gone").Found {
		t.Fatalf("a PUT already expired over a value left %d value records", n)
	}
}
