package shardkv

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/shardkv/shardkv/pkg/grpcdial"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"google.golang.org/grpc"
)

func (g *Group) conn(addr string) (shardkvpb.KVClient, error) {
	g.connMu.Lock()
	defer g.connMu.Unlock()
	c, ok := g.conns[addr]
	if !ok {
		var err error
		if c, err = grpc.NewClient(grpcdial.Target(addr), g.cfg.DialOptions...); err != nil {
			return nil, err
		}
		g.conns[addr] = c
	}
	return shardkvpb.NewKVClient(c), nil
}

// servers lists a group's addresses, its last known leader first.
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
	g.connMu.Lock()
	lead := g.leaders[gid]
	g.connMu.Unlock()
	if i := slices.Index(addrs, lead); i > 0 {
		addrs[0], addrs[i] = addrs[i], addrs[0]
	}
	return addrs
}

func (g *Group) noteLeader(gid uint64, addr string) {
	g.connMu.Lock()
	g.leaders[gid] = addr
	g.connMu.Unlock()
}

// callGroup calls f on gid's replicas until one succeeds or all fail.
func (g *Group) callGroup(ctx context.Context, gid uint64, f func(context.Context, shardkvpb.KVClient) error) error {
	var last error = fmt.Errorf("group %d has no known servers", gid)
	tried := map[string]bool{}
	queue := g.servers(gid)
	for len(queue) > 0 && ctx.Err() == nil {
		addr := queue[0]
		queue = queue[1:]
		if tried[addr] {
			continue
		}
		tried[addr] = true
		cl, err := g.conn(addr)
		if err != nil {
			last = err
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err = f(cctx, cl)
		cancel()
		if err == nil {
			g.noteLeader(gid, addr)
			return nil
		}
		last = err
		if _, hint, ok := shardkvpb.LeaderHint(err); ok && hint != "" && !tried[hint] {
			queue = append([]string{hint}, queue...)
		}
	}
	return last
}
