package controllers

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// TestShardMapRollsPods: a template change rolls the controller pods one at
// a time, each only when all are ready, followers first and the leader last.
func TestShardMapRollsPods(t *testing.T) {
	ns := newNamespace(t)
	dp := newFakeDataPlane()
	fc := dp.Ctrler(ns, "demo")
	fc.SetShards(4)
	// The leader is pod 1.
	fc.SetMemberStatus(&shardkvpb.MemberStatus{Id: 2, Leader: 2, Role: "leader", Addr: "demo-ctrler-1.demo-ctrler." + ns + ".svc:7000"})
	startManager(t, ns, setupShardMap(dp))
	mustCreate(t, testShardMap(ns, "demo", 4, 3))
	eventually(t, "StatefulSet", func() error { return get(context.Background(), ns, CtrlerName("demo"), &appsv1.StatefulSet{}) })

	// Play the StatefulSet controller and kubelet: pods at revision r1,
	// the StatefulSet's update revision r2.
	mkPod := func(ord int, rev string) {
		t.Helper()
		sm := &shardkvv1.ShardMap{ObjectMeta: metav1.ObjectMeta{Name: "demo", Namespace: ns}}
		labels := ctrlerLabels(sm)
		labels[stsRevisionLabel] = rev
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("demo-ctrler-%d", ord), Labels: labels},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "node", Image: "x"}}},
		}
		mustCreate(t, pod)
		pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
		pod.Status.PodIP = fmt.Sprintf("10.0.0.%d", ord+1)
		if err := k8sClient.Status().Update(context.Background(), pod); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 3 {
		mkPod(i, "r1")
	}
	markCtrlerReady(t, ns, "demo", 3, func(s *appsv1.StatefulSetStatus) { s.CurrentRevision, s.UpdateRevision = "r1", "r2" })

	deleted := func() []string {
		var out []string
		var pods corev1.PodList
		if err := k8sClient.List(context.Background(), &pods, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		for i := range 3 {
			name := fmt.Sprintf("demo-ctrler-%d", i)
			if !slices.ContainsFunc(pods.Items, func(p corev1.Pod) bool { return p.Name == name }) {
				out = append(out, name)
			}
		}
		return out
	}
	var order []string
	for round := range 3 {
		eventually(t, fmt.Sprintf("round %d: a pod deleted", round), func() error {
			if d := deleted(); len(d) != 1 {
				return fmt.Errorf("deleted %v", d)
			}
			return nil
		})
		gone := deleted()[0]
		order = append(order, gone)
		// While one pod is missing nothing else is deleted.
		markCtrlerReady(t, ns, "demo", 2)
		consistently(t, 700*time.Millisecond, "one pod at a time", func() error {
			if d := deleted(); len(d) != 1 {
				return fmt.Errorf("deleted %v", d)
			}
			return nil
		})
		var ord int
		fmt.Sscanf(gone, "demo-ctrler-%d", &ord)
		mkPod(ord, "r2")
		markCtrlerReady(t, ns, "demo", 3)
	}
	if want := []string{"demo-ctrler-2", "demo-ctrler-0", "demo-ctrler-1"}; !slices.Equal(order, want) {
		t.Errorf("roll order %v, want %v (followers from the highest ordinal, the leader last)", order, want)
	}
	consistently(t, time.Second, "done rolling", func() error {
		if d := deleted(); len(d) != 0 {
			return fmt.Errorf("deleted %v", d)
		}
		return nil
	})
	eventually(t, "RollingPod event", func() error {
		return hasEvent(ns, "demo", "RollingPod", "deleting controller pod demo-ctrler-1 (leader)")
	})
}
