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

// BenchmarkPopAfterPops: one ZPOPMIN, ZPOPMAX or SPOP on the state machine
// (real badger) after `popped` earlier pops of a 100,000-member collection,
// whose deleted records are still tombstones in badger. A pop should not
// cost more the more pops came before it.
//
//	go test ./pkg/shardkv -run '^$' -bench PopAfterPops
func BenchmarkPopAfterPops(b *testing.B) {
	const n = 100_000
	for _, kind := range []shardkvpb.WriteOp_Kind{shardkvpb.WriteOp_ZPOPMIN, shardkvpb.WriteOp_ZPOPMAX, shardkvpb.WriteOp_SPOP} {
		for _, popped := range []int{0, 50_000, 90_000} {
			b.Run(fmt.Sprintf("%v/popped=%d", kind, popped), func(b *testing.B) {
				h := &smHarness{t: b, sm: openSM(b, 7), now: time.Unix(1_800_000_000, 0)}
				h.apply(&shardkvpb.GroupCommand{NextConfig: &shardkvpb.Config{Num: 1, Shards: []uint64{7, 7, 7, 7},
					Groups: []*shardkvpb.Group{{Gid: 7, Servers: []*shardkvpb.Server{{Id: 1, Addr: "a:1"}}}}}})
				const per = 5000
				for i := 0; i < n; i += per {
					op := &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_ZADD, Key: []byte("c")}
					if kind == shardkvpb.WriteOp_SPOP {
						op.Kind = shardkvpb.WriteOp_SADD
					}
					for j := i; j < min(i+per, n); j++ {
						op.Fields = append(op.Fields, fmt.Appendf(nil, "element:%012d", j)) // as redis-benchmark names them
						if kind != shardkvpb.WriteOp_SPOP {
							op.FieldValues = append(op.FieldValues, ScoreValue(float64(j)))
						}
					}
					if r := h.write(op); r.Result.Error != "" {
						b.Fatalf("fill: %v", r.Result)
					}
				}
				for left := popped; left > 0; left -= 500 {
					if r := h.write(&shardkvpb.WriteOp{Kind: kind, Key: []byte("c"), Delta: int64(min(left, 500))}); r.Result.Error != "" {
						b.Fatalf("pop: %v", r.Result)
					}
				}
				b.ResetTimer()
				for i := range b.N {
					if i == n-popped {
						b.Fatal("the set ran out")
					}
					if r := h.write(&shardkvpb.WriteOp{Kind: kind, Key: []byte("c"), Delta: 1}); r.Result.Error != "" || r.Result.Num != 1 {
						b.Fatalf("pop: %v", r.Result)
					}
				}
			})
		}
	}
}

// BenchmarkSPopMany: one SPOP of count members from a set of 12,500 on
// the state machine (real badger), reported per member popped: it should
// not grow with count (the picked members' duplicate check was once
// quadratic, 10,000 members taking seconds under -race).
//
//	go test ./pkg/shardkv -run '^$' -bench SPopMany
func BenchmarkSPopMany(b *testing.B) {
	const n = 12_500
	for _, count := range []int{1_000, 10_000} {
		b.Run(fmt.Sprintf("count=%d", count), func(b *testing.B) {
			h := &smHarness{t: b, sm: openSM(b, 7), now: time.Unix(1_800_000_000, 0)}
			h.apply(&shardkvpb.GroupCommand{NextConfig: &shardkvpb.Config{Num: 1, Shards: []uint64{7, 7, 7, 7},
				Groups: []*shardkvpb.Group{{Gid: 7, Servers: []*shardkvpb.Server{{Id: 1, Addr: "a:1"}}}}}})
			var popping time.Duration
			for i := range b.N {
				b.StopTimer()
				key := fmt.Appendf(nil, "s%d", i)
				const per = 5000
				for j := 0; j < n; j += per {
					op := &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_SADD, Key: key}
					for k := j; k < min(j+per, n); k++ {
						op.Fields = append(op.Fields, fmt.Appendf(nil, "m%d", k))
					}
					if r := h.write(op); r.Result.Error != "" {
						b.Fatalf("fill: %v", r.Result)
					}
				}
				b.StartTimer()
				start := time.Now()
				if r := h.write(&shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_SPOP, Key: key, Delta: int64(count)}); r.Result.Error != "" || r.Result.Num != int64(count) {
					b.Fatalf("spop %d: %v", count, r.Result)
				}
				popping += time.Since(start)
			}
			b.ReportMetric(float64(popping.Nanoseconds())/float64(b.N*count), "ns/member")
		})
	}
}
