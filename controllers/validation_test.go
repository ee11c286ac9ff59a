package controllers

// The CRDs' validation and defaulting (OpenAPI schema + CEL rules), checked
// against a real API server: no reconciler runs here.

import (
	"context"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
)

func unstructuredObj(kind, ns, name string, spec map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"spec": spec}}
	u.SetGroupVersionKind(schema.GroupVersionKind{Group: shardkvv1.GroupVersion.Group, Version: shardkvv1.GroupVersion.Version, Kind: kind})
	u.SetNamespace(ns)
	u.SetName(name)
	return u
}

// expectRefused checks err is a refusal whose message contains want.
func expectRefused(t *testing.T, what string, err error, want string) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: accepted, want refused with %q", what, want)
		return
	}
	if !strings.Contains(err.Error(), want) {
		t.Errorf("%s: refused with %q, want a message containing %q", what, err, want)
	}
}

func TestValidationShardMapCreate(t *testing.T) {
	ns := newNamespace(t)
	ctx := context.Background()
	cases := []struct {
		name string
		spec map[string]any
		want string
	}{
		{"shards-not-power-of-two", map[string]any{"shards": 3}, "shards must be a power of two between 1 and 16384"},
		{"shards-too-many", map[string]any{"shards": 32768}, "should be less than or equal to 16384"},
		{"shards-zero-or-less", map[string]any{"shards": -4}, "should be greater than or equal to 1"},
		{"placement-unknown", map[string]any{"placement": "random"}, `Unsupported value: "random"`},
		{"controller-replicas-even", map[string]any{"controller": map[string]any{"replicas": 2}}, "controller replicas must be odd (1, 3, 5 or 7)"},
		{"controller-replicas-too-many", map[string]any{"controller": map[string]any{"replicas": 9}}, "should be less than or equal to 7"},
		{"controller-replicas-too-few", map[string]any{"controller": map[string]any{"replicas": -1}}, "should be greater than or equal to 1"},
		{"move-shard-out-of-range", map[string]any{"moves": []any{map[string]any{"shard": 16384, "group": "a"}}}, "should be less than or equal to 16383"},
		{"move-without-group", map[string]any{"moves": []any{map[string]any{"shard": 1, "group": ""}}}, "should be at least 1 chars long"},
		{"move-duplicate-shard", map[string]any{"moves": []any{
			map[string]any{"shard": 1, "group": "a"}, map[string]any{"shard": 1, "group": "b"}}}, "Duplicate value"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := k8sClient.Create(ctx, unstructuredObj("ShardMap", ns, c.name, c.spec))
			expectRefused(t, c.name, err, c.want)
		})
	}
}

func TestValidationShardMapDefaultsAndImmutability(t *testing.T) {
	ns := newNamespace(t)
	ctx := context.Background()
	// No controller block at all: its defaults apply through default={}.
	if err := k8sClient.Create(ctx, unstructuredObj("ShardMap", ns, "d", map[string]any{})); err != nil {
		t.Fatal(err)
	}
	var sm shardkvv1.ShardMap
	if err := get(ctx, ns, "d", &sm); err != nil {
		t.Fatal(err)
	}
	if sm.Spec.Shards != 256 || sm.Spec.Placement != "balanced" || sm.Spec.Controller.Replicas != 3 ||
		sm.Spec.Controller.ImagePullPolicy != "IfNotPresent" || sm.Spec.Controller.Storage.Size.String() != "1Gi" {
		t.Errorf("defaults: got shards=%d placement=%q controller.replicas=%d imagePullPolicy=%q storage=%s; want 256 balanced 3 IfNotPresent 1Gi",
			sm.Spec.Shards, sm.Spec.Placement, sm.Spec.Controller.Replicas, sm.Spec.Controller.ImagePullPolicy, sm.Spec.Controller.Storage.Size.String())
	}

	// Immutable fields. Each case starts from the stored object.
	mutate := func(what string, f func(sm *shardkvv1.ShardMap), want string) {
		t.Helper()
		var cur shardkvv1.ShardMap
		if err := get(ctx, ns, "d", &cur); err != nil {
			t.Fatal(err)
		}
		f(&cur)
		err := k8sClient.Update(ctx, &cur)
		if want == "" {
			if err != nil {
				t.Errorf("%s: refused: %v", what, err)
			}
			return
		}
		expectRefused(t, what, err, want)
	}
	mutate("shards changed", func(sm *shardkvv1.ShardMap) { sm.Spec.Shards = 128 }, "shards is immutable: it is fixed when the cluster is created")
	mutate("placement changed", func(sm *shardkvv1.ShardMap) { sm.Spec.Placement = "consistent-hash" }, "placement is immutable: it is fixed when the cluster is created")
	mutate("controller replicas even", func(sm *shardkvv1.ShardMap) { sm.Spec.Controller.Replicas = 4 },
		"controller replicas must be odd (1, 3, 5 or 7)")
	mutate("controller replicas changed (a resize)", func(sm *shardkvv1.ShardMap) { sm.Spec.Controller.Replicas = 5 }, "")
	mutate("paused and moves may change", func(sm *shardkvv1.ShardMap) {
		sm.Spec.Paused = true
		sm.Spec.Moves = []shardkvv1.ShardMove{{Shard: 3, Group: "g"}}
	}, "")
}

