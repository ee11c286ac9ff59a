package shardkv

import (
	"context"
	"google.golang.org/protobuf/proto"
	"sync"
	"time"

	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// copyThrottle paces the bytes a group copies in (all its pulls together)
// to a rate, like Kvrocks's migrate-speed: each chunk received books its
// size on a virtual clock that runs at the rate, and the puller waits
// until the clock catches up with now. The clock may lag now by at most
// credit: time spent installing a chunk, not receiving, counts toward the
// next one, so a copy runs at the rate, not below it, and never bursts by
// more than credit's worth. Large chunks (one 32 MiB record) just wait
// longer.
type copyThrottle struct {
	bytesPerSec int64
	credit      time.Duration
	mu          sync.Mutex
	next        time.Time // when the bytes booked so far are paid for
}

func newCopyThrottle(bytesPerSec int64) *copyThrottle {
	if bytesPerSec <= 0 {
		return nil
	}
	return &copyThrottle{bytesPerSec: bytesPerSec, credit: time.Second}
}

// wait books n bytes and waits until the rate allows them.
func (t *copyThrottle) wait(ctx context.Context, n int) error {
	if t == nil || n <= 0 {
		return nil
	}
	t.mu.Lock()
	now := time.Now()
	if earliest := now.Add(-t.credit); t.next.Before(earliest) {
		t.next = earliest
	}
	t.next = t.next.Add(time.Duration(float64(n) / float64(t.bytesPerSec) * float64(time.Second)))
	sleep := t.next.Sub(now)
	t.mu.Unlock()
	if sleep <= 0 {
		return nil
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(sleep):
		return nil
	}
}

// throttle waits until the group's copy rate limit allows chunk.
func (g *Group) throttle(ctx context.Context, chunk *shardkvpb.ShardChunk) error {
	return g.copyRate.wait(ctx, proto.Size(chunk))
}
