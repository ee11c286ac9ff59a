package shardkv

import (
	"testing"
	"time"
)

// TestCopyRatesEstimate: a copy's rate comes from its progress between
// status reads, and its time left from the bytes its snapshot still needs.
func TestCopyRatesEstimate(t *testing.T) {
	var c copyRates
	t0 := time.Unix(1_800_000_000, 0)
	m := ShardMeta{State: PreCopying, Config: 3, Bytes: 0, TotalBytes: 10_000_000}
	if r, eta := c.observe(1, m, t0); r != 0 || eta != 0 {
		t.Fatalf("first observation: rate %d, eta %d; want both unknown", r, eta)
	}
	m.Bytes = 1_000_000
	r, eta := c.observe(1, m, t0.Add(time.Second))
	if r != 1_000_000 || eta != 9 {
		t.Fatalf("1 MB in 1 s with 9 MB left: rate %d, eta %d s; want 1000000 and 9", r, eta)
	}
	m.Bytes = 1_100_000 // a read 100 ms later changes nothing yet
	if r2, _ := c.observe(1, m, t0.Add(1100*time.Millisecond)); r2 != r {
		t.Fatalf("rate moved to %d on a read 100 ms later", r2)
	}
	m.Delta = true
	if _, eta := c.observe(1, m, t0.Add(2*time.Second)); eta != 0 {
		t.Fatalf("eta %d s in the delta phase, want 0 (the snapshot is in)", eta)
	}
	m = ShardMeta{State: PreCopying, Config: 4, Bytes: 5}
	if r, _ := c.observe(1, m, t0.Add(3*time.Second)); r != 0 {
		t.Fatalf("a new copy (config 4) kept the old rate %d", r)
	}
}
