package shardkv

import (
	"encoding/json"
	"fmt"
	"slices"

	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"google.golang.org/protobuf/proto"
)

// nextConfig steps from config N to N+1. It applies only if the group is at
// N and no shard that N+1 changes for this group is in motion (stepBlockers);
// otherwise it is a stale or early proposal and is ignored.
func (a *applyCtx) nextConfig(next *shardkvpb.Config) (any, error) {
	cur := a.config
	if !stepFollows(a.sm.gid, cur, next) {
		return fmt.Errorf("config %d does not follow %d", next.Num, cur.Num), nil
	}
	if cur.Num > 0 && len(next.Shards) != len(cur.Shards) {
		return nil, fmt.Errorf("config %d has %d shards, config %d had %d", next.Num, len(next.Shards), cur.Num, len(cur.Shards))
	}
	if busy := stepBlockers(a.sm.gid, cur, next, a.meta); len(busy) > 0 {
		return fmt.Errorf("shards still moving: %v", busy), nil
	}
	b, err := proto.Marshal(next)
	if err != nil {
		return nil, err
	}
	pb, _ := proto.Marshal(cur)
	// The step stores both configs (up to the controller's 1 MiB each, in
	// full below badger's value threshold) and the shards' new states:
	// the entries before it in the transaction may have to be committed
	// first.
	size := budget{}
	size.add(len(keyConfig), len(b))
	size.add(len(keyPrev), len(pb))
	type step struct {
		s int
		m ShardMeta
	}
	var steps []step
	for s := range next.Shards {
		m, ok := a.shardStep(s, cur, next)
		if !ok {
			continue
		}
		steps = append(steps, step{s, m})
		enc, _ := json.Marshal(m)
		size.add(len(shardMetaKey(s)), len(enc))
	}
	if err := a.room(size); err != nil {
		return nil, err
	}
	for _, st := range steps {
		if err := a.setMeta(st.s, st.m); err != nil {
			return nil, err
		}
	}
	if err := a.set(keyConfig, b); err != nil {
		return nil, err
	}
	if err := a.set(keyPrev, pb); err != nil {
		return nil, err
	}
	a.prev, a.config = cur, proto.Clone(next).(*shardkvpb.Config)
	a.changed = true
	return nil, nil
}

// stepFollows reports whether next may follow cur for group gid: it is
// cur+1, or the group jumps ahead. A group that owns nothing now and
// nothing in next may jump ahead to it: a brand-new group starting at the
// oldest config the controller keeps, or a group that left and fell behind
// while the configs it missed were compacted. It owned nothing in the
// configs it skips (the controller never drops a config that a group
// present in a kept config has not reported past), so there is nothing to
// pull or hand off. Any other gap is never jumped: the group is stranded
// (Group.stepPlan), and its leader proposes no step across it.
func stepFollows(gid uint64, cur, next *shardkvpb.Config) bool {
	idle := !slices.Contains(cur.Shards, gid) && !slices.Contains(next.Shards, gid)
	return next.Num == cur.Num+1 || (idle && next.Num > cur.Num)
}

// plannedMove is shard s's planned move in conf, if any.
func plannedMove(conf *shardkvpb.Config, s int) *shardkvpb.PlannedMove {
	for _, mv := range conf.GetMoves() {
		if int(mv.Shard) == s {
			return mv
		}
	}
	return nil
}

func owner(conf *shardkvpb.Config, s int) uint64 {
	if s < len(conf.GetShards()) {
		return conf.Shards[s]
	}
	return 0
}

