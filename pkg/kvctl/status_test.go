package kvctl

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// A group that reports itself stranded (it cannot step through configs the
// controller compacted) is shown as such, in the table and in JSON, and
// the cluster is not settled.
func TestStatusShowsStrandedGroup(t *testing.T) {
	var out bytes.Buffer
	k := &kvctl{stdout: &out, timeout: time.Second}
	why := "stranded at config 0: the controller keeps configs from 7 on only (1..6 were compacted), and this group owns shards [0 1] in config 7 but holds none of them"
	conf := &shardkvpb.Config{Num: 7, Shards: []uint64{1, 1, 2, 2}, Groups: []*shardkvpb.Group{{Gid: 1}, {Gid: 2}}}
	st := &shardkvpb.ClusterStatus{Latest: conf, OldestConfig: 7, Nshards: 4, Groups: []*shardkvpb.GroupStatus{
		{Report: &shardkvpb.GroupReport{Gid: 1, ConfigNum: 0, Stranded: why}},
		{Report: &shardkvpb.GroupReport{Gid: 2, ConfigNum: 7, Shards: []*shardkvpb.ShardState{{Shard: 2, State: "Serving"}, {Shard: 3, State: "Serving"}}}},
	}}
	s := k.buildStatus(context.Background(), st)
	if s.Settled {
		t.Fatal("settled with a stranded group")
	}
	if s.Groups[0].Stranded != why || s.Groups[1].Stranded != "" {
		t.Fatalf("stranded fields: %q, %q", s.Groups[0].Stranded, s.Groups[1].Stranded)
	}
	if err := k.printStatus(s); err != nil {
		t.Fatal(err)
	}
	t.Logf("status:\n%s", out.String())
	for _, want := range []string{"0 (STRANDED)", "GROUP 1 CANNOT STEP, serves none of its shards: " + why} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("status lacks %q:\n%s", want, out.String())
		}
	}
}
