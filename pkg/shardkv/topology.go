package shardkv

import (
	"context"
	"maps"
	"slices"
	"time"

	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// Topology is what this replica knows of the cluster beyond its replicated
// state, as facts for a front end that tells its clients where to go
// (pkg/resp renders it as its protocol's cluster topology). Soft state: a stale
// leader costs a client one more redirect.
type Topology struct {
	GID, ReplicaID uint64
	// Leads: this replica is its group's leader, as Raft says.
	Leads bool
	// Applied is the config this replica has applied; Newest the newest it
	// knows from the controller (Applied if none is newer), by which its
	// refusals send clients on (see refuse).
	Applied, Newest *shardkvpb.Config
	// Leaders maps a gid to its leader replica as last known: Raft's for
	// this group (else the controller's), the controller's for the others
	// (GroupConfig.TrackLeaders). Absent: unknown.
	Leaders map[uint64]uint64
}

// Topology returns what this replica knows of the cluster now.
func (g *Group) Topology() Topology {
	conf := g.sm.Config()
	id, _ := g.r.Leader()
	t := Topology{GID: g.sm.gid, ReplicaID: g.r.ID(), Leads: id == g.r.ID(), Applied: conf, Newest: g.newestConfig()}
	g.heardMu.Lock()
	t.Leaders = maps.Clone(g.heard)
	g.heardMu.Unlock()
	if t.Leaders == nil {
		t.Leaders = map[uint64]uint64{}
	}
	if id != 0 {
		t.Leaders[g.sm.gid] = id
	}
	return t
}

// watchConfigs keeps the controller's configs newer than the applied one,
// on every replica and for the replica's lifetime: the leader steps through
// them (nextKnown), and every replica decides where to send a request it
// does not serve by the newest (refuse): a follower's refusals must be as
// current as its leader's.
func (g *Group) watchConfigs() {
	defer g.wg.Done()
	if g.cfg.Ctrler == nil {
		return
	}
	for conf := range g.cfg.Ctrler.Watch(g.ctx, g.sm.Config().Num+1) {
		g.knownMu.Lock()
		g.known[conf.Num] = conf
		if g.newest == nil || conf.Num > g.newest.Num {
			g.newest = conf
		}
		cur := g.sm.Config().Num
		for n := range g.known {
			if n <= cur {
				delete(g.known, n)
			}
		}
		g.knownMu.Unlock()
		select {
		case g.announced <- struct{}{}:
		default:
		}
	}
}

// newestConfig is the newest config this replica knows: the controller's
// newest it has heard of, or its applied one if that is as new.
func (g *Group) newestConfig() *shardkvpb.Config {
	applied := g.sm.Config()
	g.knownMu.Lock()
	defer g.knownMu.Unlock()
	if g.newest == nil || g.newest.Num <= applied.Num {
		return applied
	}
	return g.newest
}

// nextKnown is the config the leader steps to next, if the controller has
// announced it.
func (g *Group) nextKnown() *shardkvpb.Config {
	cur := g.sm.Config().Num
	g.knownMu.Lock()
	defer g.knownMu.Unlock()
	if c, ok := g.known[cur+1]; ok {
		return c
	}
	if !slices.Contains(g.sm.Config().Shards, g.sm.gid) {
		// A group that owns nothing (new, or left and fell behind) may
		// start from the oldest config the controller still has (see
		// nextConfig for why that is safe).
		// Only configs ahead of ours: the watch prunes older ones only when
		// a new config arrives, and proposing one we have already applied
		// (it is refused at apply) made an idle group propose in a loop.
		var best *shardkvpb.Config
		for _, c := range g.known {
			if c.Num > cur && (best == nil || c.Num < best.Num) {
				best = c
			}
		}
		return best
	}
	return nil
}

// LeaderPollInterval is how often a replica that tracks leaders
// (GroupConfig.TrackLeaders) asks the controller for every group's leader:
// a front end names another group's new leader at most this long after the
// controller heard of it.
const LeaderPollInterval = time.Second

// trackLeaders keeps every group's leader as the controller last heard of
// it (its status), for refusals and Topology (soft state: a stale leader
// only costs a client one more redirect).
func (g *Group) trackLeaders() {
	defer g.wg.Done()
	if g.cfg.Ctrler == nil {
		return
	}
	t := time.NewTicker(LeaderPollInterval)
	defer t.Stop()
	for {
		ctx, cancel := context.WithTimeout(g.ctx, 2*time.Second)
		st, err := g.cfg.Ctrler.StatusStale(ctx) // soft state: no read barrier
		cancel()
		if err == nil {
			m := map[uint64]uint64{}
			for _, gs := range st.Groups {
				if r := gs.GetReport(); r != nil && r.LeaderId != 0 {
					m[r.Gid] = r.LeaderId
				}
			}
			g.heardMu.Lock()
			g.heard = m
			g.heardMu.Unlock()
		}
		select {
		case <-g.ctx.Done():
			return
		case <-t.C:
		}
	}
}
