package ctrler

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/shardkv/shardkv/pkg/raftgroup"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// logOf makes a log of cmds, one second of log time apart from t0.
func logOf(t *testing.T, t0 time.Time, first uint64, cmds ...*shardkvpb.ControllerCommand) []raftgroup.Entry {
	t.Helper()
	var ents []raftgroup.Entry
	for i, c := range cmds {
		b, err := encodeCommand(c)
		if err != nil {
			t.Fatal(err)
		}
		ents = append(ents, raftgroup.Entry{Index: first + uint64(i), Term: 1, Time: t0.Add(time.Duration(i) * time.Second), Cmd: b})
	}
	return ents
}

func initCmd(shards uint32, placement string) *shardkvpb.ControllerCommand {
	return &shardkvpb.ControllerCommand{Op: &shardkvpb.ControllerCommand_Init{Init: &shardkvpb.ControllerInit{Shards: shards, Placement: placement}}}
}

func joinCmd(client, seq uint64, groups ...*shardkvpb.Group) *shardkvpb.ControllerCommand {
	return &shardkvpb.ControllerCommand{Op: &shardkvpb.ControllerCommand_Join{Join: &shardkvpb.JoinRequest{ClientId: client, Seq: seq, Groups: groups}}, PlanMoves: true}
}

func moveCmd(client, seq uint64, shard uint32, gid uint64) *shardkvpb.ControllerCommand {
	return &shardkvpb.ControllerCommand{Op: &shardkvpb.ControllerCommand_Move{Move: &shardkvpb.MoveRequest{ClientId: client, Seq: seq, Shard: shard, Gid: gid}}, PlanMoves: true}
}

func grp(gid uint64, weight uint32) *shardkvpb.Group {
	return &shardkvpb.Group{Gid: gid, Weight: weight, Servers: []*shardkvpb.Server{{Id: 1, Addr: fmt.Sprintf("g%d:1", gid)}}}
}

func mustApply(t *testing.T, sm *StateMachine, ents []raftgroup.Entry) {
	t.Helper()
	if err := raftgroup.ApplyAlone(sm, sm.store.DB(), ents); err != nil {
		t.Fatalf("Apply of %d entries [%d,%d] stopped the replica: %.300v", len(ents), ents[0].Index, ents[len(ents)-1].Index, err)
	}
}

func refusal(t *testing.T, e raftgroup.Entry) string {
	t.Helper()
	var ie *InputError
	if err := e.Result.(Result).Err; !errors.As(err, &ie) {
		t.Fatalf("entry %d: got %v, want a refusal", e.Index, err)
	}
	return e.Result.(Result).Err.Error()
}

// Twenty moves committed in one Ready, in a cluster of 16384 shards on
// groups with large gids (a config of about 160 KB each): one transaction
// cannot hold their configs. Before, Apply failed with ErrTxnTooBig and the
// replica stopped, at every restart again.
func TestApplyBatchPastOneTransaction(t *testing.T) {
	sm := openFuzzSM(t)
	t0 := time.Unix(1_800_000_000, 0)
	big := uint64(math.MaxUint64 - 10)
	mustApply(t, sm, logOf(t, t0, 1, initCmd(16384, "balanced"), joinCmd(1, 1, grp(big, 1), grp(big+1, 1))))
	var cmds []*shardkvpb.ControllerCommand
	for i := range 20 {
		cmds = append(cmds, moveCmd(1, uint64(2+i), uint32(i), big+uint64(i%2)))
	}
	ents := logOf(t, t0.Add(time.Minute), 3, cmds...)
	mustApply(t, sm, ents)
	for _, e := range ents {
		if err := e.Result.(Result).Err; err != nil {
			t.Fatalf("entry %d: %v", e.Index, err)
		}
	}
	if _, latest := sm.Bounds(); latest != 21 {
		t.Fatalf("latest config %d, want 21", latest)
	}
	checkHistory(t, sm)
}

