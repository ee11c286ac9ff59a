package controllers

import (
	"slices"
	"testing"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

func TestSummarize(t *testing.T) {
	name := func(gid uint64) string { return map[uint64]string{1: "a", 2: "b", 3: "c"}[gid] }
	st := &shardkvpb.ClusterStatus{
		Latest: &shardkvpb.Config{Num: 5, Shards: []uint64{0, 1, 1, 2, 2, 3, 3, 3}, Groups: []*shardkvpb.Group{smGroup(1), smGroup(2), smGroup(3)}},
		Groups: []*shardkvpb.GroupStatus{
			{Report: &shardkvpb.GroupReport{Gid: 1, ConfigNum: 5, Shards: []*shardkvpb.ShardState{
				{Shard: 1, State: "Serving"}, {Shard: 2, State: "Serving"}, {Shard: 5, State: "BePulling", PeerGid: 3}}}},
			{Report: &shardkvpb.GroupReport{Gid: 2, ConfigNum: 4, Shards: []*shardkvpb.ShardState{
				{Shard: 3, State: "Serving"}, {Shard: 7, State: "GCing", PeerGid: 3}}}},
			{Report: &shardkvpb.GroupReport{Gid: 3, ConfigNum: 5, Shards: []*shardkvpb.ShardState{
				{Shard: 5, State: "Pulling", PeerGid: 1, Keys: 5, TotalKeys: 10}, {Shard: 6, State: "Serving"}, {Shard: 7, State: "Serving"}}}},
		},
	}
	s := summarize(st, nil, name)
	wantTable := []shardkvv1.ShardRange{
		{First: 0, Last: 0, State: "Unassigned"},
		{First: 1, Last: 2, Group: "a", GroupID: 1, State: "Serving"},
		{First: 3, Last: 3, Group: "b", GroupID: 2, State: "Serving"},
		{First: 4, Last: 4, Group: "b", GroupID: 2, State: "Pending"}, // b has not reached config 5
		{First: 5, Last: 5, Group: "c", GroupID: 3, State: "Pulling"},
		{First: 6, Last: 7, Group: "c", GroupID: 3, State: "Serving"},
	}
	if !slices.Equal(s.table, wantTable) {
		t.Errorf("table\n got %+v\nwant %+v", s.table, wantTable)
	}
	wantMig := []shardkvv1.Migration{
		{Source: "a", Target: "c", Shards: 1, Keys: 5, TotalKeys: 10, Progress: "50%"},
		{Source: "b", Target: "c", Shards: 1},
	}
	if !slices.Equal(s.migrations, wantMig) || s.migrating != 2 {
		t.Errorf("migrations %+v (%d), want %+v", s.migrations, s.migrating, wantMig)
	}
	if s.notServing != 3 || !slices.Equal(s.behind, []uint64{2}) {
		t.Errorf("notServing %d behind %v", s.notServing, s.behind)
	}
	if s.states["Serving"] != 5 || s.states["Pending"] != 1 || s.states["Unassigned"] != 1 || s.states["Pulling"] != 1 {
		t.Errorf("states %v", s.states)
	}

	// With the previous config, the Pending shard 4 is a migration from
	// its old owner a to b, nothing copied yet.
	prev := &shardkvpb.Config{Num: 4, Shards: []uint64{0, 1, 1, 2, 1, 1, 3, 2}}
	s = summarize(st, prev, name)
	wantMig = []shardkvv1.Migration{
		{Source: "a", Target: "b", Shards: 1},
		{Source: "a", Target: "c", Shards: 1, Keys: 5, TotalKeys: 10, Progress: "50%"},
		{Source: "b", Target: "c", Shards: 1},
	}
	if !slices.Equal(s.migrations, wantMig) || s.migrating != 3 {
		t.Errorf("with prev: migrations %+v (%d), want %+v", s.migrations, s.migrating, wantMig)
	}

	// Alternating owners: the table is capped.
	big := &shardkvpb.ClusterStatus{Latest: &shardkvpb.Config{Num: 1, Shards: make([]uint64, 4096), Groups: []*shardkvpb.Group{smGroup(1), smGroup(2)}}}
	for i := range big.Latest.Shards {
		big.Latest.Shards[i] = uint64(i%2 + 1)
	}
	if s := summarize(big, nil, name); len(s.table) != maxTableRanges || !s.truncated {
		t.Errorf("table of %d runs (truncated %v), want %d", len(s.table), s.truncated, maxTableRanges)
	}
}
