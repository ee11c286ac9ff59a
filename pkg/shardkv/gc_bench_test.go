package shardkv

import (
	"fmt"
	"testing"
	"time"

	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// BenchmarkShardGC deletes a handed-off shard of N keys the way its old
// owner does (DeleteChunk entries until it is gone) and reports the time
// per key and of the last chunk against the first. Each chunk resumes
// after the previous one: a chunk that started from the shard's beginning
// stepped over the delete marker of every key deleted so far, so deleting
// a shard took time quadratic in its keys (1,000,000 keys: over 10 minutes
// on the source of a live move).
func BenchmarkShardGC(b *testing.B) {
	for _, n := range []int{20_000, 80_000} {
		b.Run(fmt.Sprintf("keys=%d", n), func(b *testing.B) {
			for range b.N {
				b.StopTimer()
				first, last, total := gcShard(b, n)
				b.StartTimer()
				b.ReportMetric(float64(total.Nanoseconds())/float64(n), "ns/key")
				b.ReportMetric(float64(last)/float64(first), "last/first-chunk")
			}
		})
	}
}

func gcShard(b *testing.B, n int) (first, last, total time.Duration) {
	h := &smHarness{t: b, sm: openSM(b, 7), now: time.Unix(1_800_000_000, 0)}
	groups := []*shardkvpb.Group{{Gid: 7, Servers: []*shardkvpb.Server{{Id: 1, Addr: "a:1"}}}, {Gid: 8, Servers: []*shardkvpb.Server{{Id: 1, Addr: "b:1"}}}}
	const s = 1
	h.apply(&shardkvpb.GroupCommand{NextConfig: &shardkvpb.Config{Num: 1, Shards: []uint64{7, 7, 8, 7}, Groups: groups}})
	var ops []*shardkvpb.WriteOp
	for i := range n {
		for j := 0; ; j++ {
			if k := fmt.Appendf(nil, "k%d-%d", i, j); shardOfKey(h.sm, k) == s {
				ops = append(ops, &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_PUT, Key: k, Value: make([]byte, 100)})
				break
			}
		}
		if len(ops) == 1000 || i == n-1 {
			h.apply(&shardkvpb.GroupCommand{Writes: ops})
			ops = nil
		}
	}
	h.apply(&shardkvpb.GroupCommand{NextConfig: &shardkvpb.Config{Num: 2, Shards: []uint64{7, 8, 8, 7}, Groups: groups}})
	h.apply(&shardkvpb.GroupCommand{Gc: &shardkvpb.ShardRef{Shard: s, ConfigNum: 2}})
	start := time.Now()
	for chunks := 0; h.sm.Shard(s).State == GCing; chunks++ {
		t := time.Now()
		h.apply(&shardkvpb.GroupCommand{DeleteChunk: &shardkvpb.ShardRef{Shard: s, ConfigNum: 2}})
		if d := time.Since(t); chunks == 0 {
			first = d
		} else if h.sm.Shard(s).State == GCing {
			last = d // the last full chunk
		}
	}
	return first, last, time.Since(start)
}
