package controllers

// envtest tests of the ReplicaGroup's membership changes: join, scale-out,
// scale-in, and a replica that lost its disk (a groupSim plays the cluster).

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
)

func TestReplicaGroupJoinScaleOutScaleIn(t *testing.T) {
	ns, dp, g := startSimGroup(t, 3)
	newReplicaGroup(t, ns, "g", "sm", 3)

	rg := waitServing(t, ns, "g", 3)
	gid := uint64(rg.Status.GroupID)
	if rg.Status.Leader != "g-0" || rg.Status.ReadyReplicas != 3 || rg.Status.Shards.Count != 16 || rg.Status.Shards.Ranges != "0-15" {
		t.Fatalf("status %+v", rg.Status)
	}
	if c := condition(rg, shardkvv1.ConditionJoined); c == nil || c.Status != metav1.ConditionTrue {
		t.Fatalf("joined condition %+v", c)
	}
	joins := dp.CallsTo("Join")
	if len(joins) != 1 {
		t.Fatalf("joins %v", joins)
	}
	cg := configGroup(dp.Ctrler(ns, "sm").Latest(), gid)
	if cg == nil || len(cg.Servers) != 3 || cg.Servers[0].Addr != g.addr(0) || cg.Servers[0].RespAddr != fmt.Sprintf("%s:%d", PodDNS("g", 0, ns), RESPPort) {
		t.Fatalf("group in config %v", cg)
	}
	expectEvent(t, ns, "g", "Join", "joining group")

	// Scale-out 3 -> 5: one member at a time.
	dp.ResetCalls()
	updateRG(t, ns, "g", func(rg *shardkvv1.ReplicaGroup) { rg.Spec.Replicas = ptr.To[int32](5) })
	rg = waitServing(t, ns, "g", 5)
	got := callsOf(dp, "Scale", "AddLearner", "Promote", "Join", "RemoveMember", "TransferLeader")
	want := []string{
		"Scale[g 4]", fmt.Sprintf("AddLearner[101 %s]", g.addr(3)), "Promote[101]", fmt.Sprintf("Join[[%d]]", gid),
		"Scale[g 5]", fmt.Sprintf("AddLearner[102 %s]", g.addr(4)), "Promote[102]", fmt.Sprintf("Join[[%d]]", gid),
	}
	if !slices.Equal(got, want) {
		t.Fatalf("scale-out calls\n got %q\nwant %q", got, want)
	}
	if cg := configGroup(dp.Ctrler(ns, "sm").Latest(), gid); len(cg.Servers) != 5 {
		t.Fatalf("controller servers %v", cg.Servers)
	}
	if rg.Status.Selector == "" {
		t.Fatal("no selector")
	}

	// Scale-in 5 -> 3 with the leader at the highest ordinal.
	g.SetLeader(102)
	eventually(t, "leader g-4 seen", func() error {
		rg, err := getRG(ns, "g")
		if err != nil {
			return err
		}
		if rg.Status.Leader != "g-4" {
			return fmt.Errorf("leader %q", rg.Status.Leader)
		}
		return nil
	})
	dp.ResetCalls()
	updateRG(t, ns, "g", func(rg *shardkvv1.ReplicaGroup) { rg.Spec.Replicas = ptr.To[int32](3) })
	waitServing(t, ns, "g", 3)
	got = callsOf(dp, "Scale", "AddLearner", "Promote", "Join", "RemoveMember", "TransferLeader")
	if len(got) != 7 || !strings.HasPrefix(got[0], "TransferLeader[") || got[1] != "RemoveMember[102]" ||
		got[2] != fmt.Sprintf("Join[[%d]]", gid) || got[3] != "Scale[g 4]" || got[4] != "RemoveMember[101]" ||
		got[5] != fmt.Sprintf("Join[[%d]]", gid) || got[6] != "Scale[g 3]" {
		t.Fatalf("scale-in calls %q", got)
	}
	if l := g.Leader(); l == 101 || l == 102 {
		t.Fatalf("leader %d is a removed member", l)
	}
	if cg := configGroup(dp.Ctrler(ns, "sm").Latest(), gid); len(cg.Servers) != 3 {
		t.Fatalf("controller servers %v", cg.Servers)
	}
	// pvcRetention Retain (default): the claims stay.
	for _, ord := range []int{3, 4} {
		if err := get(context.Background(), ns, pvcName("g", ord), &corev1.PersistentVolumeClaim{}); err != nil {
			t.Fatalf("claim %d: %v", ord, err)
		}
	}
	pdb := &policyv1.PodDisruptionBudget{}
	if err := get(context.Background(), ns, "g", pdb); err != nil || pdb.Spec.MinAvailable.IntValue() != 2 {
		t.Fatalf("pdb %v %v", pdb.Spec.MinAvailable, err)
	}
}

