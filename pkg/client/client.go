// Package client is shardkv's Go client. It routes each key to its group
// (key -> slot -> shard -> group, through pkg/routing and a cached config),
// finds the group's leader from hints, retries with exponential backoff
// within the caller's context, and makes every mutation exactly-once with a
// session (client id, sequence number, acknowledgement floor). It depends
// only on the wire API.
package client

import (
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/shardkv/shardkv/pkg/ctrler/ctrlerclient"
	"github.com/shardkv/shardkv/pkg/grpcdial"
	"github.com/shardkv/shardkv/pkg/routing"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ErrOutcomeUnknown is returned when a mutation may or may not have been
// applied: ctx ended while it was in flight (the error then also wraps ctx's
// error, context.DeadlineExceeded or context.Canceled), or the group had to
// forget the result of that sequence number (RESULT_FORGOTTEN: more than
// 4096 of this client's writes on one shard were unacknowledged). Calling
// again is a new request, not a retry of the old one.
var ErrOutcomeUnknown = shardkvpb.ErrOutcomeUnknown // the one sentinel of the wire vocabulary

// Client is safe for concurrent use; concurrent calls pipeline.
type Client struct {
	ctrl *ctrlerclient.Client
	pool *grpcdial.Pool   // the controller's and the groups' connections
	rs   *grpcdial.Caller // the groups' leaders, by gid

	mu     sync.Mutex
	config *shardkvpb.Config

	sess sessions

	// AttemptTimeout bounds one RPC attempt (default 2s; 0: only the
	// call's context).
	AttemptTimeout time.Duration
}

// New returns a client of the cluster whose controller replicas are at
// ctrlerAddrs.
func New(ctrlerAddrs []string, opts ...grpc.DialOption) (*Client, error) {
	pool := grpcdial.NewPool(opts...)
	ctrl, err := ctrlerclient.NewWithPool(ctrlerAddrs, pool)
	if err != nil {
		return nil, err
	}
	var b [8]byte
	if _, err := crand.Read(b[:]); err != nil {
		return nil, err
	}
	c := &Client{ctrl: ctrl, pool: pool, rs: grpcdial.NewCaller(pool), AttemptTimeout: 2 * time.Second}
	c.sess.id = binary.BigEndian.Uint64(b[:]) | 1
	c.sess.inflight = map[uint64]bool{}
	return c, nil
}

// Close releases connections; calls fail afterwards.
func (c *Client) Close() error {
	c.ctrl.Close()
	return c.pool.Close()
}

// sessions hands out sequence numbers and computes the acknowledgement
// floor: every seq at or below it has completed.
type sessions struct {
	mu       sync.Mutex
	id       uint64
	next     uint64
	inflight map[uint64]bool
}

func (s *sessions) begin() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.next++
	s.inflight[s.next] = true
	return s.next
}

func (s *sessions) end(seq uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.inflight, seq)
}

func (s *sessions) ack() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	floor := s.next
	for q := range s.inflight {
		floor = min(floor, q-1)
	}
	return floor
}

func (c *Client) session(seq uint64) *shardkvpb.Session {
	return &shardkvpb.Session{ClientId: c.sess.id, Seq: seq, Ack: c.sess.ack()}
}

// --- routing ---

func (c *Client) currentConfig(ctx context.Context) (*shardkvpb.Config, error) {
	c.mu.Lock()
	conf := c.config
	c.mu.Unlock()
	if conf != nil && len(conf.Shards) > 0 {
		return conf, nil
	}
	return c.refresh(ctx, 0)
}

// refresh fetches the latest config if ours is older than atLeast (or unset).
func (c *Client) refresh(ctx context.Context, atLeast uint64) (*shardkvpb.Config, error) {
	conf, err := c.ctrl.Query(ctx, -1)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.config == nil || conf.Num >= c.config.Num {
		c.config = conf
	}
	_ = atLeast
	return c.config, nil
}

// Config returns the client's cached config (fetching it if needed).
func (c *Client) Config(ctx context.Context) (*shardkvpb.Config, error) { return c.currentConfig(ctx) }

