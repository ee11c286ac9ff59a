package rgtest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/shardkv/shardkv/pkg/raftgroup"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
)

// Network is a fault-injecting raftgroup.Filter shared by all replicas of a
// Cluster. The zero value delivers everything.
type Network struct {
	mu       sync.Mutex
	blocked  map[[2]uint64]bool // directed links that drop everything
	drop     float64            // probability of dropping a message
	dup      float64            // probability of delivering it twice
	maxDelay time.Duration      // uniform random delay (reorders messages)
	rng      *rand.Rand
}

// NewNetwork returns a reliable network.
func NewNetwork() *Network {
	return &Network{blocked: map[[2]uint64]bool{}, rng: rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))}
}

// Outgoing implements raftgroup.Filter.
func (n *Network) Outgoing(from, to uint64, _ *pb.Message) (int, time.Duration) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.blocked[[2]uint64{from, to}] {
		return 0, 0
	}
	if n.drop > 0 && n.rng.Float64() < n.drop {
		return 0, 0
	}
	copies := 1
	if n.dup > 0 && n.rng.Float64() < n.dup {
		copies = 2
	}
	var d time.Duration
	if n.maxDelay > 0 {
		d = time.Duration(n.rng.Int64N(int64(n.maxDelay)))
	}
	return copies, d
}

// SetUnreliable sets the drop and duplicate probabilities and the maximum
// random delay. Zeros make the network reliable again.
func (n *Network) SetUnreliable(drop, dup float64, maxDelay time.Duration) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.drop, n.dup, n.maxDelay = drop, dup, maxDelay
}

// Partition splits replicas into sides; messages cross no side boundary.
// Replicas not named are cut off from everyone.
func (n *Network) Partition(all []uint64, sides ...[]uint64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	side := map[uint64]int{}
	for i, s := range sides {
		for _, id := range s {
			side[id] = i + 1
		}
	}
	clear(n.blocked)
	for _, a := range all {
		for _, b := range all {
			if a != b && (side[a] == 0 || side[a] != side[b]) {
				n.blocked[[2]uint64{a, b}] = true
			}
		}
	}
}

// Isolate cuts one replica off from all others, both ways.
func (n *Network) Isolate(all []uint64, id uint64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, o := range all {
		if o != id {
			n.blocked[[2]uint64{id, o}] = true
			n.blocked[[2]uint64{o, id}] = true
		}
	}
}

// Heal removes all partitions (not the unreliability settings).
func (n *Network) Heal() {
	n.mu.Lock()
	defer n.mu.Unlock()
	clear(n.blocked)
}

// Options tune a Cluster.
type Options struct {
	// NewSM makes the state machine for replica id (on every start). Default: &KV{}.
	NewSM func(id uint64) raftgroup.StateMachine
	// Config is applied to every replica's config before start (may be nil).
	Config func(c *raftgroup.Config)
	// GroupID of the group. Default 1.
	GroupID uint64
	// Register, if set, registers extra gRPC services on each replica's
	// server (e.g. a state machine's client API).
	Register func(id uint64, s *grpc.Server, r *raftgroup.Replica, sm raftgroup.StateMachine)
	// OnCrash, if set, runs when replica id is crashed or shut down, before
	// its replica closes (stop services started by Register).
	OnCrash func(id uint64)
	// ServerOptions are added to each replica's gRPC server (e.g.
	// interceptors that inject faults into client RPCs).
	ServerOptions []grpc.ServerOption
}

// Node is one replica slot of a Cluster.
type Node struct {
	ID      uint64
	Addr    string
	Dir     string
	Replica *raftgroup.Replica // nil while crashed
	SM      raftgroup.StateMachine
	srv     *grpc.Server
	lis     net.Listener
	join    bool
}

// Cluster is a Raft group of real replicas in one process.
type Cluster struct {
	t     testing.TB
	opts  Options
	Net   *Network
	Nodes map[uint64]*Node
	mu    sync.Mutex
	peers []raftgroup.Peer
}

// NewCluster starts n replicas (ids 1..n) that bootstrap one group.
func NewCluster(t testing.TB, n int, opts Options) *Cluster {
	t.Helper()
	if opts.NewSM == nil {
		opts.NewSM = func(uint64) raftgroup.StateMachine { return &KV{} }
	}
	if opts.GroupID == 0 {
		opts.GroupID = 1
	}
	c := &Cluster{t: t, opts: opts, Net: NewNetwork(), Nodes: map[uint64]*Node{}}
	base := t.TempDir()
	for i := 1; i <= n; i++ {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		id := uint64(i)
		nd := &Node{ID: id, Addr: lis.Addr().String(), Dir: filepath.Join(base, fmt.Sprintf("r%d", i)), lis: lis}
		c.Nodes[id] = nd
		c.peers = append(c.peers, raftgroup.Peer{ID: id, Addr: nd.Addr})
	}
	for i := 1; i <= n; i++ {
		c.Start(uint64(i))
	}
	t.Cleanup(c.Shutdown)
	return c
}

// IDs lists all replica slots, crashed ones included.
func (c *Cluster) IDs() []uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ids []uint64
	for id := range c.Nodes {
		ids = append(ids, id)
	}
	sortIDs(ids)
	return ids
}

func sortIDs(ids []uint64) {
	for i := 1; i < len(ids); i++ {
		for j := i; j > 0 && ids[j] < ids[j-1]; j-- {
			ids[j], ids[j-1] = ids[j-1], ids[j]
		}
	}
}