// Joins that grow the config past what one transaction holds (each of 140
// groups of 7 servers with 1,000-byte addresses, about 1 MB) are refused
// once the config would pass MaxConfigBytes, and so is one request that
// alone is past it. Before, configs grew without bound (each mutation
// stores a whole copy), and past 4 MiB no client with gRPC's default
// receive limit (data groups, kvctl) could read the config any more.
func TestJoinPastConfigLimitRefused(t *testing.T) {
	sm := openFuzzSM(t)
	t0 := time.Unix(1_800_000_000, 0)
	groups := func(base uint64, n int) []*shardkvpb.Group {
		var gs []*shardkvpb.Group
		for i := range n {
			g := &shardkvpb.Group{Gid: base + uint64(i)}
			for j := range 7 {
				g.Servers = append(g.Servers, &shardkvpb.Server{Id: uint64(j + 1), Addr: strings.Repeat("a", 1000)})
			}
			gs = append(gs, g)
		}
		return gs
	}
	mustApply(t, sm, logOf(t, t0, 1, initCmd(64, "balanced")))
	var ents []raftgroup.Entry
	for i := range 3 {
		e := logOf(t, t0, uint64(2+i), joinCmd(1, uint64(1+i), groups(uint64(1+1000*i), 140)...))
		mustApply(t, sm, e)
		ents = append(ents, e...)
	}
	if r := ents[0].Result.(Result); r.Err != nil || r.Config.GetNum() != 1 {
		t.Fatalf("the first join: %v", r.Err)
	}
	for _, e := range ents[1:] {
		if msg := refusal(t, e); !strings.Contains(msg, "limit") {
			t.Fatalf("refusal %q does not name the limit", msg)
		}
	}
	big := logOf(t, t0, 5, joinCmd(1, 4, groups(5000, 300)...), joinCmd(1, 5, grp(1, 1)))
	mustApply(t, sm, big)
	if msg := refusal(t, big[0]); !strings.Contains(msg, "limit") {
		t.Fatalf("refusal %q does not name the limit", msg)
	}
	if r := big[1].Result.(Result); r.Err != nil || r.Config.GetNum() != 2 {
		t.Fatalf("the next join: %v %v", r.Config, r.Err)
	}
	checkHistory(t, sm)
}

// Consistent-hash placement builds 128 virtual nodes per unit of weight at
// every mutation: a weight of 2^32-1 made every replica try to build half
// a trillion (out of memory, all replicas, at every restart). Weights past
// MaxTotalWeight are refused, and so are too many groups.
func TestHugeWeightRefused(t *testing.T) {
	sm := openFuzzSM(t)
	t0 := time.Unix(1_800_000_000, 0)
	var many []*shardkvpb.Group
	for i := range MaxGroups + 1 {
		many = append(many, grp(uint64(i+1), 1))
	}
	ents := logOf(t, t0, 1, initCmd(64, "consistent-hash"),
		joinCmd(1, 1, grp(1, 20000)),
		joinCmd(1, 2, grp(1, MaxTotalWeight/2), grp(2, MaxTotalWeight/2+1)),
		joinCmd(1, 3, many...),
		joinCmd(1, 4, grp(1, MaxTotalWeight)))
	start := time.Now()
	mustApply(t, sm, ents)
	for _, e := range ents[1:4] {
		t.Logf("entry %d: %s", e.Index, refusal(t, e))
	}
	if r := ents[4].Result.(Result); r.Err != nil || r.Config.GetNum() != 1 {
		t.Fatalf("a join at the weight limit: %v %v", r.Config, r.Err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("apply took %v", d)
	}
}

// Compaction after a long time without one: more expired sessions (and
// configs) than one transaction can delete. Before, Apply failed with
// ErrTxnTooBig at the compaction entry.
func TestCompactionPastOneTransaction(t *testing.T) {
	sm := openFuzzSM(t)
	t0 := time.Unix(1_800_000_000, 0)
	mustApply(t, sm, logOf(t, t0, 1, initCmd(4, "balanced"), joinCmd(1, 1, grp(1, 1), grp(2, 1))))
	n := int(sm.store.DB().MaxBatchCount()) + 1000
	idx := uint64(3)
	for done := 0; done < n; {
		var cmds []*shardkvpb.ControllerCommand
		for range min(2000, n-done) {
			// Each client's one move: a session and a config each.
			cmds = append(cmds, moveCmd(uint64(100+done), 1, uint32(done%4), uint64(1+done%2)))
			done++
		}
		mustApply(t, sm, logOf(t, t0, idx, cmds...))
		idx += uint64(len(cmds))
	}
	_, latest := sm.Bounds()
	compact := &shardkvpb.ControllerCommand{Op: &shardkvpb.ControllerCommand_Compact{Compact: &shardkvpb.ControllerCompact{Below: latest}}}
	mustApply(t, sm, logOf(t, t0.Add(SessionTTL+time.Hour), idx, compact))
	if oldest, l := sm.Bounds(); oldest != latest || l != latest {
		t.Fatalf("after compaction: oldest %d latest %d, want both %d", oldest, l, latest)
	}
	left := 0
	for k := range ctrlStateKeys(t, sm) {
		if strings.HasPrefix(k, string(prefixDedup)) || strings.HasPrefix(k, string(prefixConf)) {
			left++
		}
	}
	if left != 1 { // the latest config
		t.Fatalf("%d sessions and configs left after compaction, want 1", left)
	}
}

func ctrlStateKeys(t *testing.T, sm *StateMachine) map[string]string { return dump(t, sm) }
