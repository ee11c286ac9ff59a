package shardkv_test

import (
	"context"
	"testing"
	"time"

	"github.com/shardkv/shardkv/pkg/grpcdial"
	"github.com/shardkv/shardkv/pkg/routing"
	"github.com/shardkv/shardkv/pkg/shardkv"
	"github.com/shardkv/shardkv/pkg/shardkv/kvtest"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Issue 14, case 5: the migration RPCs trusted their caller, so one forged
// ShardInstalled deleted a frozen shard before its new owner had pulled it.

// ccWaitFrozen waits until every replica of gid holds shard s frozen
// (BePulling) for config num, and returns the meta.
func ccWaitFrozen(t *testing.T, w *kvtest.World, gid uint64, s int, num uint64) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		frozen := true
		for _, id := range w.Groups[gid].IDs() {
			sm := w.SM(gid, id)
			if sm == nil {
				continue
			}
			if m := sm.Shard(s); m.State != shardkv.BePulling || m.Config != num {
				frozen = false
			}
		}
		if frozen {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("g%d never froze shard %d for config %d: %s", gid, s, num, w.Describe())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func ccKV(t *testing.T, addr string) shardkvpb.KVClient {
	t.Helper()
	cc, err := grpc.NewClient(grpcdial.Target(addr), grpcdial.Options()...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return shardkvpb.NewKVClient(cc)
}

// TestForgedShardInstalledRefused freezes a shard on its old owner while the
// new owner is down, then sends the old owner's every replica forged
// ShardInstalled calls: one naming a group that is not the new owner, one
// naming the new owner (which has not installed it). Both are refused, the
// frozen copy survives, and once the new owner is back it pulls the shard
// and the data is intact.
func TestForgedShardInstalledRefused(t *testing.T) {
	w := kvtest.New(t, kvtest.Options{Shards: 8})
	w.StartGroup(100)
	w.StartGroup(101)
	w.Join(100, 101)
	conf := w.WaitSettled(20 * time.Second)
	m := &scKV{t: t, c: w.Client(), want: map[string]string{}}
	const key = "frozen-key"
	m.put(key, "precious")
	s := routing.ShardOf([]byte(key), len(conf.Shards))
	from := conf.Shards[s]
	to := uint64(100)
	if from == 100 {
		to = 101
	}

	w.StopGroup(to)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Stop-and-copy: the hand-off happens at once (a pre-copy move would
	// wait, announced, for its target to copy the shard).
	moved, err := w.Admin().MoveStopAndCopy(ctx, s, to)
	if err != nil {
		t.Fatal(err)
	}
	ccWaitFrozen(t, w, from, s, moved.Num)

	for _, forged := range []struct {
		name string
		gid  uint64
		code codes.Code
	}{
		{"a group that is not the new owner", 999, codes.PermissionDenied},
		{"the new owner, which has not installed it", to, codes.FailedPrecondition},
	} {
		for _, id := range w.Groups[from].IDs() {
			kv := ccKV(t, w.Groups[from].Nodes[id].Addr)
			cctx, ccancel := context.WithTimeout(context.Background(), 15*time.Second)
			_, err := kv.ShardInstalled(cctx, &shardkvpb.ShardInstalledRequest{Shard: uint32(s), ConfigNum: moved.Num, Gid: forged.gid})
			ccancel()
			if status.Code(err) != forged.code {
				t.Errorf("forged ShardInstalled from %s to g%d/%d: err %v, want code %v", forged.name, from, id, err, forged.code)
			}
		}
	}
	// A forged pull by a non-owner is refused too.
	for _, id := range w.Groups[from].IDs() {
		kv := ccKV(t, w.Groups[from].Nodes[id].Addr)
		cctx, ccancel := context.WithTimeout(context.Background(), 15*time.Second)
		stream, err := kv.FetchShard(cctx, &shardkvpb.FetchShardRequest{Shard: uint32(s), ConfigNum: moved.Num, Gid: 999})
		if err == nil {
			_, err = stream.Recv()
		}
		ccancel()
		if status.Code(err) != codes.PermissionDenied {
			t.Errorf("forged FetchShard from g999 to g%d/%d: err %v, want PermissionDenied", from, id, err)
		}
	}
	time.Sleep(500 * time.Millisecond) // a wrongly accepted GC would have started
	for _, id := range w.Groups[from].IDs() {
		sm := w.SM(from, id)
		if got := sm.Shard(s); got.State != shardkv.BePulling {
			t.Fatalf("g%d/%d: shard %d is %v after forged calls; the frozen copy must survive", from, id, s, got)
		}
		if n, err := sm.CountKeys(s); err != nil || n != 1 {
			t.Fatalf("g%d/%d: shard %d holds %d keys (err %v), want 1", from, id, s, n, err)
		}
	}

	w.RestartGroup(to)
	conf = w.WaitSettled(60 * time.Second)
	if conf.Shards[s] != to {
		t.Fatalf("shard %d owned by %d, want %d", s, conf.Shards[s], to)
	}
	m.checkAll("after the pull")
	scCheckReplicas(t, w, conf, m.want)
}
