package resp

import "sync/atomic"

// inputBudget bounds the bytes all of a server's connections hold of their
// input (buffers and commands received but not yet run). A connection that
// would go past it is refused: an error, then closed, rather than the
// process running out of memory.
type inputBudget struct {
	limit int64
	used  atomic.Int64
}

// take reserves n bytes, or reports that they do not fit. A nil budget is
// unbounded.
func (b *inputBudget) take(n int64) bool {
	if b == nil || n <= 0 {
		return true
	}
	if b.used.Add(n) > b.limit {
		b.used.Add(-n)
		return false
	}
	return true
}

// give returns n bytes.
func (b *inputBudget) give(n int64) {
	if b != nil && n != 0 {
		b.used.Add(-n)
	}
}

// inUse is the bytes reserved now.
func (b *inputBudget) inUse() int64 { return b.used.Load() }
