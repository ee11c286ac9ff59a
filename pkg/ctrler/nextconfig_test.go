package ctrler

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shardkv/shardkv/pkg/ctrler/placement"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
)

// Helpers for nextConfig tables: a config, plans, and mutations.

func conf(num uint64, shards []uint64, groups ...*shardkvpb.Group) *shardkvpb.Config {
	return &shardkvpb.Config{Num: num, Shards: shards, Groups: groups, Placement: "balanced"}
}

func leaving(g *shardkvpb.Group) *shardkvpb.Group { g.Leaving = true; return g }

func plan(shard uint32, from, to, since uint64) *shardkvpb.PlannedMove {
	return &shardkvpb.PlannedMove{Shard: shard, FromGid: from, ToGid: to, SinceConfig: since}
}

func joinOf(gids ...uint64) *shardkvpb.ControllerCommand {
	var gs []*shardkvpb.Group
	for _, g := range gids {
		gs = append(gs, grp(g, 1))
	}
	return joinCmd(0, 0, gs...)
}

func leaveOf(gids ...uint64) *shardkvpb.ControllerCommand {
	return &shardkvpb.ControllerCommand{Op: &shardkvpb.ControllerCommand_Leave{Leave: &shardkvpb.LeaveRequest{Gids: gids}}, PlanMoves: true}
}

func moveOf(shard uint32, gid uint64, stopAndCopy bool) *shardkvpb.ControllerCommand {
	return &shardkvpb.ControllerCommand{Op: &shardkvpb.ControllerCommand_Move{Move: &shardkvpb.MoveRequest{Shard: shard, Gid: gid, StopAndCopy: stopAndCopy}}, PlanMoves: true}
}

func cutOf(ms ...*shardkvpb.PlannedMove) *shardkvpb.ControllerCutOver {
	return &shardkvpb.ControllerCutOver{Moves: ms}
}

// step applies cmd to c with balanced placement and fails on a refusal or
// on no change.
func step(t *testing.T, c *shardkvpb.Config, cmd *shardkvpb.ControllerCommand) *shardkvpb.Config {
	t.Helper()
	next, err := nextConfig(c, len(c.Shards), placement.Balanced, cmd)
	if err != nil || next == nil {
		t.Fatalf("%v on config %d: %v, %v", prototext.Format(cmd), c.Num, next, err)
	}
	again, _ := nextConfig(c, len(c.Shards), placement.Balanced, cmd)
	if !proto.Equal(next, again) {
		t.Fatalf("nextConfig is not deterministic: %v / %v", next, again)
	}
	return next
}

func cut(t *testing.T, c *shardkvpb.Config, ms ...*shardkvpb.PlannedMove) *shardkvpb.Config {
	t.Helper()
	next := cutOverConfig(c, cutOf(ms...))
	if next == nil {
		t.Fatalf("cut-over of %v matched nothing in %v", ms, c)
	}
	return next
}

func wantShards(t *testing.T, c *shardkvpb.Config, want ...uint64) {
	t.Helper()
	if len(c.Shards) != len(want) {
		t.Fatalf("config %d shards %v, want %v", c.Num, c.Shards, want)
	}
	for i := range want {
		if c.Shards[i] != want[i] {
			t.Fatalf("config %d shards %v, want %v", c.Num, c.Shards, want)
		}
	}
}

func wantMoves(t *testing.T, c *shardkvpb.Config, want ...*shardkvpb.PlannedMove) {
	t.Helper()
	ok := len(c.Moves) == len(want)
	for i := 0; ok && i < len(want); i++ {
		ok = proto.Equal(c.Moves[i], want[i])
	}
	if !ok {
		t.Fatalf("config %d moves %v, want %v", c.Num, c.Moves, want)
	}
}

func wantGroups(t *testing.T, c *shardkvpb.Config, want string) {
	t.Helper()
	var parts []string
	for _, g := range c.Groups {
		s := prototext.Format(&shardkvpb.Pin{Gid: g.Gid}) // "gid:N"
		s = strings.Join(strings.Fields(s), "")
		if g.Leaving {
			s += "(leaving)"
		}
		parts = append(parts, s)
	}
	if got := strings.Join(parts, " "); got != want {
		t.Fatalf("config %d groups %q, want %q", c.Num, got, want)
	}
}

func TestUnownedShardsAssignedAtOnce(t *testing.T) {
	c0 := conf(0, make([]uint64, 4))
	c1 := step(t, c0, joinOf(1, 2))
	wantShards(t, c1, 1, 1, 2, 2)
	wantMoves(t, c1)
}

