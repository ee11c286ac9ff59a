package controllers

// envtest test of the ReplicaGroup's rolling update (a groupSim plays the
// cluster).

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
)

func TestReplicaGroupRollingUpdate(t *testing.T) {
	ns, dp, g := startSimGroup(t, 3)
	newReplicaGroup(t, ns, "g", "sm", 3)
	waitServing(t, ns, "g", 3)
	ctx := context.Background()
	sts := &appsv1.StatefulSet{}
	if err := get(ctx, ns, "g", sts); err != nil {
		t.Fatal(err)
	}
	oldRev := g.podTemplateRevision(sts)

	dp.ResetCalls()
	updateRG(t, ns, "g", func(rg *shardkvv1.ReplicaGroup) { rg.Spec.Image = "registry.local/shardkv/node:v2" })
	var newRev string
	eventually(t, "every pod at the new revision", func() error {
		if err := get(ctx, ns, "g", sts); err != nil {
			return err
		}
		newRev = g.podTemplateRevision(sts)
		if newRev == oldRev {
			return errors.New("template not updated")
		}
		if img := sts.Spec.Template.Spec.Containers[0].Image; img != "registry.local/shardkv/node:v2" {
			return fmt.Errorf("image %s", img)
		}
		var pods corev1.PodList
		if err := k8sClient.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{LabelGroup: "g"}); err != nil {
			return err
		}
		if len(pods.Items) != 3 {
			return fmt.Errorf("%d pods", len(pods.Items))
		}
		for _, p := range pods.Items {
			if p.Labels[appsv1.ControllerRevisionHashLabelKey] != newRev {
				return fmt.Errorf("%s at %s", p.Name, p.Labels[appsv1.ControllerRevisionHashLabelKey])
			}
		}
		return nil
	})
	waitServing(t, ns, "g", 3)
	got := callsOf(dp, "DeletePod", "TransferLeader", "RemoveMember", "AddLearner")
	want := []string{"DeletePod[g-2]", "DeletePod[g-1]", "TransferLeader[2]", "DeletePod[g-0]"}
	if !slices.Equal(got, want) {
		t.Fatalf("rolling update\n got %q\nwant %q", got, want)
	}
	expectEvent(t, ns, "g", "RestartPod", "restarting follower g-2")
}
