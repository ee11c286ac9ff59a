package controllers

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
)

func claimOf(ord int, request, capacity string, bound bool) claimView {
	c := claimView{Name: pvcName("rg", ord), Ordinal: ord, Request: resource.MustParse(request), Class: "standard", Bound: bound}
	if capacity != "" {
		c.Capacity = resource.MustParse(capacity)
	}
	return c
}

func TestPlanStorage(t *testing.T) {
	spec := func(size string) shardkvv1.StorageSpec { return shardkvv1.StorageSpec{Size: resource.MustParse(size)} }
	for _, tc := range []struct {
		name    string
		want    shardkvv1.StorageSpec
		claims  []claimView
		refused string
		grow    int // ordinal, -1: none
		status  metav1.ConditionStatus
		reason  string
		msg     string
	}{
		{"applied", spec("1Gi"), []claimView{claimOf(0, "1Gi", "1Gi", true), claimOf(1, "1Gi", "1Gi", true)}, "",
			-1, metav1.ConditionTrue, reasonStorageApplied, "all 2 volumes are 1Gi"},
		{"grow the first bound claim", spec("2Gi"), []claimView{claimOf(0, "1Gi", "", false), claimOf(1, "1Gi", "1Gi", true), claimOf(2, "1Gi", "1Gi", true)}, "",
			1, metav1.ConditionFalse, reasonStorageResizing, "growing 3 volumes to 2Gi, one at a time: data-rg-0, data-rg-1, data-rg-2"},
		{"unbound claims wait", spec("2Gi"), []claimView{claimOf(0, "1Gi", "", false)}, "",
			-1, metav1.ConditionFalse, reasonStorageResizing, "waiting for volumes data-rg-0 to be bound"},
		{"driver still growing", spec("2Gi"), []claimView{claimOf(0, "2Gi", "2Gi", true), {Name: "data-rg-1", Ordinal: 1, Request: resource.MustParse("2Gi"),
			Capacity: resource.MustParse("1Gi"), Class: "standard", Bound: true, Resizing: "FileSystemResizePending"}}, "",
			-1, metav1.ConditionFalse, reasonStorageResizing, "waiting for the volume driver to grow data-rg-1 from 1Gi (FileSystemResizePending) to 2Gi"},
		{"refused at this generation: not tried again", spec("2Gi"), []claimView{claimOf(0, "1Gi", "1Gi", true)}, "refused: no expansion",
			-1, metav1.ConditionFalse, reasonStorageResizeRefused, "refused: no expansion"},
		{"shrink", spec("512Mi"), []claimView{claimOf(0, "1Gi", "1Gi", true)}, "",
			-1, metav1.ConditionFalse, reasonStorageShrink, "spec.storage.size 512Mi is below the size of volumes data-rg-0 (1Gi), and a volume cannot shrink"},
		{"another class", shardkvv1.StorageSpec{Size: resource.MustParse("2Gi"), StorageClassName: ptr.To("fast")}, []claimView{claimOf(0, "1Gi", "1Gi", true)}, "",
			-1, metav1.ConditionFalse, reasonStorageClassImmutable, `spec.storage.storageClassName is "fast" but volumes data-rg-0 ("standard") have another class`},
		{"default size", shardkvv1.StorageSpec{}, []claimView{claimOf(0, "1Gi", "1Gi", true)}, "",
			-1, metav1.ConditionTrue, reasonStorageApplied, "all 1 volumes are 1Gi"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sp := planStorage("spec.storage", tc.want, tc.claims, tc.refused)
			grow := -1
			if sp.Grow != nil {
				grow = sp.Grow.Ordinal
			}
			if grow != tc.grow || sp.Status != tc.status || sp.Reason != tc.reason || !strings.HasPrefix(sp.Message, tc.msg) {
				t.Errorf("got grow %d, %s %s %q; want grow %d, %s %s %q", grow, sp.Status, sp.Reason, sp.Message, tc.grow, tc.status, tc.reason, tc.msg)
			}
		})
	}
}

// TestRefusedResize: a refusal holds for the generation it was seen at
// only: a spec change tries again.
func TestRefusedResize(t *testing.T) {
	conds := []metav1.Condition{{Type: shardkvv1.ConditionStorageApplied, Reason: reasonStorageResizeRefused, Message: "no", ObservedGeneration: 4}}
	if got := refusedResize(conds, 4); got != "no" {
		t.Errorf("same generation: %q", got)
	}
	if got := refusedResize(conds, 5); got != "" {
		t.Errorf("after a spec change: %q, want a retry", got)
	}
}

// TestPlanGrowsVolumesFirst: growing a volume comes before everything a
// leader is needed for: a group whose disks are full may have none.
func TestPlanGrowsVolumesFirst(t *testing.T) {
	w := newSimGroup(t, 3, 9)
	for _, p := range w.pods {
		p.down = true
	}
	o := w.observe()
	o.Storage = shardkvv1.StorageSpec{Size: resource.MustParse("2Gi")}
	o.Claims = []claimView{claimOf(0, "2Gi", "2Gi", true), claimOf(1, "1Gi", "1Gi", true), claimOf(2, "1Gi", "1Gi", true)}
	st := nextStep(o)
	if st.Kind != stepGrowVolume || st.Ordinal != 1 || st.Message != "growing volume data-rg-1 from 1Gi to 2Gi" {
		t.Fatalf("step %s %q, want GrowVolume(1)", st, st.Message)
	}
	o.ResizeRefused = "refused"
	if st := nextStep(o); st.Kind == stepGrowVolume {
		t.Fatalf("refused at this generation, still %s", st)
	}
}
