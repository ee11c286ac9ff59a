package shardkv

import (
	"context"
	"errors"
	"slices"
	"sync"
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
		MigrateBytesPerSec: uint64(g.cfg.MigrateBytesPerSec), Stranded: g.Stranded()}
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
			st.CopyBytesPerSec, st.EtaSeconds = g.copyRates.observe(s, m, time.Now())
		}
		out = append(out, st)
	}
	return out
}

// copyRates measures each copying shard's rate from its progress between
// two status reads (soft state, per replica): an exponential moving
// average, so one slow round does not swing the estimate.
type copyRates struct {
	mu  sync.Mutex
	obs map[int]rateObs
}

type rateObs struct {
	config uint64
	bytes  uint64
	at     time.Time
	rate   float64 // bytes/s
}

// observe records shard s's progress and returns its rate (bytes/s) and
// the seconds its snapshot needs at that rate (0: done, or unknown).
func (c *copyRates) observe(s int, m ShardMeta, now time.Time) (rate, eta uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.obs == nil {
		c.obs = map[int]rateObs{}
	}
	o, ok := c.obs[s]
	switch {
	case !ok || o.config != m.Config || m.Bytes < o.bytes:
		o = rateObs{config: m.Config, bytes: m.Bytes, at: now}
	case now.Sub(o.at) >= 200*time.Millisecond:
		r := float64(m.Bytes-o.bytes) / now.Sub(o.at).Seconds()
		if o.rate == 0 {
			o.rate = r
		} else {
			o.rate = 0.7*o.rate + 0.3*r
		}
		o.bytes, o.at = m.Bytes, now
	}
	c.obs[s] = o
	// Forget shards no longer copied in: the map stays as small as the
	// moves in flight.
	for k, v := range c.obs {
		if now.Sub(v.at) > time.Minute {
			delete(c.obs, k)
		}
	}
	if o.rate >= 1 && !m.Delta && m.TotalBytes > m.Bytes {
		eta = uint64((float64(m.TotalBytes-m.Bytes) / o.rate) + 0.999)
	}
	return uint64(o.rate), eta
}
