package raftgroup_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/shardkv/shardkv/pkg/raftgroup/rgtest"
)

func TestSmokeProposeAndRead(t *testing.T) {
	c := rgtest.NewCluster(t, 3, rgtest.Options{})
	l := c.WaitLeader(5 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range 20 {
		if _, err := c.Propose(ctx, rgtest.EncodeAppend("k", fmt.Sprint(i%10))); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range c.IDs() {
		if err := c.Replica(id).ReadIndex(ctx); err != nil {
			t.Fatalf("read index on %d: %v", id, err)
		}
		v, _ := c.KV(id).Get("k")
		if v != "01234567890123456789" {
			t.Fatalf("replica %d: got %q", id, v)
		}
	}
	t.Logf("leader %d status %+v", l, c.Replica(l).Status())
}