func TestValidationReplicaGroupCreate(t *testing.T) {
	ns := newNamespace(t)
	ctx := context.Background()
	cases := []struct {
		name string
		spec map[string]any
		want string
	}{
		{"no-shardmap", map[string]any{}, "spec.shardMap: Required value"},
		{"empty-shardmap", map[string]any{"shardMap": ""}, "should be at least 1 chars long"},
		{"replicas-zero", map[string]any{"shardMap": "sm", "replicas": 0}, "should be greater than or equal to 1"},
		{"replicas-too-many", map[string]any{"shardMap": "sm", "replicas": 10}, "should be less than or equal to 9"},
		{"weight-too-big", map[string]any{"shardMap": "sm", "weight": 1001}, "should be less than or equal to 1000"},
		{"weight-negative", map[string]any{"shardMap": "sm", "weight": -1}, "should be greater than or equal to 1"},
		{"bad-pvc-retention", map[string]any{"shardMap": "sm", "pvcRetention": "Keep"}, `Unsupported value: "Keep"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := k8sClient.Create(ctx, unstructuredObj("ReplicaGroup", ns, c.name, c.spec))
			expectRefused(t, c.name, err, c.want)
		})
	}
}

func TestValidationReplicaGroupDefaultsAndImmutability(t *testing.T) {
	ns := newNamespace(t)
	ctx := context.Background()
	if err := k8sClient.Create(ctx, unstructuredObj("ReplicaGroup", ns, "g", map[string]any{"shardMap": "sm", "storage": map[string]any{}})); err != nil {
		t.Fatal(err)
	}
	var rg shardkvv1.ReplicaGroup
	if err := get(ctx, ns, "g", &rg); err != nil {
		t.Fatal(err)
	}
	if rg.Spec.Replicas == nil || *rg.Spec.Replicas != 3 || rg.Spec.Weight != 1 || rg.Spec.ImagePullPolicy != "IfNotPresent" ||
		rg.Spec.PVCRetention != "Retain" || rg.Spec.Storage.Size.String() != "1Gi" {
		t.Errorf("defaults: got replicas=%v weight=%d imagePullPolicy=%q pvcRetention=%q storage=%s; want 3 1 IfNotPresent Retain 1Gi",
			rg.Spec.Replicas, rg.Spec.Weight, rg.Spec.ImagePullPolicy, rg.Spec.PVCRetention, rg.Spec.Storage.Size.String())
	}

	rg.Spec.ShardMap = "other"
	expectRefused(t, "shardMap changed", k8sClient.Update(ctx, &rg), "shardMap is immutable: a group cannot move to another cluster")

	// Scaling goes through spec.replicas (and the scale subresource).
	if err := get(ctx, ns, "g", &rg); err != nil {
		t.Fatal(err)
	}
	rg.Spec.Replicas = new(int32)
	*rg.Spec.Replicas = 5
	if err := k8sClient.Update(ctx, &rg); err != nil {
		t.Errorf("scale to 5: %v", err)
	}

	// status.phase is an enum.
	if err := get(ctx, ns, "g", &rg); err != nil {
		t.Fatal(err)
	}
	rg.Status.Phase = "Bogus"
	expectRefused(t, "status.phase Bogus", k8sClient.Status().Update(ctx, &rg), `Unsupported value: "Bogus"`)
}

// TestCRDPrinterColumns checks the kubectl columns of both kinds.
func TestCRDPrinterColumns(t *testing.T) {
	requireEnvtest(t)
	ctx := context.Background()
	want := map[string][]string{
		"shardmaps.shardkv.io":     {"Config", "Controllers", "Groups", "Shards", "Migrating", "Ready", "Migrate-Rate", "Age"},
		"replicagroups.shardkv.io": {"GID", "Phase", "Replicas", "Ready", "Shards", "Leader", "Age"},
	}
	for name, cols := range want {
		crd := &unstructured.Unstructured{}
		crd.SetGroupVersionKind(schema.GroupVersionKind{Group: "apiextensions.k8s.io", Version: "v1", Kind: "CustomResourceDefinition"})
		if err := get(ctx, "", name, crd); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		versions, _, _ := unstructured.NestedSlice(crd.Object, "spec", "versions")
		if len(versions) != 1 {
			t.Fatalf("%s: %d versions", name, len(versions))
		}
		v := versions[0].(map[string]any)
		pcs, _ := v["additionalPrinterColumns"].([]any)
		var got []string
		for _, pc := range pcs {
			got = append(got, pc.(map[string]any)["name"].(string))
		}
		if strings.Join(got, ",") != strings.Join(cols, ",") {
			t.Errorf("%s printer columns: got %v, want %v", name, got, cols)
		}
		if sub, _, _ := unstructured.NestedMap(v, "subresources", "status"); sub == nil {
			t.Errorf("%s: no status subresource", name)
		}
	}
}
