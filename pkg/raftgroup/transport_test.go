package raftgroup_test

import (
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardkv/shardkv/pkg/raftgroup"
	"github.com/shardkv/shardkv/pkg/raftgroup/rgtest"
	pb "go.etcd.io/raft/v3/raftpb"
)

// engBlackHole accepts TCP connections and never reads from them.
type engBlackHole struct {
	lis      net.Listener
	mu       sync.Mutex
	conns    []net.Conn
	accepted atomic.Int64
}

func newEngBlackHole(t *testing.T) *engBlackHole {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &engBlackHole{lis: lis}
	go func() {
		for {
			conn, err := lis.Accept()
			if err != nil {
				return
			}
			b.accepted.Add(1)
			b.mu.Lock()
			b.conns = append(b.conns, conn) // held open, never read
			b.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		lis.Close()
		b.mu.Lock()
		for _, c := range b.conns {
			c.Close()
		}
		b.mu.Unlock()
	})
	return b
}

// engFlood multiplies every message to one peer, so that peer's send queue
// overflows quickly if the peer does not drain it.
type engFlood struct {
	inner  raftgroup.Filter
	to     uint64
	copies int
}

func (f *engFlood) Outgoing(from, to uint64, m *pb.Message) (int, time.Duration) {
	n, d := f.inner.Outgoing(from, to, m)
	if to == f.to && n > 0 && m.GetType() != pb.MsgSnap {
		n *= f.copies
	}
	return n, d
}

// TestSlowPeerDoesNotBlock: a voter whose address accepts connections but
// never reads gets its queue flooded; the other replicas still commit
// thousands of proposals, reads and membership changes keep working.
func TestSlowPeerDoesNotBlock(t *testing.T) {
	bh := newEngBlackHole(t)
	c := rgtest.NewCluster(t, 3, rgtest.Options{Config: func(cfg *raftgroup.Config) {
		cfg.SnapshotEntries, cfg.TrailingEntries = 300, 50 // the black hole will be offered snapshots too
		cfg.Filter = &engFlood{inner: cfg.Filter, to: 4, copies: 256}
	}})
	l := c.WaitLeader(engHang)
	leader := c.Replica(l)
	ctx := engCtx(t, engHang) // bounds the whole load: a blocked Ready loop fails it
	if err := leader.AddLearner(ctx, 4, bh.lis.Addr().String()); err != nil {
		t.Fatalf("add black hole as learner: %v", err)
	}
	if err := leader.Promote(ctx, 4); err != nil {
		t.Fatalf("promote black hole: %v", err)
	}
	engWaitMembers(t, c, l, "1 2 3 4")
	engWaitFor(t, "the leader to connect to the black hole", func() bool { return bh.accepted.Load() > 0 })

	// 2000 proposals from 16 clients. With the black hole a voter, every
	// commit needs all three real replicas.
	const clients, each = 16, 125
	var wg sync.WaitGroup
	var ok atomic.Int64
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range each {
				if _, err := c.Propose(ctx, rgtest.EncodePut(fmt.Sprintf("k%d-%d", i, j), "v")); err != nil {
					t.Errorf("proposal %d-%d: %v", i, j, err)
					return
				}
				ok.Add(1)
			}
		}()
	}
	wg.Wait()
	if ok.Load() != clients*each {
		t.Fatalf("only %d of %d proposals committed", ok.Load(), clients*each)
	}
	m := c.Replica(c.WaitLeader(engHang)).Metrics()
	if m.MessagesDropped.Load() == 0 {
		t.Fatal("the leader dropped no message for the black hole: its queue never filled, so the test proved nothing")
	}

	// The Ready loop is alive: reads, a membership change and more writes go
	// through.
	data := engSameData(t, c, 1, 2, 3)
	if len(data) != clients*each {
		t.Fatalf("replicas hold %d keys, want %d", len(data), clients*each)
	}
	l = c.WaitLeader(engHang)
	if err := c.Replica(l).RemoveMember(ctx, 4); err != nil {
		t.Fatalf("remove black hole: %v", err)
	}
	engWaitMembers(t, c, l, "1 2 3")
	engPropose(t, c, rgtest.EncodePut("after", "1"))
	engSameData(t, c, 1, 2, 3)
	t.Logf("black hole accepted %d connections; leader dropped %d messages", bh.accepted.Load(), m.MessagesDropped.Load())
}