// Logger is the logger replicas use: quiet unless RGTEST_LOG is set.
func Logger() *slog.Logger {
	if os.Getenv("RGTEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// Start starts (or restarts, on its data dir) replica id.
func (c *Cluster) Start(id uint64) {
	c.t.Helper()
	c.mu.Lock()
	nd := c.Nodes[id]
	c.mu.Unlock()
	if nd.Replica != nil {
		return
	}
	if nd.lis == nil {
		var err error
		for range 50 {
			if nd.lis, err = net.Listen("tcp", nd.Addr); err == nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			c.t.Fatalf("relisten %s: %v", nd.Addr, err)
		}
	}
	cfg := raftgroup.Config{
		GroupID: c.opts.GroupID, ID: id, Addr: nd.Addr, Dir: nd.Dir, Peers: c.peers, Join: nd.join,
		TickInterval: 20 * time.Millisecond, Filter: c.Net, Logger: Logger().With("replica", id),
	}
	if c.opts.Config != nil {
		c.opts.Config(&cfg)
	}
	sm := c.opts.NewSM(id)
	r, err := raftgroup.Open(cfg, sm)
	if err != nil {
		c.t.Fatalf("start replica %d: %v", id, err)
	}
	srv := grpc.NewServer(append(raftgroup.ServerOptions(), c.opts.ServerOptions...)...)
	r.RegisterGRPC(srv)
	if c.opts.Register != nil {
		c.opts.Register(id, srv, r, sm)
	}
	lis := nd.lis
	go srv.Serve(lis)
	c.mu.Lock()
	nd.Replica, nd.SM, nd.srv = r, sm, srv
	c.mu.Unlock()
}

// Crash stops replica id abruptly: no leadership transfer, in-flight
// requests fail. Its data dir stays for Start.
func (c *Cluster) Crash(id uint64) {
	c.mu.Lock()
	nd := c.Nodes[id]
	r, srv := nd.Replica, nd.srv
	nd.Replica, nd.srv, nd.lis = nil, nil, nil
	c.mu.Unlock()
	if r == nil {
		return
	}
	srv.Stop()
	if c.opts.OnCrash != nil {
		c.opts.OnCrash(id)
	}
	if err := r.Close(); err != nil {
		c.t.Logf("close replica %d: %v", id, err)
	}
}

// AddNode creates an empty replica slot that starts in join mode; the caller
// adds it to the group (AddLearner) and promotes it.
func (c *Cluster) AddNode(id uint64) *Node {
	c.t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		c.t.Fatal(err)
	}
	nd := &Node{ID: id, Addr: lis.Addr().String(), Dir: filepath.Join(c.t.TempDir(), fmt.Sprintf("r%d", id)), lis: lis, join: true}
	c.mu.Lock()
	c.Nodes[id] = nd
	c.mu.Unlock()
	c.Start(id)
	return nd
}

// Remove crashes replica id and forgets its slot.
func (c *Cluster) Remove(id uint64) {
	c.Crash(id)
	c.mu.Lock()
	delete(c.Nodes, id)
	c.mu.Unlock()
}

// Shutdown stops every replica.
func (c *Cluster) Shutdown() {
	for _, id := range c.IDs() {
		c.Crash(id)
	}
}

// Replica returns the running replica id, or nil if it is crashed.
func (c *Cluster) Replica(id uint64) *raftgroup.Replica {
	c.mu.Lock()
	defer c.mu.Unlock()
	if nd := c.Nodes[id]; nd != nil {
		return nd.Replica
	}
	return nil
}

// KV returns replica id's state machine as *KV (nil if crashed).
func (c *Cluster) KV(id uint64) *KV {
	c.mu.Lock()
	defer c.mu.Unlock()
	if nd := c.Nodes[id]; nd != nil && nd.Replica != nil {
		kv, _ := nd.SM.(*KV)
		return kv
	}
	return nil
}

// Leader returns the id of a running replica that believes it leads, or 0.
// With partitions there may briefly be two; the one with the higher term wins.
func (c *Cluster) Leader() uint64 {
	var best, term uint64
	for _, id := range c.IDs() {
		if r := c.Replica(id); r != nil && r.IsLeader() && r.Term() >= term {
			best, term = id, r.Term()
		}
	}
	return best
}

// WaitLeader waits until some running replica leads, and returns it.
func (c *Cluster) WaitLeader(timeout time.Duration) uint64 {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if l := c.Leader(); l != 0 {
			return l
		}
		time.Sleep(10 * time.Millisecond)
	}
	c.t.Fatalf("no leader within %v", timeout)
	return 0
}

// Propose sends cmd to the current leader, retrying while the command is
// provably not executed (no leader, wrong leader), until ctx ends. It
// returns the last error otherwise, e.g. an outcome-unknown one.
func (c *Cluster) Propose(ctx context.Context, cmd []byte) (any, error) {
	for {
		id := c.Leader()
		var err error
		if id != 0 {
			if r := c.Replica(id); r != nil {
				var v any
				v, err = r.Propose(ctx, cmd)
				if err == nil {
					return v, nil
				}
				if !IsNotExecuted(err) {
					return nil, err
				}
			}
		}
		select {
		case <-ctx.Done():
			if err == nil {
				err = ctx.Err()
			}
			return nil, err
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// IsNotExecuted reports whether err proves a command did not execute.
func IsNotExecuted(err error) bool { return raftgroup.IsNotExecuted(err) }
