package shardkv

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/shardkv/shardkv/pkg/grpcdial"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"google.golang.org/grpc"
)

// servers lists a group's addresses in the previous and current configs
// (a shard's source may have left the group's current config).
func (g *Group) servers(gid uint64) []string {
	var addrs []string
	for _, c := range []*shardkvpb.Config{g.sm.PrevConfig(), g.sm.Config()} {
		for _, grp := range c.Groups {
			if grp.Gid == gid {
				for _, s := range grp.Servers {
					if !slices.Contains(addrs, s.Addr) {
						addrs = append(addrs, s.Addr)
					}
				}
			}
		}
	}
	return addrs
}

// callGroup calls f on gid's replicas, the last known leader first and
// following leader hints, until one succeeds or each has failed once; the
// migration tasks that call it keep their own retry loops.
func (g *Group) callGroup(ctx context.Context, gid uint64, f func(context.Context, shardkvpb.KVClient) error) error {
	err := g.peers.Round(ctx, gid, g.servers(gid), grpcdial.CallOptions{AttemptTimeout: 10 * time.Second},
		func(ctx context.Context, _ string, cc *grpc.ClientConn) error {
			return f(ctx, shardkvpb.NewKVClient(cc))
		})
	if errors.Is(err, grpcdial.ErrNoReplicas) {
		return fmt.Errorf("group %d has no known servers", gid)
	}
	return err
}