// shardStep is shard s's state after stepping from cur to next, and
// whether it changes (see the state diagram in docs/shardkv.md):
//
//   - lost: Serving → BePulling (frozen: the write barrier), keeping the
//     change index position the target's copy continues from;
//   - gained from nobody: Serving; from a group: Pulling, continuing a
//     pre-copy from that group if there is one;
//   - kept, with its move out newly planned: Serving that records its
//     changes (TrackFrom); with its planned move gone (cancelled): Serving
//     that deletes them (TrimBelow); a retargeted plan keeps tracking;
//   - neither owner: a move planned here starts PreCopying; a pre-copy no
//     longer planned here is discarded (GCing deletes it).
func (a *applyCtx) shardStep(s int, cur, next *shardkvpb.Config) (ShardMeta, bool) {
	gid := a.sm.gid
	old, nw := owner(cur, s), owner(next, s)
	pn := plannedMove(next, s)
	m := a.meta(s)
	switch {
	case old == gid && nw != gid:
		return ShardMeta{State: BePulling, Config: next.Num, Peer: nw, TrackFrom: m.TrackFrom, FrozeAtNs: a.nowNS}, true
	case nw == gid && old == 0:
		return ShardMeta{State: Serving, Config: next.Num}, true
	case nw == gid && old != gid:
		if m.State == PreCopying && m.Peer == old {
			m.State, m.Config = Pulling, next.Num
			return m, true
		}
		return ShardMeta{State: Pulling, Config: next.Num, Peer: old}, true
	case old == gid: // kept
		switch {
		case pn != nil && pn.ToGid != gid && (m.TrackFrom == 0 || m.Peer != pn.ToGid):
			if m.TrackFrom == 0 {
				m.TrackFrom = a.index
			}
			m.Peer, m.Config = pn.ToGid, next.Num
			return m, true
		case pn == nil && m.TrackFrom != 0:
			m.TrimBelow, m.TrackFrom, m.Peer, m.Config = a.index, 0, 0, next.Num
			return m, true
		}
	default: // neither owner
		switch {
		case pn != nil && pn.ToGid == gid && m.State == NotOwned:
			return ShardMeta{State: PreCopying, Config: next.Num, Peer: pn.FromGid}, true
		case m.State == PreCopying && (pn == nil || pn.ToGid != gid || pn.FromGid != m.Peer):
			return ShardMeta{State: GCing, Config: next.Num}, true
		}
	}
	return m, false
}

// stepBlockers lists the shards that keep group gid from stepping from cur
// to next: only shards whose ownership or planned move next changes for
// this group, and that are in motion. A group steps on while it pulls,
// confirms or deletes shards next does not touch, and the chain of owners
// stays intact: a shard it gives away must be Serving here (so it holds
// all of it), one it gains must be NotOwned here or pre-copied from its
// owner (a copy still being deleted here must be gone first), and the
// frozen copy a puller needs is found by its shard state (BePulling for
// the pull's config), whatever config its holder has reached since.
func stepBlockers(gid uint64, cur, next *shardkvpb.Config, meta func(int) ShardMeta) []int {
	var busy []int
	for s := range next.Shards {
		old, nw := owner(cur, s), owner(next, s)
		pc, pn := plannedMove(cur, s), plannedMove(next, s)
		planChanged := !proto.Equal(pc, pn)
		m := meta(s)
		ok := true
		switch {
		case old == gid && nw != gid:
			ok = m.State == Serving
		case nw == gid && old != gid:
			ok = m.State == NotOwned || (m.State == PreCopying && m.Peer == old && old != 0)
		case old == gid:
			ok = !planChanged || m.State == Serving
		case planChanged && pn != nil && pn.ToGid == gid:
			ok = m.State == NotOwned || (m.State == PreCopying && m.Peer == pn.FromGid)
		}
		// A copy or a confirmation in progress finds its peer's replicas
		// in the current and previous configs (servers): never step to a
		// config after which neither lists the peer (a leaving group is
		// dropped from the config that cuts over its last shard).
		if (m.State == Pulling || m.State == Acking || m.State == PreCopying) && m.Peer != 0 && !hasGroup(cur, m.Peer) && !hasGroup(next, m.Peer) {
			ok = false
		}
		if !ok {
			busy = append(busy, s)
		}
	}
	return busy // in shard order: it goes into the entry's result
}

func hasGroup(conf *shardkvpb.Config, gid uint64) bool {
	return slices.ContainsFunc(conf.GetGroups(), func(g *shardkvpb.Group) bool { return g.Gid == gid })
}
