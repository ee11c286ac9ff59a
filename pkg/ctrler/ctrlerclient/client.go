// Package ctrlerclient is the Go client of the shard controller. It depends
// only on the wire API (pkg/shardkvpb), never on server internals.
//
// The client follows leader hints, retries on errors that prove a request
// was not executed, and gives every mutation a client id and sequence number
// so a retry after an unknown outcome applies at most once. Calls on one
// Client are serialised; use several Clients for concurrency.
package ctrlerclient

import (
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/shardkv/shardkv/pkg/grpcdial"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Client talks to a controller group.
type Client struct {
	addrs []string
	opts  []grpc.DialOption

	mu       sync.Mutex // serialises mutations (sequence numbers)
	clientID uint64
	seq      uint64

	cmu    sync.Mutex
	conns  map[string]*grpc.ClientConn
	leader string
}

// New returns a client for the controller replicas at addrs (gRPC host:port).
func New(addrs []string, opts ...grpc.DialOption) (*Client, error) {
	if len(addrs) == 0 {
		return nil, errors.New("ctrlerclient: no controller addresses")
	}
	if len(opts) == 0 {
		opts = grpcdial.Options()
	}
	var b [8]byte
	if _, err := crand.Read(b[:]); err != nil {
		return nil, err
	}
	return &Client{addrs: slices.Clone(addrs), opts: opts, clientID: binary.BigEndian.Uint64(b[:]) | 1, conns: map[string]*grpc.ClientConn{}}, nil
}

// Close closes all connections.
func (c *Client) Close() error {
	c.cmu.Lock()
	defer c.cmu.Unlock()
	for _, cc := range c.conns {
		cc.Close()
	}
	c.conns = map[string]*grpc.ClientConn{}
	return nil
}

func (c *Client) conn(addr string) (shardkvpb.ControllerClient, error) {
	c.cmu.Lock()
	defer c.cmu.Unlock()
	cc, ok := c.conns[addr]
	if !ok {
		var err error
		if cc, err = grpc.NewClient(grpcdial.Target(addr), c.opts...); err != nil {
			return nil, err
		}
		c.conns[addr] = cc
	}
	return shardkvpb.NewControllerClient(cc), nil
}

// order returns the addresses to try: the known leader first.
func (c *Client) order() []string {
	c.cmu.Lock()
	defer c.cmu.Unlock()
	out := make([]string, 0, len(c.addrs)+1)
	if c.leader != "" {
		out = append(out, c.leader)
	}
	for _, a := range c.addrs {
		if a != c.leader {
			out = append(out, a)
		}
	}
	return out
}

func (c *Client) setLeader(addr string) {
	c.cmu.Lock()
	c.leader = addr
	c.cmu.Unlock()
}

// IsRefused reports whether err is a refusal of bad input (the config is
// unchanged and retrying will not help).
func IsRefused(err error) bool { return shardkvpb.Reason(err) == shardkvpb.ReasonInvalid }

// do runs call against the controller until it succeeds, fails for good, or
// ctx ends. idempotent calls (reads, and mutations carrying a sequence
// number) are retried on any transient error, including unknown outcomes.
func (c *Client) do(ctx context.Context, call func(context.Context, shardkvpb.ControllerClient) error) error {
	backoff := 20 * time.Millisecond
	var last error
	for {
		for _, addr := range c.order() {
			cl, err := c.conn(addr)
			if err != nil {
				last = err
				continue
			}
			actx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err = call(actx, cl)
			cancel()
			if err == nil {
				c.setLeader(addr)
				return nil
			}
			last = err
			if IsRefused(err) {
				return err
			}
			if _, hint, ok := shardkvpb.LeaderHint(err); ok && hint != "" && hint != addr {
				c.setLeader(hint)
				if cl2, err2 := c.conn(hint); err2 == nil {
					actx, cancel := context.WithTimeout(ctx, 5*time.Second)
					err2 = call(actx, cl2)
					cancel()
					if err2 == nil {
						return nil
					}
					last = err2
					if IsRefused(err2) {
						return err2
					}
				}
			}
			if ctx.Err() != nil {
				return fmt.Errorf("controller: %w (last error: %v)", ctx.Err(), last)
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("controller: %w (last error: %v)", ctx.Err(), last)
		case <-time.After(backoff/2 + rand.N(backoff/2+1)):
		}
		backoff = min(2*backoff, time.Second)
	}
}

func (c *Client) mutate(ctx context.Context, call func(ctx context.Context, cl shardkvpb.ControllerClient, id, seq uint64) (*shardkvpb.ConfigReply, error)) (*shardkvpb.Config, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	seq := c.seq
	var out *shardkvpb.Config
	err := c.do(ctx, func(ctx context.Context, cl shardkvpb.ControllerClient) error {
		r, err := call(ctx, cl, c.clientID, seq)
		if err == nil {
			out = r.Config
		}
		return err
	})
	return out, err
}

// Join adds groups (or updates the servers and weight of groups already in
// the config) and returns the resulting config.
func (c *Client) Join(ctx context.Context, groups ...*shardkvpb.Group) (*shardkvpb.Config, error) {
	return c.mutate(ctx, func(ctx context.Context, cl shardkvpb.ControllerClient, id, seq uint64) (*shardkvpb.ConfigReply, error) {
		return cl.Join(ctx, &shardkvpb.JoinRequest{ClientId: id, Seq: seq, Groups: groups})
	})
}

// Leave removes groups; their shards move to the others.
func (c *Client) Leave(ctx context.Context, gids ...uint64) (*shardkvpb.Config, error) {
	return c.mutate(ctx, func(ctx context.Context, cl shardkvpb.ControllerClient, id, seq uint64) (*shardkvpb.ConfigReply, error) {
		return cl.Leave(ctx, &shardkvpb.LeaveRequest{ClientId: id, Seq: seq, Gids: gids})
	})
}

// Move pins shard to gid.
func (c *Client) Move(ctx context.Context, shard int, gid uint64) (*shardkvpb.Config, error) {
	return c.mutate(ctx, func(ctx context.Context, cl shardkvpb.ControllerClient, id, seq uint64) (*shardkvpb.ConfigReply, error) {
		return cl.Move(ctx, &shardkvpb.MoveRequest{ClientId: id, Seq: seq, Shard: uint32(shard), Gid: gid})
	})
}

// Unpin releases a pinned shard back to the balancer.
func (c *Client) Unpin(ctx context.Context, shard int) (*shardkvpb.Config, error) {
	return c.mutate(ctx, func(ctx context.Context, cl shardkvpb.ControllerClient, id, seq uint64) (*shardkvpb.ConfigReply, error) {
		return cl.Unpin(ctx, &shardkvpb.UnpinRequest{ClientId: id, Seq: seq, Shard: uint32(shard)})
	})
}

// Query returns config num; -1 (or past the latest) returns the latest.
func (c *Client) Query(ctx context.Context, num int64) (*shardkvpb.Config, error) {
	var out *shardkvpb.Config
	err := c.do(ctx, func(ctx context.Context, cl shardkvpb.ControllerClient) error {
		r, err := cl.Query(ctx, &shardkvpb.QueryRequest{Num: num})
		out = r
		return err
	})
	return out, err
}

// Status returns the cluster status kept by the controller leader.
func (c *Client) Status(ctx context.Context) (*shardkvpb.ClusterStatus, error) {
	var out *shardkvpb.ClusterStatus
	err := c.do(ctx, func(ctx context.Context, cl shardkvpb.ControllerClient) error {
		r, err := cl.Status(ctx, &shardkvpb.ClusterStatusRequest{})
		out = r
		return err
	})
	return out, err
}

// Report sends a group leader's heartbeat to the controller leader.
func (c *Client) Report(ctx context.Context, r *shardkvpb.GroupReport) (*shardkvpb.ReportReply, error) {
	var out *shardkvpb.ReportReply
	err := c.do(ctx, func(ctx context.Context, cl shardkvpb.ControllerClient) error {
		rr, err := cl.Report(ctx, r)
		out = rr
		return err
	})
	return out, err
}

// Watch delivers every config from `from` on, in order and without gaps
// (unless history was compacted below from), reconnecting as needed, until
// ctx ends. The channel is closed when Watch stops.
func (c *Client) Watch(ctx context.Context, from uint64) <-chan *shardkvpb.Config {
	out := make(chan *shardkvpb.Config, 16)
	go func() {
		defer close(out)
		next := from
		backoff := 20 * time.Millisecond
		for ctx.Err() == nil {
			for _, addr := range c.order() {
				cl, err := c.conn(addr)
				if err != nil {
					continue
				}
				stream, err := cl.Watch(ctx, &shardkvpb.WatchRequest{From: next})
				if err != nil {
					continue
				}
				for {
					conf, err := stream.Recv()
					if err != nil {
						if err != io.EOF && status.Code(err) != codes.Canceled {
							backoff = 20 * time.Millisecond
						}
						break
					}
					if conf.Num < next {
						continue
					}
					select {
					case out <- conf:
						next = conf.Num + 1
					case <-ctx.Done():
						return
					}
				}
				if ctx.Err() != nil {
					return
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, time.Second)
		}
	}()
	return out
}