func groupOf(conf *shardkvpb.Config, key []byte) (uint64, []string) {
	if len(conf.Shards) == 0 {
		return 0, nil
	}
	gid := routing.GroupOf(key, conf.Shards)
	for _, g := range conf.Groups {
		if g.Gid == gid {
			var addrs []string
			for _, s := range g.Servers {
				addrs = append(addrs, s.Addr)
			}
			return gid, addrs
		}
	}
	return gid, nil
}

// call routes key to its group and runs f on the group's replicas until f
// succeeds, fails for good, or ctx ends. f runs again (on another replica,
// or after a backoff) after every error that is not final, including those
// that leave its outcome unknown (an attempt timeout, a lost connection,
// OUTCOME_UNKNOWN): a read may repeat, and a write stays exactly-once
// because every try carries the same session sequence number. When ctx
// ends first, write reports ErrOutcomeUnknown.
func (c *Client) call(ctx context.Context, key []byte, f func(context.Context, shardkvpb.KVClient) error) error {
	return c.callGroup(ctx, key, false, f)
}

// errReroute: a batch part must be split again under a newer config.
var errReroute = errors.New("keys moved to another group")

// callGroup is call; with batch set, a WRONG_GROUP answer returns
// errReroute instead of retrying the same keys (they may now span groups).
func (c *Client) callGroup(ctx context.Context, key []byte, batch bool, f func(context.Context, shardkvpb.KVClient) error) error {
	backoff := grpcdial.Backoff{Base: 10 * time.Millisecond, Max: time.Second}
	opts := grpcdial.CallOptions{AttemptTimeout: c.AttemptTimeout, Final: endsRound}
	attempt := func(ctx context.Context, _ string, cc *grpc.ClientConn) error {
		return f(ctx, shardkvpb.NewKVClient(cc))
	}
	var last error
	for {
		conf, err := c.currentConfig(ctx)
		if err != nil {
			return err
		}
		refresh := false
		if gid, addrs := groupOf(conf, key); gid == 0 || len(addrs) == 0 {
			last = fmt.Errorf("no group serves key %q in config %d", key, conf.Num)
			if _, err := c.refresh(ctx, conf.Num+1); err != nil {
				last = err
			}
		} else if err := c.rs.Round(ctx, gid, addrs, opts, attempt); err == nil {
			return nil
		} else {
			last = err
			opts.AfterRound(ctx, err)
			switch shardkvpb.Reason(err) {
			case shardkvpb.ReasonWrongGroup:
				refresh = true
				if owner, addr := shardkvpb.OwnerHint(err); owner != 0 && addr != "" {
					c.rs.Hint(owner, addr)
				}
			case shardkvpb.ReasonInvalid, shardkvpb.ReasonTooLarge, shardkvpb.ReasonNotAuthorized:
				return err
			case shardkvpb.ReasonResultForgotten:
				return fmt.Errorf("%w: %v", ErrOutcomeUnknown, err)
			}
			if errors.Is(err, grpcdial.ErrClosed) {
				return err
			}
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%w (last error: %v)", ctx.Err(), last)
		}
		if refresh {
			next, err := c.refresh(ctx, conf.Num+1)
			switch {
			case err != nil:
				last = err
			case batch:
				return errReroute
			case next.Num > conf.Num:
				continue // a newer config: go where it says at once
			}
		}
		if backoff.Wait(ctx) != nil {
			return fmt.Errorf("%w (last error: %v)", ctx.Err(), last)
		}
	}
}

// endsRound: errors after which the group's other replicas are not tried
// in this round. WRONG_GROUP and NOT_READY are the group's, not the
// replica's answer (the config is refreshed, or the shard awaited, before
// the next round); the others end the call.
func endsRound(err error) bool {
	switch shardkvpb.Reason(err) {
	case shardkvpb.ReasonWrongGroup, shardkvpb.ReasonNotReady,
		shardkvpb.ReasonInvalid, shardkvpb.ReasonTooLarge, shardkvpb.ReasonResultForgotten:
		return true
	}
	return false
}

