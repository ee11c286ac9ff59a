package resp

import "sync/atomic"

// memBudget bounds bytes that all of a server's connections hold together:
// one for their input (buffers and commands received but not yet run), one
// for their output (values read for replies, and replies not yet written).
// What would go past it is refused (an error to that client) rather than
// the process running out of memory.
type memBudget struct {
	limit int64
	used  atomic.Int64
	peak  atomic.Int64
}

// take reserves n bytes, or reports that they do not fit. A nil budget is
// unbounded.
func (b *memBudget) take(n int64) bool {
	if b == nil || n <= 0 {
		return true
	}
	u := b.used.Add(n)
	if u > b.limit {
		b.used.Add(-n)
		return false
	}
	b.notePeak(u)
	return true
}

// force reserves n bytes even past the limit: for bytes that already exist
// (a reply built from values reserved before, a small reply every
// connection may always have one of).
func (b *memBudget) force(n int64) {
	if b != nil && n > 0 {
		b.notePeak(b.used.Add(n))
	}
}

func (b *memBudget) notePeak(u int64) {
	for {
		p := b.peak.Load()
		if u <= p || b.peak.CompareAndSwap(p, u) {
			return
		}
	}
}

// give returns n bytes.
func (b *memBudget) give(n int64) {
	if b != nil && n != 0 {
		b.used.Add(-n)
	}
}

// full reports whether the budget is spent.
func (b *memBudget) full() bool { return b != nil && b.used.Load() >= b.limit }

// inUse is the bytes reserved now.
func (b *memBudget) inUse() int64 {
	if b == nil {
		return 0
	}
	return b.used.Load()
}

// maxUsed is the most bytes reserved at once so far.
func (b *memBudget) maxUsed() int64 {
	if b == nil {
		return 0
	}
	return b.peak.Load()
}
