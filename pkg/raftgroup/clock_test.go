package raftgroup_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardkv/shardkv/pkg/raftgroup"
	"github.com/shardkv/shardkv/pkg/raftgroup/rgtest"
)

// timeSM is rgtest's KV that records the time of every entry it applies.
type timeSM struct {
	rgtest.KV
	dependent atomic.Bool // TimeDependent's answer
	mu        sync.Mutex
	times     []time.Time // entries with a time, in log order
	clocks    int         // of which clock entries (no command)
}

func (s *timeSM) Apply(b *raftgroup.Batch, ents []raftgroup.Entry) error {
	s.mu.Lock()
	for _, e := range ents {
		if !e.Time.IsZero() {
			s.times = append(s.times, e.Time)
			if e.Cmd == nil {
				s.clocks++
			}
		}
	}
	s.mu.Unlock()
	return s.KV.Apply(b, ents)
}

func (s *timeSM) TimeDependent() bool { return s.dependent.Load() }

func (s *timeSM) snapshot() (times []time.Time, clocks int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Time(nil), s.times...), s.clocks
}

type timeCluster struct {
	*rgtest.Cluster
	clocks *rgtest.Clocks
	mu     sync.Mutex
	sms    map[uint64]*timeSM
}

func newTimeCluster(t *testing.T) *timeCluster {
	tc := &timeCluster{clocks: &rgtest.Clocks{}, sms: map[uint64]*timeSM{}}
	tc.Cluster = rgtest.NewCluster(t, 3, rgtest.Options{
		NewSM: func(id uint64) raftgroup.StateMachine {
			sm := &timeSM{}
			tc.mu.Lock()
			tc.sms[id] = sm
			tc.mu.Unlock()
			return sm
		},
		Config: tc.clocks.Config,
	})
	return tc
}

func (tc *timeCluster) sm(id uint64) *timeSM {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	return tc.sms[id]
}

// TestClockJumpOnLeader: the leader's wall clock jumps an hour ahead, then
// an hour back. Entry times follow the group's time (the median of the
// voters' clocks), not the leader's: they stay near the true time, and on
// every replica they never go back.
func TestClockJumpOnLeader(t *testing.T) {
	tc := newTimeCluster(t)
	l := tc.WaitLeader(5 * time.Second)
	const bound = 500 * time.Millisecond
	propose := func(phase string, n int) {
		t.Helper()
		for i := range n {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			before := time.Now()
			_, err := tc.Propose(ctx, rgtest.EncodePut("k", fmt.Sprint(i)))
			after := time.Now()
			cancel()
			if err != nil {
				t.Fatalf("%s: propose: %v", phase, err)
			}
			// The entry just applied on the leader is among the last ones
			// its state machine saw; none may be far from the true time.
			times, _ := tc.sm(tc.Leader()).snapshot()
			got := times[len(times)-1]
			if got.Before(before.Add(-bound)) || got.After(after.Add(bound)) {
				t.Fatalf("%s: entry time %v, true time %v..%v (off by %v)", phase, got.Format(time.RFC3339Nano),
					before.Format(time.RFC3339Nano), after.Format(time.RFC3339Nano), got.Sub(after).Round(time.Millisecond))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	propose("all clocks right", 10)
	tc.clocks.Get(1, l).Set(time.Hour)
	propose("leader's clock 1h ahead", 30)
	tc.clocks.Get(1, l).Set(-time.Hour)
	propose("leader's clock 1h behind", 30)
	if got := tc.Leader(); got != l {
		t.Logf("leadership moved from %d to %d", l, got)
	}
	for _, id := range tc.IDs() {
		if err := tc.Replica(id).WaitApplied(context.Background(), tc.Replica(l).AppliedIndex()); err != nil {
			t.Fatal(err)
		}
		times, _ := tc.sm(id).snapshot()
		for i := 1; i < len(times); i++ {
			if times[i].Before(times[i-1]) {
				t.Fatalf("replica %d: entry time went back by %v (%v after %v)", id, times[i-1].Sub(times[i]), times[i], times[i-1])
			}
		}
	}
}

// TestClockEntriesKeepLogTimeFresh: an idle group whose state machine
// says its reads depend on time gets clock entries (no command, only a
// time) at most one per ClockLag, keeping the log clock within about
// ClockLag of the true time; once it says they do not, none.
func TestClockEntriesKeepLogTimeFresh(t *testing.T) {
	tc := newTimeCluster(t)
	l := tc.WaitLeader(5 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := tc.Propose(ctx, rgtest.EncodePut("k", "v")); err != nil {
		t.Fatal(err)
	}
	for _, id := range tc.IDs() {
		tc.sm(id).dependent.Store(true)
	}
	const idle = 2 * time.Second
	time.Sleep(idle)
	times, clocks := tc.sm(l).snapshot()
	if lag := time.Since(times[len(times)-1]); lag > raftgroup.ClockLag+250*time.Millisecond {
		t.Fatalf("log clock %v behind the true time after %v idle (ClockLag %v, %d clock entries)", lag, idle, raftgroup.ClockLag, clocks)
	}
	if most := int(idle/raftgroup.ClockLag) + 2; clocks == 0 || clocks > most {
		t.Fatalf("%d clock entries in %v idle, want 1..%d", clocks, idle, most)
	}
	for _, id := range tc.IDs() {
		tc.sm(id).dependent.Store(false)
	}
	time.Sleep(2 * raftgroup.ClockLag) // one may be in flight
	_, before := tc.sm(l).snapshot()
	time.Sleep(idle)
	if _, after := tc.sm(l).snapshot(); after != before {
		t.Fatalf("%d clock entries in %v while no reads depend on time", after-before, idle)
	}
}
