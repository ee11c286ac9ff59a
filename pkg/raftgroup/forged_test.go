package raftgroup_test

import (
	"context"
	"testing"
	"time"

	"github.com/shardkv/shardkv/pkg/grpcdial"
	"github.com/shardkv/shardkv/pkg/raftgroup/rgtest"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// TestForgedHeartbeatPastLogEnd: one forged heartbeat, in the leader's name
// and term, whose commit is past the follower's log made etcd raft panic
// ("tocommit(...) is out of range"), which took down the whole process. The
// transport drops it; the group keeps committing.
func TestForgedHeartbeatPastLogEnd(t *testing.T) {
	c := rgtest.NewCluster(t, 3, rgtest.Options{})
	leader := c.WaitLeader(10 * time.Second)
	var follower uint64
	for _, id := range c.IDs() {
		if id != leader {
			follower = id
			break
		}
	}
	term := c.Replica(leader).Term()
	hb, err := proto.Marshal(&pb.Message{Type: pb.MsgHeartbeat.Enum(), From: proto.Uint64(leader), To: proto.Uint64(follower),
		Term: proto.Uint64(term), Commit: proto.Uint64(1 << 40)})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := grpc.NewClient(grpcdial.Target(c.Nodes[follower].Addr), grpcdial.Options()...)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st := c.Replica(follower).Status()
	stream, err := shardkvpb.NewRaftClient(cc).Send(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&shardkvpb.RaftBatch{GroupId: st.GroupID, From: leader, To: follower, Messages: [][]byte{hb}}); err != nil {
		t.Fatal(err)
	}
	stream.CloseAndRecv()
	time.Sleep(200 * time.Millisecond)
	if err := c.Replica(follower).Err(); err != nil {
		t.Fatalf("follower stopped: %v", err)
	}
	if _, err := c.Propose(ctx, rgtest.EncodePut("after", "forged")); err != nil {
		t.Fatalf("group does not commit after the forged heartbeat: %v", err)
	}
	if got := c.Replica(follower).Status().Commit; got > 1<<39 {
		t.Fatalf("follower's commit index is %d: the forged heartbeat was believed", got)
	}
}
