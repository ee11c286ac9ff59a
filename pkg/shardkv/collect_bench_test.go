package shardkv

import (
	"fmt"
	"testing"
	"time"

	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// BenchmarkDelHugeHash: DEL of a hash of N fields, on the state machine
// (real badger, raftgroup's limits): the DEL entry's apply (one record and
// a dead-version mark, whatever N), then the CollectDead entries that
// delete the fields, reported as their count, total time and the slowest
// entry (what a write queued behind one of them waits, at most).
//
//	go test ./pkg/shardkv -run '^$' -bench DelHugeHash -benchtime 1x
func BenchmarkDelHugeHash(b *testing.B) {
	for _, n := range []int{100_000, 1_000_000} {
		b.Run(fmt.Sprintf("fields=%d", n), func(b *testing.B) {
			for range b.N {
				b.StopTimer()
				h := &smHarness{t: b, sm: openSM(b, 7), now: time.Unix(1_800_000_000, 0)}
				h.apply(&shardkvpb.GroupCommand{NextConfig: &shardkvpb.Config{Num: 1, Shards: []uint64{7, 7, 7, 7},
					Groups: []*shardkvpb.Group{{Gid: 7, Servers: []*shardkvpb.Server{{Id: 1, Addr: "a:1"}}}}}})
				const per = 5000
				for i := 0; i < n; i += per {
					op := &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_HSET, Key: []byte("big")}
					for j := i; j < min(i+per, n); j++ {
						op.Fields = append(op.Fields, fmt.Appendf(nil, "field-%08d", j))
						op.FieldValues = append(op.FieldValues, []byte("value-0123456789"))
					}
					if r := h.write(op); r.Result.Error != "" {
						b.Fatalf("hset: %v", r.Result)
					}
				}
				b.StartTimer()
				start := time.Now()
				if r := h.write(&shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_DELETE, Key: []byte("big")}); !r.Result.Ok {
					b.Fatalf("del: %v", r.Result)
				}
				del := time.Since(start)
				start = time.Now()
				var slowest time.Duration
				entries := 0
				for more := true; more; entries++ {
					t := time.Now()
					res := h.apply(&shardkvpb.GroupCommand{CollectDead: true})
					slowest = max(slowest, time.Since(t))
					more = bool(res.(moreWork))
				}
				collect := time.Since(start)
				b.ReportMetric(float64(del.Microseconds()), "del-µs")
				b.ReportMetric(float64(entries), "collect-entries")
				b.ReportMetric(collect.Seconds(), "collect-s")
				b.ReportMetric(float64(slowest.Milliseconds()), "slowest-entry-ms")
			}
		})
	}
}
