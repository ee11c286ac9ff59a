package controllers

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
		{Source: "a", Target: "c", Shards: 1, Phase: "CuttingOver", Keys: 5, TotalKeys: 10, Progress: "50%"},
		{Source: "b", Target: "c", Shards: 1, Phase: "Finishing"},
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
		{Source: "a", Target: "b", Shards: 1, Phase: "CuttingOver"},
		{Source: "a", Target: "c", Shards: 1, Phase: "CuttingOver", Keys: 5, TotalKeys: 10, Progress: "50%"},
		{Source: "b", Target: "c", Shards: 1, Phase: "Finishing"},
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

func TestShardMapStatusFromController(t *testing.T) {
	ns := newNamespace(t)
	dp := newFakeDataPlane()
	fc := dp.Ctrler(ns, "demo")
	fc.SetShards(8)
	startManager(t, ns, setupShardMap(dp))

	mustCreate(t, testShardMap(ns, "demo", 8, 3))
	createGroup(t, ns, "a", "demo", 1)
	createGroup(t, ns, "b", "demo", 2)
	createGroup(t, ns, "other-cluster", "elsewhere", 7)
	markCtrlerReady(t, ns, "demo", 2)

	// A quorum runs but no group joined.
	waitSM(t, ns, "demo", "Ready=False NoGroups", func(sm *shardkvv1.ShardMap) error {
		if sm.Status.ControllerReadyReplicas != 2 {
			return fmt.Errorf("controllerReadyReplicas %d", sm.Status.ControllerReadyReplicas)
		}
		return condIs(sm, shardkvv1.ConditionReady, metav1.ConditionFalse, ReasonNoGroups, "no ReplicaGroup has joined")
	})

	// Groups 1 and 2 own 4 shards each; shards 6 and 7 are moving from
	// a to b (b pulls, a keeps the frozen copy).
	fc.SetConfig(&shardkvpb.Config{Shards: []uint64{1, 1, 1, 1, 2, 2, 2, 2}, Groups: []*shardkvpb.Group{smGroup(1), smGroup(2)}})
	num := fc.Latest().Num
	fc.SetReports(
		&shardkvpb.GroupReport{Gid: 1, ConfigNum: num, Shards: []*shardkvpb.ShardState{
			{Shard: 0, State: "Serving"}, {Shard: 1, State: "Serving"}, {Shard: 2, State: "Serving"}, {Shard: 3, State: "Serving"},
			{Shard: 6, State: "BePulling", PeerGid: 2}, {Shard: 7, State: "BePulling", PeerGid: 2},
		}},
		&shardkvpb.GroupReport{Gid: 2, ConfigNum: num, Shards: []*shardkvpb.ShardState{
			{Shard: 4, State: "Serving"}, {Shard: 5, State: "Serving"},
			{Shard: 6, State: "Pulling", PeerGid: 1, Keys: 30, TotalKeys: 100},
			{Shard: 7, State: "Pulling", PeerGid: 1, Keys: 20, TotalKeys: 100},
		}},
	)
	sm := waitSM(t, ns, "demo", "migration in status", func(sm *shardkvv1.ShardMap) error {
		if sm.Status.ConfigNum != int64(num) || sm.Status.MigratingShards != 2 {
			return fmt.Errorf("configNum %d migratingShards %d", sm.Status.ConfigNum, sm.Status.MigratingShards)
		}
		return nil
	})
	wantTable := []shardkvv1.ShardRange{
		{First: 0, Last: 3, Group: "a", GroupID: 1, State: "Serving"},
		{First: 4, Last: 5, Group: "b", GroupID: 2, State: "Serving"},
		{First: 6, Last: 7, Group: "b", GroupID: 2, State: "Pulling"},
	}
	if !slices.Equal(sm.Status.Table, wantTable) {
		t.Errorf("table\n got %+v\nwant %+v", sm.Status.Table, wantTable)
	}
	wantGroups := []shardkvv1.GroupRef{{Name: "a", GroupID: 1, Shards: 4}, {Name: "b", GroupID: 2, Shards: 4}}
	if !slices.Equal(sm.Status.Groups, wantGroups) || sm.Status.GroupCount != 2 {
		t.Errorf("groups %+v count %d", sm.Status.Groups, sm.Status.GroupCount)
	}
	if sm.Status.ShardStates["Serving"] != 6 || sm.Status.ShardStates["Pulling"] != 2 || len(sm.Status.ShardStates) != 2 {
		t.Errorf("shardStates %v", sm.Status.ShardStates)
	}
	wantMig := []shardkvv1.Migration{{Source: "a", Target: "b", Shards: 2, Phase: "CuttingOver", Keys: 50, TotalKeys: 200, Progress: "25%"}}
	if !slices.Equal(sm.Status.Migrations, wantMig) {
		t.Errorf("migrations %+v, want %+v", sm.Status.Migrations, wantMig)
	}
	for _, err := range []error{
		condIs(sm, shardkvv1.ConditionReady, metav1.ConditionFalse, ReasonShardsNotServing, "2 of 8 shards not serving"),
		condIs(sm, shardkvv1.ConditionBalanced, metav1.ConditionFalse, ReasonMigrationsInFlight, "2 shards migrating"),
		condIs(sm, shardkvv1.ConditionMigrating, metav1.ConditionTrue, ReasonShardsMoving, "a->b 2 shards 25%"),
	} {
		if err != nil {
			t.Error(err)
		}
	}

	// Reports change without a new config: the periodic resync picks up
	// the progress, then the end of the migration.
	fc.SetReports(
		&shardkvpb.GroupReport{Gid: 1, ConfigNum: num, Shards: []*shardkvpb.ShardState{
			{Shard: 0, State: "Serving"}, {Shard: 1, State: "Serving"}, {Shard: 2, State: "Serving"}, {Shard: 3, State: "Serving"},
			{Shard: 6, State: "GCing", PeerGid: 2}, {Shard: 7, State: "BePulling", PeerGid: 2},
		}},
		&shardkvpb.GroupReport{Gid: 2, ConfigNum: num, Shards: []*shardkvpb.ShardState{
			{Shard: 4, State: "Serving"}, {Shard: 5, State: "Serving"},
			{Shard: 6, State: "Acking", PeerGid: 1, Keys: 100},
			{Shard: 7, State: "Pulling", PeerGid: 1, Keys: 80, TotalKeys: 100},
		}},
	)
	waitSM(t, ns, "demo", "progress 90%", func(sm *shardkvv1.ShardMap) error {
		if len(sm.Status.Migrations) != 1 || sm.Status.Migrations[0].Progress != "90%" {
			return fmt.Errorf("migrations %+v", sm.Status.Migrations)
		}
		return nil
	})
	serving := func(gid, num uint64, shards ...uint32) *shardkvpb.GroupReport {
		r := &shardkvpb.GroupReport{Gid: gid, ConfigNum: num}
		for _, s := range shards {
			r.Shards = append(r.Shards, &shardkvpb.ShardState{Shard: s, State: "Serving"})
		}
		return r
	}
	fc.SetReports(serving(1, num, 0, 1, 2, 3), serving(2, num, 4, 5, 6, 7))
	sm = waitSM(t, ns, "demo", "Ready and Balanced", func(sm *shardkvv1.ShardMap) error {
		if err := condIs(sm, shardkvv1.ConditionReady, metav1.ConditionTrue, ReasonServing, "all 8 shards serving on 2 groups"); err != nil {
			return err
		}
		return condIs(sm, shardkvv1.ConditionBalanced, metav1.ConditionTrue, ReasonSettled, "")
	})
	if err := condIs(sm, shardkvv1.ConditionMigrating, metav1.ConditionFalse, ReasonNoMigrations, ""); err != nil {
		t.Error(err)
	}
	if len(sm.Status.Migrations) != 0 || sm.Status.MigratingShards != 0 || !slices.Equal(sm.Status.Table, []shardkvv1.ShardRange{
		{First: 0, Last: 3, Group: "a", GroupID: 1, State: "Serving"}, {First: 4, Last: 7, Group: "b", GroupID: 2, State: "Serving"}}) {
		t.Errorf("settled status: %+v", sm.Status)
	}

	// A group no ReplicaGroup claims is shown by gid; one that has not
	// applied the config keeps the cluster unbalanced, its new shards
	// Pending and moving from their previous owner; nextGroupID stays
	// above every gid in use.
	fc.SetConfig(&shardkvpb.Config{Shards: []uint64{1, 1, 1, 1, 2, 2, 9, 9}, Groups: []*shardkvpb.Group{smGroup(1), smGroup(2), smGroup(9)}})
	num2 := fc.Latest().Num
	fc.SetReports(serving(1, num2, 0, 1, 2, 3), serving(2, num2, 4, 5, 6, 7))
	sm = waitSM(t, ns, "demo", "unknown gid", func(sm *shardkvv1.ShardMap) error {
		if sm.Status.ConfigNum != int64(num2) {
			return fmt.Errorf("configNum %d", sm.Status.ConfigNum)
		}
		return nil
	})
	if last := sm.Status.Table[len(sm.Status.Table)-1]; last != (shardkvv1.ShardRange{First: 6, Last: 7, Group: "gid-9", GroupID: 9, State: "Pending"}) {
		t.Errorf("last range %+v", last)
	}
	if want := []shardkvv1.Migration{{Source: "b", Target: "gid-9", Shards: 2, Phase: "CuttingOver"}}; !slices.Equal(sm.Status.Migrations, want) {
		t.Errorf("migrations %+v, want %+v", sm.Status.Migrations, want)
	}
	if sm.Status.NextGroupID != 10 {
		t.Errorf("nextGroupID %d, want 10", sm.Status.NextGroupID)
	}
	for _, err := range []error{
		condIs(sm, shardkvv1.ConditionBalanced, metav1.ConditionFalse, ReasonMigrationsInFlight, "gid-9 have not applied"),
		condIs(sm, shardkvv1.ConditionReady, metav1.ConditionFalse, ReasonShardsNotServing, "Pending=2"),
	} {
		if err != nil {
			t.Error(err)
		}
	}

	// The controller stops answering: the last known table stays, the
	// conditions say why.
	fc.FailWith("Status", errors.New("connection refused"))
	sm = waitSM(t, ns, "demo", "ControllerUnavailable", func(sm *shardkvv1.ShardMap) error {
		return condIs(sm, shardkvv1.ConditionReady, metav1.ConditionFalse, ReasonControllerUnavailable, "connection refused")
	})
	if sm.Status.ConfigNum != int64(num2) || len(sm.Status.Table) == 0 {
		t.Errorf("last known status lost: config %d table %v", sm.Status.ConfigNum, sm.Status.Table)
	}
	if err := condIs(sm, shardkvv1.ConditionBalanced, metav1.ConditionUnknown, ReasonControllerUnavailable, ""); err != nil {
		t.Error(err)
	}
}
