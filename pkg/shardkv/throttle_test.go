package shardkv

import (
	"context"
	"testing"
	"time"
)

// TestCopyThrottleBooks: chunks book their bytes on a clock that runs at
// the rate; a copy that took longer than its bytes' time (installing) has
// credit for at most one second; an idle throttle does not let a long
// burst through.
func TestCopyThrottleBooks(t *testing.T) {
	th := newCopyThrottle(1000) // 1000 bytes/s
	ctx := context.Background()
	start := time.Now()
	th.next = start.Add(-10 * time.Second)    // idle for long: credit is capped
	if err := th.wait(ctx, 500); err != nil { // within the 1 s credit: no wait
		t.Fatal(err)
	}
	if got := th.next.Sub(start); got < -600*time.Millisecond || got > -400*time.Millisecond {
		t.Fatalf("after 500 bytes from an idle throttle the clock is at %v from now, want about -0.5s (1 s of credit, 0.5 s booked)", got)
	}
	var nilT *copyThrottle
	if err := nilT.wait(ctx, 1<<30); err != nil {
		t.Fatal("no limit must never wait")
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := th.wait(cctx, 10_000); err == nil { // 10 s of bytes: waits, and the context ends it
		t.Fatal("a wait past a cancelled context returned nil")
	}
}
