package shardkv_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/shardkv/shardkv/pkg/client"
	"github.com/shardkv/shardkv/pkg/routing"
	"github.com/shardkv/shardkv/pkg/shardkv/kvtest"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// TestClientStringOps: the Go client's string operations against real
// groups over gRPC (two groups, so that a cross-shard rename is refused
// by the group, not by the client).
func TestClientStringOps(t *testing.T) {
	w := kvtest.New(t, kvtest.Options{Shards: 16})
	w.StartGroup(100)
	w.StartGroup(101)
	w.Join(100, 101)
	w.WaitSettled(20 * time.Second)
	c := w.Client()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	get := func(k string) string {
		t.Helper()
		v, _, err := c.Get(ctx, k)
		must(err)
		return v
	}
	if n, err := c.Incr(ctx, "{u}n", 41); err != nil || n != 41 {
		t.Fatalf("Incr: %d %v", n, err)
	}
	must(c.Put(ctx, "{u}s", "abc"))
	var op *client.OpError
	if _, err := c.Incr(ctx, "{u}s", 1); !errors.As(err, &op) || op.Code != shardkvpb.OpErrNotInteger {
		t.Fatalf("Incr of text: %v", err)
	}
	if n, err := c.SetRange(ctx, "{u}s", 1, "XY"); err != nil || n != 3 || get("{u}s") != "aXY" {
		t.Fatalf("SetRange: %d %v %q", n, err, get("{u}s"))
	}
	if old, err := c.SetBit(ctx, "{u}b", 7, true); err != nil || old || get("{u}b") != "\x01" {
		t.Fatalf("SetBit: %v %v %q", old, err, get("{u}b"))
	}
	if ok, err := c.Rename(ctx, "{u}s", "{u}t", false); err != nil || !ok || get("{u}t") != "aXY" {
		t.Fatalf("Rename: %v %v", ok, err)
	}
	if _, err := c.Rename(ctx, "{u}s", "{u}t", false); !errors.As(err, &op) || op.Code != shardkvpb.OpErrNoSuchKey {
		t.Fatalf("Rename of a missing key: %v", err)
	}
	if ok, err := c.Copy(ctx, "{u}t", "{u}n", false); err != nil || ok || get("{u}n") != "41" {
		t.Fatalf("Copy onto an existing key: %v %v", ok, err)
	}
	if ok, err := c.PutIfNoneExist(ctx, map[string]string{"{u}x": "1", "{u}t": "2"}); err != nil || ok || get("{u}t") != "aXY" {
		t.Fatalf("PutIfNoneExist with one existing: %v %v", ok, err)
	}
	if ok, err := c.PutIfNoneExist(ctx, map[string]string{"{u}x": "1", "{u}y": "2"}); err != nil || !ok || get("{u}y") != "2" {
		t.Fatalf("PutIfNoneExist: %v %v", ok, err)
	}
	if ok, err := c.Expire(ctx, "{u}y", time.Hour); err != nil || !ok {
		t.Fatalf("Expire: %v %v", ok, err)
	}
	if ok, err := c.Persist(ctx, "{u}y"); err != nil || !ok {
		t.Fatalf("Persist: %v %v", ok, err)
	}
	// A destination in another shard: refused by the group.
	other := "o"
	for i := 0; routing.ShardOf([]byte(other), 16) == routing.ShardOf([]byte("{u}t"), 16); i++ {
		other = "o" + string(rune('a'+i))
	}
	if _, err := c.Rename(ctx, "{u}t", other, false); !errors.As(err, &op) || op.Code != shardkvpb.OpErrCrossShard || get("{u}t") != "aXY" {
		t.Fatalf("Rename across shards: %v", err)
	}
}
