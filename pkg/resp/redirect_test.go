package resp_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shardkv/shardkv/pkg/routing"
	"github.com/shardkv/shardkv/pkg/shardkv/kvtest"
)

// TestRedirectsLeadToOwner: while two groups are at different configs, a
// redirect still leads toward the shard's owner and never back. A fresh
// CI run once had go-redis give up on a SET after bouncing between a group
// that had stepped to config N+1 (shard handed off: MOVED to the new owner)
// and the new owner, still at config N because it was busy finishing an
// earlier migration (MOVED back to the old owner, which owned the shard in
// its config).
//
// The layout: group C is down, so group B, which is given one of C's shards
// in config 2, is stuck at config 2 (Pulling from C). Config 3 moves a
// shard of A to B: A steps to 3 and hands the shard off, B cannot step.
func TestRedirectsLeadToOwner(t *testing.T) {
	gids := []uint64{300, 301, 302}
	w := newWorld(t)
	for _, gid := range gids {
		w.StartGroup(gid)
	}
	w.Join(gids...)
	conf := w.WaitSettled(60 * time.Second)
	// C is the group with 6 of the 16 shards: pinning one of C's shards to
	// B, then one of A's, leaves every group its balanced share of the
	// unpinned shards, so that no other shard moves.
	count := func(gid uint64) int {
		n := 0
		for _, g := range conf.Shards {
			if g == gid {
				n++
			}
		}
		return n
	}
	slices.SortFunc(gids, func(a, b uint64) int { return count(a) - count(b) })
	gX, gY, gZ := gids[0], gids[1], gids[2]
	fromZ, fromX := slices.Index(conf.Shards, gZ), slices.Index(conf.Shards, gX)
	move := func(shard int, to uint64) uint64 {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		before := slices.Clone(conf.Shards)
		next, err := w.Admin().MoveStopAndCopy(ctx, shard, to) // the owner changes in this config
		if err != nil {
			t.Fatal(err)
		}
		before[shard] = to
		if !slices.Equal(before, next.Shards) {
			t.Fatalf("moving shard %d to %d: config %d is %v, want %v", shard, to, next.Num, next.Shards, before)
		}
		conf = next
		return next.Num
	}

	// A group steps on while it pulls shards a config does not touch
	// (docs/shardkv.md, "Stepping"), so B is held at config 2 by a config
	// that hands on the very shard it is still pulling: config 3 moves C's
	// shard on from B to A; config 4 moves A's shard to B. A steps to 4
	// (it only starts pulling C's shard from B), B cannot step to 3.
	w.StopGroup(gZ)
	waitApplied(t, w, gY, move(fromZ, gY))
	c3 := move(fromZ, gX)
	c4 := move(fromX, gY)
	waitApplied(t, w, gX, c4)
	if n := w.SM(gY, w.Groups[gY].WaitLeader(10*time.Second)).Config().Num; n >= c3 {
		t.Fatalf("group %d stepped to config %d while pulling from a group that is down", gY, n)
	}

	key := ""
	for i := 0; key == ""; i++ {
		if k := fmt.Sprintf("pp:%d", i); routing.ShardOf([]byte(k), len(conf.Shards)) == fromX {
			key = k
		}
	}
	var starts []string
	for _, gid := range []uint64{gX, gY} {
		for _, id := range w.Groups[gid].IDs() {
			starts = append(starts, w.RESPAddr(gid, id))
		}
	}
	for _, cmd := range [][]string{{"set", key, "v"}, {"get", key}} {
		for _, start := range starts {
			chain := []string{start}
			for addr := start; len(chain) < 10; {
				c := dial(t, addr)
				r := c.do(cmd...)
				c.c.Close()
				e, ok := r.(rerr)
				if !ok || !strings.HasPrefix(string(e), "MOVED ") {
					if !ok || !strings.HasPrefix(string(e), "TRYAGAIN ") {
						t.Errorf("%s from %s via %v: %v, want TRYAGAIN (the new owner gets the shard only once group %d is back)", cmd[0], start, chain, r, gZ)
					}
					break
				}
				addr = strings.Fields(string(e))[2]
				if slices.Contains(chain, addr) {
					t.Errorf("%s from %s: redirected back to %s: %v", cmd[0], start, addr, append(chain, addr))
					break
				}
				chain = append(chain, addr)
			}
		}
	}
}

// waitApplied waits until every running replica of gid has applied config num.
func waitApplied(t *testing.T, w *kvtest.World, gid, num uint64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		done := true
		for _, id := range w.Groups[gid].IDs() {
			if sm := w.SM(gid, id); sm != nil && sm.Config().Num < num {
				done = false
			}
		}
		if done {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("group %d did not apply config %d: %s", gid, num, w.Describe())
		}
		time.Sleep(20 * time.Millisecond)
	}
}