func TestJoinPlansMovesWithoutHandingOver(t *testing.T) {
	c1 := conf(1, []uint64{1, 1, 1, 1}, grp(1, 1))
	c2 := step(t, c1, joinOf(2))
	wantShards(t, c2, 1, 1, 1, 1) // owners unchanged
	wantMoves(t, c2, plan(2, 1, 2, 2), plan(3, 1, 2, 2))
	wantGroups(t, c2, "gid:1 gid:2")

	// A later join starts from the planned targets: the plan still to 2
	// keeps its since_config, the one placement retargets to 3 gets a new
	// one, and no shard is planned back or elsewhere.
	c3 := step(t, c2, joinOf(3))
	wantShards(t, c3, 1, 1, 1, 1)
	wantMoves(t, c3, plan(2, 1, 2, 2), plan(3, 1, 3, 3))

	// Cut over one: its owner changes, the other plan stays as it was.
	c4 := cut(t, c3, plan(2, 1, 2, 2))
	wantShards(t, c4, 1, 1, 2, 1)
	wantMoves(t, c4, plan(3, 1, 3, 3))
	if c4.Num != 4 {
		t.Fatalf("cut-over made config %d", c4.Num)
	}
	// A join after it starts from the new owner.
	c5 := step(t, c4, joinOf(4))
	wantShards(t, c5, 1, 1, 2, 1)
	wantMoves(t, c5, plan(1, 1, 4, 5), plan(3, 1, 3, 3))
}

func TestMoveCancelAndRetarget(t *testing.T) {
	// Every shard pinned: placement is the pins, nothing else moves.
	c := conf(5, []uint64{1, 1, 2, 2}, grp(1, 1), grp(2, 1), grp(3, 1))
	c.Moves = []*shardkvpb.PlannedMove{plan(3, 2, 3, 4)}
	c.Pins = []*shardkvpb.Pin{{Shard: 0, Gid: 1}, {Shard: 1, Gid: 1}, {Shard: 2, Gid: 2}, {Shard: 3, Gid: 3}}

	// Retarget: a new since_config.
	r := step(t, c, moveOf(3, 1, false))
	wantShards(t, r, 1, 1, 2, 2)
	wantMoves(t, r, plan(3, 2, 1, 6))

	// Cancel: move the shard back to its owner; the plan goes, the pin
	// now holds it where it is.
	x := step(t, c, moveOf(3, 2, false))
	wantShards(t, x, 1, 1, 2, 2)
	wantMoves(t, x)
	if len(x.Pins) != 4 || x.Pins[3].Gid != 2 {
		t.Fatalf("pins after cancel: %v", x.Pins)
	}
	// A move to where the shard already is and is pinned changes nothing.
	if n, err := nextConfig(x, 4, placement.Balanced, moveOf(3, 2, false)); n != nil || err != nil {
		t.Fatalf("repeated cancel: %v, %v", n, err)
	}

	// A Move that changes nothing else keeps other plans' since_config.
	c.Moves = append([]*shardkvpb.PlannedMove{plan(0, 1, 3, 2)}, c.Moves...)
	c.Pins[0].Gid = 3
	y := step(t, c, moveOf(3, 1, false))
	wantMoves(t, y, plan(0, 1, 3, 2), plan(3, 2, 1, 6))
}

func TestStopAndCopyIsImmediate(t *testing.T) {
	c := conf(3, []uint64{1, 1, 2, 2}, grp(1, 1), grp(2, 1))
	s := step(t, c, moveOf(0, 2, true))
	wantShards(t, s, 2, 1, 2, 2)
	wantMoves(t, s)
	// A planned move (pinned already) handed over by a stop-and-copy Move
	// of the same shard and target.
	p := step(t, c, moveOf(0, 2, false))
	wantShards(t, p, 1, 1, 2, 2)
	wantMoves(t, p, plan(0, 1, 2, 4))
	q := step(t, p, moveOf(0, 2, true))
	wantShards(t, q, 2, 1, 2, 2)
	wantMoves(t, q)
	// Stop-and-copy applies to its own shard only: a join after it still plans.
	j := step(t, q, joinOf(3))
	if !slices2Equal(j.Shards, q.Shards) || len(j.Moves) == 0 {
		t.Fatalf("join after a stop-and-copy move: %v", j)
	}
}

