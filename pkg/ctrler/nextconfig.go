package ctrler

import (
	"cmp"
	"slices"

	"github.com/shardkv/shardkv/pkg/ctrler/placement"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"google.golang.org/protobuf/proto"
)

// nextConfig computes the config a client mutation makes from latest, in a
// cluster of nshards shards placed by strategy. It returns (nil, nil) when
// the command changes nothing, and a refusal for bad input. It is a pure
// function of its arguments: every replica computes the same config.
//
// A mutation does not hand shards over: a shard whose owner placement
// changes is announced as a planned move (Config.moves) and keeps its owner
// until a cut-over entry (cutOverConfig) hands it to the target, once the
// target has pre-copied it. Shards nobody owns (gid 0) are assigned at
// once, and a Move with stop_and_copy hands its shard over at once.
func nextConfig(latest *shardkvpb.Config, nshards int, strategy placement.Strategy, cmd *shardkvpb.ControllerCommand) (*shardkvpb.Config, error) {
	if err := checkRequest(cmd); err != nil {
		return nil, err
	}
	next := proto.Clone(latest).(*shardkvpb.Config)
	next.Num = latest.Num + 1
	joining := map[uint64]bool{}
	stopAndCopy := -1 // the shard a stop-and-copy Move hands over at once
	switch op := cmd.GetOp().(type) {
	case *shardkvpb.ControllerCommand_Join:
		groups := op.Join.GetGroups()
		if len(groups) == 0 {
			return nil, refuse("join: no groups given")
		}
		seen := map[uint64]bool{}
		changed := false
		for _, g := range groups {
			if err := validateGroup(g); err != nil {
				return nil, err
			}
			if seen[g.Gid] {
				return nil, refuse("join: gid %d given twice", g.Gid)
			}
			seen[g.Gid] = true
			ng := normalizeGroup(g)
			i := slices.IndexFunc(next.Groups, func(x *shardkvpb.Group) bool { return x.Gid == g.Gid })
			if i < 0 {
				next.Groups = append(next.Groups, ng)
				joining[g.Gid] = true
				changed = true
			} else if !proto.Equal(next.Groups[i], ng) {
				// A join of a gid that is already in the config updates its
				// servers and weight (documented in docs/controller.md); of
				// a leaving gid, it also takes the group back (rejoin).
				next.Groups[i] = ng
				changed = true
			}
		}
		if !changed {
			return nil, nil
		}
		if err := checkGroups("join", next.Groups); err != nil {
			return nil, err
		}
		slices.SortFunc(next.Groups, func(a, b *shardkvpb.Group) int { return cmp.Compare(a.Gid, b.Gid) })
	case *shardkvpb.ControllerCommand_Leave:
		gids := op.Leave.GetGids()
		if len(gids) == 0 {
			return nil, refuse("leave: no gids given")
		}
		for _, gid := range gids {
			if gid == 0 {
				return nil, refuse("leave: gid 0 is not a group")
			}
			if findGroup(next, gid) == nil {
				return nil, refuse("leave: gid %d is not in config %d", gid, latest.Num)
			}
		}
		// A leaving group stays in the config, marked, until its last shard
		// is cut over; one that owns nothing goes below, with the others.
		for _, g := range next.Groups {
			if slices.Contains(gids, g.Gid) {
				g.Leaving = true
			}
		}
		if !slices.ContainsFunc(next.Groups, func(g *shardkvpb.Group) bool { return !g.Leaving }) {
			return nil, refuse("leave: refused, no group would remain to hold the data (config %d has %d groups)", latest.Num, len(latest.Groups))
		}
		next.Pins = slices.DeleteFunc(next.Pins, func(p *shardkvpb.Pin) bool {
			g := findGroup(next, p.Gid)
			return g == nil || g.Leaving
		})
	case *shardkvpb.ControllerCommand_Move:
		shard, gid := op.Move.GetShard(), op.Move.GetGid()
		if int(shard) >= nshards {
			return nil, refuse("move: shard %d is out of range [0, %d)", shard, nshards)
		}
		g := findGroup(next, gid)
		if gid == 0 || g == nil {
			return nil, refuse("move: gid %d is not in config %d", gid, latest.Num)
		}
		if g.Leaving {
			return nil, refuse("move: gid %d is leaving (config %d); move the shard to a group that stays", gid, latest.Num)
		}
		if op.Move.GetStopAndCopy() {
			stopAndCopy = int(shard)
		}
		// A pin already there may still be a planned move, which a
		// stop-and-copy Move hands over now: no early return, the
		// comparison with latest at the end finds what is unchanged.
		i := slices.IndexFunc(next.Pins, func(p *shardkvpb.Pin) bool { return p.Shard == shard })
		if i >= 0 {
			next.Pins[i].Gid = gid
		} else {
			next.Pins = append(next.Pins, &shardkvpb.Pin{Shard: shard, Gid: gid})
			slices.SortFunc(next.Pins, func(a, b *shardkvpb.Pin) int { return cmp.Compare(a.Shard, b.Shard) })
		}
	case *shardkvpb.ControllerCommand_Unpin:
		shard := op.Unpin.GetShard()
		if int(shard) >= nshards {
			return nil, refuse("unpin: shard %d is out of range [0, %d)", shard, nshards)
		}
		i := slices.IndexFunc(next.Pins, func(p *shardkvpb.Pin) bool { return p.Shard == shard })
		if i < 0 {
			return nil, refuse("unpin: shard %d is not pinned", shard)
		}
		next.Pins = slices.Delete(next.Pins, i, i+1)
	default:
		return nil, refuse("unknown operation")
	}
	// Placement starts from where every shard is going: its owner, or its
	// planned target, so that successive mutations do not reshuffle the
	// plans. Leaving groups get nothing.
	var gs []placement.Group
	for _, g := range next.Groups {
		if !g.Leaving {
			gs = append(gs, placement.Group{GID: g.Gid, Weight: g.Weight, Joining: joining[g.Gid]})
		}
	}
	pins := make([]uint64, nshards)
	for _, p := range next.Pins {
		pins[p.Shard] = p.Gid
	}
	planned := make([]*shardkvpb.PlannedMove, len(latest.Shards))
	prev := slices.Clone(latest.Shards)
	for _, m := range latest.Moves {
		if int(m.Shard) < len(prev) {
			prev[m.Shard], planned[m.Shard] = m.ToGid, m
		}
	}
	assigned := placement.Assign(strategy, prev, gs, pins)
	next.Shards = slices.Clone(latest.Shards)
	next.Moves = nil
	for i, owner := range latest.Shards {
		target := assigned[i]
		switch {
		case target == owner: // nothing to move; a plan there is cancelled
		case owner == 0, i == stopAndCopy, !cmd.GetPlanMoves(): // nothing to copy, no pre-copy asked, or logged before plans
			next.Shards[i] = target
		default:
			since := next.Num
			if p := planned[i]; p != nil && p.FromGid == owner && p.ToGid == target {
				since = p.SinceConfig
			}
			next.Moves = append(next.Moves, &shardkvpb.PlannedMove{Shard: uint32(i), FromGid: owner, ToGid: target, SinceConfig: since})
		}
	}
	dropIdleLeaving(next)
	next.Num = latest.Num
	unchanged := proto.Equal(next, latest)
	next.Num = latest.Num + 1
	if unchanged {
		return nil, nil
	}
	if n := proto.Size(next); n > MaxConfigBytes {
		return nil, refuse("the config would take %d bytes, over the %d limit", n, MaxConfigBytes)
	}
	return next, nil
}

