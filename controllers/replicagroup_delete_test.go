package controllers

// envtest test of a ReplicaGroup's deletion: it leaves, drains, and the last
// group holding data is kept (groupSims play the cluster).

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

func TestReplicaGroupDeletion(t *testing.T) {
	ns := newNamespace(t)
	dp := newFakeDataPlane()
	cc := dp.Ctrler(ns, "sm")
	cc.SetShards(16)
	startManager(t, ns, setupReplicaGroup(dp))
	newShardMap(t, ns, "sm")
	a := startGroupSim(t, ns, "a", 1, dp)
	b := startGroupSim(t, ns, "b", 1, dp)
	simHooks(dp, a, b)
	newReplicaGroup(t, ns, "a", "sm", 1, func(rg *shardkvv1.ReplicaGroup) { rg.Spec.PVCRetention = "Delete" })
	newReplicaGroup(t, ns, "b", "sm", 1)
	rgA := waitServing(t, ns, "a", 1)
	rgB := waitServing(t, ns, "b", 1)
	gidA, gidB := uint64(rgA.Status.GroupID), uint64(rgB.Status.GroupID)
	eventually(t, "both in the config", func() error {
		if cfg := cc.Latest(); len(cfg.Groups) != 2 {
			return fmt.Errorf("config %v", cfg)
		}
		return nil
	})
	// a holds shards while it hands them off.
	cc.SetReports(&shardkvpb.GroupReport{Gid: gidA, ConfigNum: cc.Latest().Num + 1, Shards: []*shardkvpb.ShardState{
		{Shard: 0, State: "BePulling", PeerGid: gidB}, {Shard: 1, State: "GCing"}}})

	ctx := context.Background()
	if err := k8sClient.Delete(ctx, rgA); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a leaves and drains", func() error {
		rg, err := getRG(ns, "a")
		if err != nil {
			return err
		}
		c := condition(rg, shardkvv1.ConditionDraining)
		if rg.Status.Phase != shardkvv1.PhaseDraining || c == nil || c.Status != metav1.ConditionTrue || c.Reason != reasonWaitingForDrain ||
			!strings.Contains(c.Message, "1 BePulling, 1 GCing") {
			return fmt.Errorf("phase %s, draining %+v", rg.Status.Phase, c)
		}
		return nil
	})
	if got := callsOf(dp, "Leave"); !slices.Equal(got, []string{fmt.Sprintf("Leave[[%d]]", gidA)}) {
		t.Fatalf("leaves %q", got)
	}
	consistently(t, 300*time.Millisecond, "a waits for its shards", func() error {
		_, err := getRG(ns, "a")
		return err
	})
	// Handed off and deleted: the report at the latest config is empty.
	cc.SetReports(&shardkvpb.GroupReport{Gid: gidA, ConfigNum: cc.Latest().Num})
	eventually(t, "a gone", func() error {
		if _, err := getRG(ns, "a"); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there (%v)", err)
		}
		return nil
	})
	if dels := callsOf(dp, "DeletePVC"); !slices.Equal(dels, []string{"DeletePVC[" + pvcName("a", 0) + "]"}) {
		t.Fatalf("claim deletions %q (pvcRetention Delete)", dels)
	}

	// b is now the last group: its deletion is refused.
	if err := k8sClient.Delete(ctx, rgB); err != nil {
		t.Fatal(err)
	}
	eventually(t, "b refused", func() error {
		rg, err := getRG(ns, "b")
		if err != nil {
			return err
		}
		c := condition(rg, shardkvv1.ConditionDraining)
		if c == nil || c.Status != metav1.ConditionFalse || c.Reason != reasonLastGroupHoldsData || !strings.Contains(c.Message, "last group") {
			return fmt.Errorf("draining %+v", c)
		}
		return hasEvent(ns, "b", reasonLastGroupHoldsData, "last group")
	})
	consistently(t, 300*time.Millisecond, "b kept", func() error {
		rg, err := getRG(ns, "b")
		if err != nil {
			return err
		}
		if !slices.Contains(rg.Finalizers, Finalizer) {
			return errors.New("finalizer removed")
		}
		return nil
	})
	if got := callsOf(dp, "Leave"); len(got) != 1 {
		t.Fatalf("leaves %q: b must not leave", got)
	}
	if configGroup(cc.Latest(), gidB) == nil {
		t.Fatal("b left the config")
	}
}
