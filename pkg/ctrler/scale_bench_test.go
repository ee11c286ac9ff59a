package ctrler_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/shardkv/shardkv/pkg/ctrler/ctrlerclient"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"google.golang.org/protobuf/proto"
)

// BenchmarkControllerLoad measures what the controller leader serves for
// each data group, as a function of the number of groups G (3 controller
// replicas over loopback gRPC, 4,096 shards, every group of 3 replicas
// having reported once): a group leader's Report, a replica's readiness
// poll (QueryStale) and a Redis-serving replica's leader poll
// (StatusStale, whose answer holds every group's report). Its numbers feed
// the model in docs/scaling.md; the client's CPU is in them too.
func BenchmarkControllerLoad(b *testing.B) {
	for _, groups := range []int{64, 256, 1000} {
		b.Run(fmt.Sprintf("groups=%d", groups), func(b *testing.B) {
			cc := newCtrlCluster(b, 3, 4096, "balanced", nil)
			c, err := ctrlerclient.New(cc.addrs())
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			var gs []*shardkvpb.Group
			for gid := 1; gid <= groups; gid++ {
				gs = append(gs, group(uint64(gid), fmt.Sprintf("g%d-1.shardkv:7000", gid), fmt.Sprintf("g%d-2.shardkv:7000", gid), fmt.Sprintf("g%d-3.shardkv:7000", gid)))
			}
			conf, err := c.Join(ctx, gs...)
			if err != nil {
				b.Fatal(err)
			}
			reports := make([]*shardkvpb.GroupReport, groups)
			for i := range reports {
				reports[i] = benchReport(uint64(i+1), conf)
				if _, err := c.Report(ctx, reports[i]); err != nil {
					b.Fatal(err)
				}
			}
			st, err := c.StatusStale(ctx)
			if err != nil {
				b.Fatal(err)
			}
			q, err := c.QueryStale(ctx, -1)
			if err != nil {
				b.Fatal(err)
			}

			b.Run("Report", func(b *testing.B) {
				for i := 0; b.Loop(); i++ {
					if _, err := c.Report(ctx, reports[i%groups]); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(len(marshal(b, reports[0]))), "B/request")
			})
			b.Run("QueryStale", func(b *testing.B) {
				for b.Loop() {
					if _, err := c.QueryStale(ctx, -1); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(len(marshal(b, q))), "B/reply")
			})
			b.Run("StatusStale", func(b *testing.B) {
				for b.Loop() {
					if _, err := c.StatusStale(ctx); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(len(marshal(b, st))), "B/reply")
			})
		})
	}
}

// benchReport is a group leader's report as shardkv sends it when all is
// quiet: its shards serving, three members, the leader's addresses.
func benchReport(gid uint64, c *shardkvpb.Config) *shardkvpb.GroupReport {
	r := &shardkvpb.GroupReport{Gid: gid, LeaderId: 1, LeaderAddr: fmt.Sprintf("g%d-1.shardkv:7000", gid),
		LeaderRespAddr: fmt.Sprintf("g%d-1.shardkv:6379", gid), Term: 7, ConfigNum: c.Num, AppliedIndex: 123456}
	for s, owner := range c.Shards {
		if owner == gid {
			r.Shards = append(r.Shards, &shardkvpb.ShardState{Shard: uint32(s), State: "Serving", ConfigNum: c.Num})
		}
	}
	for id := uint64(1); id <= 3; id++ {
		heard := uint64(40)
		r.Members = append(r.Members, &shardkvpb.Member{Id: id, Addr: fmt.Sprintf("g%d-%d.shardkv:7000", gid, id), Match: 123456, HeardMsAgo: &heard})
	}
	return r
}

func marshal(b *testing.B, m proto.Message) []byte {
	out, err := proto.Marshal(m)
	if err != nil {
		b.Fatal(err)
	}
	return out
}