func TestReplicaGroupScaleInDeletesClaimsAndScaleOutDuringScaleIn(t *testing.T) {
	ns, dp, g := startSimGroup(t, 4)
	newReplicaGroup(t, ns, "g", "sm", 4, func(rg *shardkvv1.ReplicaGroup) { rg.Spec.PVCRetention = "Delete" })
	waitServing(t, ns, "g", 4)

	// Scale-in to 3, and back to 4 as soon as the member is removed,
	// before (or after) the StatefulSet shrinks: either way the step in
	// flight finishes and the group gets back to 4 members, the new one
	// under a fresh id on an empty volume.
	dp.ResetCalls()
	updateRG(t, ns, "g", func(rg *shardkvv1.ReplicaGroup) { rg.Spec.Replicas = ptr.To[int32](3) })
	eventually(t, "member 4 removed", func() error {
		if len(dp.CallsTo("RemoveMember")) == 0 {
			return errors.New("not yet")
		}
		return nil
	})
	updateRG(t, ns, "g", func(rg *shardkvv1.ReplicaGroup) { rg.Spec.Replicas = ptr.To[int32](4) })
	waitServing(t, ns, "g", 4)
	ms := g.Members()
	if slices.ContainsFunc(ms, func(m memberView) bool { return m.ID == 4 }) ||
		!slices.ContainsFunc(ms, func(m memberView) bool { return m.ID > 100 && m.Ordinal == 3 }) {
		t.Fatalf("members %+v: want 4 replaced by a fresh id at ordinal 3", ms)
	}
	got := callsOf(dp, "RemoveMember", "AddLearner", "Promote")
	if len(got) != 3 || got[0] != "RemoveMember[4]" || !strings.HasPrefix(got[1], "AddLearner[") || !strings.HasPrefix(got[2], "Promote[") {
		t.Fatalf("calls %q\nall: %v", got, dp.Calls())
	}
	// The removed replica's volume was deleted (pvcRetention Delete),
	// either by the shrink's cleanup or to give the pod a fresh one.
	if dels := dp.CallsTo("DeletePVC"); len(dels) == 0 || dels[0].Args[0] != pvcName("g", 3) {
		t.Fatalf("claim deletions %v", dels)
	}

	// Plain scale-in with Delete: the claim goes after its pod.
	dp.ResetCalls()
	updateRG(t, ns, "g", func(rg *shardkvv1.ReplicaGroup) { rg.Spec.Replicas = ptr.To[int32](3) })
	waitServing(t, ns, "g", 3)
	eventually(t, "claim of g-3 deleted", func() error {
		c := &corev1.PersistentVolumeClaim{}
		if err := get(context.Background(), ns, pvcName("g", 3), c); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there (%v)", err)
		}
		return nil
	})
	got = callsOf(dp, "RemoveMember", "Scale", "DeletePVC")
	if len(got) != 3 || !strings.HasPrefix(got[0], "RemoveMember[") || got[1] != "Scale[g 3]" || got[2] != "DeletePVC["+pvcName("g", 3)+"]" {
		t.Fatalf("calls %q", got)
	}
}

func TestReplicaGroupLostDisk(t *testing.T) {
	ns, dp, g := startSimGroup(t, 3)
	newReplicaGroup(t, ns, "g", "sm", 3)
	rg := waitServing(t, ns, "g", 3)
	gid := uint64(rg.Status.GroupID)

	// Pod g-1 loses its volume: it comes back on an empty one, and
	// --id=auto makes it a new replica waiting to join.
	dp.ResetCalls()
	ctx := context.Background()
	g.Freeze(1, true)
	c := &corev1.PersistentVolumeClaim{}
	if err := get(ctx, ns, pvcName("g", 1), c); err != nil {
		t.Fatal(err)
	}
	if err := k8sClient.Delete(ctx, c); err != nil {
		t.Fatal(err)
	}
	if err := k8sClient.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "g-1"}}); err != nil {
		t.Fatal(err)
	}
	g.Freeze(1, false)
	eventually(t, "member 2 replaced", func() error {
		ms := g.Members()
		if slices.ContainsFunc(ms, func(m memberView) bool { return m.ID == 2 }) {
			return errors.New("2 is still a member")
		}
		if !slices.ContainsFunc(ms, func(m memberView) bool { return m.ID > 100 && m.Ordinal == 1 && !m.Learner }) {
			return fmt.Errorf("no new voter at ordinal 1: %+v", ms)
		}
		return nil
	})
	waitServing(t, ns, "g", 3)
	got := callsOf(dp, "RemoveMember", "AddLearner", "Promote", "Join")
	want := []string{"RemoveMember[2]", fmt.Sprintf("Join[[%d]]", gid), fmt.Sprintf("AddLearner[101 %s]", g.addr(1)),
		"Promote[101]", fmt.Sprintf("Join[[%d]]", gid)}
	if !slices.Equal(got, want) {
		t.Fatalf("calls\n got %q\nwant %q", got, want)
	}
}
