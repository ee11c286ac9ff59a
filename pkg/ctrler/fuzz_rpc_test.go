package ctrler_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardkv/shardkv/pkg/ctrler"
	"github.com/shardkv/shardkv/pkg/ctrler/ctrlerclient"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// FuzzControllerRPC sends every request type of the Controller service,
// decoded from fuzzed bytes (proto.Unmarshal of the payload into the
// method's request type), to a real 3-replica controller group over
// loopback gRPC, to a replica the fuzzer picks (leader or follower).
// Whatever the request, no replica stops, no answer is Internal (or
// Unknown other than an outcome-unknown), and the group keeps answering
// Query and Join (checked every fuzzRPCServeEvery inputs).
func FuzzControllerRPC(f *testing.F) {
	seeds := []struct {
		m   ctrlMethod
		req proto.Message
	}{
		{mJoin, &shardkvpb.JoinRequest{ClientId: 7, Seq: 1, Groups: []*shardkvpb.Group{group(1), group(2)}}},
		{mJoin, &shardkvpb.JoinRequest{Groups: []*shardkvpb.Group{{Gid: 3, Weight: 1 << 31, Servers: []*shardkvpb.Server{{Id: 1, Addr: "x:1"}}}}}},
		{mJoin, &shardkvpb.JoinRequest{Groups: []*shardkvpb.Group{{Gid: 0}, {Gid: 1 << 63, Servers: []*shardkvpb.Server{{Id: 1}, {Id: 1, Addr: "a"}}}}}},
		{mLeave, &shardkvpb.LeaveRequest{ClientId: 7, Seq: 2, Gids: []uint64{2}}},
		{mLeave, &shardkvpb.LeaveRequest{Gids: []uint64{0, 1, 1, 1 << 63}}},
		{mMove, &shardkvpb.MoveRequest{ClientId: 8, Seq: 1, Shard: 3, Gid: 1}},
		{mMove, &shardkvpb.MoveRequest{Shard: 1 << 31, Gid: 0}},
		{mMove, &shardkvpb.MoveRequest{ClientId: 8, Seq: 2, Shard: 5, Gid: 2, StopAndCopy: true}},
		{mUnpin, &shardkvpb.UnpinRequest{Shard: 3}},
		{mUnpin, &shardkvpb.UnpinRequest{Shard: 0xffffffff}},
		{mQuery, &shardkvpb.QueryRequest{Num: -1}},
		{mQuery, &shardkvpb.QueryRequest{Num: -1 << 63}},
		{mQuery, &shardkvpb.QueryRequest{Num: 1<<63 - 1}},
		{mWatch, &shardkvpb.WatchRequest{From: 0}},
		{mWatch, &shardkvpb.WatchRequest{From: 1 << 63}},
		{mReport, &shardkvpb.GroupReport{Gid: 1, LeaderId: 1, LeaderAddr: "g1-1:7000", ConfigNum: 1 << 62}},
		{mReport, &shardkvpb.GroupReport{Gid: 0}},
		{mReport, &shardkvpb.GroupReport{Gid: 99, Shards: []*shardkvpb.ShardState{{}}, Members: []*shardkvpb.Member{{}}}},
		// A target's report that its pre-copies caught up: the leader cuts over.
		{mReport, &shardkvpb.GroupReport{Gid: 2, Shards: []*shardkvpb.ShardState{
			{Shard: 3, State: ctrler.PreCopyState, ConfigNum: 1 << 62, PeerGid: 1, CaughtUp: true},
			{Shard: 12, State: ctrler.PreCopyState, ConfigNum: 3, PeerGid: 1, CaughtUp: true}}}},
		{mStatus, &shardkvpb.ClusterStatusRequest{}},
	}
	for _, s := range seeds {
		b, err := proto.Marshal(s.req)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(uint8(s.m), b)
	}
	f.Add(uint8(mJoin), []byte{0x1a, 0xff, 0xff, 0xff, 0xff, 0x0f}) // truncated length
	f.Add(uint8(mReport)|0x10, []byte{})

	cc := newCtrlCluster(f, 3, 16, "balanced", nil)
	var conns []shardkvpb.ControllerClient
	for _, addr := range cc.addrs() {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			f.Fatal(err)
		}
		f.Cleanup(func() { conn.Close() })
		conns = append(conns, shardkvpb.NewControllerClient(conn))
	}
	c, err := ctrlerclient.New(cc.addrs())
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { c.Close() })
	var execs atomic.Uint64

	f.Fuzz(func(t *testing.T, method uint8, payload []byte) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		m := ctrlMethod(method&0x0f) % ctrlMethods
		err := ctrlCall(ctx, conns[int(method>>4)%len(conns)], m, payload)
		if st, ok := status.FromError(err); ok && err != nil {
			bad := st.Code() == codes.Internal || (st.Code() == codes.Unknown && shardkvpb.Reason(err) != shardkvpb.ReasonOutcomeUnknown)
			if bad {
				t.Fatalf("method %d payload %x: %v", m, payload, err)
			}
		}
		for _, id := range cc.IDs() {
			if r := cc.Replica(id); r == nil || r.Err() != nil {
				t.Fatalf("replica %d stopped after method %d payload %x: %v", id, m, payload, r.Err())
			}
		}
		if n := execs.Add(1); n%fuzzRPCServeEvery == 0 {
			sctx, scancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer scancel()
			if _, err := c.Query(sctx, -1); err != nil {
				t.Fatalf("the group stopped answering Query: %v", err)
			}
			if _, err := c.Join(sctx, group(uint64(1_000_000+n))); err != nil && !ctrlerclient.IsRefused(err) {
				t.Fatalf("the group stopped answering Join: %v", err)
			}
		}
	})
}

