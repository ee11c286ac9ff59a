package controllers

// envtest tests of the ShardMap reconciler: the controller group's objects
// and pod spec, spec.paused, --dial-pod-ips.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

func TestShardMapCreatesObjects(t *testing.T) {
	ns := newNamespace(t)
	dp := newFakeDataPlane()
	startManager(t, ns, setupShardMap(dp))
	ctx := context.Background()

	sm := testShardMap(ns, "demo", 64, 3)
	sm.Spec.Controller.Image = "example/shardkv:1"
	sm.Spec.Controller.Resources = corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")}}
	mustCreate(t, sm)

	name := CtrlerName("demo")
	isOwned := func(o client.Object) error {
		for _, ref := range o.GetOwnerReferences() {
			if ref.Kind == "ShardMap" && ref.Name == "demo" && ref.UID == sm.UID && ref.Controller != nil && *ref.Controller {
				return nil
			}
		}
		return fmt.Errorf("%s has no controller reference to the ShardMap: %v", o.GetName(), o.GetOwnerReferences())
	}

	sts := &appsv1.StatefulSet{}
	eventually(t, "controller StatefulSet", func() error {
		if err := get(ctx, ns, name, sts); err != nil {
			return err
		}
		return isOwned(sts)
	})
	if got := *sts.Spec.Replicas; got != 3 {
		t.Errorf("replicas %d, want 3", got)
	}
	if sts.Spec.PodManagementPolicy != appsv1.ParallelPodManagement || sts.Spec.UpdateStrategy.Type != appsv1.OnDeleteStatefulSetStrategyType || sts.Spec.ServiceName != name {
		t.Errorf("podManagementPolicy %s, updateStrategy %s, serviceName %s", sts.Spec.PodManagementPolicy, sts.Spec.UpdateStrategy.Type, sts.Spec.ServiceName)
	}
	if vct := sts.Spec.VolumeClaimTemplates; len(vct) != 1 || vct[0].Name != "data" || vct[0].Spec.Resources.Requests.Storage().String() != "256Mi" {
		t.Errorf("volumeClaimTemplates %+v", vct)
	}
	pod := sts.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers", len(pod.Containers))
	}
	c := pod.Containers[0]
	wantArgs := []string{
		"serve", "--role=ctrler", "--id=auto", "--data-dir=/data", "--listen=0.0.0.0:7000",
		"--advertise=$(POD_NAME).demo-ctrler." + ns + ".svc:7000",
		"--peers=" + PeersFlag(name, 3, ns),
		"--shards=64", "--placement=balanced", "--http=0.0.0.0:8080",
	}
	if c.Name != "node" || c.Image != "example/shardkv:1" || c.ImagePullPolicy != corev1.PullIfNotPresent || !slices.Equal(c.Command, []string{"/node"}) {
		t.Errorf("container %s image %s pull %s command %v", c.Name, c.Image, c.ImagePullPolicy, c.Command)
	}
	if !slices.Equal(c.Args, wantArgs) {
		t.Errorf("args\n got %q\nwant %q", c.Args, wantArgs)
	}
	if !strings.Contains(strings.Join(c.Args, " "), "1=demo-ctrler-0.demo-ctrler."+ns+".svc:7000,2=demo-ctrler-1.") {
		t.Errorf("peers %q", c.Args)
	}
	if len(c.Env) != 1 || c.Env[0].Name != "POD_NAME" || c.Env[0].ValueFrom == nil || c.Env[0].ValueFrom.FieldRef == nil || c.Env[0].ValueFrom.FieldRef.FieldPath != "metadata.name" {
		t.Errorf("env %+v", c.Env)
	}
	// Ready is Raft health; live is "the process answers".
	for what, p := range map[string]*corev1.Probe{"/readyz": c.ReadinessProbe, "/healthz": c.LivenessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != what || p.HTTPGet.Port.String() != "http" {
			t.Errorf("probe %+v, want %s", p, what)
		}
	}
	if q := c.Resources.Requests[corev1.ResourceCPU]; q.String() != "100m" {
		t.Errorf("resources %+v", c.Resources)
	}
	if pod.SecurityContext == nil || pod.SecurityContext.FSGroup == nil || *pod.SecurityContext.FSGroup != NodeUID {
		t.Errorf("pod security context %+v", pod.SecurityContext)
	}

	svc := &corev1.Service{}
	eventually(t, "controller Service", func() error {
		if err := get(ctx, ns, name, svc); err != nil {
			return err
		}
		return isOwned(svc)
	})
	if svc.Spec.ClusterIP != corev1.ClusterIPNone || !svc.Spec.PublishNotReadyAddresses || len(svc.Spec.Ports) != 2 ||
		svc.Spec.Ports[0].Port != GRPCPort || svc.Spec.Ports[1].Port != HTTPPort {
		t.Errorf("service spec %+v", svc.Spec)
	}

	pdb := &policyv1.PodDisruptionBudget{}
	eventually(t, "controller PDB", func() error {
		if err := get(ctx, ns, name, pdb); err != nil {
			return err
		}
		return isOwned(pdb)
	})
	if pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.IntValue() != 2 {
		t.Errorf("PDB minAvailable %v, want 2 (a majority of 3)", pdb.Spec.MinAvailable)
	}

	// No pod is ready (envtest runs no StatefulSet controller): the wait is
	// recorded, and no data-plane call is made.
	waitSM(t, ns, "demo", "Ready=False WaitingForControllerQuorum", func(sm *shardkvv1.ShardMap) error {
		if sm.Status.NextGroupID != 1 || sm.Status.ObservedGeneration != sm.Generation {
			return fmt.Errorf("nextGroupID %d observedGeneration %d", sm.Status.NextGroupID, sm.Status.ObservedGeneration)
		}
		return condIs(sm, shardkvv1.ConditionReady, metav1.ConditionFalse, ReasonWaitingForControllerQuorum, "0/3 controller pods ready (2 needed for a quorum)")
	})
	if calls := dp.CallsTo("Status"); len(calls) != 0 {
		t.Errorf("data-plane calls without a quorum: %v", calls)
	}
	eventually(t, "Created events", func() error { return hasEvent(ns, "demo", "Created", "StatefulSet "+name) })

	// A one-replica controller group: default image, PDB minAvailable 1.
	mustCreate(t, testShardMap(ns, "solo", 16, 1))
	eventually(t, "solo PDB", func() error { return get(ctx, ns, CtrlerName("solo"), pdb) })
	if pdb.Spec.MinAvailable.IntValue() != 1 {
		t.Errorf("solo PDB minAvailable %v, want 1", pdb.Spec.MinAvailable)
	}
	if err := get(ctx, ns, CtrlerName("solo"), sts); err != nil {
		t.Fatal(err)
	}
	if img := sts.Spec.Template.Spec.Containers[0].Image; img != "shardkv:test" {
		t.Errorf("default image %q, want the operator's shardkv:test", img)
	}

	// A spec change reaches the template (the operator rolls pods itself).
	eventually(t, "image update", func() error {
		var cur shardkvv1.ShardMap
		if err := get(ctx, ns, "demo", &cur); err != nil {
			return err
		}
		cur.Spec.Controller.Image = "example/shardkv:2"
		return k8sClient.Update(ctx, &cur)
	})
	eventually(t, "new image in the template", func() error {
		if err := get(ctx, ns, name, sts); err != nil {
			return err
		}
		if img := sts.Spec.Template.Spec.Containers[0].Image; img != "example/shardkv:2" {
			return fmt.Errorf("image %s", img)
		}
		return nil
	})

	// The controller pods' volumes (bound, as a provisioner would, with no
	// class): shrinking them is refused by the operator, growing them by
	// the API server (a claim without a StorageClass cannot expand).
	var smObj shardkvv1.ShardMap
	if err := get(ctx, ns, "demo", &smObj); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		claim := &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: pvcName(name, i), Labels: ctrlerSelectorLabels(&smObj)},
			Spec:       *sts.Spec.VolumeClaimTemplates[0].Spec.DeepCopy(),
		}
		if err := k8sClient.Create(ctx, claim); err != nil {
			t.Fatal(err)
		}
		claim.Status = corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimBound,
			Capacity: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("256Mi")}}
		if err := k8sClient.Status().Update(ctx, claim); err != nil {
			t.Fatal(err)
		}
	}
	setStorage := func(size string) {
		t.Helper()
		eventually(t, "storage change", func() error {
			var cur shardkvv1.ShardMap
			if err := get(ctx, ns, "demo", &cur); err != nil {
				return err
			}
			cur.Spec.Controller.Storage.Size = resource.MustParse(size)
			return k8sClient.Update(ctx, &cur)
		})
	}
	waitSM(t, ns, "demo", "StorageApplied", func(sm *shardkvv1.ShardMap) error {
		return condIs(sm, shardkvv1.ConditionStorageApplied, metav1.ConditionTrue, reasonStorageApplied, "all 3 volumes are 256Mi")
	})
	setStorage("128Mi")
	waitSM(t, ns, "demo", "Degraded ShrinkNotSupported", func(sm *shardkvv1.ShardMap) error {
		return condIs(sm, shardkvv1.ConditionDegraded, metav1.ConditionTrue, reasonStorageShrink, "spec.controller.storage.size 128Mi is below the size of volumes data-demo-ctrler-0 (256Mi)")
	})
	setStorage("512Mi")
	waitSM(t, ns, "demo", "Degraded ResizeRefused", func(sm *shardkvv1.ShardMap) error {
		return condIs(sm, shardkvv1.ConditionDegraded, metav1.ConditionTrue, reasonStorageResizeRefused,
			"growing volume "+pvcName(name, 0)+" from 256Mi to 512Mi was refused by the API server")
	})
	expectEvent(t, ns, "demo", reasonStorageResizeRefused, "allowVolumeExpansion")
}

