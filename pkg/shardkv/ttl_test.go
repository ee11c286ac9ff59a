package shardkv_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/shardkv/shardkv/pkg/routing"
	"github.com/shardkv/shardkv/pkg/shardkv"
	"github.com/shardkv/shardkv/pkg/shardkv/kvtest"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// leaderGroup returns the service of gid's current leader.
func leaderGroup(t *testing.T, w *kvtest.World, gid uint64) *shardkv.Group {
	t.Helper()
	id := w.Groups[gid].WaitLeader(10 * time.Second)
	g := w.Group(gid, id)
	if g == nil {
		t.Fatalf("group %d leader %d is down", gid, id)
	}
	return g
}

// owner is the group serving key in the latest config.
func owner(t *testing.T, w *kvtest.World, key string) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conf, err := w.Admin().Query(ctx, -1)
	if err != nil {
		t.Fatal(err)
	}
	return routing.GroupOf([]byte(key), conf.Shards)
}

// batchWrite runs op on the key's owner, retrying refusals (never executed).
func batchWrite(t *testing.T, w *kvtest.World, op *shardkvpb.WriteOp) *shardkvpb.WriteResult {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		g := leaderGroup(t, w, owner(t, w, string(op.Key)))
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		out, err := g.WriteBatch(ctx, []*shardkvpb.WriteOp{op})
		cancel()
		var ref *shardkvpb.Refusal
		if err == nil && out[0].Err == nil {
			return out[0].Result
		}
		if err == nil {
			err = out[0].Err
		}
		if !errors.As(err, &ref) || time.Now().After(deadline) {
			t.Fatalf("write %s: %v", op.Key, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func readKey(t *testing.T, w *kvtest.World, key string) shardkv.ValueEntry {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		g := leaderGroup(t, w, owner(t, w, key))
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		out, err := g.ReadKeys(ctx, [][]byte{[]byte(key)}, false, nil)
		cancel()
		if err == nil {
			return out[0]
		}
		var ref *shardkvpb.Refusal
		if !errors.As(err, &ref) || time.Now().After(deadline) {
			t.Fatalf("read %s: %v", key, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestTTLSurvivesMigrationAndRestart: expiry times are absolute and stored
// with the value, so they move with their shard, survive a restart, and the
// new owner deletes expired keys itself; the old owner's garbage collection
// removes its copies with their expiry index entries.
func TestTTLSurvivesMigrationAndRestart(t *testing.T) {
	w := kvtest.New(t, kvtest.Options{Shards: 16})
	w.StartGroup(100)
	w.StartGroup(101)
	w.Join(100)
	w.WaitSettled(20 * time.Second)
	now := time.Now().UnixMilli()
	shortAt, longAt := now+4000, now+600_000
	const n = 40
	for i := range n {
		batchWrite(t, w, &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_PUT, Key: []byte(fmt.Sprintf("short-%d", i)), Value: []byte("s"), ExpireAtMs: shortAt})
		batchWrite(t, w, &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_PUT, Key: []byte(fmt.Sprintf("long-%d", i)), Value: []byte("l"), ExpireAtMs: longAt})
	}
	w.Join(101)
	w.WaitSettled(30 * time.Second)
	w.StopGroup(101)
	w.RestartGroup(101)
	moved := 0
	for i := range n {
		k := fmt.Sprintf("long-%d", i)
		if owner(t, w, k) == 101 {
			moved++
		}
		if e := readKey(t, w, k); !e.Found || e.ExpireAtMs != longAt {
			t.Fatalf("%s after migration and restart: %+v, want expiry %d", k, e, longAt)
		}
	}
	if moved == 0 || moved == n {
		t.Fatalf("%d of %d keys moved; the test needs some on each side", moved, n)
	}
	// Reads judge expiry by the log clock, which passes an expiry within
	// the expiry loop's period and a commit (docs/time.md).
	time.Sleep(time.Until(time.UnixMilli(shortAt)) + 100*time.Millisecond)
	for i := range n {
		for e := readKey(t, w, fmt.Sprintf("short-%d", i)); e.Found; e = readKey(t, w, fmt.Sprintf("short-%d", i)) {
			if late := time.Since(time.UnixMilli(shortAt)); late > time.Second {
				t.Fatalf("short-%d visible %v after its expiry", i, late)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	// Active expiry deletes them on both owners; GC removed the old copies.
	deadline := time.Now().Add(20 * time.Second)
	for {
		total, expires := 0, 0
		for _, gid := range []uint64{100, 101} {
			kc, err := leaderGroup(t, w, gid).KeyCounts()
			if err != nil {
				t.Fatal(err)
			}
			total += kc.Total
			expires += kc.Expires
		}
		if total == n && expires == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("keys held: %d (%d with expiry), want %d long-lived keys only", total, expires, n)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
