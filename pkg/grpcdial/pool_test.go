package grpcdial_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/shardkv/shardkv/pkg/grpcdial"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"google.golang.org/grpc/connectivity"
)

func TestPoolGetForgetRetainClose(t *testing.T) {
	a, b := startReplica(t), startReplica(t)
	p := grpcdial.NewPool()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	ca, err := p.Get(a.addr)
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := p.Get(a.addr); again != ca {
		t.Fatal("Get dialed a second connection to the same address")
	}
	if v, err := get(ctx, ca); err != nil || v != a.addr {
		t.Fatalf("get over the pooled connection: %q, %v", v, err)
	}
	cb, _ := p.Get(b.addr)
	dead := deadAddr(t)
	if _, err := p.Get(dead); err != nil {
		t.Fatalf("Get is lazy, yet dialing %s failed: %v", dead, err)
	}
	if got := p.Addrs(); !slices.Equal(got, sorted(a.addr, b.addr, dead)) {
		t.Fatalf("Addrs = %v", got)
	}

	// Forget closes the connection; the next Get dials a new one.
	p.Forget(a.addr)
	if s := ca.GetState(); s != connectivity.Shutdown {
		t.Fatalf("forgotten connection is %v, want Shutdown", s)
	}
	ca2, err := p.Get(a.addr)
	if err != nil || ca2 == ca {
		t.Fatalf("Get after Forget: same connection or %v", err)
	}
	if v, err := get(ctx, ca2); err != nil || v != a.addr {
		t.Fatalf("get after Forget: %q, %v", v, err)
	}

	// Retain keeps only the addresses given.
	p.Retain([]string{b.addr, "unknown:1"})
	if got := p.Addrs(); !slices.Equal(got, []string{b.addr}) {
		t.Fatalf("Addrs after Retain = %v", got)
	}
	if ca2.GetState() != connectivity.Shutdown || cb.GetState() == connectivity.Shutdown {
		t.Fatalf("after Retain(b): a is %v, b is %v", ca2.GetState(), cb.GetState())
	}

	// Close closes the rest and refuses new connections.
	p.Close()
	if cb.GetState() != connectivity.Shutdown {
		t.Fatalf("after Close: b is %v", cb.GetState())
	}
	if _, err := p.Get(a.addr); !errors.Is(err, grpcdial.ErrClosed) {
		t.Fatalf("Get after Close: %v, want ErrClosed", err)
	}
	if got := p.Addrs(); len(got) != 0 {
		t.Fatalf("Addrs after Close = %v", got)
	}
}

func TestPoolCloseIdle(t *testing.T) {
	a, b := startReplica(t), startReplica(t)
	p := grpcdial.NewPool()
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	ca, _ := p.Get(a.addr)
	p.Get(b.addr)
	if closed := p.CloseIdle(); len(closed) != 0 {
		t.Fatalf("CloseIdle right after Get closed %v", closed)
	}
	// a carries an RPC (on the connection held, without a new Get); b
	// is not used for a whole period.
	if _, err := get(ctx, ca); err != nil {
		t.Fatal(err)
	}
	if closed := p.CloseIdle(); !slices.Equal(closed, []string{b.addr}) {
		t.Fatalf("CloseIdle closed %v, want only %s", closed, b.addr)
	}

	// A stream open on a keeps it through any number of periods.
	sctx, scancel := context.WithCancel(ctx)
	defer scancel()
	stream, err := shardkvpb.NewKVClient(ca).FetchShard(sctx, &shardkvpb.FetchShardRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if closed := p.CloseIdle(); len(closed) != 0 {
			t.Fatalf("CloseIdle closed %v under an open stream", closed)
		}
	}
	if ca.GetState() == connectivity.Shutdown {
		t.Fatal("the stream's connection was closed")
	}
	// Once the stream ends, a is idle: closed within two periods.
	scancel()
	deadline := time.Now().Add(5 * time.Second)
	for slices.Contains(p.Addrs(), a.addr) {
		if time.Now().After(deadline) {
			t.Fatal("a is still open long after its stream ended")
		}
		p.CloseIdle()
		time.Sleep(10 * time.Millisecond)
	}
	if ca.GetState() != connectivity.Shutdown {
		t.Fatalf("idle connection is %v, want Shutdown", ca.GetState())
	}
}

func sorted(s ...string) []string {
	slices.Sort(s)
	return s
}
