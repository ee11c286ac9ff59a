package ctrler

import (
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"google.golang.org/protobuf/proto"
)

// Limits of one config. Apply refuses a mutation past them (a deterministic
// per-entry result, the same on every replica), and the server refuses a
// request that is past them on its own before proposing it. They keep one
// entry's apply bounded: a config is written whole at every mutation, and
// every client reads it whole (gRPC's default receive limit is 4 MiB), and
// consistent-hash placement builds VNodesPerWeight virtual nodes per unit
// of weight at every mutation (about 150 ms at MaxTotalWeight).
const (
	// MaxGroups is the most groups one config holds.
	MaxGroups = 1024
	// MaxTotalWeight bounds the sum of the weights of one config's groups
	// (a weight of 0 counts as 1).
	MaxTotalWeight = 4096
	// MaxConfigBytes bounds one encoded config, and one request.
	MaxConfigBytes = 1 << 20
	// MaxReportBytes bounds one group report (soft state the leader keeps;
	// one shard state per shard is about 20 bytes).
	MaxReportBytes = 1 << 20
	// maxStrayReports is how many reports of gids not in the latest config
	// the leader keeps (groups about to join); past it the oldest goes.
	maxStrayReports = 64
)

// checkRequest refuses what a request alone shows to be past the limits.
func checkRequest(cmd *shardkvpb.ControllerCommand) error {
	if n := proto.Size(cmd); n > MaxConfigBytes {
		return refuse("request of %d bytes, over the %d-byte config limit", n, MaxConfigBytes)
	}
	switch op := cmd.GetOp().(type) {
	case *shardkvpb.ControllerCommand_Join:
		if n := len(op.Join.GetGroups()); n > MaxGroups {
			return refuse("join: %d groups, over the limit of %d a config holds", n, MaxGroups)
		}
		var w uint64
		for _, g := range op.Join.GetGroups() {
			w += uint64(max(g.GetWeight(), 1))
		}
		if w > MaxTotalWeight {
			return refuse("join: total weight %d, over the limit of %d", w, MaxTotalWeight)
		}
	case *shardkvpb.ControllerCommand_Leave:
		if n := len(op.Leave.GetGids()); n > MaxGroups {
			return refuse("leave: %d gids, over the limit of %d a config holds", n, MaxGroups)
		}
	}
	return nil
}

// checkGroups refuses a group set past the limits, before it is placed.
func checkGroups(op string, groups []*shardkvpb.Group) error {
	if len(groups) > MaxGroups {
		return refuse("%s: the config would have %d groups, over the %d limit", op, len(groups), MaxGroups)
	}
	var w uint64
	for _, g := range groups {
		w += uint64(max(g.GetWeight(), 1))
	}
	if w > MaxTotalWeight {
		return refuse("%s: the config's groups would weigh %d in total, over the %d limit", op, w, MaxTotalWeight)
	}
	return nil
}
