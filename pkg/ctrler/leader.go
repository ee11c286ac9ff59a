package ctrler

import (
	"context"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"google.golang.org/protobuf/proto"
)

// The leader's own duties: propose the cluster's first config, cut over
// planned moves whose targets have caught up, and periodically compact the
// history no group needs any more.

func (s *Server) background() {
	defer s.wg.Done()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	lastCompact := time.Now()
	for {
		// A follower waits to lead with no timer running.
		if !s.r.AwaitLeading(s.stopc) {
			return
		}
		select {
		case <-s.stopc:
			return
		case <-tick.C:
		}
		if !s.r.IsLeader() {
			continue
		}
		if !s.sm.Initialized() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_, err := s.propose(ctx, initCommand(s.cfg.Shards, s.cfg.Placement))
			cancel()
			if err != nil {
				s.log.Warn("initialising the cluster", "err", err)
			}
			continue
		}
		s.maybeCutOver()
		if time.Since(lastCompact) >= s.cfg.CompactEvery {
			lastCompact = time.Now()
			s.maybeCompact()
		}
	}
}

// maybeCompact drops configs below the lowest one any group still needs.
// Groups step one config at a time, so a group that reported having applied
// config n needs nothing older. Every group present in any kept config must
// have reported, or nothing is dropped.
func (s *Server) maybeCompact() {
	oldest, latest := s.sm.Bounds()
	need := latest
	s.mu.Lock()
	reports := make(map[uint64]uint64, len(s.reports))
	for gid, rp := range s.reports {
		reports[gid] = rp.r.ConfigNum
	}
	s.mu.Unlock()
	for n := oldest; n <= latest; n++ {
		c, err := s.sm.Config(int64(n))
		if err != nil {
			return
		}
		for _, g := range c.Groups {
			got, ok := reports[g.Gid]
			if !ok {
				return
			}
			need = min(need, got)
		}
	}
	// Always propose: the same command also expires idle client sessions.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := s.propose(ctx, &shardkvpb.ControllerCommand{Op: &shardkvpb.ControllerCommand_Compact{Compact: &shardkvpb.ControllerCompact{Below: need}}}); err != nil {
		s.log.Debug("compaction proposal failed", "err", err)
	}
}

// Cut-over timing: a target's report counts if it is younger than
// cutOverReportAge, and the same set of moves is proposed again (its entry
// lost, or refused by a leader change) no sooner than cutOverRetry.
const (
	cutOverReportAge = 2 * time.Second
	cutOverRetry     = 500 * time.Millisecond
)

// PreCopyState is the ShardState.state a target group reports for a shard
// it pre-copies for a planned move (peer_gid: the source; config_num: the
// config it pre-copies for, at least the plan's since_config).
const PreCopyState = "PreCopying"

// caughtUpMoves returns the latest config's planned moves whose target's
// fresh report says its copy has caught up, in shard order.
func (s *Server) caughtUpMoves(latest *shardkvpb.Config, now time.Time) []*shardkvpb.PlannedMove {
	var out []*shardkvpb.PlannedMove
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range latest.Moves {
		rp, ok := s.reports[m.ToGid]
		if !ok || now.Sub(rp.at) >= cutOverReportAge {
			continue
		}
		for _, st := range rp.r.Shards {
			if st.Shard == m.Shard && st.State == PreCopyState && st.ConfigNum >= m.SinceConfig && st.PeerGid == m.FromGid && st.CaughtUp {
				out = append(out, proto.Clone(m).(*shardkvpb.PlannedMove))
				break
			}
		}
	}
	return out
}

// maybeCutOver proposes one cut-over entry for every planned move whose
// target has caught up. One proposal at a time; the same set is not
// proposed again within cutOverRetry.
func (s *Server) maybeCutOver() {
	if s.cutting.Load() {
		return
	}
	latest, err := s.sm.Config(-1)
	if err != nil || len(latest.Moves) == 0 {
		return
	}
	now := time.Now()
	moves := s.caughtUpMoves(latest, now)
	if len(moves) == 0 {
		return
	}
	cut := &shardkvpb.ControllerCutOver{Moves: moves}
	key := movesText(moves)
	if key == s.lastCut && now.Sub(s.lastCutAt) < cutOverRetry {
		return
	}
	s.lastCut, s.lastCutAt = key, now
	s.cutting.Store(true)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer s.cutting.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		c, err := s.propose(ctx, &shardkvpb.ControllerCommand{Op: &shardkvpb.ControllerCommand_CutOver{CutOver: cut}})
		if err != nil {
			s.log.Warn("cut-over proposal failed", "moves", movesText(moves), "err", err)
			return
		}
		var done []*shardkvpb.PlannedMove
		for _, m := range moves {
			if int(m.Shard) < len(c.GetShards()) && c.Shards[m.Shard] == m.ToGid && c.Num > latest.Num {
				done = append(done, m)
			}
		}
		if len(done) == 0 {
			s.log.Info("cut-over matched no planned move (changed meanwhile)", "moves", movesText(moves), "config", c.GetNum())
			return
		}
		s.log.Info("cut over planned moves", "config", c.Num, "moves", movesText(done))
	}()
}

// movesText is "shard 3: 1->2 (since 7), ..." for logs.
func movesText(ms []*shardkvpb.PlannedMove) string {
	var parts []string
	for _, m := range ms {
		parts = append(parts, fmt.Sprintf("shard %d: %d->%d (since %d)", m.Shard, m.FromGid, m.ToGid, m.SinceConfig))
	}
	return strings.Join(parts, ", ")
}

// initCommand is the cluster's first entry, from this replica's settings.
// A shard count that does not fit the entry becomes one init refuses too.
func initCommand(shards int, placement string) *shardkvpb.ControllerCommand {
	n := uint32(math.MaxUint32)
	if shards >= 0 && shards < math.MaxUint32 {
		n = uint32(shards)
	}
	return &shardkvpb.ControllerCommand{Op: &shardkvpb.ControllerCommand_Init{Init: &shardkvpb.ControllerInit{Shards: n, Placement: placement}}}
}
