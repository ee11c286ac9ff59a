package controllers

// Helpers of the ShardMap envtest tests (smGroup also serves the pure ones).

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// setupShardMap registers a ShardMapReconciler over dp, with short resync
// periods; opts adjust it.
func setupShardMap(dp DataPlane, opts ...func(*ShardMapReconciler)) func(ctrl.Manager) error {
	return func(mgr ctrl.Manager) error {
		r := &ShardMapReconciler{
			DataPlane:    dp,
			DefaultImage: "shardkv:test",
			BusyResync:   300 * time.Millisecond,
			IdleResync:   2 * time.Second,
			CallTimeout:  2 * time.Second,
		}
		for _, o := range opts {
			o(r)
		}
		return r.SetupWithManager(mgr)
	}
}

func testShardMap(ns, name string, shards, ctrlers int32) *shardkvv1.ShardMap {
	return &shardkvv1.ShardMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: shardkvv1.ShardMapSpec{
			Shards: shards,
			Controller: shardkvv1.ControllerSpec{
				Replicas: ctrlers,
				Storage:  shardkvv1.StorageSpec{Size: resource.MustParse("256Mi")},
			},
		},
	}
}

func mustCreate(t *testing.T, obj client.Object) {
	t.Helper()
	if err := k8sClient.Create(context.Background(), obj); err != nil {
		t.Fatalf("create %T %s: %v", obj, obj.GetName(), err)
	}
}

// waitSM polls the ShardMap until check passes.
func waitSM(t *testing.T, ns, name, what string, check func(sm *shardkvv1.ShardMap) error) *shardkvv1.ShardMap {
	t.Helper()
	sm := &shardkvv1.ShardMap{}
	eventually(t, what, func() error {
		if err := get(context.Background(), ns, name, sm); err != nil {
			return err
		}
		return check(sm)
	})
	return sm
}

func condIs(sm *shardkvv1.ShardMap, typ string, status metav1.ConditionStatus, reason, msgSub string) error {
	c := meta.FindStatusCondition(sm.Status.Conditions, typ)
	if c == nil {
		return fmt.Errorf("no %s condition", typ)
	}
	if c.Status != status || c.Reason != reason || !strings.Contains(c.Message, msgSub) {
		return fmt.Errorf("%s=%s reason %s %q; want %s reason %s containing %q", typ, c.Status, c.Reason, c.Message, status, reason, msgSub)
	}
	return nil
}

// markCtrlerReady plays the StatefulSet controller: n of the controller
// StatefulSet's replicas are ready.
func markCtrlerReady(t *testing.T, ns, sm string, n int32, mutate ...func(*appsv1.StatefulSetStatus)) {
	t.Helper()
	eventually(t, "controller StatefulSet status", func() error {
		sts := &appsv1.StatefulSet{}
		if err := get(context.Background(), ns, CtrlerName(sm), sts); err != nil {
			return err
		}
		sts.Status.Replicas, sts.Status.ReadyReplicas, sts.Status.ObservedGeneration = *sts.Spec.Replicas, n, sts.Generation
		for _, m := range mutate {
			m(&sts.Status)
		}
		return k8sClient.Status().Update(context.Background(), sts)
	})
}

// createGroup creates ReplicaGroup name of ShardMap sm with status.groupID
// gid (0: none yet). No ReplicaGroup reconciler runs in these tests.
func createGroup(t *testing.T, ns, name, sm string, gid int64) {
	t.Helper()
	rg := &shardkvv1.ReplicaGroup{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: shardkvv1.ReplicaGroupSpec{ShardMap: sm}}
	mustCreate(t, rg)
	if gid == 0 {
		return
	}
	rg.Status.GroupID = gid
	if err := k8sClient.Status().Update(context.Background(), rg); err != nil {
		t.Fatal(err)
	}
}

func smGroup(gid uint64) *shardkvpb.Group {
	return &shardkvpb.Group{Gid: gid, Weight: 1, Servers: []*shardkvpb.Server{{Id: 1, Addr: fmt.Sprintf("g%d-0:7000", gid)}}}
}