// --- data API ---

// Get returns key's value and whether it exists.
func (c *Client) Get(ctx context.Context, key string) (string, bool, error) {
	var rep *shardkvpb.GetReply
	err := c.call(ctx, []byte(key), func(ctx context.Context, cl shardkvpb.KVClient) error {
		var err error
		rep, err = cl.Get(ctx, &shardkvpb.GetRequest{Key: []byte(key)})
		return err
	})
	if err != nil {
		return "", false, err
	}
	if rep.Found && rep.Type != 0 {
		return "", false, fmt.Errorf("key %q: %w", key, ErrWrongType)
	}
	return string(rep.Value), rep.Found, nil
}

func (c *Client) write(ctx context.Context, op *shardkvpb.WriteOp) (*shardkvpb.WriteResult, error) {
	seq := c.sess.begin()
	defer c.sess.end(seq)
	var rep *shardkvpb.WriteReply
	err := c.call(ctx, op.Key, func(actx context.Context, cl shardkvpb.KVClient) error {
		op.Session = c.session(seq)
		var err error
		rep, err = cl.Write(actx, &shardkvpb.WriteRequest{Op: op})
		return err
	})
	if err != nil {
		if ctx.Err() != nil && !mayHaveFailedBeforeSending(err) {
			return nil, fmt.Errorf("%w: %w", ErrOutcomeUnknown, err) // err wraps ctx.Err()
		}
		return nil, err
	}
	return rep.Result, opResult(op.Key, rep.Result)
}

func mayHaveFailedBeforeSending(err error) bool {
	return status.Code(err) == codes.InvalidArgument
}

// Put sets key to value.
func (c *Client) Put(ctx context.Context, key, value string) error {
	_, err := c.write(ctx, &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_PUT, Key: []byte(key), Value: []byte(value)})
	return err
}

// Append appends value to key's value (creating it).
func (c *Client) Append(ctx context.Context, key, value string) error {
	_, err := c.write(ctx, &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_APPEND, Key: []byte(key), Value: []byte(value)})
	return err
}

// Delete removes key and reports whether it existed.
func (c *Client) Delete(ctx context.Context, key string) (bool, error) {
	r, err := c.write(ctx, &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_DELETE, Key: []byte(key)})
	if err != nil {
		return false, err
	}
	return r.Ok, nil
}

// CompareAndSet sets key to value if its current value is expect (or, with
// expect nil, if key does not exist). It reports whether it swapped.
func (c *Client) CompareAndSet(ctx context.Context, key string, expect *string, value string) (bool, error) {
	op := &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_CAS, Key: []byte(key), Value: []byte(value), ExpectAbsent: expect == nil}
	if expect != nil {
		op.Expect = []byte(*expect)
	}
	r, err := c.write(ctx, op)
	if err != nil {
		return false, err
	}
	return r.Ok, nil
}

// --- batches ---

// MultiGet reads keys, one request per group, groups in parallel. Missing
// keys are absent from the result.
func (c *Client) MultiGet(ctx context.Context, keys []string) (map[string]string, error) {
	out := map[string]string{}
	pending := keys
	for len(pending) > 0 {
		retry, err := fanOut(ctx, c, pending,
			func(ctx context.Context, cl shardkvpb.KVClient, part []string) (*shardkvpb.MultiGetReply, error) {
				bkeys := make([][]byte, len(part))
				for i, k := range part {
					bkeys[i] = []byte(k)
				}
				return cl.MultiGet(ctx, &shardkvpb.MultiGetRequest{Keys: bkeys})
			},
			func(part []string, rep *shardkvpb.MultiGetReply) ([]string, error) {
				for i, v := range rep.Values {
					if v.Found {
						out[part[i]] = string(v.Value)
					}
				}
				return nil, nil
			})
		if err != nil {
			return nil, err
		}
		pending = retry
	}
	return out, nil
}

