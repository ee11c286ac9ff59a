package controllers

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

func TestShardSummary(t *testing.T) {
	cfg := &shardkvpb.Config{Shards: []uint64{1, 1, 2, 1, 0, 1, 1, 1}}
	n, r := shardSummary(cfg, 1)
	if n != 6 || r != "0-1,3,5-7" {
		t.Fatalf("got %d %q", n, r)
	}
	if n, r := shardSummary(cfg, 3); n != 0 || r != "" {
		t.Fatalf("got %d %q", n, r)
	}
}

// TestStatusStranded: a group whose report says it is stranded (it lost
// its state and cannot step through the configs it missed) is Degraded
// with the group's own words.
func TestStatusStranded(t *testing.T) {
	w := newSimGroup(t, 3, 9)
	o := w.observe()
	why := "config 7 does not follow 0: this group's state went back (every disk lost?)"
	o.Reports = map[uint64]*shardkvpb.GroupReport{o.GroupID: {Gid: o.GroupID, Stranded: why}}
	rg := &shardkvv1.ReplicaGroup{}
	(&ReplicaGroupReconciler{}).computeStatus(rg, o, step{Kind: stepIdle}, nil)
	c := meta.FindStatusCondition(rg.Status.Conditions, shardkvv1.ConditionDegraded)
	if c == nil || c.Status != metav1.ConditionTrue || c.Reason != reasonStranded || c.Message != why {
		t.Fatalf("degraded %+v", c)
	}
}