// cutOverConfig hands each of cut's moves that is planned exactly so in
// latest (shard, source, target and announcing config) to its target, and
// drops leaving groups left with nothing. It returns nil when no move
// matched. Pure and deterministic, like nextConfig.
func cutOverConfig(latest *shardkvpb.Config, cut *shardkvpb.ControllerCutOver) *shardkvpb.Config {
	next := proto.Clone(latest).(*shardkvpb.Config)
	next.Num = latest.Num + 1
	matched := false
	for _, m := range cut.GetMoves() {
		i := slices.IndexFunc(next.Moves, func(p *shardkvpb.PlannedMove) bool {
			return p.Shard == m.GetShard() && p.FromGid == m.GetFromGid() && p.ToGid == m.GetToGid() && p.SinceConfig == m.GetSinceConfig()
		})
		if i < 0 || int(m.Shard) >= len(next.Shards) {
			continue
		}
		next.Shards[m.Shard] = m.ToGid
		next.Moves = slices.Delete(next.Moves, i, i+1)
		matched = true
	}
	if !matched {
		return nil
	}
	dropIdleLeaving(next)
	return next
}

// dropIdleLeaving removes the leaving groups that own no shard (a planned
// move's source is its shard's owner, so they are no plan's source either).
func dropIdleLeaving(c *shardkvpb.Config) {
	c.Groups = slices.DeleteFunc(c.Groups, func(g *shardkvpb.Group) bool {
		return g.Leaving && !slices.Contains(c.Shards, g.Gid)
	})
}

func findGroup(c *shardkvpb.Config, gid uint64) *shardkvpb.Group {
	for _, g := range c.Groups {
		if g.Gid == gid {
			return g
		}
	}
	return nil
}

func validateGroup(g *shardkvpb.Group) error {
	if g.GetGid() == 0 {
		return refuse("join: gid 0 is reserved for unassigned shards")
	}
	if len(g.Servers) == 0 {
		return refuse("join: group %d has an empty server list", g.Gid)
	}
	ids := map[uint64]bool{}
	for _, s := range g.Servers {
		if s.GetId() == 0 {
			return refuse("join: group %d: server id 0 is invalid (ids start at 1)", g.Gid)
		}
		if s.GetAddr() == "" {
			return refuse("join: group %d server %d has no address", g.Gid, s.Id)
		}
		if ids[s.Id] {
			return refuse("join: group %d lists server %d twice", g.Gid, s.Id)
		}
		ids[s.Id] = true
	}
	return nil
}

func normalizeGroup(g *shardkvpb.Group) *shardkvpb.Group {
	ng := proto.Clone(g).(*shardkvpb.Group)
	ng.Weight = max(ng.Weight, 1)
	ng.Leaving = false // set by Leave only
	slices.SortFunc(ng.Servers, func(a, b *shardkvpb.Server) int { return cmp.Compare(a.Id, b.Id) })
	return ng
}
