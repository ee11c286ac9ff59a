package shardkv_test

import (
	"testing"
	"time"

	"github.com/shardkv/shardkv/pkg/shardkv/kvtest"
)

// TestSpareGroupStaysIdle: a group that runs but has not joined steps to
// the controller's latest config once and then writes nothing to its log.
// (It used to re-propose a config it had already applied in a loop, some
// 300 entries and fsyncs a second, for as long as it stayed spare.)
func TestSpareGroupStaysIdle(t *testing.T) {
	w := kvtest.New(t, kvtest.Options{Shards: 16})
	w.StartGroup(100)
	w.StartGroup(101)
	w.Join(100)
	w.WaitSettled(20 * time.Second)
	id := w.Groups[101].WaitLeader(10 * time.Second)
	before := w.Groups[101].Replica(id).Status().Applied
	time.Sleep(2 * time.Second)
	r := w.Groups[101].Replica(id)
	if r == nil {
		t.Fatal("spare group's leader went down")
	}
	if after := r.Status().Applied; after > before+5 {
		t.Fatalf("idle spare group applied %d entries in 2s (index %d -> %d)", after-before, before, after)
	}
	if got := w.SM(101, id).Config().Num; got != 1 {
		t.Fatalf("spare group at config %d, want the latest, 1", got)
	}
}
