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

// TestClientCollections: the Go client's hash, set, list and sorted-set
// operations against a real group over gRPC, and WRONGTYPE across types.
func TestClientCollections(t *testing.T) {
	w := kvtest.New(t, kvtest.Options{Shards: 4})
	w.StartGroup(100)
	w.Join(100)
	w.WaitSettled(20 * time.Second)
	c := w.Client()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	check := func(what string, ok bool, got ...any) {
		t.Helper()
		if !ok {
			t.Fatalf("%s: got %v", what, got)
		}
	}
	n, err := c.HSet(ctx, "h", "a", "1", "b", "2")
	check("HSet", err == nil && n == 2, n, err)
	v, found, err := c.HGet(ctx, "h", "b")
	check("HGet", err == nil && found && v == "2", v, found, err)
	all, err := c.HGetAll(ctx, "h")
	check("HGetAll", err == nil && len(all) == 2 && all["a"] == "1", all, err)
	page, next, err := c.HScan(ctx, "h", nil, 1)
	check("HScan page 1", err == nil && len(page) == 1 && page["a"] == "1" && next != nil, page, next, err)
	page, next, err = c.HScan(ctx, "h", next, 1)
	check("HScan page 2", err == nil && len(page) == 1 && page["b"] == "2" && next == nil, page, next, err)
	_, _, err = c.Get(ctx, "h")
	check("Get of a hash", errors.Is(err, client.ErrWrongType), err)
	_, err = c.SAdd(ctx, "h", "x")
	check("SAdd on a hash", errors.Is(err, client.ErrWrongType), err)

	n, err = c.SAdd(ctx, "s", "x", "y", "x")
	check("SAdd", err == nil && n == 2, n, err)
	ok, err := c.SIsMember(ctx, "s", "y")
	check("SIsMember", err == nil && ok, ok, err)
	ms, err := c.SMembers(ctx, "s")
	check("SMembers", err == nil && len(ms) == 2 && ms[0] == "x", ms, err)

	n, err = c.RPush(ctx, "l", "a", "b", "c")
	check("RPush", err == nil && n == 3, n, err)
	e, found, err := c.LPop(ctx, "l")
	check("LPop", err == nil && found && e == "a", e, found, err)
	l, err := c.LRange(ctx, "l", 0, -1)
	check("LRange", err == nil && len(l) == 2 && l[1] == "c", l, err)
	n, err = c.LLen(ctx, "l")
	check("LLen", err == nil && n == 2, n, err)

	n, err = c.ZAdd(ctx, "z", client.Z{Member: "a", Score: 2}, client.Z{Member: "b", Score: 1}, client.Z{Member: "c", Score: 3})
	check("ZAdd", err == nil && n == 3, n, err)
	f, err := c.ZIncrBy(ctx, "z", "b", 5)
	check("ZIncrBy", err == nil && f == 6, f, err)
	zs, err := c.ZRange(ctx, "z", 0, -1)
	check("ZRange", err == nil && len(zs) == 3 && zs[0].Member == "a" && zs[2].Member == "b", zs, err)
	zs, err = c.ZRangeByScore(ctx, "z", 2.5, 10, 0, 1)
	check("ZRangeByScore limit 1", err == nil && len(zs) == 1 && zs[0].Member == "c", zs, err)
	r, err := c.ZRank(ctx, "z", "c")
	check("ZRank", err == nil && r == 1, r, err)
	r, err = c.ZRank(ctx, "none", "c")
	check("ZRank of no set", err == nil && r == -1, r, err)
	sc, found, err := c.ZScore(ctx, "z", "a")
	check("ZScore", err == nil && found && sc == 2, sc, found, err)
	zs, err = c.ZPopMin(ctx, "z", 2)
	check("ZPopMin", err == nil && len(zs) == 2 && zs[0].Member == "a" && zs[1].Score == 3, zs, err)
	n, err = c.ZCard(ctx, "z")
	check("ZCard", err == nil && n == 1, n, err)
}

// TestMultiSourceStores: SSTORE and ZSTORE with several sources pass the
// checks before proposing (which required a value per extra key: every
// such store was refused).
func TestMultiSourceStores(t *testing.T) {
	w := kvtest.New(t, kvtest.Options{Shards: 4})
	w.StartGroup(100)
	w.Join(100)
	w.WaitSettled(20 * time.Second)
	c := w.Client()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.SAdd(ctx, "{m}a", "x", "y"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SAdd(ctx, "{m}b", "y"); err != nil {
		t.Fatal(err)
	}
	g := w.Group(100, w.Groups[100].Leader())
	outs, err := g.WriteBatch(ctx, []*shardkvpb.WriteOp{
		{Kind: shardkvpb.WriteOp_SSTORE, Key: []byte("{m}a"), MoreKeys: [][]byte{[]byte("{m}b")}, Dest: []byte("{m}s"), Delta: 0},
		{Kind: shardkvpb.WriteOp_ZSTORE, Key: []byte("{m}a"), MoreKeys: [][]byte{[]byte("{m}b")}, Dest: []byte("{m}z"), Delta: 1, Weights: []float64{1, 2}},
	})
	if err != nil || outs[0].Err != nil || outs[1].Err != nil {
		t.Fatalf("stores refused: %v %+v", err, outs)
	}
	if outs[0].Result.Num != 1 || outs[1].Result.Num != 2 {
		t.Fatalf("sinterstore %v, zunionstore %v", outs[0].Result, outs[1].Result)
	}
	if sc, _, err := c.ZScore(ctx, "{m}z", "y"); err != nil || sc != 3 {
		t.Fatalf("zunionstore weights 1 2: y scored %v (%v)", sc, err)
	}
}
