package controllers

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// TestShardMapResizesControllerGroup: spec.controller.replicas 3 -> 5 -> 3
// against a real API server, the test playing the StatefulSet controller,
// the kubelet and the controller group (whose membership follows the
// operator's calls). The grow scales the StatefulSet, adds each new pod's
// replica as a learner and promotes it; the shrink moves the leadership
// off a pod that goes, removes the members, shrinks the StatefulSet and
// deletes the removed pods' claims. The data groups' --ctrler list and the
// controller pods' --peers stay as bootstrapped: no pod template changes.
func TestShardMapResizesControllerGroup(t *testing.T) {
	ns := newNamespace(t)
	ctx := context.Background()
	dp := newFakeDataPlane()
	fc := dp.Ctrler(ns, "demo")
	fc.SetShards(4)
	addr := func(ord int) string { return podGRPCAddr(CtrlerName("demo"), ord, ns) }

	// The controller group's membership, as its leader reports it.
	var mu sync.Mutex
	ms := &shardkvpb.MemberStatus{Id: 1, Leader: 1, Role: "leader", Addr: addr(0), Commit: 100}
	for i := range 3 {
		ms.Members = append(ms.Members, &shardkvpb.Member{Id: uint64(i + 1), Addr: addr(i), Match: 100, HeardMsAgo: ptr.To[uint64](20)})
	}
	fc.SetMemberStatus(ms)
	dp.OnReplicaCall(func(r *fakeReplica, c fakeCall) {
		mu.Lock()
		defer mu.Unlock()
		id := c.Args[0].(uint64)
		switch c.Method {
		case "AddLearner":
			// It catches up at once.
			ms.Members = append(ms.Members, &shardkvpb.Member{Id: id, Addr: c.Args[1].(string), Learner: true, Match: 100, HeardMsAgo: ptr.To[uint64](20)})
		case "Promote":
			for _, m := range ms.Members {
				if m.Id == id {
					m.Learner = false
				}
			}
		case "RemoveMember":
			ms.Members = slices.DeleteFunc(ms.Members, func(m *shardkvpb.Member) bool { return m.Id == id })
		case "TransferLeader":
			for _, m := range ms.Members {
				if m.Id == id {
					ms.Id, ms.Leader, ms.Addr = id, id, m.Addr
				}
			}
		}
		fc.SetMemberStatus(ms)
	})

	startManager(t, ns, setupShardMap(dp))
	mustCreate(t, testShardMap(ns, "demo", 4, 3))
	sts := &appsv1.StatefulSet{}
	eventually(t, "StatefulSet", func() error { return get(ctx, ns, CtrlerName("demo"), sts) })
	tmpl := sts.Annotations[annotationSpecHash]

	// Play the kubelet: pod ord running (ready or not), its replica
	// answering with id and role, its claim bound.
	mkPod := func(ord int, ready bool, id uint64, role string) {
		t.Helper()
		// What the pod's replica answers, before the pod is seen.
		dp.Member(addr(ord)).SetStatus(&shardkvpb.MemberStatus{Id: id, Role: role, Addr: addr(ord)})
		sm := &shardkvv1.ShardMap{ObjectMeta: metav1.ObjectMeta{Name: "demo", Namespace: ns}}
		// The claim first, as the StatefulSet controller makes them.
		pvc := &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: pvcName(CtrlerName("demo"), ord), Labels: ctrlerSelectorLabels(sm)},
			Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("256Mi")}}},
		}
		mustCreate(t, pvc)
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("demo-ctrler-%d", ord), Labels: ctrlerLabels(sm)},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "node", Image: "x"}}},
		}
		pod.Labels[stsRevisionLabel] = "r1"
		mustCreate(t, pod)
		pod.Status.Phase = corev1.PodRunning
		if ready {
			pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
		}
		if err := k8sClient.Status().Update(ctx, pod); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 3 {
		mkPod(i, true, uint64(i+1), "follower")
	}
	markCtrlerReady(t, ns, "demo", 3, func(s *appsv1.StatefulSetStatus) { s.CurrentRevision, s.UpdateRevision = "r1", "r1" })
	waitSM(t, ns, "demo", "3 voters", func(sm *shardkvv1.ShardMap) error {
		if sm.Annotations[AnnotationCtrlerBootstrap] != "3" || sm.Status.ControllerVoters != 3 {
			return fmt.Errorf("bootstrap annotation %q, %d voters", sm.Annotations[AnnotationCtrlerBootstrap], sm.Status.ControllerVoters)
		}
		return nil
	})
	setReplicas := func(n int32) {
		t.Helper()
		eventually(t, "spec.controller.replicas", func() error {
			var sm shardkvv1.ShardMap
			if err := get(ctx, ns, "demo", &sm); err != nil {
				return err
			}
			sm.Spec.Controller.Replicas = n
			return k8sClient.Update(ctx, &sm)
		})
	}
	stsReplicas := func(want int32) {
		t.Helper()
		eventually(t, fmt.Sprintf("StatefulSet at %d", want), func() error {
			if err := get(ctx, ns, CtrlerName("demo"), sts); err != nil {
				return err
			}
			if *sts.Spec.Replicas != want {
				return fmt.Errorf("replicas %d", *sts.Spec.Replicas)
			}
			return nil
		})
	}

	// An even size is refused by the CRD.
	var sm shardkvv1.ShardMap
	if err := get(ctx, ns, "demo", &sm); err != nil {
		t.Fatal(err)
	}
	sm.Spec.Controller.Replicas = 4
	expectRefused(t, "4 controller replicas", k8sClient.Update(ctx, &sm), "controller replicas must be odd")

	// Grow to 5.
	setReplicas(5)
	stsReplicas(5)
	if sts.Annotations[annotationSpecHash] == tmpl {
		t.Errorf("the spec hash did not follow the size")
	}
	mkPod(3, false, 103, "joining")
	mkPod(4, false, 104, "joining")
	markCtrlerReady(t, ns, "demo", 3)
	waitSM(t, ns, "demo", "5 voters", func(sm *shardkvv1.ShardMap) error {
		if sm.Status.ControllerVoters != 5 {
			return fmt.Errorf("%d voters", sm.Status.ControllerVoters)
		}
		return condIs(sm, shardkvv1.ConditionProgressing, metav1.ConditionFalse, ReasonUpToDate, "")
	})
	var got []string
	for _, c := range dp.CallsTo("AddLearner", "Promote", "RemoveMember", "TransferLeader") {
		got = append(got, fmt.Sprintf("%s(%v)", c.Method, c.Args[0]))
	}
	if want := []string{"AddLearner(103)", "Promote(103)", "AddLearner(104)", "Promote(104)"}; !slices.Equal(got, want) {
		t.Fatalf("grow: calls %v, want %v", got, want)
	}
	expectEvent(t, ns, "demo", ReasonResizingController, "growing the controller StatefulSet from 3 to 5 pods")
	// The template (--peers) is the bootstrap's; so are the data pods'
	// --ctrler addresses.
	if err := get(ctx, ns, CtrlerName("demo"), sts); err != nil {
		t.Fatal(err)
	}
	if args := strings.Join(sts.Spec.Template.Spec.Containers[0].Args, " "); !strings.Contains(args, "--peers="+PeersFlag(CtrlerName("demo"), 3, ns)) {
		t.Errorf("controller args %q", args)
	}
	if err := get(ctx, ns, "demo", &sm); err != nil {
		t.Fatal(err)
	}
	if args := strings.Join(nodeArgs(&shardkvv1.ReplicaGroup{ObjectMeta: metav1.ObjectMeta{Name: "g", Namespace: ns}}, &sm, 1, 3), " "); !strings.Contains(args, "--ctrler="+strings.Join(CtrlerAddrs("demo", 3, ns), ",")+" ") {
		t.Errorf("data pod args %q: want the bootstrap's 3 controller addresses", args)
	}

	// Back to 3, with pod 4 leading.
	mu.Lock()
	ms.Id, ms.Leader, ms.Addr = 104, 104, addr(4)
	fc.SetMemberStatus(ms)
	mu.Unlock()
	markCtrlerReady(t, ns, "demo", 5)
	setReplicas(3)
	stsReplicas(3)
	got = nil
	for _, c := range dp.CallsTo("RemoveMember", "TransferLeader") {
		got = append(got, fmt.Sprintf("%s(%v)@%s", c.Method, c.Args[0], strings.Split(c.Target, ".")[0]))
	}
	if len(got) != 3 || !strings.HasPrefix(got[0], "TransferLeader(") || !strings.HasSuffix(got[0], "@demo-ctrler-4") ||
		!strings.HasPrefix(got[1], "RemoveMember(104)@") || !strings.HasPrefix(got[2], "RemoveMember(103)@") {
		t.Fatalf("shrink: calls %v, want TransferLeader on pod 4, then RemoveMember 104 and 103 on the new leader", got)
	}
	// The claims of pods 3 and 4 stay while their pods do.
	for _, ord := range []int{3, 4} {
		pvc := &corev1.PersistentVolumeClaim{}
		if err := get(ctx, ns, pvcName(CtrlerName("demo"), ord), pvc); err != nil || !pvc.DeletionTimestamp.IsZero() {
			t.Fatalf("claim %d while its pod runs: %v, deleting %v", ord, err, pvc.DeletionTimestamp)
		}
	}
	waitSM(t, ns, "demo", "waiting for the removed pods", func(sm *shardkvv1.ShardMap) error {
		return condIs(sm, shardkvv1.ConditionProgressing, metav1.ConditionTrue, ReasonResizingController, "waiting for pod demo-ctrler-3, no longer a member, to terminate")
	})
	for _, ord := range []int{3, 4} {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("demo-ctrler-%d", ord)}}
		if err := k8sClient.Delete(ctx, p, client.GracePeriodSeconds(0)); err != nil {
			t.Fatal(err)
		}
	}
	markCtrlerReady(t, ns, "demo", 3)
	eventually(t, "removed pods' claims deleted", func() error {
		for _, ord := range []int{3, 4} {
			pvc := &corev1.PersistentVolumeClaim{}
			err := get(ctx, ns, pvcName(CtrlerName("demo"), ord), pvc)
			if err == nil && pvc.DeletionTimestamp.IsZero() {
				return fmt.Errorf("claim of pod %d not deleted", ord)
			}
			if err != nil && !apierrors.IsNotFound(err) {
				return err
			}
		}
		return nil
	})
	waitSM(t, ns, "demo", "3 voters again", func(sm *shardkvv1.ShardMap) error {
		if sm.Status.ControllerVoters != 3 {
			return fmt.Errorf("%d voters", sm.Status.ControllerVoters)
		}
		return condIs(sm, shardkvv1.ConditionProgressing, metav1.ConditionFalse, ReasonUpToDate, "")
	})
	// The claims of the pods that stay are untouched.
	for i := range 3 {
		pvc := &corev1.PersistentVolumeClaim{}
		if err := get(ctx, ns, pvcName(CtrlerName("demo"), i), pvc); err != nil || !pvc.DeletionTimestamp.IsZero() {
			t.Errorf("claim %d: %v", i, err)
		}
	}

	// To 5 again, the new pods on disks of the removed replicas 103 and
	// 104 (as if their claims had outlived the shrink): each is recreated
	// with an empty volume, then added under its fresh id.
	claimGone := func(ord int) {
		t.Helper()
		eventually(t, fmt.Sprintf("claim %d gone", ord), func() error {
			pvc := &corev1.PersistentVolumeClaim{}
			if err := get(ctx, ns, pvcName(CtrlerName("demo"), ord), pvc); err != nil {
				return client.IgnoreNotFound(err)
			}
			if pvc.DeletionTimestamp.IsZero() {
				return fmt.Errorf("claim %d not deleted", ord)
			}
			// Play the PVC protection controller: its pod is gone.
			pvc.Finalizers = nil
			if err := k8sClient.Update(ctx, pvc); err != nil {
				return err
			}
			return fmt.Errorf("claim %d still there", ord)
		})
	}
	claimGone(3)
	claimGone(4)
	before := len(dp.CallsTo("AddLearner", "Promote", "RemoveMember", "TransferLeader"))
	setReplicas(5)
	stsReplicas(5)
	mkPod(3, false, 103, "removed")
	mkPod(4, false, 104, "removed")
	markCtrlerReady(t, ns, "demo", 3)
	for _, ord := range []int{3, 4} {
		eventually(t, fmt.Sprintf("pod %d recreated", ord), func() error {
			err := get(ctx, ns, fmt.Sprintf("demo-ctrler-%d", ord), &corev1.Pod{})
			if err == nil {
				var sm shardkvv1.ShardMap
				_ = get(ctx, ns, "demo", &sm)
				c := meta.FindStatusCondition(sm.Status.Conditions, shardkvv1.ConditionProgressing)
				return fmt.Errorf("pod %d still there; progressing %v", ord, c)
			}
			return client.IgnoreNotFound(err)
		})
		claimGone(ord)
		mkPod(ord, false, uint64(200+ord), "joining")
	}
	waitSM(t, ns, "demo", "5 voters again", func(sm *shardkvv1.ShardMap) error {
		if sm.Status.ControllerVoters != 5 {
			return fmt.Errorf("%d voters", sm.Status.ControllerVoters)
		}
		return condIs(sm, shardkvv1.ConditionProgressing, metav1.ConditionFalse, ReasonUpToDate, "")
	})
	got = nil
	for _, c := range dp.CallsTo("AddLearner", "Promote", "RemoveMember", "TransferLeader")[before:] {
		got = append(got, fmt.Sprintf("%s(%v)", c.Method, c.Args[0]))
	}
	if want := []string{"AddLearner(203)", "Promote(203)", "AddLearner(204)", "Promote(204)"}; !slices.Equal(got, want) {
		t.Fatalf("grow onto removed replicas' disks: calls %v, want %v", got, want)
	}
	expectEvent(t, ns, "demo", ReasonResizingController, "pod demo-ctrler-3 runs replica 103, which was removed from the group: recreating it with an empty volume")
}
