package raftgroup

import (
	"context"
	"encoding/binary"
	"sync"
	"time"

	"go.etcd.io/raft/v3"
)

// readBatcher serves linearizable reads without writing to the log: waiting
// readers are grouped, and one ReadIndex round (a heartbeat quorum check on
// the leader) answers the whole group. While a round is in flight, new readers
// queue for the next one, so rounds stay far fewer than reads under load.
type readBatcher struct {
	r *Replica

	mu      sync.Mutex
	pending []chan error
	kick    chan struct{}

	statec chan raft.ReadState
	stopc  chan struct{}
	seq    uint64
}

func newReadBatcher(r *Replica) *readBatcher {
	return &readBatcher{r: r, kick: make(chan struct{}, 1), statec: make(chan raft.ReadState, 64), stopc: make(chan struct{})}
}

// ReadIndex returns once this replica's state machine reflects every write
// that completed before the call: reads made after it are linearizable. It
// works on followers too (the leader confirms the index). It writes nothing.
func (r *Replica) ReadIndex(ctx context.Context) error {
	if r.Err() != nil || r.isClosed() {
		return ErrStopped
	}
	r.metrics.ReadIndexReads.Add(1)
	start := time.Now()
	defer func() { r.metrics.ReadIndexNanos.Add(uint64(time.Since(start))) }()
	ch := make(chan error, 1)
	rb := r.reads
	rb.mu.Lock()
	rb.pending = append(rb.pending, ch)
	rb.mu.Unlock()
	select {
	case rb.kick <- struct{}{}:
	default:
	}
	select {
	case err := <-ch:
		return err
	case <-ctx.Done():
		return notExecuted("read index: %v", ctx.Err())
	}
}

func (rb *readBatcher) readState(rs raft.ReadState) {
	select {
	case rb.statec <- rs:
	default: // a stale or duplicate answer nobody waits for any more
	}
}

func (rb *readBatcher) stop() { close(rb.stopc) }

func (rb *readBatcher) run() {
	for {
		select {
		case <-rb.kick:
		case <-rb.stopc:
			rb.failPending(ErrStopped)
			return
		}
		for {
			rb.mu.Lock()
			batch := rb.pending
			rb.pending = nil
			rb.mu.Unlock()
			if len(batch) == 0 {
				break
			}
			err := rb.round()
			for _, ch := range batch {
				ch <- err
			}
		}
	}
}

func (rb *readBatcher) failPending(err error) {
	rb.mu.Lock()
	defer rb.mu.Unlock()
	for _, ch := range rb.pending {
		ch <- err
	}
	rb.pending = nil
}

// round runs one ReadIndex round, retrying while no leader answers, until it
// gets an index and the state machine has applied it.
func (rb *readBatcher) round() error {
	r := rb.r
	timeout := time.Duration(r.cfg.ElectionTicks) * r.cfg.TickInterval
	deadline := time.Now().Add(4 * timeout)
	for time.Now().Before(deadline) {
		rb.seq++
		rctx := make([]byte, 16)
		binary.BigEndian.PutUint64(rctx, r.props.nonce)
		binary.BigEndian.PutUint64(rctx[8:], rb.seq)
		r.metrics.ReadIndexRounds.Add(1)
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		if err := r.node.ReadIndex(ctx, rctx); err != nil {
			cancel()
			select {
			case <-rb.stopc:
				return ErrStopped
			case <-time.After(r.cfg.TickInterval):
			}
			continue
		}
		index, ok := rb.awaitState(ctx, rctx)
		cancel()
		if !ok {
			select {
			case <-rb.stopc:
				return ErrStopped
			default:
			}
			continue
		}
		wctx, wcancel := context.WithTimeout(context.Background(), 4*timeout)
		err := r.WaitApplied(wctx, index)
		wcancel()
		if err != nil {
			return notExecuted("read index %d: waiting to apply: %v", index, err)
		}
		return nil
	}
	return notExecuted("read index: no leader confirmed leadership (no quorum?)")
}

func (rb *readBatcher) awaitState(ctx context.Context, rctx []byte) (uint64, bool) {
	for {
		select {
		case rs := <-rb.statec:
			if string(rs.RequestCtx) == string(rctx) {
				return rs.Index, true
			}
		case <-ctx.Done():
			return 0, false
		case <-rb.stopc:
			return 0, false
		}
	}
}
