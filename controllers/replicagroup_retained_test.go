package controllers

// envtest test of a ReplicaGroup re-created under the name of a deleted
// one whose volume was retained: refused until the claim is gone, or wiped
// with spec.retainedVolumes: Wipe.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
)

func TestReplicaGroupRetainedVolumes(t *testing.T) {
	ns, dp, _ := startSimGroup(t, 1)
	ctx := context.Background()
	// The claim a deleted group "g" left behind (pvcRetention: Retain),
	// labelled as its StatefulSet labelled it.
	old := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: pvcName("g", 0), Labels: map[string]string{LabelGroup: "g"}},
		Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}},
	}
	if err := k8sClient.Create(ctx, old); err != nil {
		t.Fatal(err)
	}
	// Creation times have a resolution of one second.
	time.Sleep(1100 * time.Millisecond)
	newReplicaGroup(t, ns, "g", "sm", 1)

	eventually(t, "g refused", func() error {
		rg, err := getRG(ns, "g")
		if err != nil {
			return err
		}
		c := condition(rg, shardkvv1.ConditionProgressing)
		if c == nil || c.Status != metav1.ConditionFalse || c.Reason != reasonRetainedVolumes ||
			!strings.Contains(c.Message, "volumes data-g-0 are older than this ReplicaGroup") {
			return fmt.Errorf("progressing %+v", c)
		}
		return hasEvent(ns, "g", reasonRetainedVolumes, "spec.retainedVolumes: Wipe")
	})
	consistently(t, 500*time.Millisecond, "no StatefulSet on a deleted group's volume", func() error {
		if err := get(ctx, ns, "g", &appsv1.StatefulSet{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("statefulset: %v", err)
		}
		return nil
	})
	if dels := callsOf(dp, "DeletePVC"); len(dels) != 0 {
		t.Fatalf("claims deleted under Refuse: %q", dels)
	}

	updateRG(t, ns, "g", func(rg *shardkvv1.ReplicaGroup) { rg.Spec.RetainedVolumes = "Wipe" })
	waitServing(t, ns, "g", 1)
	if dels := callsOf(dp, "DeletePVC"); !slices.Equal(dels, []string{"DeletePVC[" + pvcName("g", 0) + "]"}) {
		t.Fatalf("claim deletions %q, want the retained one", dels)
	}
	expectEvent(t, ns, "g", string(stepDeletePVC), "deleting retained volume data-g-0")
}
