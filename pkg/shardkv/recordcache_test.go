package shardkv

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// TestRecordCacheRestore: apply reads a key's record from the cache of its
// last writes, and a restored snapshot replaces the state under it. The
// write after the restore must build on the restored value, not on the
// one apply wrote before it (the cache must not survive Restore).
func TestRecordCacheRestore(t *testing.T) {
	h := newSMHarness(t)
	h.write(&shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_PUT, Key: []byte("k"), Value: []byte("old")})
	snap, err := h.sm.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := snap.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	snap.Close()
	h.write(&shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_PUT, Key: []byte("k"), Value: []byte("new")})
	applied, err := h.sm.Restore(&buf)
	if err != nil {
		t.Fatal(err)
	}
	h.index = applied
	res := h.write(&shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_APPEND, Key: []byte("k"), Value: []byte("+"), ReturnPrev: true})
	if res.Code != OK || string(res.Result.GetPrev()) != "old" {
		t.Fatalf("APPEND after restoring a snapshot of k=old returned previous %q (%v), want \"old\"", res.Result.GetPrev(), res.Code)
	}
}

// TestRecordCacheBounds: reads are copies, the cache stays within its
// bytes, and a value too large to cache drops the older one.
func TestRecordCacheBounds(t *testing.T) {
	var c recordCache
	c.put([]byte("a"), []byte("xyz"))
	v, ok := c.get([]byte("a"))
	if !ok || string(v) != "xyz" {
		t.Fatalf("get a = %q, %v", v, ok)
	}
	v[0] = 'Q'
	if v, _ := c.get([]byte("a")); string(v) != "xyz" {
		t.Fatalf("a read changed in place changed the cache: %q", v)
	}
	c.put([]byte("a"), make([]byte, cacheMaxValue+1))
	if _, ok := c.get([]byte("a")); ok {
		t.Fatal("a value too large to cache left the older one cached")
	}
	c.put([]byte("gone"), nil)
	if v, ok := c.get([]byte("gone")); !ok || v != nil {
		t.Fatalf("a delete is not cached as absent: %q, %v", v, ok)
	}
	for i := range 100_000 {
		c.put(fmt.Appendf(nil, "key-%d", i), make([]byte, 200))
		if c.bytes > cacheMaxBytes {
			t.Fatalf("after %d puts the cache holds %d bytes, over %d", i+1, c.bytes, cacheMaxBytes)
		}
	}
	sum := 0
	for k, v := range c.m {
		sum += len(k) + len(v) + cacheOverhead
	}
	if sum != c.bytes {
		t.Fatalf("cache counts %d bytes, holds %d", c.bytes, sum)
	}
}
