package shardkv_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardkv/shardkv/pkg/grpcdial"
	"github.com/shardkv/shardkv/pkg/shardkv/kvtest"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// FuzzGroupRPC sends every request type of the data-group KV service,
// decoded from fuzzed bytes (proto.Unmarshal of the payload into the
// method's request type), to a real group over loopback gRPC. Whatever the
// request, no replica stops, and the group keeps serving (checked every
// fuzzRPCServeEvery inputs with a write and a read).
//
// Not fuzzed here, and why: the Raft transport (Raft.Send, Raft.Snapshot)
// and the Admin membership calls trust their caller by design until the
// TLS work authenticates peers (see docs/shardkv.md, "What the internal
// APIs trust"): a forged Raft message from a claimed member is
// indistinguishable from a real one.
func FuzzGroupRPC(f *testing.F) {
	seeds := []struct {
		m   fuzzMethod
		req proto.Message
	}{
		{fuzzGet, &shardkvpb.GetRequest{Key: []byte("k")}},
		{fuzzMultiGet, &shardkvpb.MultiGetRequest{Keys: [][]byte{[]byte("a"), []byte("b{x}")}}},
		{fuzzWrite, &shardkvpb.WriteRequest{Op: &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_PUT, Key: []byte("k"), Value: []byte("v")}}},
		{fuzzWrite, &shardkvpb.WriteRequest{Op: &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_APPEND, Key: []byte("k"), Value: []byte("v"), Session: &shardkvpb.Session{ClientId: 7, Seq: 1}}}},
		{fuzzWrite, &shardkvpb.WriteRequest{Op: &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_CAS, Key: []byte("k"), Expect: []byte("v"), Value: []byte("w"), ReturnPrev: true}}},
		{fuzzWrite, &shardkvpb.WriteRequest{Op: &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_INCR, Key: []byte("n"), Delta: 1 << 62}}},
		{fuzzWrite, &shardkvpb.WriteRequest{Op: &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_EXPIRE, Key: []byte("k"), ExpireAtMs: 1, Cond: shardkvpb.WriteOp_IF_GREATER}}},
		{fuzzWrite, &shardkvpb.WriteRequest{Op: &shardkvpb.WriteOp{Kind: 99, Key: []byte("k")}}},
		{fuzzMultiWrite, &shardkvpb.MultiWriteRequest{Ops: []*shardkvpb.WriteOp{
			{Kind: shardkvpb.WriteOp_PUT, Key: []byte("{t}a"), Value: []byte("1")},
			{Kind: shardkvpb.WriteOp_DELETE, Key: []byte("{t}b")},
			{Kind: shardkvpb.WriteOp_INCR_FLOAT, Key: []byte("{t}c"), Value: []byte("1.5")}}}},
		{fuzzFetchShard, &shardkvpb.FetchShardRequest{Shard: 1, ConfigNum: 2, Gid: 101}},
		{fuzzFetchShard, &shardkvpb.FetchShardRequest{Shard: 1 << 31, ConfigNum: 1 << 60, Resume: true, AfterKey: []byte("d\x00\x01k")}},
		{fuzzFetchShard, &shardkvpb.FetchShardRequest{Shard: 1, ConfigNum: 2, Gid: 101, Precopy: true}},
		{fuzzFetchShard, &shardkvpb.FetchShardRequest{Shard: 1, ConfigNum: 2, Gid: 101, Precopy: true, Delta: true, Cursor: []byte("d\x00\x01w\x00\x00\x00\x00\x00\x00\x05")}},
		{fuzzFetchShard, &shardkvpb.FetchShardRequest{Shard: 1, ConfigNum: 9, Gid: 101, Delta: true, Cursor: []byte("garbage")}},
		{fuzzShardInstalled, &shardkvpb.ShardInstalledRequest{Shard: 1, ConfigNum: 2, Gid: 101}},
		{fuzzShardInstalled, &shardkvpb.ShardInstalledRequest{Shard: 70000, ConfigNum: 0, Gid: 0}},
		{fuzzGroupInfo, &shardkvpb.GroupInfoRequest{}},
	}
	for _, s := range seeds {
		b, err := proto.Marshal(s.req)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(uint8(s.m), b)
	}
	f.Add(uint8(fuzzWrite), []byte{0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f}) // truncated length
	f.Add(uint8(fuzzMultiGet), []byte{})

	w := kvtest.New(f, kvtest.Options{Shards: 8})
	w.StartGroup(100)
	w.StartGroup(101)
	w.Join(100, 101)
	w.WaitSettled(30 * time.Second)
	c := w.Client()
	var conns []*grpc.ClientConn
	for _, gid := range []uint64{100, 101} {
		for _, id := range w.Groups[gid].IDs() {
			cc, err := grpc.NewClient(grpcdial.Target(w.Groups[gid].Nodes[id].Addr), grpcdial.Options()...)
			if err != nil {
				f.Fatal(err)
			}
			f.Cleanup(func() { cc.Close() })
			conns = append(conns, cc)
		}
	}
	var execs atomic.Uint64

	f.Fuzz(func(t *testing.T, method uint8, payload []byte) {
		kv := shardkvpb.NewKVClient(conns[int(method>>4)%len(conns)])
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		fuzzCall(ctx, kv, fuzzMethod(method&0x0f)%fuzzMethods, payload)
		for _, gid := range []uint64{100, 101} {
			for _, id := range w.Groups[gid].IDs() {
				if err := w.Groups[gid].Replica(id).Err(); err != nil {
					t.Fatalf("g%d/%d stopped after method %d payload %x: %v", gid, id, method, payload, err)
				}
			}
		}
		if n := execs.Add(1); n%fuzzRPCServeEvery == 0 {
			k := fmt.Sprintf("fuzz-alive-%d", n)
			sctx, scancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer scancel()
			if err := c.Put(sctx, k, "ok"); err != nil {
				t.Fatalf("group stopped serving writes: %v", err)
			}
			if v, ok, err := c.Get(sctx, k); err != nil || !ok || v != "ok" {
				t.Fatalf("group stopped serving reads: %q %v %v", v, ok, err)
			}
		}
	})
}

