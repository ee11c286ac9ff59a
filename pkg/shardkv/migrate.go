package shardkv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/shardkv/shardkv/pkg/raftgroup"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// run keeps comparing the desired state (the controller's configs) with the
// actual one (the replicated shard states) and takes the next step toward
// it, as long as this replica leads. Every step is idempotent and retried
// until it takes, so lost RPCs, leader changes and restarts of either side
// only delay it.
func (g *Group) run() {
	defer g.wg.Done()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var lead struct {
		ctx    context.Context
		cancel context.CancelFunc
	}
	var (
		leading       bool
		tasks         = map[string]context.CancelFunc{}
		pullPeer      = map[string]uint64{} // running pull task -> source gid
		lastReport    time.Time
		lastExpire    = time.Now()
		lastCollect   time.Time
		lastKeyExpire time.Time
		taskDone      = make(chan string, 64)
		stepPending   bool
		stepDone      = make(chan stepOutcome, 1)
		refused       stepRefusal // the last step apply refused, while it holds us back
	)
	stopLeading := func() {
		if lead.cancel != nil {
			lead.cancel()
		}
		for _, c := range tasks {
			c()
		}
		clear(tasks)
		clear(pullPeer)
		g.clearFinals() // a new term may have dropped the entries
		leading = false
	}
	defer stopLeading()
	// Only a leader ticks; a follower wakes when its role changes (or its
	// state does), so an idle follower costs no timer wake-ups.
	var tickC <-chan time.Time
	roleC := g.r.RoleChanged()
	for {
		select {
		case <-g.ctx.Done():
			return
		case <-tickC:
		case <-roleC:
		case <-g.sm.Changed():
		case <-g.announced:
		case name := <-taskDone:
			delete(tasks, name)
			delete(pullPeer, name)
		case o := <-stepDone:
			stepPending = false
			refused.record(g, o)
		}
		roleC = g.r.RoleChanged() // before the check: no change is missed
		if !g.r.IsLeader() {
			if leading {
				stopLeading()
			}
			tickC = nil
			continue
		}
		tickC = tick.C
		if !leading {
			leading = true
			lead.ctx, lead.cancel = context.WithCancel(context.Background())
		}
		// Heartbeat to the controller.
		if time.Since(lastReport) >= g.cfg.ReportEvery {
			lastReport = time.Now()
			g.wg.Add(1)
			go func() {
				defer g.wg.Done()
				g.report(lead.ctx)
			}()
		}
		if _, running := tasks["expire-keys"]; !running && time.Since(lastKeyExpire) >= g.cfg.ExpireKeysEvery {
			lastKeyExpire = time.Now()
			if g.expiryDue() {
				g.spawn(lead.ctx, tasks, taskDone, "expire-keys", func(ctx context.Context) {
					ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
					defer cancel()
					// One entry deletes at most ExpireKeysBatch keys and
					// maintBytes (a few long keys): go on while it deleted
					// some and more are due.
					for {
						res, err := g.propose(ctx, &shardkvpb.GroupCommand{ExpireKeys: true})
						if n, _ := res.(int); err != nil || n == 0 || !g.expiryDue() {
							return
						}
					}
				})
			}
		}
		if _, running := tasks["collect"]; !running && g.sm.deadPending.Load() && time.Since(lastCollect) >= g.cfg.ExpireKeysEvery {
			lastCollect = time.Now()
			g.spawn(lead.ctx, tasks, taskDone, "collect", func(ctx context.Context) {
				for {
					res, err := g.propose(ctx, &shardkvpb.GroupCommand{CollectDead: true})
					if more, _ := res.(moreWork); err != nil || !bool(more) {
						return
					}
				}
			})
		}
		if _, running := tasks["expire"]; !running && time.Since(lastExpire) >= g.cfg.ExpireEvery {
			lastExpire = time.Now()
			g.spawn(lead.ctx, tasks, taskDone, "expire", func(ctx context.Context) {
				// Go on while an entry stopped at its bounds with work left.
				for {
					res, err := g.propose(ctx, &shardkvpb.GroupCommand{ExpireSessions: true})
					if more, _ := res.(moreWork); err != nil || !bool(more) {
						return
					}
				}
			})
		}
		// Step to the next config when nothing it changes is moving, unless
		// apply just refused that very step (refused.holds).
		if !stepPending {
			if next := g.nextKnown(); next != nil && g.sm.CanStep(next) && !refused.holds(g.sm.Config().Num, next.Num) {
				stepPending = true
				from := g.sm.Config().Num
				g.wg.Add(1)
				go func() {
					defer g.wg.Done()
					ctx, cancel := context.WithTimeout(lead.ctx, 5*time.Second)
					defer cancel()
					o := stepOutcome{from: from, to: next.Num}
					res, err := g.propose(ctx, &shardkvpb.GroupCommand{NextConfig: next})
					if err == nil {
						o.refused, _ = res.(error) // refused at apply (stale or early)
					}
					switch {
					case err != nil:
						g.log.Debug("proposing next config", "num", next.Num, "err", err)
					case o.refused == nil:
						g.log.Info("stepped to config", "num", next.Num)
					}
					stepDone <- o
				}()
			}
		}
		// One task per moving shard, at most PullConcurrency pulls per
		// source group.
		pulls := map[uint64]int{}
		for name := range tasks {
			if peer, ok := pullPeer[name]; ok {
				pulls[peer]++
			}
		}
		shards := g.sm.Shards()
		var ids []int
		for s, m := range shards {
			if m.State != Serving || m.TrimBelow != 0 { // nearly every shard, every tick, has nothing to run
				ids = append(ids, s)
			}
		}
		slices.Sort(ids)
		for _, s := range ids {
			m := shards[s]
			name := fmt.Sprintf("%s/%d/%d", m.State, s, m.Config)
			if _, ok := tasks[name]; ok {
				continue
			}
			switch m.State {
			case Pulling, PreCopying:
				// The last round of a pre-copied shard, whose writes wait
				// behind the barrier, never waits for a slot.
				final := m.State == Pulling && m.Delta
				if !final && pulls[m.Peer] >= g.cfg.PullConcurrency {
					continue
				}
				pulls[m.Peer]++
				pullPeer[name] = m.Peer
				g.spawn(lead.ctx, tasks, taskDone, name, func(ctx context.Context) { g.pull(ctx, s, m) })
			case Serving:
				if m.TrimBelow != 0 {
					g.spawn(lead.ctx, tasks, taskDone, name, func(ctx context.Context) { g.trim(ctx, s, m) })
				}
			case Acking:
				g.spawn(lead.ctx, tasks, taskDone, name, func(ctx context.Context) { g.confirm(ctx, s, m) })
			case GCing:
				g.spawn(lead.ctx, tasks, taskDone, name, func(ctx context.Context) { g.gc(ctx, s, m) })
			}
		}
	}
}

