package controllers

// envtest test of the order of an upgrade: a new spec.image on the
// ShardMap rolls its data groups only after the controller group has
// rolled, and one group at a time (groupSims play the cluster).

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
)

func TestUpgradeRollsControllerFirstThenOneGroupAtATime(t *testing.T) {
	ns, dp := startTwoGroups(t, 2, false)
	ctx := context.Background()

	// The controller group's StatefulSet (the ShardMap reconciler does not
	// run here), mid-roll: 1 of its 3 pods at the new revision.
	ctrler := &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: CtrlerName("sm")},
		Spec: appsv1.StatefulSetSpec{Replicas: ptr.To[int32](3), Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"x": "y"}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"x": "y"}},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "node", Image: "example/shardkv:2"}}}}},
	}
	mustCreate(t, ctrler)
	setCtrlerStatus := func(updated int32) {
		t.Helper()
		ctrler.Status = appsv1.StatefulSetStatus{ObservedGeneration: ctrler.Generation, Replicas: 3, ReadyReplicas: 3, UpdatedReplicas: updated}
		if err := k8sClient.Status().Update(ctx, ctrler); err != nil {
			t.Fatal(err)
		}
	}
	setCtrlerStatus(1)

	dp.ResetCalls()
	sm := &shardkvv1.ShardMap{}
	eventually(t, "spec.image set", func() error {
		if err := get(ctx, ns, "sm", sm); err != nil {
			return err
		}
		sm.Spec.Image = "example/shardkv:2"
		return k8sClient.Update(ctx, sm)
	})
	for _, g := range []string{"a", "b"} {
		eventually(t, g+" waits for the controller", func() error {
			rg, err := getRG(ns, g)
			if err != nil {
				return err
			}
			c := condition(rg, shardkvv1.ConditionProgressing)
			if c == nil || c.Reason != reasonWaitingForRollSlot || !strings.Contains(c.Message, "the controller group rolls first: 1 of its 3 pods updated") {
				return fmt.Errorf("progressing %+v", c)
			}
			return nil
		})
	}
	if calls := callsOf(dp, "DeletePod"); len(calls) != 0 {
		t.Fatalf("pods restarted while the controller group rolls: %q", calls)
	}

	// The controller is done: the groups roll, one at a time.
	setCtrlerStatus(3)
	both := ""
	eventuallyWithin(t, 2*time.Minute, "both groups rolled to the ShardMap's image", func() error {
		holders := 0
		for _, g := range []string{"a", "b"} {
			rg, err := getRG(ns, g)
			if err != nil {
				return err
			}
			if rg.Annotations[AnnotationRolling] != "" {
				holders++
			}
		}
		if holders > 1 {
			both = "a and b held the roll slot together"
		}
		for _, g := range []string{"a", "b"} {
			sts := &appsv1.StatefulSet{}
			if err := get(ctx, ns, g, sts); err != nil {
				return err
			}
			if img := sts.Spec.Template.Spec.Containers[0].Image; img != "example/shardkv:2" {
				return fmt.Errorf("%s's image %s", g, img)
			}
			rg, err := getRG(ns, g)
			if err != nil {
				return err
			}
			if rg.Annotations[AnnotationRolling] != "" || !hasEventErr(ns, g, reasonRollingUpdate, "rolling update done") {
				return fmt.Errorf("%s still rolling", g)
			}
		}
		return nil
	})
	if both != "" {
		t.Fatal(both)
	}
	// Every pod of one group restarted before any of the other's.
	calls := callsOf(dp, "DeletePod")
	if len(calls) != 4 {
		t.Fatalf("pod restarts %q, want 4", calls)
	}
	first := calls[0][len("DeletePod[")]
	for i, c := range calls {
		if (i < 2) != (c[len("DeletePod[")] == first) {
			t.Fatalf("the groups' restarts interleave: %q", calls)
		}
	}
}

func hasEventErr(ns, name, reason, sub string) bool { return hasEvent(ns, name, reason, sub) == nil }
