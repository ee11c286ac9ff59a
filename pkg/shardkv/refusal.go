package shardkv

import (
	"context"
	"fmt"
	"time"

	"github.com/shardkv/shardkv/pkg/routing"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// refuse says, as facts, where a request for key that this replica does not
// execute belongs. code is the routing verdict of the replica's applied
// state (see route): OK means the shard is served here and only leadership
// is in the way (NOT_LEADER, naming the leader). Otherwise the newest config
// this replica knows from the controller decides, not the applied one: the
// shard's owner there is where the shard is going, so a client sent there
// is always sent closer to it. Deciding by the applied config made two
// groups at different configs send a client back and forth until it gave
// up: the old owner, at N+1, to the new owner, and the new owner, still at
// N (busy finishing an earlier migration), back to the old owner. So:
// another group owns it (WRONG_GROUP, naming it and its leader); none does
// (WRONG_GROUP without an owner); this group does but does not serve it yet
// (NOT_READY: the client waits here; or NOT_LEADER if needLeader and this
// replica is a follower, as the leader may serve it already).
func (g *Group) refuse(key []byte, code Code, needLeader bool) *shardkvpb.Refusal {
	applied, conf := g.sm.Config(), g.newestConfig()
	r := &shardkvpb.Refusal{ConfigNum: conf.Num, Shard: -1}
	if len(conf.Shards) == 0 {
		r.Reason, r.Msg = shardkvpb.ReasonWrongGroup, "no config yet: no group serves any shard"
		return r
	}
	s := routing.ShardOf(key, len(conf.Shards))
	owner := conf.Shards[s]
	r.Shard = s
	switch {
	case code == OK || (owner == g.sm.gid && needLeader && !g.r.IsLeader()):
		r.Reason, r.Owner = shardkvpb.ReasonNotLeader, g.sm.gid
		r.Leader, r.LeaderAddr = g.leaderHint(g.sm.gid)
		r.Msg = "not the leader of this group"
		if r.Leader == 0 {
			r.Msg = "no leader is known for this group right now"
		}
	case owner == 0:
		r.Reason, r.Msg = shardkvpb.ReasonWrongGroup, fmt.Sprintf("shard %d is not served by any group in config %d", s, conf.Num)
	case owner == g.sm.gid && g.sm.stranded():
		r.Reason, r.Msg = shardkvpb.ReasonNotReady, fmt.Sprintf("shard %d is not served: this group is %s", s, g.Stranded())
	case owner == g.sm.gid && code == NotReady && conf.Num == applied.Num:
		r.Reason, r.Msg = shardkvpb.ReasonNotReady, fmt.Sprintf("shard %d is still arriving (config %d)", s, conf.Num)
	case owner == g.sm.gid:
		r.Reason, r.Msg = shardkvpb.ReasonNotReady, fmt.Sprintf("shard %d comes to this group in config %d; this replica is at config %d", s, conf.Num, applied.Num)
	default:
		r.Reason, r.Owner = shardkvpb.ReasonWrongGroup, owner
		r.Leader, r.LeaderAddr = g.leaderHint(owner)
		r.Msg = fmt.Sprintf("shard %d is not served by this group: group %d owns it in config %d", s, owner, conf.Num)
	}
	return r
}

// leaderHint is gid's leader replica (not this one) as last known, and its
// gRPC address when known: Raft's for this group, else the controller's (a
// replica that just restarted knows no leader until the leader's first
// message; sending the client to the one the controller last heard from
// beats a retry here, and a stale one costs one more redirect); the
// controller's for the other groups.
func (g *Group) leaderHint(gid uint64) (uint64, string) {
	if gid == g.sm.gid {
		if id, addr := g.r.Leader(); id != 0 {
			if id == g.r.ID() {
				return 0, ""
			}
			return id, addr
		}
	}
	g.heardMu.Lock()
	id := g.heard[gid]
	g.heardMu.Unlock()
	if id == 0 || (gid == g.sm.gid && id == g.r.ID()) {
		return 0, ""
	}
	for _, c := range []*shardkvpb.Config{g.newestConfig(), g.sm.Config(), g.sm.PrevConfig()} {
		if s := server(c, gid, id); s != nil {
			return id, s.Addr
		}
	}
	return id, ""
}

// server is replica id of group gid in conf (nil if not listed).
func server(conf *shardkvpb.Config, gid, id uint64) *shardkvpb.Server {
	for _, grp := range conf.GetGroups() {
		if grp.Gid != gid {
			continue
		}
		for _, s := range grp.Servers {
			if s.Id == id {
				return s
			}
		}
	}
	return nil
}

// requestHold bounds how long a request waits behind a write barrier: far
// above a barrier's expected milliseconds, far below a client's timeout.
const requestHold = 500 * time.Millisecond

// routeWait is route, except that a request for a shard behind a move's
// write barrier here (this group is finishing its copy: the last round of
// changes, or the step to the cut-over config) waits up to requestHold for
// the shard to be served, rather than being refused at once into the
// client's backoff: clients see a short stall, not seconds of retries.
// A request only the leader can run (needLeader) waits only on the
// leader: a follower refuses it at once, naming the leader, so the client
// waits there instead of here and then being sent on.
func (g *Group) routeWait(ctx context.Context, key []byte, needLeader bool) Code {
	return g.hold(ctx, key, needLeader, false)
}

// writeRoute is routeWait for a write. A held write goes on as soon as
// the copy's last round is in this leader's log (finals), not once it has
// applied: the write's entry follows it, so both commit in about one
// round, and the write's apply checks the shard again.
func (g *Group) writeRoute(ctx context.Context, key []byte) Code {
	return g.hold(ctx, key, true, true)
}

func (g *Group) hold(ctx context.Context, key []byte, needLeader, write bool) Code {
	s, code := g.sm.route(key)
	if code == OK {
		return OK
	}
	var deadline <-chan time.Time
	for {
		if needLeader && !g.r.IsLeader() {
			return code
		}
		changed, finalc := g.sm.Changed(), g.finalsChanged()
		m := g.sm.Shard(s)
		final := m.State == Pulling && m.Delta
		if write && final && g.finalAppended(s, m.Config) {
			return OK
		}
		arriving := final || (m.State == PreCopying && m.CaughtUp && owner(g.newestConfig(), s) == g.sm.gid)
		if !arriving {
			return code
		}
		if deadline == nil {
			t := time.NewTimer(requestHold)
			defer t.Stop()
			deadline = t.C
		}
		select {
		case <-changed:
		case <-finalc:
		case <-ctx.Done():
			return code
		case <-deadline:
			return code
		}
		if s, code = g.sm.route(key); code == OK {
			return OK
		}
	}
}

// markFinal records that the last round of shard s's copy for config num
// is in this leader's log.
func (g *Group) markFinal(s int, num uint64) {
	g.finalMu.Lock()
	g.finals[s] = num
	close(g.finalc)
	g.finalc = make(chan struct{})
	g.finalMu.Unlock()
}

// clearFinals forgets the last rounds this replica put in its log, when
// it stops leading: a later term may not have them.
func (g *Group) clearFinals() {
	g.finalMu.Lock()
	clear(g.finals)
	g.finalMu.Unlock()
}

func (g *Group) finalAppended(s int, num uint64) bool {
	g.finalMu.Lock()
	defer g.finalMu.Unlock()
	n, ok := g.finals[s]
	return ok && n == num
}

func (g *Group) finalsChanged() <-chan struct{} {
	g.finalMu.Lock()
	defer g.finalMu.Unlock()
	return g.finalc
}