// stepOutcome is how a proposed config step ended: refused is apply's
// refusal (nil if it applied, or if the proposal itself failed).
type stepOutcome struct {
	from, to uint64
	refused  error
}

// stepRefusal keeps the leader from proposing again, at once, a step that
// apply refused. nextKnown offers only steps apply accepts (stepPlan) and
// CanStep checks what apply checks, so a refusal means the two disagree
// (a race with another leader's step, or a bug): each entry is an fsync
// on every replica, and proposing in a loop once made a group apply
// 200,000 refused entries in minutes. The same step from the same config
// is retried after a doubling delay, from 100 ms up to 10 s; the first
// refusal is logged as a warning, the repeats at debug level.
type stepRefusal struct {
	from, to uint64
	delay    time.Duration
	until    time.Time
}

const (
	stepRetryMin = 100 * time.Millisecond
	stepRetryMax = 10 * time.Second
)

func (r *stepRefusal) record(g *Group, o stepOutcome) {
	if o.refused == nil {
		return // applied, or not decided (the proposal failed): no delay
	}
	if g.sm.Config().Num != o.from {
		// Stale: the group stepped meanwhile (an earlier leader's step,
		// applied before this one). Nothing holds the next step back.
		g.log.Debug("config step refused at apply: stale", "from", o.from, "to", o.to, "err", o.refused)
		return
	}
	if r.delay != 0 && r.from == o.from && r.to == o.to {
		r.delay = min(2*r.delay, stepRetryMax)
		g.log.Debug("config step refused at apply again", "from", o.from, "to", o.to, "err", o.refused, "retry_in", r.delay)
	} else {
		r.from, r.to, r.delay = o.from, o.to, stepRetryMin
		g.log.Warn("config step refused at apply; retrying with backoff", "from", o.from, "to", o.to, "err", o.refused)
	}
	r.until = time.Now().Add(r.delay)
}

// holds reports whether the step from `from` to `to` waits after a refusal.
func (r *stepRefusal) holds(from, to uint64) bool {
	return r.delay != 0 && r.from == from && r.to == to && time.Now().Before(r.until)
}

func (g *Group) spawn(parent context.Context, tasks map[string]context.CancelFunc, done chan<- string, name string, f func(context.Context)) {
	ctx, cancel := context.WithCancel(parent)
	tasks[name] = cancel
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		defer cancel()
		f(ctx)
		select {
		case done <- name:
		case <-g.ctx.Done():
		}
	}()
}

