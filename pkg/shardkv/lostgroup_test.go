package shardkv_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/shardkv/shardkv/pkg/routing"
	"github.com/shardkv/shardkv/pkg/shardkv/kvtest"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// TestWipedGroupDoesNotSpin: every replica of a data group loses its disk
// after the controller compacted the configs the group would need to step
// through again. The group comes back empty at config 0, and in every
// config the controller still keeps it owns shards, so it can neither step
// to config 1 (gone) nor jump (it would serve those shards empty). It must
// stay put without writing to its log (it used to propose the oldest kept
// config in a loop that apply refused: some 1,400 entries a second on a
// real cluster), say why in its status, and not serve the lost shards.
func TestWipedGroupDoesNotSpin(t *testing.T) {
	w := kvtest.New(t, kvtest.Options{Shards: 8, CompactEvery: 100 * time.Millisecond})
	w.StartGroup(100)
	w.StartGroup(101)
	w.Join(100)
	w.WaitSettled(20 * time.Second)
	c := w.Client()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, k := range []string{"a", "b", "c", "d", "e", "f", "g", "h"} {
		if err := c.Put(ctx, k, "v"+k); err != nil {
			t.Fatalf("put %s: %v", k, err)
		}
	}
	// More configs (joins and leaves, each move's cut-over): group 100
	// owns shards in every one of them.
	w.Join(101)
	w.WaitSettled(30 * time.Second)
	w.Leave(101)
	w.WaitSettled(30 * time.Second)
	w.Join(101)
	conf := w.WaitSettled(30 * time.Second)

	// Wait until the controller has forgotten config 1 and 2.
	deadline := time.Now().Add(20 * time.Second)
	for {
		sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
		st, err := w.Admin().Status(sctx)
		scancel()
		if err == nil && st.OldestConfig >= 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("controller did not compact its history below 3 (status %v, err %v)", st, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	var lost string // a key of a shard group 100 owns in the latest config
	for _, k := range []string{"a", "b", "c", "d", "e", "f", "g", "h"} {
		if conf.Shards[routing.ShardOf([]byte(k), len(conf.Shards))] == 100 {
			lost = k
			break
		}
	}
	if lost == "" {
		t.Fatalf("group 100 owns none of the test keys in config %d: %v", conf.Num, conf.Shards)
	}

	// Every replica of group 100 loses its disk and bootstraps empty.
	w.StopGroup(100)
	for _, nd := range w.Groups[100].Nodes {
		if err := os.RemoveAll(nd.Dir); err != nil {
			t.Fatal(err)
		}
	}
	w.RestartGroup(100)
	id := w.Groups[100].WaitLeader(10 * time.Second)
	time.Sleep(time.Second) // the watch delivers the kept configs; the leader tries to step

	before := w.Groups[100].Replica(id).Status().Applied
	time.Sleep(2 * time.Second)
	r := w.Groups[100].Replica(id)
	if r == nil {
		t.Fatal("group 100's leader went down")
	}
	after := r.Status().Applied
	if after > before+10 {
		t.Fatalf("wiped group 100 applied %d entries in 2s (index %d -> %d): it proposes a config step apply refuses, in a loop", after-before, before, after)
	}
	if got := w.SM(100, id).Config().Num; got != 0 {
		t.Fatalf("wiped group 100 stepped to config %d: it must not skip configs in which it owned shards", got)
	}

	// It says why, to the operator (GroupInfo, and its report to the controller).
	info, err := w.Group(100, id).GroupInfo(context.Background(), &shardkvpb.GroupInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(info.Stranded, "lost") {
		t.Fatalf("GroupInfo.stranded = %q, want the reason the group cannot step", info.Stranded)
	}
	deadline = time.Now().Add(10 * time.Second)
	for {
		sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
		st, err := w.Admin().Status(sctx)
		scancel()
		var got string
		if err == nil {
			for _, gs := range st.Groups {
				if gs.GetReport().GetGid() == 100 {
					got = gs.GetReport().GetStranded()
				}
			}
		}
		if got != "" {
			t.Logf("group 100 reports: %s", got)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the controller's status never showed group 100 stranded (err %v)", err)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// It does not serve the lost shard as if it were empty.
	gctx, gcancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer gcancel()
	if v, ok, err := c.Get(gctx, lost); err == nil {
		t.Fatalf("Get(%s) of a lost shard = %q found=%v, want an error", lost, v, ok)
	}
}
