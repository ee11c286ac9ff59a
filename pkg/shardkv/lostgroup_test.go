package shardkv_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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

	waitCompacted(t, w, 3) // config 1 and 2 forgotten
	var lost string        // a key of a shard group 100 owns in the latest config
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
	id := waitQuiet(t, w, 100)
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
	deadline := time.Now().Add(10 * time.Second)
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

// TestRestoredGroupIsStranded: every replica of a data group comes back on
// an old copy of its disk, from before configs the controller has since
// compacted. The group owns shards in its old config, and has handed some
// of them off since, and taken writes: it can neither step through the
// configs it missed nor jump them. It must stay put without writing to its
// log, say why, and not serve its old shards (their data is stale).
func TestRestoredGroupIsStranded(t *testing.T) {
	w := kvtest.New(t, kvtest.Options{Shards: 8, CompactEvery: 100 * time.Millisecond})
	w.StartGroup(100)
	w.StartGroup(101)
	w.Join(100)
	old := w.WaitSettled(20 * time.Second)
	c := w.Client()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	keys := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
	for _, k := range keys {
		if err := c.Put(ctx, k, "old-"+k); err != nil {
			t.Fatalf("put %s: %v", k, err)
		}
	}
	// The copy of group 100's disks, at config old.Num (it owns every shard).
	w.StopGroup(100)
	backup := t.TempDir()
	for id, nd := range w.Groups[100].Nodes {
		if out, err := exec.Command("cp", "-a", nd.Dir, filepath.Join(backup, fmt.Sprint(id))).CombinedOutput(); err != nil {
			t.Fatalf("copy %s: %v: %s", nd.Dir, err, out)
		}
	}
	w.RestartGroup(100)
	w.Join(101)
	w.WaitSettled(30 * time.Second)
	w.Leave(101)
	w.WaitSettled(30 * time.Second)
	w.Join(101)
	w.WaitSettled(30 * time.Second)
	for _, k := range keys {
		if err := c.Put(ctx, k, "new-"+k); err != nil {
			t.Fatalf("put %s: %v", k, err)
		}
	}
	waitCompacted(t, w, old.Num+2)

	// Group 100 comes back on the old copy.
	w.StopGroup(100)
	for id, nd := range w.Groups[100].Nodes {
		if err := os.RemoveAll(nd.Dir); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("cp", "-a", filepath.Join(backup, fmt.Sprint(id)), nd.Dir).CombinedOutput(); err != nil {
			t.Fatalf("restore %s: %v: %s", nd.Dir, err, out)
		}
	}
	w.RestartGroup(100)
	id := waitQuiet(t, w, 100)
	if got := w.SM(100, id).Config().Num; got != old.Num {
		t.Fatalf("restored group 100 at config %d, want its old config %d: it must not jump configs", got, old.Num)
	}
	why := w.Group(100, id).Stranded()
	if !strings.Contains(why, "older") {
		t.Fatalf("Stranded() = %q, want the reason the group cannot step", why)
	}
	t.Logf("group 100: %s", why)
	// Its old shards hold the old values: it must not serve them, to any
	// client that still routes by the old config.
	for _, k := range keys {
		gctx, gcancel := context.WithTimeout(context.Background(), 2*time.Second)
		rep, err := w.Group(100, id).Get(gctx, &shardkvpb.GetRequest{Key: []byte(k)})
		gcancel()
		if err == nil {
			t.Fatalf("stranded group 100 served Get(%s) = %q found=%v", k, rep.Value, rep.Found)
		}
		if r := shardkvpb.Reason(err); r != shardkvpb.ReasonNotReady && r != shardkvpb.ReasonWrongGroup {
			t.Fatalf("Get(%s) from stranded group 100: %v, want NOT_READY or WRONG_GROUP", k, err)
		}
	}
}

// waitCompacted waits until the controller keeps no config below oldest.
func waitCompacted(t *testing.T, w *kvtest.World, oldest uint64) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
		st, err := w.Admin().Status(sctx)
		scancel()
		if err == nil && st.OldestConfig >= oldest {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("controller did not compact its history below %d (status %v, err %v)", oldest, st, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitQuiet waits for group gid's leader, gives the controller's configs a
// second to arrive and the leader to act on them, then checks that the
// group writes (almost) nothing to its log for 2s; it returns the leader.
func waitQuiet(t *testing.T, w *kvtest.World, gid uint64) uint64 {
	t.Helper()
	id := w.Groups[gid].WaitLeader(10 * time.Second)
	time.Sleep(time.Second)
	r := w.Groups[gid].Replica(id)
	if r == nil {
		t.Fatalf("group %d's leader went down", gid)
	}
	before := r.Status().Applied
	time.Sleep(2 * time.Second)
	if r = w.Groups[gid].Replica(id); r == nil {
		t.Fatalf("group %d's leader went down", gid)
	}
	if after := r.Status().Applied; after > before+10 {
		t.Fatalf("group %d applied %d entries in 2s (index %d -> %d): it proposes a config step apply refuses, in a loop", gid, after-before, before, after)
	}
	return id
}
