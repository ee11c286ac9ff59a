package resp

import (
	"sync/atomic"
	"time"
)

// A write batch must be answered before its first command's deadline: a
// batch cut off mid-way leaves every command in it "outcome unknown", where
// a command never started is plainly "not executed" (TRYAGAIN, which
// clients retry). On a loaded machine a full batch (maxBatchOps) can take
// longer than its first command has left, so runWrites starts only as many
// commands as the recent cost per op says fit in half that time; the rest
// go in the next batch, or are refused as late.

// fitMinOps: batches smaller than this do not teach the cost per op (a
// Raft round's fixed cost, spread over a few ops, would overstate it), and
// a batch is never fitted below it.
const fitMinOps = 256

// writeCost is the recent cost of a write op, in nanoseconds: the largest
// of recent batches' time per op, decaying by an eighth with each batch.
type writeCost struct{ ns atomic.Int64 }

// note records that a batch of ops took d.
func (c *writeCost) note(ops int, d time.Duration) {
	if ops < fitMinOps {
		return
	}
	old := c.ns.Load()
	c.ns.Store(max(int64(d)/int64(ops), old-old/8))
}

// fit returns how many of items (at least one) to run as one batch with
// left to go before the first one's deadline: those whose ops, at the
// recent cost, take at most half of left, or fitMinOps ops if that is more.
func (c *writeCost) fit(items []*item, left time.Duration) int {
	per := c.ns.Load()
	if per <= 0 {
		return len(items)
	}
	budget := max(int64(left)/2/per, fitMinOps)
	n, ops := 1, int64(len(items[0].ops))
	for n < len(items) && ops+int64(len(items[n].ops)) <= budget {
		ops += int64(len(items[n].ops))
		n++
	}
	return n
}