func backoff(ctx context.Context, d *time.Duration) bool {
	sleep := *d/2 + rand.N(*d/2+1)
	*d = min(2**d, 2*time.Second)
	select {
	case <-ctx.Done():
		return false
	case <-time.After(sleep):
		return true
	}
}

// shardTask runs step while shard s is still in m's state for m's config,
// until step says it is done, retrying its errors with jittered backoff. A
// task's only state is the replicated shard state (cur), so lost RPCs,
// leader changes and restarts of either side only delay it.
func (g *Group) shardTask(ctx context.Context, s int, m ShardMeta, step func(cur ShardMeta) (done bool, err error)) {
	delay := 20 * time.Millisecond
	for ctx.Err() == nil {
		cur := g.sm.Shard(s)
		if cur.State != m.State || cur.Config != m.Config {
			return
		}
		done, err := step(cur)
		if done {
			return
		}
		if err == nil {
			delay = 20 * time.Millisecond
			continue
		}
		g.log.Debug("shard task", "state", m.State, "shard", s, "config", m.Config, "peer", m.Peer, "err", err)
		if !backoff(ctx, &delay) {
			return
		}
	}
}

// errIdleRound: a round of changes found nothing new; the copy waits a
// little before the next.
var errIdleRound = errors.New("no changes since the last round")

// idleRoundWait is the pause between rounds of changes that found nothing:
// it bounds how far a caught-up copy falls behind (what the cut-over's last
// round must carry) at one cheap read of the source per interval.
const idleRoundWait = 20 * time.Millisecond

// pull copies shard s from its source group through the log: a snapshot in
// chunks, resuming where the log says it stopped, then rounds of changes
// since the snapshot. While PreCopying (the source still serves the shard),
// the rounds go on until the controller cuts over; once Pulling (the source
// froze it), the last round carries the dedup table and ends the copy.
func (g *Group) pull(ctx context.Context, s int, m ShardMeta) {
	g.shardTask(ctx, s, m, func(ShardMeta) (bool, error) {
		err := g.callGroup(ctx, m.Peer, func(cctx context.Context, cl shardkvpb.KVClient) error {
			return g.pullRound(ctx, cctx, cl, s, m)
		})
		if errors.Is(err, errIdleRound) {
			select {
			case <-ctx.Done():
			case <-time.After(idleRoundWait):
			}
			return false, nil
		}
		return false, err
	})
}

// pullRound streams one FetchShard call from where the log says the copy
// stands (read afresh: callGroup retries it on another replica after an
// attempt times out): the rest of the snapshot, or one round of changes.
// Each entry it proposes continues from the position the previous one of
// this stream reached; if the log is elsewhere (a duplicate, or another
// leader's stream, got there first) the entry is refused as stale and the
// stream starts again from the log's position.
func (g *Group) pullRound(ctx, cctx context.Context, cl shardkvpb.KVClient, s int, m ShardMeta) error {
	cur := g.sm.Shard(s)
	if cur.State != m.State || cur.Config != m.Config {
		return nil
	}
	precopy := m.State == PreCopying
	req := &shardkvpb.FetchShardRequest{Shard: uint32(s), ConfigNum: m.Config, Gid: g.sm.gid, Precopy: precopy}
	if cur.Delta {
		req.Delta, req.Cursor, req.SessionsSince = true, cur.Cursor, cur.SessionsAt
	} else {
		req.AfterKey, req.Resume = cur.Resume, cur.Resumed
	}
	stream, err := cl.FetchShard(cctx, req)
	if err != nil {
		return err
	}
	after, resumed, cursor := req.AfterKey, req.Resume, req.Cursor // this stream's position
	for {
		chunk, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if at := g.sm.Shard(s); at.State != m.State || at.Config != m.Config {
			return nil
		}
		// The copy rate limit holds for everything but the last round,
		// which the shard's writes wait for.
		if precopy || !cur.Delta {
			if err := g.throttle(ctx, chunk); err != nil {
				return err
			}
		}
		if req.Delta {
			if !chunk.Last && bytes.Equal(chunk.NextCursor, cursor) && chunk.CaughtUp == g.sm.Shard(s).CaughtUp && g.sm.holdsSessions(chunk.Kvs) {
				return errIdleRound // nothing to write down
			}
			if err := g.install(ctx, s, m, &shardkvpb.InsertChunk{Precopy: precopy, Delta: true, Cursor: cursor, NextCursor: chunk.NextCursor,
				Kvs: chunk.Kvs, Last: chunk.Last, CaughtUp: chunk.CaughtUp, SourceIndex: chunk.SourceIndex, FrozeAtNs: chunk.FrozeAtNs, LogTimeNs: chunk.LogTimeNs,
				SessionsAt: chunk.SessionsAt}); err != nil {
				return err
			}
			cursor = chunk.NextCursor
			if chunk.Last {
				g.log.Info("shard installed", "shard", s, "config", m.Config, "from", m.Peer)
			}
			continue
		}
		pieces := installPieces(chunk.Kvs, after, g.r.MaxCommandBytes())
		for i, kvs := range pieces {
			err := g.install(ctx, s, m, &shardkvpb.InsertChunk{Precopy: precopy, AfterKey: after, Resume: resumed,
				Kvs: kvs, Last: chunk.Last && i == len(pieces)-1, TotalKeys: chunk.TotalKeys, TotalBytes: chunk.TotalBytes,
				SourceIndex: chunk.SourceIndex, LogTimeNs: chunk.LogTimeNs})
			if errors.Is(err, errChunkCut) {
				return nil // installed up to the log's resume point: pull again from there
			} else if err != nil {
				return err
			}
			if len(kvs) > 0 {
				after, resumed = kvs[len(kvs)-1].Key, true
			}
		}
		if chunk.Last {
			return nil // the snapshot is in: rounds of changes next
		}
	}
}

