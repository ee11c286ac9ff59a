// Package ctrlerclient is the Go client of the shard controller. It depends
// only on the wire API (pkg/shardkvpb) and pkg/grpcdial, never on server
// internals.
//
// The client tries the known leader first and follows leader hints
// (grpcdial.Caller), retries every error but a refusal, and gives every
// mutation a client id and sequence number so a retry after an unknown
// outcome applies at most once. Mutations on one Client are serialised;
// use several Clients for concurrent ones.
package ctrlerclient

import (
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
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
	pool  *grpcdial.Pool
	owned bool // Close closes pool
	rs    *grpcdial.Caller

	mu       sync.Mutex // serialises mutations (sequence numbers)
	clientID uint64
	seq      uint64
}

// New returns a client for the controller replicas at addrs (gRPC
// host:port), with its own connections.
func New(addrs []string, opts ...grpc.DialOption) (*Client, error) {
	return newClient(addrs, grpcdial.NewPool(opts...), true)
}

// NewWithPool returns a client for the controller replicas at addrs that
// dials through pool, which Close leaves open.
func NewWithPool(addrs []string, pool *grpcdial.Pool) (*Client, error) {
	return newClient(addrs, pool, false)
}

func newClient(addrs []string, pool *grpcdial.Pool, owned bool) (*Client, error) {
	if len(addrs) == 0 {
		if owned {
			pool.Close()
		}
		return nil, errors.New("ctrlerclient: no controller addresses")
	}
	var b [8]byte
	if _, err := crand.Read(b[:]); err != nil {
		return nil, err
	}
	return &Client{addrs: slices.Clone(addrs), pool: pool, owned: owned, rs: grpcdial.NewCaller(pool),
		clientID: binary.BigEndian.Uint64(b[:]) | 1}, nil
}

// Close closes the client's connections (not those of a shared pool).
func (c *Client) Close() error {
	if c.owned {
		return c.pool.Close()
	}
	return nil
}

// IsRefused reports whether err is a refusal of bad input (the config is
// unchanged and retrying will not help).
func IsRefused(err error) bool { return shardkvpb.Reason(err) == shardkvpb.ReasonInvalid }

// do runs call against the controller, the leader first, until it
// succeeds, is refused, or ctx ends. Every other error is retried (on the
// next replica, then after a backoff), unknown outcomes included: calls
// are reads, or mutations whose sequence number makes a resend apply at
// most once.
func (c *Client) do(ctx context.Context, call func(context.Context, shardkvpb.ControllerClient) error) error {
	opts := grpcdial.CallOptions{AttemptTimeout: 5 * time.Second, Final: IsRefused,
		Backoff: grpcdial.Backoff{Base: 20 * time.Millisecond, Max: time.Second}}
	err := c.rs.Call(ctx, 0, c.addrs, opts, func(ctx context.Context, _ string, cc *grpc.ClientConn) error {
		return call(ctx, shardkvpb.NewControllerClient(cc))
	})
	if err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		return fmt.Errorf("controller: %w", err)
	}
	return err
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

// Leave removes groups; their shards move to the others. A group that owns
// shards stays in the config, marked leaving, until the last of them is
// cut over.
func (c *Client) Leave(ctx context.Context, gids ...uint64) (*shardkvpb.Config, error) {
	return c.mutate(ctx, func(ctx context.Context, cl shardkvpb.ControllerClient, id, seq uint64) (*shardkvpb.ConfigReply, error) {
		return cl.Leave(ctx, &shardkvpb.LeaveRequest{ClientId: id, Seq: seq, Gids: gids})
	})
}

// Move pins shard to gid. The config it returns plans the move (the
// target pre-copies the shard and the controller cuts over once it has
// caught up); a move to the shard's current owner cancels a planned move.
func (c *Client) Move(ctx context.Context, shard int, gid uint64) (*shardkvpb.Config, error) {
	return c.move(ctx, shard, gid, false)
}

// MoveStopAndCopy pins shard to gid and hands it over in the next config,
// without pre-copy: writes to the shard pause until gid has pulled it.
func (c *Client) MoveStopAndCopy(ctx context.Context, shard int, gid uint64) (*shardkvpb.Config, error) {
	return c.move(ctx, shard, gid, true)
}

func (c *Client) move(ctx context.Context, shard int, gid uint64, stopAndCopy bool) (*shardkvpb.Config, error) {
	return c.mutate(ctx, func(ctx context.Context, cl shardkvpb.ControllerClient, id, seq uint64) (*shardkvpb.ConfigReply, error) {
		return cl.Move(ctx, &shardkvpb.MoveRequest{ClientId: id, Seq: seq, Shard: uint32(shard), Gid: gid, StopAndCopy: stopAndCopy})
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
	return c.query(ctx, &shardkvpb.QueryRequest{Num: num})
}

// QueryStale is Query answered without the controller's linearizable read
// barrier: the config may trail a mutation that just completed. For
// pollers.
func (c *Client) QueryStale(ctx context.Context, num int64) (*shardkvpb.Config, error) {
	return c.query(ctx, &shardkvpb.QueryRequest{Num: num, Stale: true})
}

func (c *Client) query(ctx context.Context, req *shardkvpb.QueryRequest) (*shardkvpb.Config, error) {
	var out *shardkvpb.Config
	err := c.do(ctx, func(ctx context.Context, cl shardkvpb.ControllerClient) error {
		r, err := cl.Query(ctx, req)
		out = r
		return err
	})
	return out, err
}

// Status returns the cluster status kept by the controller leader.
func (c *Client) Status(ctx context.Context) (*shardkvpb.ClusterStatus, error) {
	return c.status(ctx, false)
}

// StatusStale is Status answered without the controller's linearizable
// read barrier: for pollers of the groups' leaders, which are soft state
// anyway.
func (c *Client) StatusStale(ctx context.Context) (*shardkvpb.ClusterStatus, error) {
	return c.status(ctx, true)
}

func (c *Client) status(ctx context.Context, stale bool) (*shardkvpb.ClusterStatus, error) {
	var out *shardkvpb.ClusterStatus
	err := c.do(ctx, func(ctx context.Context, cl shardkvpb.ControllerClient) error {
		r, err := cl.Status(ctx, &shardkvpb.ClusterStatusRequest{Stale: stale})
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
		backoff := grpcdial.Backoff{Base: 20 * time.Millisecond, Max: time.Second}
		for ctx.Err() == nil {
			err := c.rs.Round(ctx, 0, c.addrs, grpcdial.CallOptions{}, func(ctx context.Context, _ string, cc *grpc.ClientConn) error {
				stream, err := shardkvpb.NewControllerClient(cc).Watch(ctx, &shardkvpb.WatchRequest{From: next})
				if err != nil {
					return err
				}
				for {
					conf, err := stream.Recv()
					if err != nil {
						if err != io.EOF && status.Code(err) != codes.Canceled {
							backoff.Reset()
						}
						return err
					}
					if conf.Num < next {
						continue
					}
					select {
					case out <- conf:
						next = conf.Num + 1
					case <-ctx.Done():
						return ctx.Err()
					}
				}
			})
			if errors.Is(err, grpcdial.ErrClosed) || backoff.Wait(ctx) != nil {
				return
			}
		}
	}()
	return out
}