func slices2Equal(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestLeavingGroupStaysUntilItsLastShardIsCutOver(t *testing.T) {
	c := conf(3, []uint64{1, 1, 2, 2}, grp(1, 1), grp(2, 1), grp(3, 1))
	c.Pins = []*shardkvpb.Pin{{Shard: 2, Gid: 2}}
	l := step(t, c, leaveOf(2))
	wantShards(t, l, 1, 1, 2, 2)
	wantGroups(t, l, "gid:1 gid:2(leaving) gid:3")
	if len(l.Pins) != 0 {
		t.Fatalf("pin to a leaving group kept: %v", l.Pins)
	}
	if len(l.Moves) != 2 || l.Moves[0].Shard != 2 || l.Moves[1].Shard != 3 || l.Moves[0].FromGid != 2 || l.Moves[1].FromGid != 2 || l.Moves[0].SinceConfig != 4 {
		t.Fatalf("leave plans: %v", l.Moves)
	}
	for _, m := range l.Moves {
		if m.ToGid == 2 || m.ToGid == 0 {
			t.Fatalf("leave plans: %v", l.Moves)
		}
	}
	// Leave again: a no-op, not a refusal.
	if n, err := nextConfig(l, 4, placement.Balanced, leaveOf(2)); n != nil || err != nil {
		t.Fatalf("second leave: %v, %v", n, err)
	}
	// Move to a leaving group: refused, saying so.
	if _, err := nextConfig(l, 4, placement.Balanced, moveOf(0, 2, false)); err == nil || !strings.Contains(err.Error(), "leaving") {
		t.Fatalf("move to a leaving group: %v", err)
	}
	// Leave of everyone else: refused (2 is leaving already).
	if _, err := nextConfig(l, 4, placement.Balanced, leaveOf(1, 3)); err == nil || !strings.Contains(err.Error(), "no group would remain") {
		t.Fatalf("leave of the rest: %v", err)
	}
	// A join meanwhile keeps the leaving group's plans' since_config.
	j := step(t, l, joinOf(4))
	wantGroups(t, j, "gid:1 gid:2(leaving) gid:3 gid:4")
	for _, m := range j.Moves {
		if m.FromGid == 2 && m.ToGid != 0 && m.SinceConfig != 4 && m.ToGid != 4 {
			t.Fatalf("plans after join: %v", j.Moves)
		}
	}
	// Cut over one: 2 stays (it owns the other); cut over the last: it goes.
	a := cut(t, l, l.Moves[0])
	wantGroups(t, a, "gid:1 gid:2(leaving) gid:3")
	b := cut(t, a, a.Moves[0])
	wantGroups(t, b, "gid:1 gid:3")
	wantMoves(t, b)
	if slicesContains(b.Shards, 2) {
		t.Fatalf("shards still on 2: %v", b.Shards)
	}
}

func slicesContains(s []uint64, v uint64) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func TestLeaveOfGroupOwningNothing(t *testing.T) {
	c1 := conf(1, []uint64{1, 1, 1, 1}, grp(1, 1))
	c2 := step(t, c1, joinOf(2)) // plans to 2, 2 owns nothing
	l := step(t, c2, leaveOf(2))
	wantGroups(t, l, "gid:1")
	wantMoves(t, l) // its incoming plans are cancelled
	wantShards(t, l, 1, 1, 1, 1)
	// Leave of the last group: refused.
	if _, err := nextConfig(l, 4, placement.Balanced, leaveOf(1)); err == nil || !strings.Contains(err.Error(), "no group would remain") {
		t.Fatalf("leave of the last group: %v", err)
	}
}

func TestRejoinOfLeavingGroup(t *testing.T) {
	c := conf(3, []uint64{1, 1, 2, 2}, grp(1, 1), grp(2, 1))
	l := step(t, c, leaveOf(2))
	wantMoves(t, l, plan(2, 2, 1, 4), plan(3, 2, 1, 4))
	r := step(t, l, joinOf(2))
	wantGroups(t, r, "gid:1 gid:2")
	wantShards(t, r, 1, 1, 2, 2)
	wantMoves(t, r) // back where they are: the plans are cancelled
	if r.Groups[1].Leaving {
		t.Fatalf("rejoined group still leaving: %v", r.Groups)
	}
	// A join that claims leaving=true is not leaving.
	g := grp(3, 1)
	g.Leaving = true
	j := step(t, r, joinCmd(0, 0, g))
	if j.Groups[2].Gid != 3 || j.Groups[2].Leaving {
		t.Fatalf("join with leaving set: %v", j.Groups)
	}
}

func TestCutOverMatchesExactly(t *testing.T) {
	c := conf(7, []uint64{1, 1, 2, 2}, grp(1, 1), grp(2, 1), leaving(grp(3, 1)))
	c.Shards[0] = 3
	c.Moves = []*shardkvpb.PlannedMove{plan(0, 3, 1, 6), plan(3, 2, 1, 7)}
	for _, bad := range []*shardkvpb.PlannedMove{plan(0, 3, 1, 5), plan(0, 3, 2, 6), plan(0, 2, 1, 6), plan(1, 1, 2, 7), plan(9, 3, 1, 6)} {
		if n := cutOverConfig(c, cutOf(bad)); n != nil {
			t.Fatalf("cut-over of %v (not planned) made %v", bad, n)
		}
	}
	if n := cutOverConfig(c, cutOf()); n != nil {
		t.Fatalf("empty cut-over made %v", n)
	}
	// Partial: one matches, one does not.
	p := cut(t, c, plan(3, 2, 1, 7), plan(0, 3, 1, 5))
	wantShards(t, p, 3, 1, 2, 1)
	wantMoves(t, p, plan(0, 3, 1, 6))
	wantGroups(t, p, "gid:1 gid:2 gid:3(leaving)")
	if p.Num != 8 {
		t.Fatalf("num %d", p.Num)
	}
	// The leaving group's last shard: it goes. A repeated move is skipped.
	q := cut(t, p, plan(0, 3, 1, 6), plan(3, 2, 1, 7))
	wantShards(t, q, 1, 1, 2, 1)
	wantMoves(t, q)
	wantGroups(t, q, "gid:1 gid:2")
	if n := cutOverConfig(q, cutOf(plan(0, 3, 1, 6))); n != nil {
		t.Fatalf("cut-over repeated: %v", n)
	}
}

// Through Apply: a cut-over entry makes a config when a plan matches, and
// answers the latest config otherwise; it takes no client session.
func TestApplyCutOver(t *testing.T) {
	sm := openSM(t)
	t0 := time.Unix(1_700_000_000, 0)
	co := func(ms ...*shardkvpb.PlannedMove) *shardkvpb.ControllerCommand {
		return &shardkvpb.ControllerCommand{Op: &shardkvpb.ControllerCommand_CutOver{CutOver: cutOf(ms...)}}
	}
	ents := logOf(t, t0, 1,
		initCmd(4, "balanced"),
		joinCmd(1, 1, grp(1, 1)),               // config 1: every shard on 1
		joinCmd(1, 2, grp(2, 1)),               // config 2: shards 2, 3 planned to 2
		co(plan(2, 1, 2, 1)),                   // wrong since_config: nothing
		co(plan(2, 1, 2, 2), plan(3, 1, 3, 2)), // one of two
		co(plan(2, 1, 2, 2)),                   // again: nothing
		co(plan(3, 1, 2, 2)),                   // the last
	)
	mustApply(t, sm, ents)
	res := func(i int) *shardkvpb.Config { return ents[i].Result.(Result).Config }
	for i, want := range []uint64{0, 1, 2, 2, 3, 3, 4} {
		if r := ents[i].Result.(Result); r.Err != nil || r.Config.GetNum() != want {
			t.Fatalf("entry %d: config %d err %v, want config %d", i+1, r.Config.GetNum(), r.Err, want)
		}
	}
	wantMoves(t, res(2), plan(2, 1, 2, 2), plan(3, 1, 2, 2))
	wantShards(t, res(4), 1, 1, 2, 1)
	wantShards(t, res(6), 1, 1, 2, 2)
	wantMoves(t, res(6))
	if _, latest := sm.Bounds(); latest != 4 {
		t.Fatalf("latest %d", latest)
	}
}

// TestEntriesOfEarlierControllersHandOverAtOnce: a mutation logged by a
// controller that did not announce moves (no plan_moves) is applied as it
// was then, so that a replica replaying it after an upgrade computes the
// config the others stored: owners change at once, Leave removes the group.
func TestEntriesOfEarlierControllersHandOverAtOnce(t *testing.T) {
	c0 := &shardkvpb.Config{Num: 0, Shards: make([]uint64, 8), Placement: "balanced"}
	c1, err := nextConfig(c0, 8, "balanced", joinOf(1))
	if err != nil {
		t.Fatal(err)
	}
	old := joinOf(2)
	old.PlanMoves = false
	c2, err := nextConfig(c1, 8, "balanced", old)
	if err != nil {
		t.Fatal(err)
	}
	if len(c2.Moves) != 0 || !slices.Contains(c2.Shards, 2) {
		t.Fatalf("an earlier controller's join: owners %v, moves %v; want the owners changed at once", c2.Shards, c2.Moves)
	}
	lv := leaveOf(1)
	lv.PlanMoves = false
	c3, err := nextConfig(c2, 8, "balanced", lv)
	if err != nil {
		t.Fatal(err)
	}
	if len(c3.Moves) != 0 || slices.Contains(c3.Shards, 1) || len(c3.Groups) != 1 {
		t.Fatalf("an earlier controller's leave: owners %v, moves %v, groups %v; want group 1 gone at once", c3.Shards, c3.Moves, c3.Groups)
	}
	if planned, err := nextConfig(c1, 8, "balanced", joinOf(2)); err != nil || len(planned.Moves) == 0 {
		t.Fatalf("this controller's join: %v %v; want moves announced", planned, err)
	}
}
