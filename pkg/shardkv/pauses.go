package shardkv

import (
	"sync"
	"time"
)

// PauseBuckets are the upper bounds of the write pause histogram.
var PauseBuckets = []time.Duration{
	time.Millisecond, 2 * time.Millisecond, 5 * time.Millisecond, 10 * time.Millisecond, 20 * time.Millisecond,
	50 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond, 500 * time.Millisecond,
	time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second, 30 * time.Second, time.Minute,
}

// pauseHist counts the write pauses of the moves this replica applied
// (process lifetime, like the migration counters).
type pauseHist struct {
	mu     sync.Mutex
	counts []uint64 // per bucket, not cumulative; one more for +Inf
	sum    time.Duration
	n      uint64
}

func (h *pauseHist) observe(d time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.counts == nil {
		h.counts = make([]uint64, len(PauseBuckets)+1)
	}
	i := 0
	for i < len(PauseBuckets) && d > PauseBuckets[i] {
		i++
	}
	h.counts[i]++
	h.sum += d
	h.n++
}

// WritePauses returns the write pause histogram of the moves into this
// group that this replica applied: cumulative counts per PauseBuckets
// bound, their sum and count.
func (sm *StateMachine) WritePauses() (cumulative []uint64, sum time.Duration, n uint64) {
	h := &sm.pauses
	h.mu.Lock()
	defer h.mu.Unlock()
	cumulative = make([]uint64, len(PauseBuckets))
	var c uint64
	for i := range PauseBuckets {
		if h.counts != nil {
			c += h.counts[i]
		}
		cumulative[i] = c
	}
	return cumulative, h.sum, h.n
}
