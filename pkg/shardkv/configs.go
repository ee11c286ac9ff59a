package shardkv

import (
	"fmt"
	"slices"

	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"google.golang.org/protobuf/proto"
)

// nextConfig steps from config N to N+1. It applies only if the group is at
// N and no shard is in motion; otherwise it is a stale or early proposal and
// is ignored.
func (a *applyCtx) nextConfig(next *shardkvpb.Config) (any, error) {
	cur := a.config
	// A group that owns nothing now and nothing in `next` may jump ahead to
	// it: a brand-new group starting at the oldest config the controller
	// keeps, or a group that left and fell behind while the configs it
	// missed were compacted. It owned nothing in the configs it skips (the
	// controller never drops a config that a group present in a kept config
	// has not reported past), so there is nothing to pull or hand off.
	idle := !slices.Contains(cur.Shards, a.sm.gid) && !slices.Contains(next.Shards, a.sm.gid)
	if next.Num != cur.Num+1 && !(idle && next.Num > cur.Num) {
		return fmt.Errorf("config %d does not follow %d", next.Num, cur.Num), nil
	}
	if cur.Num > 0 && len(next.Shards) != len(cur.Shards) {
		return nil, fmt.Errorf("config %d has %d shards, config %d had %d", next.Num, len(next.Shards), cur.Num, len(cur.Shards))
	}
	if busy := a.busyShards(); len(busy) > 0 {
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
	gid := a.sm.gid
	for s, newOwner := range next.Shards {
		var oldOwner uint64
		if len(cur.Shards) > 0 {
			oldOwner = cur.Shards[s]
		}
		var m ShardMeta
		switch {
		case oldOwner == gid && newOwner == gid:
			continue
		case oldOwner == gid:
			m = ShardMeta{State: BePulling, Config: next.Num, Peer: newOwner}
		case newOwner == gid && oldOwner == 0:
			m = ShardMeta{State: Serving, Config: next.Num} // brand new: nothing to pull
		case newOwner == gid:
			m = ShardMeta{State: Pulling, Config: next.Num, Peer: oldOwner}
		default:
			continue
		}
		steps = append(steps, step{s, m})
		size.add(len(shardMetaKey(s)), 256) // a meta without a resume key
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

func (a *applyCtx) busyShards() []int {
	var busy []int
	a.sm.mu.RLock()
	for s, m := range a.sm.shards {
		if _, staged := a.metas[s]; !staged && m.State != Serving {
			busy = append(busy, s)
		}
	}
	a.sm.mu.RUnlock()
	for s, m := range a.metas {
		if m.State != Serving && m.State != NotOwned {
			busy = append(busy, s)
		}
	}
	slices.Sort(busy) // it goes into the entry's result: the same on every replica
	return busy
}
