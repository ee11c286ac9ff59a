package grpcdial_test

import (
	"context"
	"net"
	"sync"
	"testing"

	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"google.golang.org/grpc"
)

// replica is a tiny KV server on loopback: Get answers with the replica's
// address, or with the error its answer func returns.
type replica struct {
	shardkvpb.UnimplementedKVServer
	addr string

	mu     sync.Mutex
	calls  int
	answer func(call int) error // nil: succeed
}

func startReplica(t *testing.T) *replica {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &replica{addr: ln.Addr().String()}
	srv := grpc.NewServer()
	shardkvpb.RegisterKVServer(srv, r)
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return r
}

// deadAddr is a loopback address nothing listens on.
func deadAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := ln.Addr().String()
	ln.Close()
	return a
}

func (r *replica) set(answer func(call int) error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.answer = answer
}

func (r *replica) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls
}

func (r *replica) Get(ctx context.Context, _ *shardkvpb.GetRequest) (*shardkvpb.GetReply, error) {
	r.mu.Lock()
	r.calls++
	n, answer := r.calls, r.answer
	r.mu.Unlock()
	if answer != nil {
		if err := answer(n); err != nil {
			return nil, err
		}
	}
	return &shardkvpb.GetReply{Value: []byte(r.addr), Found: true}, nil
}

// FetchShard sends one chunk and holds the stream open until the client
// ends it.
func (r *replica) FetchShard(_ *shardkvpb.FetchShardRequest, s grpc.ServerStreamingServer[shardkvpb.ShardChunk]) error {
	if err := s.Send(&shardkvpb.ShardChunk{}); err != nil {
		return err
	}
	<-s.Context().Done()
	return nil
}

// get calls Get on cc.
func get(ctx context.Context, cc grpc.ClientConnInterface) (string, error) {
	rep, err := shardkvpb.NewKVClient(cc).Get(ctx, &shardkvpb.GetRequest{Key: []byte("k")})
	if err != nil {
		return "", err
	}
	return string(rep.Value), nil
}
