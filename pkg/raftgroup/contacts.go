package raftgroup

import (
	"sync"
	"time"
)

// contacts records when a Raft message from each peer last arrived. Raft's
// own progress keeps a restarted follower's match index from before its
// restart, so match alone says nothing about whether the follower answers
// now; an operator deciding whether the next pod may restart needs this.
type contacts struct {
	mu      sync.Mutex
	started time.Time
	last    map[uint64]time.Time
}

func newContacts() *contacts {
	return &contacts{started: time.Now(), last: map[uint64]time.Time{}}
}

func (c *contacts) note(id uint64) {
	now := time.Now()
	c.mu.Lock()
	c.last[id] = now
	c.mu.Unlock()
}

// ago is the time since id was last heard from, or since this replica
// started if it never was.
func (c *contacts) ago(id uint64) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	t, ok := c.last[id]
	if !ok {
		t = c.started
	}
	return time.Since(t)
}