const fuzzRPCServeEvery = 100

type ctrlMethod uint8

const (
	mJoin ctrlMethod = iota
	mLeave
	mMove
	mUnpin
	mQuery
	mWatch
	mReport
	mStatus
	ctrlMethods
)

// ctrlCall decodes payload as method m's request and calls it, returning
// the call's error (nil if the payload does not decode).
func ctrlCall(ctx context.Context, c shardkvpb.ControllerClient, m ctrlMethod, payload []byte) error {
	decode := func(req proto.Message) bool { return proto.Unmarshal(payload, req) == nil }
	var err error
	switch m {
	case mJoin:
		if req := new(shardkvpb.JoinRequest); decode(req) {
			_, err = c.Join(ctx, req)
		}
	case mLeave:
		if req := new(shardkvpb.LeaveRequest); decode(req) {
			_, err = c.Leave(ctx, req)
		}
	case mMove:
		if req := new(shardkvpb.MoveRequest); decode(req) {
			_, err = c.Move(ctx, req)
		}
	case mUnpin:
		if req := new(shardkvpb.UnpinRequest); decode(req) {
			_, err = c.Unpin(ctx, req)
		}
	case mQuery:
		if req := new(shardkvpb.QueryRequest); decode(req) {
			_, err = c.Query(ctx, req)
		}
	case mWatch:
		if req := new(shardkvpb.WatchRequest); decode(req) {
			wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			defer cancel()
			stream, serr := c.Watch(wctx, req)
			for serr == nil {
				_, serr = stream.Recv()
			}
			if wctx.Err() == nil && ctx.Err() == nil {
				err = serr
			}
		}
	case mReport:
		if req := new(shardkvpb.GroupReport); decode(req) {
			_, err = c.Report(ctx, req)
		}
	case mStatus:
		if req := new(shardkvpb.ClusterStatusRequest); decode(req) {
			_, err = c.Status(ctx, req)
		}
	default:
		panic(fmt.Sprint("method ", m))
	}
	return err
}
