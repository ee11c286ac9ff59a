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
func nextConfig(latest *shardkvpb.Config, nshards int, strategy placement.Strategy, cmd *shardkvpb.ControllerCommand) (*shardkvpb.Config, error) {
	if err := checkRequest(cmd); err != nil {
		return nil, err
	}
	next := proto.Clone(latest).(*shardkvpb.Config)
	next.Num = latest.Num + 1
	joining := map[uint64]bool{}
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
				// servers and weight (documented in docs/controller.md).
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
			if !slices.ContainsFunc(next.Groups, func(x *shardkvpb.Group) bool { return x.Gid == gid }) {
				return nil, refuse("leave: gid %d is not in config %d", gid, latest.Num)
			}
		}
		next.Groups = slices.DeleteFunc(next.Groups, func(x *shardkvpb.Group) bool { return slices.Contains(gids, x.Gid) })
		if len(next.Groups) == 0 {
			return nil, refuse("leave: refused, no group would remain to hold the data (config %d has %d groups)", latest.Num, len(latest.Groups))
		}
		next.Pins = slices.DeleteFunc(next.Pins, func(p *shardkvpb.Pin) bool { return slices.Contains(gids, p.Gid) })
	case *shardkvpb.ControllerCommand_Move:
		shard, gid := op.Move.GetShard(), op.Move.GetGid()
		if int(shard) >= nshards {
			return nil, refuse("move: shard %d is out of range [0, %d)", shard, nshards)
		}
		if gid == 0 || !slices.ContainsFunc(next.Groups, func(x *shardkvpb.Group) bool { return x.Gid == gid }) {
			return nil, refuse("move: gid %d is not in config %d", gid, latest.Num)
		}
		i := slices.IndexFunc(next.Pins, func(p *shardkvpb.Pin) bool { return p.Shard == shard })
		if i >= 0 && next.Pins[i].Gid == gid {
			return nil, nil
		}
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
	var gs []placement.Group
	for _, g := range next.Groups {
		gs = append(gs, placement.Group{GID: g.Gid, Weight: g.Weight, Joining: joining[g.Gid]})
	}
	pins := make([]uint64, nshards)
	for _, p := range next.Pins {
		pins[p.Shard] = p.Gid
	}
	next.Shards = placement.Assign(strategy, latest.Shards, gs, pins)
	if n := proto.Size(next); n > MaxConfigBytes {
		return nil, refuse("the config would take %d bytes, over the %d limit", n, MaxConfigBytes)
	}
	return next, nil
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
	slices.SortFunc(ng.Servers, func(a, b *shardkvpb.Server) int { return cmp.Compare(a.Id, b.Id) })
	return ng
}
