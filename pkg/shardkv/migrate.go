package shardkv

import (
	"context"
	"errors"
	"fmt"
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
		lastKeyExpire time.Time
		taskDone      = make(chan string, 64)
		stepPending   bool
		stepDone      = make(chan struct{}, 1)
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
		leading = false
	}
	defer stopLeading()
	for {
		select {
		case <-g.ctx.Done():
			return
		case <-tick.C:
		case <-g.sm.Changed():
		case name := <-taskDone:
			delete(tasks, name)
			delete(pullPeer, name)
		case <-stepDone:
			stepPending = false
		}
		if !g.r.IsLeader() {
			if leading {
				stopLeading()
			}
			continue
		}
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
		// Step to the next config when nothing is moving.
		if !stepPending && g.sm.Stable() {
			if next := g.nextKnown(); next != nil {
				stepPending = true
				g.wg.Add(1)
				go func() {
					defer g.wg.Done()
					ctx, cancel := context.WithTimeout(lead.ctx, 5*time.Second)
					defer cancel()
					res, err := g.propose(ctx, &shardkvpb.GroupCommand{NextConfig: next})
					if err == nil {
						err, _ = res.(error) // refused at apply (stale or early)
					}
					if err != nil {
						g.log.Debug("proposing next config", "num", next.Num, "err", err)
					} else {
						g.log.Info("stepped to config", "num", next.Num)
					}
					stepDone <- struct{}{}
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
		ids := make([]int, 0, len(shards))
		for s := range shards {
			ids = append(ids, s)
		}
		slices.Sort(ids)
		for _, s := range ids {
			m := shards[s]
			name := fmt.Sprintf("%s/%d/%d", m.State, s, m.Config)
			if _, ok := tasks[name]; ok {
				continue
			}
			switch m.State {
			case Pulling:
				if pulls[m.Peer] >= g.cfg.PullConcurrency {
					continue
				}
				pulls[m.Peer]++
				pullPeer[name] = m.Peer
				g.spawn(lead.ctx, tasks, taskDone, name, func(ctx context.Context) { g.pull(ctx, s, m) })
			case Acking:
				g.spawn(lead.ctx, tasks, taskDone, name, func(ctx context.Context) { g.confirm(ctx, s, m) })
			case GCing:
				g.spawn(lead.ctx, tasks, taskDone, name, func(ctx context.Context) { g.gc(ctx, s, m) })
			}
		}
	}
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

// pull fetches shard s from its previous owner and installs it through the
// log, chunk by chunk, resuming where the log says it stopped. Each received
// chunk becomes as many install entries as the entry limit requires.
func (g *Group) pull(ctx context.Context, s int, m ShardMeta) {
	g.shardTask(ctx, s, m, func(cur ShardMeta) (bool, error) {
		return false, g.callGroup(ctx, m.Peer, func(cctx context.Context, cl shardkvpb.KVClient) error {
			stream, err := cl.FetchShard(cctx, &shardkvpb.FetchShardRequest{Shard: uint32(s), ConfigNum: m.Config, Gid: g.sm.gid, AfterKey: cur.Resume, Resume: cur.Resumed})
			if err != nil {
				return err
			}
			for {
				chunk, err := stream.Recv()
				if err != nil {
					return err
				}
				at := g.sm.Shard(s)
				if at.State != Pulling || at.Config != m.Config {
					return nil
				}
				pieces := installPieces(chunk.Kvs, at.Resume, g.r.MaxCommandBytes())
				for i, kvs := range pieces {
					if i > 0 {
						if at = g.sm.Shard(s); at.State != Pulling || at.Config != m.Config {
							return nil
						}
					}
					last := chunk.Last && i == len(pieces)-1
					if err := g.install(ctx, s, m, at, kvs, last, chunk); errors.Is(err, errChunkCut) {
						return nil // installed up to the log's resume point: pull again from there
					} else if err != nil {
						return err
					}
				}
				if chunk.Last {
					g.log.Info("shard installed", "shard", s, "config", m.Config, "from", m.Peer)
					return nil
				}
			}
		})
	})
}

// install proposes one install entry of shard s after at's resume point:
// kvs, a piece of chunk.
func (g *Group) install(ctx context.Context, s int, m, at ShardMeta, kvs []*shardkvpb.KeyValue, last bool, chunk *shardkvpb.ShardChunk) error {
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	v, err := g.propose(pctx, &shardkvpb.GroupCommand{Insert: &shardkvpb.InsertChunk{
		Shard: uint32(s), ConfigNum: m.Config, AfterKey: at.Resume, Resume: at.Resumed,
		Kvs: kvs, Last: last, TotalKeys: chunk.TotalKeys, LogTimeNs: chunk.LogTimeNs}})
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
		return e // stale: restart from the log's resume point
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

// gc deletes a handed-off shard in bounded chunks through the log.
func (g *Group) gc(ctx context.Context, s int, m ShardMeta) {
	g.shardTask(ctx, s, m, func(ShardMeta) (bool, error) {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := g.propose(pctx, &shardkvpb.GroupCommand{DeleteChunk: &shardkvpb.ShardRef{Shard: uint32(s), ConfigNum: m.Config}})
		return false, err
	})
}
