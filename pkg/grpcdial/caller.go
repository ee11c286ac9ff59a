package grpcdial

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ErrNoReplicas is returned for a call given no addresses.
var ErrNoReplicas = errors.New("grpcdial: no replica addresses")

// Caller calls the replicas of Raft groups, the leader first. It
// remembers each group's leader (by a key the caller chooses: the group
// id, or 0 for a single group) from the replica that last answered and
// from NOT_LEADER hints (shardkvpb.LeaderHint).
//
// A remembered leader is tried first even if it is not among the
// addresses given (a hint may name a replica by another address), until a
// call gives the group a different address list without it: the group's
// membership changed, and the leader may be gone.
type Caller struct {
	pool *Pool

	mu   sync.Mutex
	sets map[uint64]*replicaSet
}

type replicaSet struct {
	addrs  []string // the addresses of the last call
	leader string   // "" when unknown
}

// NewCaller returns a Caller dialing through pool.
func NewCaller(pool *Pool) *Caller {
	return &Caller{pool: pool, sets: map[uint64]*replicaSet{}}
}

// CallOptions say how to retry one call.
type CallOptions struct {
	// AttemptTimeout bounds each attempt on one replica (0: only ctx).
	AttemptTimeout time.Duration
	// Final reports errors after which no other replica is tried and
	// Call does not retry (the request was refused, or its outcome is
	// known not to improve). nil: every error moves on to the next one.
	Final func(error) bool
	// Backoff is the delay between Call's rounds.
	Backoff Backoff
}

// MaxAttemptTimeout caps AfterRound's growth of AttemptTimeout.
const MaxAttemptTimeout = 30 * time.Second

// AfterRound doubles AttemptTimeout (up to MaxAttemptTimeout) when a round
// ended because its attempts ran out of their own time while ctx has time
// left: a request that needs longer than the budget (a large batch on a
// loaded machine) would otherwise time out on every retry, for ever.
func (o *CallOptions) AfterRound(ctx context.Context, err error) {
	if o.AttemptTimeout > 0 && ctx.Err() == nil && status.Code(err) == codes.DeadlineExceeded {
		o.AttemptTimeout = min(2*o.AttemptTimeout, max(MaxAttemptTimeout, o.AttemptTimeout))
	}
}

// Attempt is one try on the replica at addr over cc. It may run several
// times in one call, on different replicas.
type Attempt func(ctx context.Context, addr string, cc *grpc.ClientConn) error

// Leader returns the remembered leader of group key ("" if unknown).
func (c *Caller) Leader(key uint64) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s := c.sets[key]; s != nil {
		return s.leader
	}
	return ""
}

// Round tries the replicas at addrs of group key once each: the
// remembered leader first, then addrs in order; a NOT_LEADER hint names
// the replica tried next. It stops at the first success (returning nil),
// at an error opts.Final accepts, or when ctx ends, and otherwise returns
// the last attempt's error (ctx's error if it made none).
func (c *Caller) Round(ctx context.Context, key uint64, addrs []string, opts CallOptions, f Attempt) error {
	queue := c.order(key, addrs)
	if len(queue) == 0 {
		return ErrNoReplicas
	}
	tried := map[string]bool{}
	var last error
	for len(queue) > 0 && ctx.Err() == nil {
		addr := queue[0]
		queue = queue[1:]
		if tried[addr] {
			continue
		}
		tried[addr] = true
		cc, err := c.pool.Get(addr)
		if errors.Is(err, ErrClosed) {
			return err
		}
		if err == nil {
			err = attempt(ctx, opts.AttemptTimeout, f, addr, cc)
		}
		if err == nil {
			c.Hint(key, addr)
			return nil
		}
		last = err
		if (opts.Final != nil && opts.Final(err)) || shardkvpb.Unauthorized(err) {
			return err
		}
		if _, hint, ok := shardkvpb.LeaderHint(err); ok && hint != "" {
			c.Hint(key, hint)
			if !tried[hint] {
				queue = append([]string{hint}, queue...)
			}
		}
	}
	if last == nil {
		return ctx.Err()
	}
	return last
}

// Call repeats Round, waiting opts.Backoff between rounds, until an
// attempt succeeds, fails with an error opts.Final accepts (returned as
// is), or ctx ends: then the error wraps ctx's and names the last
// attempt's error.
func (c *Caller) Call(ctx context.Context, key uint64, addrs []string, opts CallOptions, f Attempt) error {
	b := opts.Backoff
	for {
		err := c.Round(ctx, key, addrs, opts, f)
		if err == nil || errors.Is(err, ErrClosed) || errors.Is(err, ErrNoReplicas) || (opts.Final != nil && opts.Final(err)) || shardkvpb.Unauthorized(err) {
			return err
		}
		opts.AfterRound(ctx, err)
		if ctx.Err() == nil {
			b.Wait(ctx)
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%w (last error: %v)", ctx.Err(), err)
		}
	}
}

func attempt(ctx context.Context, timeout time.Duration, f Attempt, addr string, cc *grpc.ClientConn) error {
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	return f(ctx, addr, cc)
}

// order is the round's order: the remembered leader, then addrs.
func (c *Caller) order(key uint64, addrs []string) []string {
	c.mu.Lock()
	s := c.sets[key]
	if s == nil {
		s = &replicaSet{}
		c.sets[key] = s
	}
	if !slices.Equal(s.addrs, addrs) {
		if !slices.Contains(addrs, s.leader) {
			s.leader = ""
		}
		s.addrs = slices.Clone(addrs)
	}
	lead := s.leader
	c.mu.Unlock()
	out := make([]string, 0, len(addrs)+1)
	if lead != "" {
		out = append(out, lead)
	}
	for _, a := range addrs {
		if a != lead {
			out = append(out, a)
		}
	}
	return out
}

// Hint remembers addr as group key's leader: from a replica that answered,
// a NOT_LEADER hint, or a refusal by another group naming the owner's
// leader.
func (c *Caller) Hint(key uint64, addr string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sets[key] == nil {
		c.sets[key] = &replicaSet{}
	}
	c.sets[key].leader = addr
}

// Backoff is a jittered exponential delay: Base (default 10 ms), doubling
// up to Max (default 1 s). The zero value is ready to use.
type Backoff struct {
	Base, Max time.Duration
	next      time.Duration
}

// Wait sleeps for the next delay (between half of it and all of it) or
// until ctx ends, and returns ctx.Err().
func (b *Backoff) Wait(ctx context.Context) error {
	if b.next == 0 {
		b.next = b.Base
		if b.next <= 0 {
			b.next = 10 * time.Millisecond
		}
	}
	d := b.next/2 + rand.N(b.next/2+1)
	limit := b.Max
	if limit <= 0 {
		limit = time.Second
	}
	b.next = min(2*b.next, limit)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
	return ctx.Err()
}

// Reset makes the next delay Base again.
func (b *Backoff) Reset() { b.next = 0 }
