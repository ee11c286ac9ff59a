package raftgroup_test

import (
	"context"
	"testing"
	"time"

	"github.com/shardkv/shardkv/pkg/raftgroup/rgtest"
)

// Leader-only loops (the clock keeper, the data group's and controller's
// duties) wait in AwaitLeading while following, with no timer: it must
// return as soon as the replica leads, and only then.
func TestAwaitLeadingFollowsTransfers(t *testing.T) {
	c := rgtest.NewCluster(t, 3, rgtest.Options{})
	defer c.Shutdown()
	leader := c.WaitLeader(10 * time.Second)
	stop := make(chan struct{})
	led := make(chan uint64, 3)
	for _, id := range c.IDs() {
		if id == leader {
			if !c.Replica(id).AwaitLeading(stop) {
				t.Fatalf("the leader %d waits to lead", id)
			}
			continue
		}
		go func() {
			if c.Replica(id).AwaitLeading(stop) {
				led <- id
			}
		}()
	}
	select {
	case id := <-led:
		t.Fatalf("follower %d returned from AwaitLeading while %d leads", id, leader)
	case <-time.After(300 * time.Millisecond):
	}

	var to uint64
	for _, id := range c.IDs() {
		if id != leader {
			to = id
			break
		}
	}
	changed := c.Replica(leader).RoleChanged()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Replica(leader).TransferLeadership(ctx, to); err != nil {
		t.Fatal(err)
	}
	select {
	case id := <-led:
		if id != to {
			t.Fatalf("replica %d returned from AwaitLeading; leadership went to %d", id, to)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("replica %d leads but still waits in AwaitLeading", to)
	}
	select {
	case <-changed:
	case <-time.After(5 * time.Second):
		t.Fatalf("the old leader %d stepped down without RoleChanged firing", leader)
	}
	close(stop)
}
