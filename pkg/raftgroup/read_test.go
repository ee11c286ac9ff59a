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

// TestDeposedLeaderNeverServesStaleRead: a leader cut off from the majority
// confirms no read once isolated, while the majority elects a new leader and
// overwrites the value, so a read on it can never return the old value as
// current. After healing, it serves the new value.
func TestDeposedLeaderNeverServesStaleRead(t *testing.T) {
	c := rgtest.NewCluster(t, 3, rgtest.Options{})
	old := c.WaitLeader(engHang)
	engPropose(t, c, rgtest.EncodePut("x", "v1"))
	for _, id := range c.IDs() {
		engReadIndex(t, c, id)
		if v, _ := c.KV(id).Get("x"); v != "v1" {
			t.Fatalf("replica %d: x=%q", id, v)
		}
	}
	oldR, oldKV := c.Replica(old), c.KV(old)

	c.Net.Isolate(c.IDs(), old)
	// Readers on the isolated leader, all started after the isolation.
	var (
		stop      atomic.Bool
		v2acked   atomic.Bool
		wg        sync.WaitGroup
		mu        sync.Mutex
		successes []string
		failed    atomic.Int64
		failedV2  atomic.Int64 // failures of reads started after v2 was acknowledged
	)
	t.Cleanup(func() { stop.Store(true); wg.Wait() }) // before the cluster shuts down
	// A write accepted by the isolated leader can never commit: once healed,
	// it must be reported as not executed, and never applied.
	staleErr := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), engHang)
		defer cancel()
		_, err := oldR.Propose(ctx, rgtest.EncodePut("x", "stale"))
		staleErr <- err
	}()
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				after := v2acked.Load()
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				err := oldR.ReadIndex(ctx)
				cancel()
				if err != nil {
					if !raftgroup.IsNotExecuted(err) {
						t.Errorf("read index failed with an unexpected error: %v", err)
					}
					failed.Add(1)
					if after {
						failedV2.Add(1)
					}
					continue
				}
				v, _ := oldKV.Get("x")
				mu.Lock()
				successes = append(successes, fmt.Sprintf("read (started after v2: %v) saw x=%q", after, v))
				mu.Unlock()
			}
		}()
	}

	var newL uint64
	engWaitFor(t, "the majority to elect a new leader", func() bool {
		for _, id := range c.IDs() {
			if id != old && c.Replica(id).IsLeader() {
				newL = id
				return true
			}
		}
		return false
	})
	ctx := engCtx(t, engHang)
	for {
		_, err := c.Replica(newL).Propose(ctx, rgtest.EncodePut("x", "v2"))
		if err == nil {
			break
		}
		if !raftgroup.IsNotExecuted(err) || ctx.Err() != nil {
			t.Fatalf("write v2 on new leader %d: %v", newL, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	v2acked.Store(true)
	// A direct read on the deposed leader, started after v2 committed.
	if err := oldR.ReadIndex(engCtx(t, 5*time.Second)); err == nil {
		v, _ := oldKV.Get("x")
		t.Fatalf("isolated old leader confirmed a read after v2 was written (x=%q)", v)
	}
	engWaitFor(t, "reads started after v2 to fail on the old leader", func() bool { return failedV2.Load() >= 4 })
	engWaitFor(t, "the isolated leader to step down", func() bool { return !oldR.IsLeader() })
	stop.Store(true)
	wg.Wait()
	mu.Lock()
	if len(successes) > 0 {
		t.Fatalf("isolated old leader served %d reads: %v", len(successes), successes)
	}
	mu.Unlock()
	if v, _ := oldKV.Get("x"); v != "v1" {
		t.Fatalf("isolated replica's local state changed: x=%q", v)
	}

	c.Net.Heal()
	engReadIndex(t, c, old)
	if v, _ := oldKV.Get("x"); v != "v2" {
		t.Fatalf("after healing, linearizable read on %d saw x=%q, want v2", old, v)
	}
	if err := <-staleErr; err == nil || !raftgroup.IsNotExecuted(err) {
		t.Fatalf("write on the isolated leader: want a not-executed error once overwritten, got %v", err)
	}
	for _, id := range c.IDs() {
		if v := engDump(t, c, id)["x"]; v != "v2" {
			t.Fatalf("replica %d: x=%q, want v2", id, v)
		}
	}
	t.Logf("%d reads refused on the isolated leader (%d after v2)", failed.Load(), failedV2.Load())
}

// TestReadIndexBatching: under concurrent readers, one ReadIndex round
// serves many reads, and each read sees the latest acknowledged write.
func TestReadIndexBatching(t *testing.T) {
	c := rgtest.NewCluster(t, 3, rgtest.Options{})
	l := c.WaitLeader(engHang)
	f := engFollower(c, l)
	engPropose(t, c, rgtest.EncodePut("x", "000"))
	for phase, id := range []uint64{l, f} {
		r, kv := c.Replica(id), c.KV(id)
		m := r.Metrics()
		rounds0, reads0 := m.ReadIndexRounds.Load(), m.ReadIndexReads.Load()
		const readers, each = 64, 30
		var wg sync.WaitGroup
		var bad atomic.Int64
		var lastX atomic.Pointer[string] // last acknowledged value of x
		for range readers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range each {
					// Remember the last acknowledged write before reading.
					want := lastX.Load()
					if err := r.ReadIndex(engCtx(t, engHang)); err != nil {
						t.Errorf("replica %d read index: %v", id, err)
						bad.Add(1)
						return
					}
					v, _ := kv.Get("x")
					if want != nil && v < *want {
						t.Errorf("replica %d: read saw x=%q after %q was acknowledged", id, v, *want)
						bad.Add(1)
					}
				}
			}()
		}
		// A writer keeps the value moving while the readers run.
		done := make(chan struct{})
		go func() {
			defer close(done)
			for i := 1; i <= 20; i++ {
				v := fmt.Sprintf("%03d", phase*100+i)
				if _, err := c.Propose(engCtx(t, engHang), rgtest.EncodePut("x", v)); err != nil {
					t.Errorf("write: %v", err)
					return
				}
				lastX.Store(&v)
			}
		}()
		wg.Wait()
		<-done
		if bad.Load() > 0 {
			t.FailNow()
		}
		rounds, reads := m.ReadIndexRounds.Load()-rounds0, m.ReadIndexReads.Load()-reads0
		if reads != readers*each {
			t.Fatalf("replica %d counted %d reads, want %d", id, reads, readers*each)
		}
		if rounds == 0 || rounds >= reads/4 {
			t.Fatalf("replica %d: %d ReadIndex rounds for %d reads; reads are not batched", id, rounds, reads)
		}
		t.Logf("replica %d (leader %v): %d reads in %d rounds", id, id == l, reads, rounds)
	}
}
