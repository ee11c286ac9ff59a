package kvctl

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// The phase lines of move --wait, from a sequence of controller statuses
// as a planned move goes through them (the data groups' side simulated).
func TestMoveWaitPhases(t *testing.T) {
	var out bytes.Buffer
	k := &kvctl{stdout: &out}
	plan := &shardkvpb.PlannedMove{Shard: 5, FromGid: 1, ToGid: 3, SinceConfig: 12}
	planned := &shardkvpb.Config{Num: 12, Shards: []uint64{1, 1, 1, 1, 1, 1, 1, 1}, Moves: []*shardkvpb.PlannedMove{plan}}
	cut := &shardkvpb.Config{Num: 13, Shards: []uint64{1, 1, 1, 1, 1, 3, 1, 1}}
	status := func(c *shardkvpb.Config, applied uint64, ss ...*shardkvpb.ShardState) *shardkvpb.ClusterStatus {
		return &shardkvpb.ClusterStatus{Latest: c, Groups: []*shardkvpb.GroupStatus{
			{Report: &shardkvpb.GroupReport{Gid: 1, ConfigNum: applied}},
			{Report: &shardkvpb.GroupReport{Gid: 3, ConfigNum: applied, Shards: ss}},
		}}
	}
	pre := func(phase string, keys, bytes, lag uint64, caughtUp bool) *shardkvpb.ShardState {
		return &shardkvpb.ShardState{Shard: 5, State: "PreCopying", ConfigNum: 12, PeerGid: 1, Phase: phase, Keys: keys, TotalKeys: 5000,
			Bytes: bytes, TotalBytes: 4 << 20, LagEntries: lag, CaughtUp: caughtUp}
	}
	mv := &mover{k: k, shard: 5, from: 1, to: 3, planned: 12}
	if err := mv.emit(moveEvent{Phase: "announced", Config: 12}); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		st   *shardkvpb.ClusterStatus
		done bool
	}{
		{status(planned, 12), false}, // the target has not started: no line
		{status(planned, 12, pre("snapshot", 1200, 1<<20, 340, false)), false},
		{status(planned, 12, pre("snapshot", 1200, 1<<20, 340, false)), false}, // unchanged: no line
		{status(planned, 12, pre("delta", 5000, 4<<20, 3, true)), false},
		{status(cut, 12, pre("delta", 5000, 4<<20, 0, true)), false},
		{status(cut, 13, &shardkvpb.ShardState{Shard: 5, State: "Pulling", ConfigNum: 13, PeerGid: 1, Phase: "delta", Keys: 12, Bytes: 2048}), false},
		{status(cut, 12, &shardkvpb.ShardState{Shard: 5, State: "Serving", ConfigNum: 9}), false}, // a report from before the cut-over
		{status(cut, 13, &shardkvpb.ShardState{Shard: 5, State: "Serving", ConfigNum: 13, WritePauseUs: 4200}), true},
	}
	for i, s := range steps {
		done, err := mv.step(context.Background(), nil, s.st)
		if err != nil || done != s.done {
			t.Fatalf("step %d: done %v err %v, want done %v", i, done, err, s.done)
		}
	}
	want := []string{
		"shard 5: move from group 1 to group 3 announced in config 12; waiting for group 3 to pre-copy",
		"shard 5: pre-copying (snapshot) from group 1: 1200 of 5000 keys, 1.0 MiB of 4.0 MiB copied, lag 340 entries",
		"shard 5: pre-copying (delta) from group 1: 5000 of 5000 keys, 4.0 MiB of 4.0 MiB copied, lag 3 entries, caught up; waiting for the cut-over",
		"shard 5: cut over in config 13: group 3 owns it; group 3 pulls the last changes",
		"shard 5: pulling (delta) from group 1: 12 keys, 2.0 KiB received",
		"shard 5: served by group 3 (config 13), write pause 4.2ms",
	}
	if got := strings.TrimSpace(out.String()); got != strings.Join(want, "\n") {
		t.Fatalf("lines:\n%s\nwant:\n%s", got, strings.Join(want, "\n"))
	}

	// A cancelled (or retargeted) move ends the wait with an error.
	mv = &mover{k: k, shard: 5, from: 1, to: 3, planned: 12}
	retarget := &shardkvpb.Config{Num: 13, Shards: planned.Shards, Moves: []*shardkvpb.PlannedMove{{Shard: 5, FromGid: 1, ToGid: 2, SinceConfig: 13}}}
	if _, err := mv.step(context.Background(), nil, status(retarget, 13)); err == nil || !strings.Contains(err.Error(), "cancelled or changed") || !strings.Contains(err.Error(), "planned to group 2") {
		t.Fatalf("retargeted: %v", err)
	}

	// --json: one object a line.
	out.Reset()
	k.json = true
	mv = &mover{k: k, shard: 5, from: 1, to: 3, planned: 12}
	if _, err := mv.step(context.Background(), nil, status(planned, 12, pre("snapshot", 1, 2, 3, false))); err != nil {
		t.Fatal(err)
	}
	if got := out.String(); got != `{"shard":5,"phase":"pre-copying","from":1,"to":3,"config":12,"copy_phase":"snapshot","keys":1,"total_keys":5000,"bytes":2,"total_bytes":4194304,"lag_entries":3,"caught_up":false,"write_pause_us":0}`+"\n" {
		t.Fatalf("json line: %s", got)
	}
}

