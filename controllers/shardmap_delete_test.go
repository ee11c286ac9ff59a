package controllers

// envtest test of deleting a ShardMap: it stays, saying why, until its
// ReplicaGroups are gone; a group deleted while others stay drains as
// usual; once all are being deleted they go without a drain, and then
// the ShardMap goes.

import (
	"context"
	"fmt"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
)

func TestShardMapDeletionWaitsForGroups(t *testing.T) {
	ns, _ := startTwoGroups(t, 1, true)
	ctx := context.Background()
	sm := waitSM(t, ns, "sm", "the finalizer", func(sm *shardkvv1.ShardMap) error {
		if !controllerutil.ContainsFinalizer(sm, ShardMapFinalizer) {
			return fmt.Errorf("finalizers %v", sm.Finalizers)
		}
		return nil
	})

	if err := k8sClient.Delete(ctx, sm); err != nil {
		t.Fatal(err)
	}
	waitSM(t, ns, "sm", "the deletion's wait", func(sm *shardkvv1.ShardMap) error {
		return condIs(sm, shardkvv1.ConditionProgressing, metav1.ConditionTrue, ReasonWaitingForReplicaGroups,
			"the ShardMap is being deleted but ReplicaGroups a, b are not")
	})
	expectEvent(t, ns, "sm", ReasonWaitingForReplicaGroups, "kubectl delete replicagroup a b")
	// Its groups stay as they are.
	for _, g := range []string{"a", "b"} {
		eventually(t, g+" waits", func() error {
			rg, err := getRG(ns, g)
			if err != nil {
				return err
			}
			if c := condition(rg, shardkvv1.ConditionProgressing); c == nil || c.Reason != reasonClusterDeleting || c.Status != metav1.ConditionFalse {
				return fmt.Errorf("progressing %+v", c)
			}
			return nil
		})
	}

	// a alone: it drains into b, which stays for now.
	rgA, err := getRG(ns, "a")
	if err != nil {
		t.Fatal(err)
	}
	if err := k8sClient.Delete(ctx, rgA); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a leaves", func() error { return hasEvent(ns, "a", string(stepLeave), "leaving") })
	consistently(t, time.Second, "a drains, not dropped", func() error {
		rg, err := getRG(ns, "a")
		if err != nil {
			return err
		}
		if c := condition(rg, shardkvv1.ConditionDraining); c != nil && c.Reason == reasonClusterDeleted {
			return fmt.Errorf("a finalized as the cluster's deletion while b stays: %+v", c)
		}
		return nil
	})

	// b too: now the whole cluster goes, with its data.
	rgB, err := getRG(ns, "b")
	if err != nil {
		t.Fatal(err)
	}
	if err := k8sClient.Delete(ctx, rgB); err != nil {
		t.Fatal(err)
	}
	for _, g := range []string{"a", "b"} {
		eventually(t, g+" gone", func() error {
			if _, err := getRG(ns, g); !apierrors.IsNotFound(err) {
				return fmt.Errorf("still there (%v)", err)
			}
			return nil
		})
	}
	expectEvent(t, ns, "b", string(stepFinalize), "the ShardMap and all its ReplicaGroups are being deleted")
	eventually(t, "the ShardMap gone", func() error {
		err := get(ctx, ns, "sm", &shardkvv1.ShardMap{})
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there (%v)", err)
		}
		return nil
	})
	expectEvent(t, ns, "sm", "Deleted", "no ReplicaGroup of the ShardMap is left")
}
