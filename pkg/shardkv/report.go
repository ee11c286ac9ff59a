package shardkv

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// report sends the group's status to the controller leader (soft state).
func (g *Group) report(ctx context.Context) {
	if g.cfg.Ctrler == nil || ctx == nil {
		return
	}
	st := g.r.StatusProto()
	// The leader's other client address (a Redis one) is data the process
	// added to the engine's status (raftgroup.Config.AnnotateStatus); the
	// group only passes it on, for status readers, and never interprets it.
	rep := &shardkvpb.GroupReport{Gid: g.sm.gid, LeaderId: st.Id, LeaderAddr: st.Addr, LeaderRespAddr: st.RespAddr,
		Term: st.Term, ConfigNum: g.sm.Config().Num, Shards: g.shardStates(), Members: st.Members, AppliedIndex: st.Applied,
		MigrateBytesPerSec: uint64(g.cfg.MigrateBytesPerSec)}
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := g.cfg.Ctrler.Report(rctx, rep); err != nil && !errors.Is(err, context.Canceled) {
		g.log.Debug("report to controller", "err", err)
	}
}

// shardStates lists the shards that are not simply unowned, by shard.
func (g *Group) shardStates() []*shardkvpb.ShardState {
	shards := g.sm.Shards()
	ids := make([]int, 0, len(shards))
	for s := range shards {
		ids = append(ids, s)
	}
	slices.Sort(ids)
	var out []*shardkvpb.ShardState
	for _, s := range ids {
		m := shards[s]
		st := &shardkvpb.ShardState{Shard: uint32(s), State: string(m.State), ConfigNum: m.Config, Keys: m.Keys, Bytes: m.Bytes, PeerGid: m.Peer,
			TotalKeys: m.Total, TotalBytes: m.TotalBytes, CaughtUp: m.CaughtUp, LagEntries: m.Lag, WritePauseUs: m.PauseUs}
		if m.copying() {
			st.Phase = "snapshot"
			if m.Delta {
				st.Phase = "delta"
			}
		}
		out = append(out, st)
	}
	return out
}