const fuzzRPCServeEvery = 200

type fuzzMethod uint8

const (
	fuzzGet fuzzMethod = iota
	fuzzMultiGet
	fuzzWrite
	fuzzMultiWrite
	fuzzFetchShard
	fuzzShardInstalled
	fuzzGroupInfo
	fuzzMethods
)

// fuzzCall decodes payload as method m's request and calls it. Errors are
// answers, not failures: only a stopped replica or group fails the target.
func fuzzCall(ctx context.Context, kv shardkvpb.KVClient, m fuzzMethod, payload []byte) {
	decode := func(req proto.Message) bool { return proto.Unmarshal(payload, req) == nil }
	switch m {
	case fuzzGet:
		if req := new(shardkvpb.GetRequest); decode(req) {
			kv.Get(ctx, req)
		}
	case fuzzMultiGet:
		if req := new(shardkvpb.MultiGetRequest); decode(req) {
			kv.MultiGet(ctx, req)
		}
	case fuzzWrite:
		if req := new(shardkvpb.WriteRequest); decode(req) {
			kv.Write(ctx, req)
		}
	case fuzzMultiWrite:
		if req := new(shardkvpb.MultiWriteRequest); decode(req) {
			kv.MultiWrite(ctx, req)
		}
	case fuzzFetchShard:
		if req := new(shardkvpb.FetchShardRequest); decode(req) {
			if stream, err := kv.FetchShard(ctx, req); err == nil {
				for {
					if _, err := stream.Recv(); err != nil {
						break
					}
				}
			}
		}
	case fuzzShardInstalled:
		if req := new(shardkvpb.ShardInstalledRequest); decode(req) {
			kv.ShardInstalled(ctx, req)
		}
	case fuzzGroupInfo:
		if req := new(shardkvpb.GroupInfoRequest); decode(req) {
			kv.GroupInfo(ctx, req)
		}
	}
}
