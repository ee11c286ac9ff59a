package controllers

import (
	"context"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// TestShardMapFollowsWatch: with periodic resyncs far away, a new config
// still reaches the status promptly (through the Watch stream).
func TestShardMapFollowsWatch(t *testing.T) {
	ns := newNamespace(t)
	dp := newFakeDataPlane()
	fc := dp.Ctrler(ns, "demo")
	fc.SetShards(4)
	startManager(t, ns, setupShardMap(dp, func(r *ShardMapReconciler) { r.BusyResync, r.IdleResync = time.Hour, time.Hour }))
	mustCreate(t, testShardMap(ns, "demo", 4, 1))
	markCtrlerReady(t, ns, "demo", 1)
	waitSM(t, ns, "demo", "first status", func(sm *shardkvv1.ShardMap) error {
		return condIs(sm, shardkvv1.ConditionReady, metav1.ConditionFalse, ReasonNoGroups, "")
	})
	eventually(t, "a Watch stream", func() error {
		if fc.Watchers() != 1 {
			return fmt.Errorf("%d watchers", fc.Watchers())
		}
		return nil
	})
	for i := range 3 {
		fc.SetConfig(&shardkvpb.Config{Shards: []uint64{1, 1, 1, 1}, Groups: []*shardkvpb.Group{smGroup(1)}})
		want := int64(fc.Latest().Num)
		eventuallyWithin(t, 20*time.Second, fmt.Sprintf("config %d (round %d)", want, i), func() error {
			sm := &shardkvv1.ShardMap{}
			if err := get(context.Background(), ns, "demo", sm); err != nil {
				return err
			}
			if sm.Status.ConfigNum != want {
				return fmt.Errorf("configNum %d, want %d", sm.Status.ConfigNum, want)
			}
			return nil
		})
	}

	// Deleting the ShardMap ends its Watch.
	sm := &shardkvv1.ShardMap{}
	if err := get(context.Background(), ns, "demo", sm); err != nil {
		t.Fatal(err)
	}
	if err := k8sClient.Delete(context.Background(), sm); err != nil {
		t.Fatal(err)
	}
	eventually(t, "Watch stream closed", func() error {
		if n := fc.Watchers(); n != 0 {
			return fmt.Errorf("%d watchers", n)
		}
		return nil
	})
}
