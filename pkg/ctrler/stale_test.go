package ctrler_test

import (
	"testing"
	"time"

	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Pollers (every data replica, each second) read with Stale: the leader
// answers without a ReadIndex round, a follower refuses and names the
// leader, and a plain read still takes the round.
func TestStaleReadsSkipTheReadBarrier(t *testing.T) {
	cc := newCtrlCluster(t, 3, 16, "", nil)
	leader := cc.WaitLeader(10 * time.Second)
	cl := cc.client(t)
	c := ctx(t, 30*time.Second)
	if _, err := cl.Join(c, group(1)); err != nil {
		t.Fatal(err)
	}
	m := cc.Replica(leader).Metrics()
	reads := func() uint64 { return m.ReadIndexReads.Load() }

	before := reads()
	for range 20 {
		conf, err := cl.QueryStale(c, -1)
		if err != nil {
			t.Fatal(err)
		}
		if conf.GetNum() < 1 {
			t.Fatalf("stale query returned config %d after a completed join", conf.GetNum())
		}
		if _, err := cl.StatusStale(c); err != nil {
			t.Fatal(err)
		}
	}
	if n := reads() - before; n != 0 {
		t.Fatalf("40 stale reads made %d ReadIndex reads on the leader", n)
	}
	if _, err := cl.Query(c, -1); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Status(c); err != nil {
		t.Fatal(err)
	}
	if n := reads() - before; n != 2 {
		t.Fatalf("2 linearizable reads made %d ReadIndex reads on the leader", n)
	}

	var follower uint64
	for _, id := range cc.IDs() {
		if id != leader {
			follower = id
			break
		}
	}
	conn, err := grpc.NewClient(cc.Nodes[follower].Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, err = shardkvpb.NewControllerClient(conn).Query(c, &shardkvpb.QueryRequest{Num: -1, Stale: true})
	if err == nil {
		t.Fatalf("follower %d answered a stale query", follower)
	}
}