// status shows planned moves with the target's progress, leaving groups
// and copy rate limits.
func TestStatusShowsPlannedMoves(t *testing.T) {
	var out bytes.Buffer
	k := &kvctl{stdout: &out}
	s := &statusJSON{NShards: 8, ConfigNum: 12,
		Groups: []groupStatusJSON{
			{GID: 1, InConfig: true, OwnedShards: 8, InfoFrom: "report", ReportAgeMs: 300, ConfigNum: 12, Leaving: true, ShardStates: map[string]int{"Serving": 8}},
			{GID: 3, InConfig: true, InfoFrom: "report", ReportAgeMs: 200, ConfigNum: 12, MigrateBytesPerSec: 10 << 20, ShardStates: map[string]int{"PreCopying": 1}},
		},
		Migrations: []migrationJSON{{Shard: 5, GID: 3, State: "PreCopying", Source: 1, Target: 3, ConfigNum: 12,
			copyJSON: copyJSON{Keys: 10, TotalKeys: 20, Bytes: 1024, TotalBytes: 2048, Phase: "snapshot", LagEntries: 7}}},
		PlannedMoves: []plannedStatusJSON{
			{Shard: 5, FromGID: 1, ToGID: 3, SinceConfig: 12, TargetState: "PreCopying", copyJSON: copyJSON{Phase: "snapshot", Keys: 10, TotalKeys: 20,
				Bytes: 1024, TotalBytes: 2048, LagEntries: 7, BytesPerSec: 512, EtaSeconds: 2}},
			{Shard: 6, FromGID: 1, ToGID: 3, SinceConfig: 12},
		},
	}
	if err := k.printStatus(s); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{
		"8 (leaving)",
		"copy limit 10.0 MiB/s",
		"PreCopying=1",
		"PLANNED MOVES",
		"snapshot: 10 of 20 keys, 1.0 KiB of 2.0 KiB copied, lag 7 entries",
		"lag 7 entries, 512 B/s, about 2s left",
		"not started",
		"not settled: 1 shard states in motion, 2 moves planned, config 12",
	} {
		if !strings.Contains(got, want) {
			t.Fatalf("status lacks %q:\n%s", want, got)
		}
	}
}

// A member change of a leaving group does not re-join it (a Join would
// take it back).
func TestRouteToVotersOfLeavingGroup(t *testing.T) {
	k := &kvctl{}
	tg := &target{gid: 3, group: &shardkvpb.Group{Gid: 3, Leaving: true, Weight: 1, Servers: []*shardkvpb.Server{{Id: 1, Addr: "a:1"}, {Id: 2, Addr: "b:1"}}}}
	_, err := k.routeToVoters(context.Background(), tg, []*shardkvpb.Member{{Id: 1, Addr: "a:1"}})
	if err == nil || !strings.Contains(err.Error(), "group 3 is leaving") {
		t.Fatalf("re-join of a leaving group: %v", err)
	}
}
