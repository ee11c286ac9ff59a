package resp

import (
	"testing"
	"time"

	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// TestWriteCostFit: with no history a batch runs whole; after slow batches
// only what fits in half the time left at their cost per op runs (never
// fewer than fitMinOps ops, nor less than one command); small batches teach
// nothing; and the cost decays as batches speed up.
func TestWriteCostFit(t *testing.T) {
	items := make([]*item, 100) // 100 commands of 10 ops: 1,000 ops
	for i := range items {
		items[i] = &item{ops: make([]*shardkvpb.WriteOp, 10)}
	}
	var c writeCost
	if k := c.fit(items, time.Second); k != 100 {
		t.Fatalf("no history: %d of 100 commands fit, want all", k)
	}
	c.note(10, time.Second) // 10 ops: a Raft round's fixed cost, not per op
	if k := c.fit(items, time.Second); k != 100 {
		t.Fatalf("after a small slow batch: %d of 100 commands fit, want all", k)
	}
	c.note(1000, time.Second) // 1 ms per op: half of 1 s is 500 ops
	if k := c.fit(items, time.Second); k != 50 {
		t.Fatalf("at 1 ms per op with 1 s left: %d commands fit, want 50", k)
	}
	if k := c.fit(items, 10*time.Millisecond); k != fitMinOps/10 {
		t.Fatalf("at 1 ms per op with 10 ms left: %d commands fit, want %d (fitMinOps)", k, fitMinOps/10)
	}
	big := []*item{{ops: make([]*shardkvpb.WriteOp, 1000)}, {ops: make([]*shardkvpb.WriteOp, 1)}}
	if k := c.fit(big, time.Millisecond); k != 1 {
		t.Fatalf("a command larger than the budget: %d fit, want it alone", k)
	}
	for range 40 {
		c.note(1000, time.Millisecond) // 1 µs per op
	}
	if k := c.fit(items, time.Second); k != 100 {
		t.Fatalf("after fast batches again: %d of 100 commands fit, want all", k)
	}
}
