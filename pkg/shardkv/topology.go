package shardkv

import (
	"context"
	"fmt"
	"maps"
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
		g.checkStranded()
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
// announced it and the group may step to it (stepPlan).
func (g *Group) nextKnown() *shardkvpb.Config {
	next, _ := g.stepPlan()
	return next
}

// Stranded is why the group cannot step to its next config ("" if it
// can): see stepPlan. Every replica knows it from its own watch.
func (g *Group) Stranded() string {
	_, why := g.stepPlan()
	return why
}

// stepPlan is the config to step to next, if one is known that apply's
// nextConfig takes as following ours (stepFollows; whether the shards it
// changes are settled is CanStep's part), or why the group can never step
// (stranded).
//
// The watch delivers every config after ours in order, skipping only those
// the controller has compacted; so if the lowest config known past ours is
// not ours+1, the configs in between are gone. The group may jump the gap
// only if it owns nothing on either side (stepFollows says why that is
// safe). Otherwise it is stranded, and stays so: the controller drops a
// config only once every group of the kept configs has reported applying
// it, so this group once stood past the gap and its state has gone back
// since (every replica's disk lost, or restored from an old copy). What it
// held after the gap is lost, or is now held by others: stepping through
// the gap is impossible (the configs are gone) and jumping it would serve
// the shards it owns after the gap empty, or stale ones it owns before it
// (it may have handed them off since). It must not step, and must not
// serve (route): an operator decides what becomes of the shards.
func (g *Group) stepPlan() (*shardkvpb.Config, string) {
	conf := g.sm.Config()
	cur := conf.Num
	g.knownMu.Lock()
	defer g.knownMu.Unlock()
	if c, ok := g.known[cur+1]; ok {
		return c, ""
	}
	// Only configs ahead of ours: the watch prunes older ones only when a
	// new config arrives, and proposing one we have already applied (it is
	// refused at apply) made an idle group propose in a loop.
	var best *shardkvpb.Config
	for _, c := range g.known {
		if c.Num > cur && (best == nil || c.Num < best.Num) {
			best = c
		}
	}
	if best == nil {
		return nil, "" // nothing announced past ours yet
	}
	if stepFollows(g.sm.gid, conf, best) {
		return best, "" // owns nothing on either side: jumps
	}
	mine, next := ownedShards(conf, g.sm.gid), ownedShards(best, g.sm.gid)
	why := fmt.Sprintf("stranded at config %d: the controller keeps configs from %d on only (%d..%d were compacted), ", cur, best.Num, cur+1, best.Num-1)
	if len(mine) == 0 {
		why += fmt.Sprintf("and this group owns %s in config %d but holds none of them: their data was lost with this group's state (every replica's disk?)", shardList(next), best.Num)
	} else {
		why += fmt.Sprintf("and this group owns %s in config %d: its state is older than the configs it once reported (disks lost or restored?), so what it holds may be lost or stale", shardList(mine), cur)
	}
	return nil, why + "; it serves none of its shards and cannot step; an operator must decide what becomes of them"
}

func ownedShards(conf *shardkvpb.Config, gid uint64) []int {
	var out []int
	for s, o := range conf.GetShards() {
		if o == gid {
			out = append(out, s)
		}
	}
	return out
}

// shardList names shards for a status line, the first few only (a report
// stays small whatever the shard count).
func shardList(shards []int) string {
	const most = 8
	if len(shards) == 1 {
		return fmt.Sprintf("shard %d", shards[0])
	}
	if len(shards) <= most {
		return fmt.Sprintf("shards %v", shards)
	}
	return fmt.Sprintf("%d shards (%v ...)", len(shards), shards[:most])
}

// checkStranded marks the state machine stranded at its applied config
// (strandedAt) once stepPlan finds it so, and says so once, loudly. The
// verdict cannot clear while the applied config stays: known configs past
// it are only ever added.
func (g *Group) checkStranded() {
	why := g.Stranded()
	if why == "" {
		return
	}
	at := g.sm.Config().Num + 1
	if g.sm.strandedAt.Swap(at) == at {
		return
	}
	if st := g.r.Status(); st.Applied < st.Commit {
		// A replica behind its group's log (a restarted follower) sees the
		// same gap until it applies the group's later steps.
		g.log.Info("configs after this replica's were compacted; it serves nothing until it catches up with its group's log",
			"config", at-1, "applied", st.Applied, "commit", st.Commit)
		return
	}
	g.log.Error("data group cannot step to its next config", "why", why)
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