// MultiPut writes all pairs, one log entry per group, groups in parallel;
// each pair is exactly-once. Pairs a group refuses (its shard moved) are
// re-routed and retried.
func (c *Client) MultiPut(ctx context.Context, kvs map[string]string) error {
	keys := make([]string, 0, len(kvs))
	for k := range kvs {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	seqs := map[string]uint64{}
	for _, k := range keys {
		seqs[k] = c.sess.begin()
	}
	defer func() {
		for _, s := range seqs {
			c.sess.end(s)
		}
	}()
	pending := keys
	delay := 10 * time.Millisecond
	for len(pending) > 0 {
		retry, err := fanOut(ctx, c, pending,
			func(ctx context.Context, cl shardkvpb.KVClient, part []string) (*shardkvpb.MultiWriteReply, error) {
				ops := make([]*shardkvpb.WriteOp, len(part))
				// One ack for the whole request: ack scans every write in
				// flight, this call's own keys included, so one per op
				// made building the request quadratic in its keys.
				ack := c.sess.ack()
				for i, k := range part {
					ops[i] = &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_PUT, Key: []byte(k), Value: []byte(kvs[k]),
						Session: &shardkvpb.Session{ClientId: c.sess.id, Seq: seqs[k], Ack: ack}}
				}
				return cl.MultiWrite(ctx, &shardkvpb.MultiWriteRequest{Ops: ops})
			},
			func(part []string, rep *shardkvpb.MultiWriteReply) ([]string, error) {
				var retry []string
				for i, r := range rep.Results {
					if r.NotExecuted == shardkvpb.ReasonResultForgotten {
						return nil, fmt.Errorf("%w: key %q: the group no longer remembers this write's result", ErrOutcomeUnknown, part[i])
					}
					if r.NotExecuted != "" {
						retry = append(retry, part[i])
						continue
					}
					if err := opResult([]byte(part[i]), r); err != nil {
						return nil, err
					}
				}
				return retry, nil
			})
		if err != nil {
			return err
		}
		pending = retry
		if len(pending) > 0 {
			if _, err := c.refresh(ctx, 0); err != nil {
				return err
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(delay):
			}
			delay = min(2*delay, time.Second)
		}
	}
	return nil
}

// fanOut calls each group with its part of keys, groups in parallel. A part
// its group refused as a whole (errReroute: the config moved on) comes back
// to be routed again; use, called under one lock, reads a reply and returns
// the keys of its part to retry.
func fanOut[R any](ctx context.Context, c *Client, keys []string,
	call func(ctx context.Context, cl shardkvpb.KVClient, part []string) (R, error),
	use func(part []string, rep R) ([]string, error)) ([]string, error) {
	var mu sync.Mutex
	var retry []string
	err := c.perGroup(ctx, keys, func(ctx context.Context, part []string) error {
		var rep R
		err := c.callGroup(ctx, []byte(part[0]), true, func(actx context.Context, cl shardkvpb.KVClient) error {
			var err error
			rep, err = call(actx, cl, part)
			return err
		})
		mu.Lock()
		defer mu.Unlock()
		if errors.Is(err, errReroute) {
			retry = append(retry, part...)
			return nil
		}
		if err != nil {
			return err
		}
		more, err := use(part, rep)
		retry = append(retry, more...)
		return err
	})
	return retry, err
}

// perGroup splits keys by their group in the cached config and runs f on
// each part in parallel.
func (c *Client) perGroup(ctx context.Context, keys []string, f func(context.Context, []string) error) error {
	conf, err := c.currentConfig(ctx)
	if err != nil {
		return err
	}
	parts := map[uint64][]string{}
	var gids []uint64
	for _, k := range keys {
		gid, _ := groupOf(conf, []byte(k))
		if _, ok := parts[gid]; !ok {
			gids = append(gids, gid)
		}
		parts[gid] = append(parts[gid], k)
	}
	var wg sync.WaitGroup
	errs := make([]error, len(gids))
	for i, gid := range gids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = f(ctx, parts[gid])
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