func TestShardMapPaused(t *testing.T) {
	ns := newNamespace(t)
	dp := newFakeDataPlane()
	fc := dp.Ctrler(ns, "demo")
	fc.SetShards(4)
	fc.SetConfig(&shardkvpb.Config{Shards: []uint64{1, 1, 2, 2}, Groups: []*shardkvpb.Group{smGroup(1), smGroup(2)}})
	startManager(t, ns, setupShardMap(dp))
	createGroup(t, ns, "a", "demo", 1)
	createGroup(t, ns, "b", "demo", 2)

	sm := testShardMap(ns, "demo", 4, 1)
	sm.Spec.Paused = true
	sm.Spec.Moves = []shardkvv1.ShardMove{{Shard: 0, Group: "b"}}
	mustCreate(t, sm)
	waitSM(t, ns, "demo", "Progressing=False Paused", func(sm *shardkvv1.ShardMap) error {
		return condIs(sm, shardkvv1.ConditionProgressing, metav1.ConditionFalse, ReasonPaused, "spec.paused is set")
	})
	eventually(t, "Paused event", func() error { return hasEvent(ns, "demo", "Paused", "") })
	consistently(t, 2*time.Second, "nothing created while paused", func() error {
		err := get(context.Background(), ns, CtrlerName("demo"), &appsv1.StatefulSet{})
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("StatefulSet: %v", err)
		}
		return nil
	})

	// Unpause: the objects come, then the move.
	setPaused := func(p bool) {
		eventually(t, fmt.Sprintf("paused=%v", p), func() error {
			var cur shardkvv1.ShardMap
			if err := get(context.Background(), ns, "demo", &cur); err != nil {
				return err
			}
			cur.Spec.Paused = p
			return k8sClient.Update(context.Background(), &cur)
		})
	}
	setPaused(false)
	eventually(t, "StatefulSet after unpause", func() error {
		return get(context.Background(), ns, CtrlerName("demo"), &appsv1.StatefulSet{})
	})
	eventually(t, "Resumed event", func() error { return hasEvent(ns, "demo", "Resumed", "") })
	markCtrlerReady(t, ns, "demo", 1)
	eventually(t, "the move", func() error {
		if len(dp.CallsTo("Move")) != 1 {
			return fmt.Errorf("calls %v", dp.CallsTo("Move"))
		}
		return nil
	})

	// Paused again: status still follows the controller, but no mutation
	// (the new pin request waits) and no object change.
	setPaused(true)
	waitSM(t, ns, "demo", "paused again", func(sm *shardkvv1.ShardMap) error {
		return condIs(sm, shardkvv1.ConditionProgressing, metav1.ConditionFalse, ReasonPaused, "")
	})
	eventually(t, "moves and image while paused", func() error {
		var cur shardkvv1.ShardMap
		if err := get(context.Background(), ns, "demo", &cur); err != nil {
			return err
		}
		cur.Spec.Moves = append(cur.Spec.Moves, shardkvv1.ShardMove{Shard: 3, Group: "a"})
		cur.Spec.Controller.Image = "example/other:1"
		return k8sClient.Update(context.Background(), &cur)
	})
	fc.SetConfig(&shardkvpb.Config{Shards: []uint64{2, 1, 2, 2}, Groups: []*shardkvpb.Group{smGroup(1), smGroup(2)}, Pins: []*shardkvpb.Pin{{Shard: 0, Gid: 2}}})
	want := int64(fc.Latest().Num)
	waitSM(t, ns, "demo", "status updated while paused", func(sm *shardkvv1.ShardMap) error {
		if sm.Status.ConfigNum != want {
			return fmt.Errorf("configNum %d want %d", sm.Status.ConfigNum, want)
		}
		return nil
	})
	consistently(t, 2*time.Second, "no mutation while paused", func() error {
		if n := len(dp.CallsTo("Move", "Unpin")); n != 1 {
			return fmt.Errorf("calls %v", dp.CallsTo("Move", "Unpin"))
		}
		sts := &appsv1.StatefulSet{}
		if err := get(context.Background(), ns, CtrlerName("demo"), sts); err != nil {
			return err
		}
		if img := sts.Spec.Template.Spec.Containers[0].Image; img != "shardkv:test" {
			return fmt.Errorf("image changed to %s while paused", img)
		}
		return nil
	})
}

