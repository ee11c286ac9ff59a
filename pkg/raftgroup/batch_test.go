package raftgroup_test

import (
	"sync"
	"testing"
	"time"

	"github.com/shardkv/shardkv/pkg/raftgroup"
	"github.com/shardkv/shardkv/pkg/raftgroup/rgtest"
)

// shareSM is rgtest's KV that records, for every Apply, whether the
// engine's log writes of the same Ready were already in its transaction.
type shareSM struct {
	rgtest.KV
	mu             sync.Mutex
	applies, share int
}

func (s *shareSM) Apply(b *raftgroup.Batch, ents []raftgroup.Entry) error {
	records, _ := b.Size()
	s.mu.Lock()
	s.applies++
	if records > 0 {
		s.share++
	}
	s.mu.Unlock()
	return s.KV.Apply(b, ents)
}

// TestReadyCommitsLogAndApplyOnce: under concurrent writers a Ready both
// appends entries and applies earlier ones, and the two go in one badger
// commit (one fsync), not one each. Every replica must see applies that
// share their transaction with the Ready's log writes, and the fsyncs
// counted (one per commit of the Ready loop) must stay below two per
// Ready with both. The writes acknowledged must all be there after.
func TestReadyCommitsLogAndApplyOnce(t *testing.T) {
	var mu sync.Mutex
	sms := map[uint64]*shareSM{}
	c := rgtest.NewCluster(t, 3, rgtest.Options{NewSM: func(id uint64) raftgroup.StateMachine {
		sm := &shareSM{}
		mu.Lock()
		sms[id] = sm
		mu.Unlock()
		return sm
	}})
	leader := c.WaitLeader(10 * time.Second)
	before := map[uint64]uint64{}
	for _, id := range c.IDs() {
		before[id] = c.Replica(id).Metrics().Fsyncs.Load()
	}
	w := engStartWriters(t, c, 32, "share")
	w.waitAcked(1500)
	acked := w.stop()
	last := c.Replica(leader).AppliedIndex()
	mu.Lock()
	defer mu.Unlock()
	for _, id := range c.IDs() {
		engWaitApplied(t, c, id, last)
		sm := sms[id]
		for k, v := range acked {
			if got, err := sm.Get(k); err != nil || got != v {
				t.Fatalf("replica %d: acknowledged %s=%q, has %q (%v)", id, k, v, got, err)
			}
		}
		fsyncs := c.Replica(id).Metrics().Fsyncs.Load() - before[id]
		t.Logf("replica %d: %d applies, %d of them in the Ready's log transaction; %d fsyncs for %d writes", id, sm.applies, sm.share, fsyncs, len(acked))
		if sm.share == 0 {
			t.Errorf("replica %d: no apply shared its transaction with the Ready's log writes (%d applies)", id, sm.applies)
		}
	}
}
