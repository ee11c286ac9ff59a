package node_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// TestSIGTERMLeaderUnderRedisLoad: a leader stopped with SIGTERM while
// Redis clients write hands over leadership and lets the writes it already
// proposed finish before it closes, so no client sees "outcome unknown".
// (Rolling updates stop every leader this way.)
func TestSIGTERMLeaderUnderRedisLoad(t *testing.T) {
	needProcesses(t)
	c, resp := startRESPLocal(t, 4, "--groups=1", "--replicas=3", "--ctrler-replicas=1", "--spare-groups=0", "--shards=16")
	var addrs []string
	for _, a := range resp {
		addrs = append(addrs, a...)
	}
	const clients = 16
	var (
		stop    atomic.Bool
		ok      atomic.Int64
		unknown atomic.Int64
		wg      sync.WaitGroup
		errMu   sync.Mutex
		errs    []error
	)
	for w := range clients {
		rc := newClusterClient(addrs)
		defer rc.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				err := rc.Set(ctx, fmt.Sprintf("w%02d-k%d", w, i%8), i, 0).Err()
				cancel()
				switch {
				case err == nil:
					ok.Add(1)
				case isOutcomeUnknown(err):
					unknown.Add(1)
				default:
					errMu.Lock()
					errs = append(errs, fmt.Errorf("client %d: %w", w, err))
					errMu.Unlock()
					return
				}
			}
		}()
	}
	waitOK := func(n int64, what string) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for ok.Load() < n {
			if time.Now().After(deadline) {
				t.Fatalf("only %d writes acknowledged, want %d (%s)", ok.Load(), n, what)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitOK(300, "before SIGTERM")
	for round := range 2 {
		leader, _ := groupLeader(t, c.ctrl, 1, 20*time.Second)
		pid := pidListening(t, leader, 5*time.Second)
		before := ok.Load()
		if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if _, gone := waitGone(pid, 20*time.Second); !gone {
			t.Fatalf("round %d: leader %s (pid %d) still running 20s after SIGTERM", round, leader, pid)
		}
		waitOK(ok.Load()+300, "after the leader exited")
		t.Logf("round %d: SIGTERM to leader %s; %d writes acknowledged meanwhile, %d unknown so far", round, leader, ok.Load()-before, unknown.Load())
		// node local restarts it; let it catch up before the next round.
		time.Sleep(3 * time.Second)
	}
	stop.Store(true)
	wg.Wait()
	for _, err := range errs {
		t.Error(err)
	}
	if n := unknown.Load(); n != 0 {
		t.Errorf("%d writes answered outcome unknown across leader SIGTERMs (%d acknowledged)", n, ok.Load())
	}
}
