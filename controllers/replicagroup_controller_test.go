package controllers

// envtest tests of the ReplicaGroup reconciler: its objects and group ids,
// spec.paused, --dial-pod-ips. The simulated cluster is in
// replicagroup_sim_test.go, the helpers in replicagroup_helpers_test.go.

import (
	"context"
	"errors"
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
	"k8s.io/utils/ptr"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
)

func TestReplicaGroupObjectsAndGroupIDs(t *testing.T) {
	ns := newNamespace(t)
	dp := newFakeDataPlane()
	startManager(t, ns, setupReplicaGroup(dp))
	ctx := context.Background()
	newShardMap(t, ns, "sm")
	// Two groups at once: different ids, whoever wins the race.
	newReplicaGroup(t, ns, "a", "sm", 3, func(rg *shardkvv1.ReplicaGroup) {
		rg.Spec.PodTemplate.Annotations = map[string]string{"team": "kv"}
		rg.Spec.PodTemplate.NodeSelector = map[string]string{"disk": "ssd"}
		rg.Spec.PodTemplate.Tolerations = []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpExists}}
		rg.Spec.Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("250m")}
	})
	newReplicaGroup(t, ns, "b", "sm", 5, func(rg *shardkvv1.ReplicaGroup) { rg.Spec.Image = "custom:1" })

	gids := map[string]int64{}
	for _, name := range []string{"a", "b"} {
		eventually(t, name+" gets a group id and its objects", func() error {
			rg, err := getRG(ns, name)
			if err != nil {
				return err
			}
			if rg.Status.GroupID == 0 {
				return errors.New("no group id yet")
			}
			if !slices.Contains(rg.Finalizers, Finalizer) {
				return errors.New("no finalizer")
			}
			gids[name] = rg.Status.GroupID
			return get(ctx, ns, name, &corev1.Service{})
		})
	}
	if gids["a"] == gids["b"] || gids["a"] < 1 || gids["a"] > 2 || gids["b"] < 1 || gids["b"] > 2 {
		t.Fatalf("group ids %v, want 1 and 2", gids)
	}
	sm := &shardkvv1.ShardMap{}
	if err := get(ctx, ns, "sm", sm); err != nil || sm.Status.NextGroupID != 3 {
		t.Fatalf("shardmap nextGroupID %d (%v), want 3", sm.Status.NextGroupID, err)
	}

	rg, _ := getRG(ns, "a")
	if rg.Annotations[AnnotationBootstrapReplicas] != "3" {
		t.Fatalf("bootstrap annotation %q", rg.Annotations[AnnotationBootstrapReplicas])
	}
	if rg.Status.Selector == "" || rg.Status.Phase != shardkvv1.PhasePending {
		t.Fatalf("status %+v", rg.Status)
	}
	ownedByA := func(o metav1.Object) error {
		refs := o.GetOwnerReferences()
		if len(refs) != 1 || refs[0].Kind != "ReplicaGroup" || refs[0].Name != "a" || refs[0].UID != rg.UID || !ptr.Deref(refs[0].Controller, false) {
			return fmt.Errorf("%s: owner references %+v", o.GetName(), refs)
		}
		return nil
	}

	sts := &appsv1.StatefulSet{}
	if err := get(ctx, ns, "a", sts); err != nil {
		t.Fatal(err)
	}
	if err := ownedByA(sts); err != nil {
		t.Fatal(err)
	}
	if *sts.Spec.Replicas != 3 || sts.Spec.PodManagementPolicy != appsv1.ParallelPodManagement ||
		sts.Spec.UpdateStrategy.Type != appsv1.OnDeleteStatefulSetStrategyType || sts.Spec.ServiceName != "a" ||
		len(sts.Spec.VolumeClaimTemplates) != 1 || sts.Spec.VolumeClaimTemplates[0].Name != "data" {
		t.Fatalf("statefulset spec %+v", sts.Spec)
	}
	pod := sts.Spec.Template.Spec
	c := pod.Containers[0]
	wantArgs := []string{"serve", "--role=group", fmt.Sprintf("--group=%d", gids["a"]), "--id=auto", "--data-dir=/data",
		"--listen=0.0.0.0:7000", fmt.Sprintf("--advertise=$(POD_NAME).a.%s.svc:7000", ns),
		"--peers=" + PeersFlag("a", 3, ns), "--ctrler=" + strings.Join(CtrlerAddrs("sm", 3, ns), ","),
		"--resp=0.0.0.0:6379", fmt.Sprintf("--resp-advertise=$(POD_NAME).a.%s.svc:6379", ns), "--http=0.0.0.0:8080"}
	if !slices.Equal(c.Args, wantArgs) {
		t.Fatalf("args\n got %q\nwant %q", c.Args, wantArgs)
	}
	if c.Image != testImage || c.ImagePullPolicy != corev1.PullIfNotPresent || c.Env[0].Name != "POD_NAME" ||
		c.Env[0].ValueFrom.FieldRef.FieldPath != "metadata.name" || c.ReadinessProbe.HTTPGet.Path != "/readyz" || c.LivenessProbe.HTTPGet.Path != "/healthz" ||
		c.TerminationMessagePolicy != corev1.TerminationMessageFallbackToLogsOnError ||
		c.Resources.Requests.Cpu().String() != "250m" {
		t.Fatalf("container %+v", c)
	}
	if pod.NodeSelector["disk"] != "ssd" || len(pod.Tolerations) != 1 || sts.Spec.Template.Annotations["team"] != "kv" {
		t.Fatalf("pod overrides not applied: %+v", pod)
	}
	if sts.Spec.Template.Labels[LabelGroup] != "a" || sts.Spec.Template.Labels[LabelInstance] != "sm" {
		t.Fatalf("pod labels %v", sts.Spec.Template.Labels)
	}

	svc := &corev1.Service{}
	if err := get(ctx, ns, "a", svc); err != nil {
		t.Fatal(err)
	}
	if err := ownedByA(svc); err != nil {
		t.Fatal(err)
	}
	if svc.Spec.ClusterIP != corev1.ClusterIPNone || !svc.Spec.PublishNotReadyAddresses || len(svc.Spec.Ports) != 3 {
		t.Fatalf("service %+v", svc.Spec)
	}
	eventually(t, "pdb of a", func() error {
		pdb := &policyv1.PodDisruptionBudget{}
		if err := get(ctx, ns, "a", pdb); err != nil {
			return err
		}
		if err := ownedByA(pdb); err != nil {
			return err
		}
		if pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.IntValue() != 2 {
			return fmt.Errorf("minAvailable %v, want 2", pdb.Spec.MinAvailable)
		}
		return nil
	})
	stsB := &appsv1.StatefulSet{}
	if err := get(ctx, ns, "b", stsB); err != nil || stsB.Spec.Template.Spec.Containers[0].Image != "custom:1" || *stsB.Spec.Replicas != 5 {
		t.Fatalf("statefulset b: %v", err)
	}

	// A group that never joined goes at once when deleted; its id is not
	// handed out again.
	if err := k8sClient.Delete(ctx, rg); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a deleted", func() error {
		if _, err := getRG(ns, "a"); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there (%v)", err)
		}
		return nil
	})
	newReplicaGroup(t, ns, "c", "sm", 1)
	eventually(t, "c gets id 3", func() error {
		rg, err := getRG(ns, "c")
		if err != nil {
			return err
		}
		if rg.Status.GroupID != 3 {
			return fmt.Errorf("group id %d, want 3", rg.Status.GroupID)
		}
		return nil
	})
	if n := len(dp.CallsTo("Join", "Leave")); n != 0 {
		t.Fatalf("%d joins/leaves without a leader", n)
	}
}

