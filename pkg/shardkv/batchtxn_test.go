package shardkv_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/shardkv/shardkv/pkg/shardkv/kvtest"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestBatchOfMidSizeValuesRefused: with the entry limit raised for large
// values, one MultiWrite of six 900 KB values (5.4 MiB, each under badger's
// 1 MiB value threshold, so counted in full in the apply transaction) was
// accepted and then failed at apply with ErrTxnTooBig, stopping every
// replica. It is refused before proposing; the group keeps serving.
func TestBatchOfMidSizeValuesRefused(t *testing.T) {
	w := kvtest.New(t, kvtest.Options{Shards: 8})
	g := w.StartGroup(100)
	w.Join(100)
	w.WaitSettled(20 * time.Second)
	leader := g.WaitLeader(10 * time.Second)
	kv := ccKV(t, g.Nodes[leader].Addr)
	var ops []*shardkvpb.WriteOp
	for i := range 6 {
		ops = append(ops, &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_PUT, Key: []byte{'{', 't', '}', byte('a' + i)}, Value: []byte(strings.Repeat("x", 900<<10))})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := kv.MultiWrite(ctx, &shardkvpb.MultiWriteRequest{Ops: ops})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("MultiWrite of six 900 KB values: %v, want InvalidArgument (TOO_LARGE)", err)
	}
	time.Sleep(500 * time.Millisecond)
	for _, id := range g.IDs() {
		if err := g.Replica(id).Err(); err != nil {
			t.Fatalf("replica %d stopped: %v", id, err)
		}
	}
	c := w.Client()
	if err := c.Put(ctx, "still-serving", "yes"); err != nil {
		t.Fatalf("group stopped serving: %v", err)
	}
}
