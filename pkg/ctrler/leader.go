package ctrler

import (
	"context"
	"math"
	"time"

	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// The leader's own duties: propose the cluster's first config, and
// periodically compact the history no group needs any more.

func (s *Server) background() {
	defer s.wg.Done()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	lastCompact := time.Now()
	for {
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

// initCommand is the cluster's first entry, from this replica's settings.
// A shard count that does not fit the entry becomes one init refuses too.
func initCommand(shards int, placement string) *shardkvpb.ControllerCommand {
	n := uint32(math.MaxUint32)
	if shards >= 0 && shards < math.MaxUint32 {
		n = uint32(shards)
	}
	return &shardkvpb.ControllerCommand{Op: &shardkvpb.ControllerCommand_Init{Init: &shardkvpb.ControllerInit{Shards: n, Placement: placement}}}
}
