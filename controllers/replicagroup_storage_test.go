package controllers

// envtest test of growing a running group's volumes: the API server's own
// admission check (PersistentVolumeClaimResize) refuses a claim whose
// StorageClass does not allow expansion, and admits one that does.

import (
	"context"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
)

func TestReplicaGroupGrowsVolumes(t *testing.T) {
	ns, _, _ := startSimGroup(t, 1)
	ctx := context.Background()
	sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "sc-" + ns}, Provisioner: "example.com/none",
		AllowVolumeExpansion: ptr.To(false)}
	if err := k8sClient.Create(ctx, sc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), sc) })
	newReplicaGroup(t, ns, "g", "sm", 1, func(rg *shardkvv1.ReplicaGroup) {
		rg.Spec.Storage = shardkvv1.StorageSpec{Size: resource.MustParse("1Gi"), StorageClassName: ptr.To(sc.Name)}
	})
	waitServing(t, ns, "g", 1)
	storageIs := func(reason, msg string) func() error {
		return func() error {
			rg, err := getRG(ns, "g")
			if err != nil {
				return err
			}
			if c := condition(rg, shardkvv1.ConditionStorageApplied); c == nil || c.Reason != reason || !strings.Contains(c.Message, msg) {
				return fmt.Errorf("StorageApplied %+v, want %s %q", c, reason, msg)
			}
			return nil
		}
	}
	claimIs := func(request string) error {
		claim := &corev1.PersistentVolumeClaim{}
		if err := get(ctx, ns, pvcName("g", 0), claim); err != nil {
			return err
		}
		if got := claim.Spec.Resources.Requests[corev1.ResourceStorage]; got.String() != request {
			return fmt.Errorf("claim asks for %s, want %s", got.String(), request)
		}
		return nil
	}
	eventually(t, "volumes applied", storageIs(reasonStorageApplied, "all 1 volumes are 1Gi"))

	// A class without expansion: the API server refuses; said once, not
	// tried again for this spec.
	updateRG(t, ns, "g", func(rg *shardkvv1.ReplicaGroup) { rg.Spec.Storage.Size = resource.MustParse("2Gi") })
	eventually(t, "resize refused", storageIs(reasonStorageResizeRefused,
		"growing volume data-g-0 from 1Gi to 2Gi was refused by the API server"))
	expectEvent(t, ns, "g", reasonStorageResizeRefused, "allowVolumeExpansion")
	if err := claimIs("1Gi"); err != nil {
		t.Fatal(err)
	}
	rg, err := getRG(ns, "g")
	if err != nil {
		t.Fatal(err)
	}
	if c := condition(rg, shardkvv1.ConditionReady); c == nil || c.Status != metav1.ConditionTrue {
		t.Fatalf("a refused resize made the group not ready: %+v", c)
	}
	if err := hasEvent(ns, "g", reasonGrowVolume, "from 1Gi to 2Gi"); err == nil {
		t.Errorf("a refused grow was announced as growing")
	}

	// The class allows expansion now; the next spec change grows the claim.
	sc.AllowVolumeExpansion = ptr.To(true)
	if err := k8sClient.Update(ctx, sc); err != nil {
		t.Fatal(err)
	}
	updateRG(t, ns, "g", func(rg *shardkvv1.ReplicaGroup) { rg.Spec.Storage.Size = resource.MustParse("3Gi") })
	eventually(t, "claim grown", func() error { return claimIs("3Gi") })
	eventually(t, "waiting for the driver", storageIs(reasonStorageResizing, "waiting for the volume driver to grow data-g-0 from 1Gi to 3Gi"))
	expectEvent(t, ns, "g", reasonGrowVolume, "growing volume data-g-0 from 1Gi to 3Gi")

	// The driver grew it.
	claim := &corev1.PersistentVolumeClaim{}
	if err := get(ctx, ns, pvcName("g", 0), claim); err != nil {
		t.Fatal(err)
	}
	claim.Status.Capacity = corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("3Gi")}
	if err := k8sClient.Status().Update(ctx, claim); err != nil {
		t.Fatal(err)
	}
	eventually(t, "volumes applied", storageIs(reasonStorageApplied, "all 1 volumes are 3Gi"))

	// Shrinking is refused by the operator itself.
	updateRG(t, ns, "g", func(rg *shardkvv1.ReplicaGroup) { rg.Spec.Storage.Size = resource.MustParse("1Gi") })
	eventually(t, "shrink refused", storageIs(reasonStorageShrink, "a volume cannot shrink"))
	if err := claimIs("3Gi"); err != nil {
		t.Fatal(err)
	}
}