// TestShardMapDialPodIPs: with DialPodIPs the controller is reached at its
// pods' IPs.
func TestShardMapDialPodIPs(t *testing.T) {
	ns := newNamespace(t)
	dp := newFakeDataPlane()
	fc := dp.CtrlerAt("10.1.0.1:7000")
	fc.SetShards(2)
	fc.SetConfig(&shardkvpb.Config{Shards: []uint64{4, 4}, Groups: []*shardkvpb.Group{smGroup(4)}})
	startManager(t, ns, setupShardMap(dp, func(r *ShardMapReconciler) { r.DialPodIPs = true }))
	mustCreate(t, testShardMap(ns, "demo", 2, 1))
	markCtrlerReady(t, ns, "demo", 1)
	waitSM(t, ns, "demo", "waiting for a pod IP", func(sm *shardkvv1.ShardMap) error {
		return condIs(sm, shardkvv1.ConditionReady, metav1.ConditionFalse, ReasonControllerUnavailable, "no controller pod has an IP yet")
	})
	sm := &shardkvv1.ShardMap{ObjectMeta: metav1.ObjectMeta{Name: "demo", Namespace: ns}}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "demo-ctrler-0", Labels: ctrlerLabels(sm)},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "node", Image: "x"}}},
	}
	mustCreate(t, pod)
	pod.Status.PodIP = "10.1.0.1"
	if err := k8sClient.Status().Update(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	waitSM(t, ns, "demo", "status from the pod IP", func(sm *shardkvv1.ShardMap) error {
		if sm.Status.ConfigNum != 1 || sm.Status.GroupCount != 1 {
			return fmt.Errorf("configNum %d groups %d", sm.Status.ConfigNum, sm.Status.GroupCount)
		}
		return nil
	})
}

// TestShardMapUpdatesService: a controller Service written from another
// spec (an older operator, or edited by hand along with its hash) is
// brought back to the desired ports and hash with an update.
func TestShardMapUpdatesService(t *testing.T) {
	ns := newNamespace(t)
	dp := newFakeDataPlane()
	startManager(t, ns, setupShardMap(dp))
	ctx := context.Background()
	mustCreate(t, testShardMap(ns, "demo", 8, 1))
	name := CtrlerName("demo")
	svc := &corev1.Service{}
	eventually(t, "controller Service", func() error { return get(ctx, ns, name, svc) })
	want := svc.Annotations[annotationSpecHash]
	wantPorts := svc.Spec.Ports
	svc.Spec.Ports = svc.Spec.Ports[:1]
	svc.Annotations[annotationSpecHash] = "stale"
	if err := k8sClient.Update(ctx, svc); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the Service updated back", func() error {
		if err := get(ctx, ns, name, svc); err != nil {
			return err
		}
		if h := svc.Annotations[annotationSpecHash]; h != want || len(svc.Spec.Ports) != len(wantPorts) {
			return fmt.Errorf("hash %s (want %s), ports %v (want %v)", h, want, svc.Spec.Ports, wantPorts)
		}
		return nil
	})
}