// install proposes one install entry of shard s (a piece of a snapshot
// chunk, or a chunk of a round of changes); ins names the position it
// continues from.
func (g *Group) install(ctx context.Context, s int, m ShardMeta, ins *shardkvpb.InsertChunk) error {
	ins.Shard, ins.ConfigNum = uint32(s), m.Config
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var appended func()
	if ins.Delta && ins.Last && !ins.Precopy {
		appended = func() { g.markFinal(s, m.Config) } // releases the held writes
	}
	v, err := g.proposeNotify(pctx, &shardkvpb.GroupCommand{Insert: ins}, appended)
	if raftgroup.IsTooLarge(err) {
		// Only a record above the entry limit (written under a larger
		// limit than this replica's) gets here: say so, the pull retries.
		g.log.Error("a record of the shard exceeds the log entry limit; raise the limit to move it",
			"shard", s, "config", m.Config, "from", m.Peer, "err", err)
	}
	if err != nil {
		return err
	}
	if e, ok := v.(error); ok {
		return e // stale: the stream starts again from the log's position
	}
	return nil
}

// confirm tells the old owner we hold the shard, then serves it plainly.
func (g *Group) confirm(ctx context.Context, s int, m ShardMeta) {
	g.shardTask(ctx, s, m, func(ShardMeta) (bool, error) {
		err := g.callGroup(ctx, m.Peer, func(cctx context.Context, cl shardkvpb.KVClient) error {
			_, err := cl.ShardInstalled(cctx, &shardkvpb.ShardInstalledRequest{Shard: uint32(s), ConfigNum: m.Config, Gid: g.sm.gid})
			return err
		})
		if err != nil {
			return false, err
		}
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err = g.propose(pctx, &shardkvpb.GroupCommand{Acked: &shardkvpb.ShardRef{Shard: uint32(s), ConfigNum: m.Config}})
		return err == nil, err
	})
}

// trim deletes a cancelled move's change index entries through the log.
func (g *Group) trim(ctx context.Context, s int, m ShardMeta) {
	g.shardTask(ctx, s, m, func(cur ShardMeta) (bool, error) {
		if cur.TrimBelow == 0 {
			return true, nil
		}
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := g.propose(pctx, &shardkvpb.GroupCommand{TrimChanges: &shardkvpb.ShardRef{Shard: uint32(s), ConfigNum: m.Config}})
		return false, err
	})
}

// gcGrace is how long a handed-off shard waits before its deletion
// starts. Nothing waits for the space back, while the moments after a
// cut-over do wait for CPU: the new owner's followers apply the last round
// (their acks hold up the shard's first writes there) and the clients
// reroute. Deleting at once competed with both on small machines.
const gcGrace = time.Second

// gc deletes a handed-off shard in bounded chunks through the log.
func (g *Group) gc(ctx context.Context, s int, m ShardMeta) {
	select {
	case <-ctx.Done():
		return
	case <-time.After(gcGrace):
	}
	g.shardTask(ctx, s, m, func(ShardMeta) (bool, error) {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := g.propose(pctx, &shardkvpb.GroupCommand{DeleteChunk: &shardkvpb.ShardRef{Shard: uint32(s), ConfigNum: m.Config}})
		return false, err
	})
}