func TestReplicaGroupPaused(t *testing.T) {
	ns, dp, _ := startSimGroup(t, 3)
	newReplicaGroup(t, ns, "g", "sm", 3)
	waitServing(t, ns, "g", 3)

	ctx := context.Background()
	eventually(t, "pause", func() error {
		sm := &shardkvv1.ShardMap{}
		if err := get(ctx, ns, "sm", sm); err != nil {
			return err
		}
		sm.Spec.Paused = true
		return k8sClient.Update(ctx, sm)
	})
	dp.ResetCalls()
	updateRG(t, ns, "g", func(rg *shardkvv1.ReplicaGroup) { rg.Spec.Replicas = ptr.To[int32](5) })
	eventually(t, "paused condition", func() error {
		rg, err := getRG(ns, "g")
		if err != nil {
			return err
		}
		if c := condition(rg, shardkvv1.ConditionProgressing); c == nil || c.Reason != reasonPaused || c.Status != metav1.ConditionFalse {
			return fmt.Errorf("progressing %+v", c)
		}
		return nil
	})
	consistently(t, 300*time.Millisecond, "nothing changes", func() error {
		sts := &appsv1.StatefulSet{}
		if err := get(ctx, ns, "g", sts); err != nil {
			return err
		}
		if *sts.Spec.Replicas != 3 {
			return fmt.Errorf("replicas %d", *sts.Spec.Replicas)
		}
		if c := callsOf(dp, "Scale", "AddLearner", "Join"); len(c) > 0 {
			return fmt.Errorf("calls %q", c)
		}
		return nil
	})
	eventually(t, "unpause", func() error {
		sm := &shardkvv1.ShardMap{}
		if err := get(ctx, ns, "sm", sm); err != nil {
			return err
		}
		sm.Spec.Paused = false
		return k8sClient.Update(ctx, sm)
	})
	waitServing(t, ns, "g", 5)
}

func TestReplicaGroupDialPodIPs(t *testing.T) {
	ns := newNamespace(t)
	dp := newFakeDataPlane()
	ctrler := dp.Ctrler(ns, "sm")
	ctrler.SetShards(16)
	startManager(t, ns, setupReplicaGroup(dp, func(r *ReplicaGroupReconciler) { r.DialPodIPs = true }))
	newShardMap(t, ns, "sm")
	// The controller's pods, as the ShardMap's StatefulSet would have them.
	ctx := context.Background()
	for i := range 3 {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("%s-%d", CtrlerName("sm"), i),
			Labels: map[string]string{LabelInstance: "sm", LabelComponent: "controller"}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "node", Image: testImage}}}}
		if err := k8sClient.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		p.Status.PodIP = fmt.Sprintf("10.2.0.%d", i+1)
		if err := k8sClient.Status().Update(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	dp.Alias("10.2.0.1:7000", ctrler)
	g := startGroupSim(t, ns, "g", 1, dp)
	g.SetDialIPs()
	simHooks(dp, g)
	newReplicaGroup(t, ns, "g", "sm", 1)
	waitServing(t, ns, "g", 1)
	calls := dp.Calls()
	if !slices.ContainsFunc(calls, func(c fakeCall) bool { return c.Method == "Status" && c.Target == g.ipAddr(0) }) {
		t.Fatalf("no Status call to the pod IP: %v", calls)
	}
	for _, c := range calls {
		if strings.HasPrefix(c.Target, "g-") {
			t.Fatalf("dialled a DNS name in pod-IP mode: %v", c)
		}
	}
}
