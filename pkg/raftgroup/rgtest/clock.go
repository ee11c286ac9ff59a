package rgtest

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardkv/shardkv/pkg/raftgroup"
)

// Clock is one replica's wall clock (raftgroup.Config.Now), shifted from
// the real one by an offset a test sets and jumps mid-run. A process-wide
// fake time (faketime) cannot shift one replica, nor a Go process at all.
type Clock struct{ off atomic.Int64 }

// Now is the real time plus the offset.
func (c *Clock) Now() time.Time { return time.Now().Add(time.Duration(c.off.Load())) }

// Set makes the clock read the real time plus off from now on (a jump).
func (c *Clock) Set(off time.Duration) { c.off.Store(int64(off)) }

// Clocks are the clocks of many replicas, by group and replica id, each
// created (at offset 0) on first use.
type Clocks struct {
	mu sync.Mutex
	m  map[[2]uint64]*Clock
}

// Get returns replica id of group gid's clock.
func (cs *Clocks) Get(gid, id uint64) *Clock {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.m == nil {
		cs.m = map[[2]uint64]*Clock{}
	}
	c := cs.m[[2]uint64{gid, id}]
	if c == nil {
		c = &Clock{}
		cs.m[[2]uint64{gid, id}] = c
	}
	return c
}

// Config gives a replica its clock: use it as (or in) Options.Config.
func (cs *Clocks) Config(c *raftgroup.Config) { c.Now = cs.Get(c.GroupID, c.ID).Now }
