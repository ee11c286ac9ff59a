package controllers

import (
	"context"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
)

// TestStatusCollector: the gauges are the status the API server holds.
func TestStatusCollector(t *testing.T) {
	requireEnvtest(t)
	ns := newNamespace(t)
	ctx := context.Background()

	sm := testShardMap(ns, "m", 8, 1)
	mustCreate(t, sm)
	sm.Status = shardkvv1.ShardMapStatus{
		ConfigNum: 7, GroupCount: 2, MigratingShards: 1, ControllerReadyReplicas: 1,
		ShardStates: map[string]int32{"Serving": 7, "Pulling": 1},
		Conditions: []metav1.Condition{{Type: "Ready", Status: metav1.ConditionFalse, Reason: "ShardsNotServing",
			Message: "x", LastTransitionTime: metav1.Now()}},
	}
	if err := k8sClient.Status().Update(ctx, sm); err != nil {
		t.Fatal(err)
	}
	rg := &shardkvv1.ReplicaGroup{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "g"},
		Spec: shardkvv1.ReplicaGroupSpec{ShardMap: "m", Replicas: ptr.To[int32](3)}}
	mustCreate(t, rg)
	rg.Status = shardkvv1.ReplicaGroupStatus{Phase: "Serving", Replicas: 3, ReadyReplicas: 2,
		Shards: shardkvv1.ShardSummary{Count: 4, Ranges: "0-3"},
		Members: []shardkvv1.Member{{ID: 1, Pod: "g-0", Role: "leader", Healthy: true},
			{ID: 2, Pod: "g-1", Role: "follower", Healthy: true}, {ID: 3, Pod: "g-2", Role: "follower"}}}
	if err := k8sClient.Status().Update(ctx, rg); err != nil {
		t.Fatal(err)
	}

	want := `
# HELP shardkv_shardmap_config The latest config number of the cluster.
# TYPE shardkv_shardmap_config gauge
shardkv_shardmap_config{namespace="NS",shardmap="m"} 7
# HELP shardkv_shardmap_shards Shards by state on their owner.
# TYPE shardkv_shardmap_shards gauge
shardkv_shardmap_shards{namespace="NS",shardmap="m",state="Pulling"} 1
shardkv_shardmap_shards{namespace="NS",shardmap="m",state="Serving"} 7
# HELP shardkv_shardmap_condition 1 if the condition is True, 0 if False, -1 if Unknown.
# TYPE shardkv_shardmap_condition gauge
shardkv_shardmap_condition{namespace="NS",reason="ShardsNotServing",shardmap="m",type="Ready"} 0
# HELP shardkv_replicagroup_members Members by role and health.
# TYPE shardkv_replicagroup_members gauge
shardkv_replicagroup_members{healthy="false",namespace="NS",replicagroup="g",role="follower",shardmap="m"} 1
shardkv_replicagroup_members{healthy="true",namespace="NS",replicagroup="g",role="follower",shardmap="m"} 1
shardkv_replicagroup_members{healthy="true",namespace="NS",replicagroup="g",role="leader",shardmap="m"} 1
# HELP shardkv_replicagroup_ready_replicas Ready pods of the group.
# TYPE shardkv_replicagroup_ready_replicas gauge
shardkv_replicagroup_ready_replicas{namespace="NS",replicagroup="g",shardmap="m"} 2
# HELP shardkv_replicagroup_phase 1 for the group's phase.
# TYPE shardkv_replicagroup_phase gauge
shardkv_replicagroup_phase{namespace="NS",phase="Serving",replicagroup="g",shardmap="m"} 1
`
	// Only this test's namespace: other tests run in their own.
	c := StatusCollector{Reader: k8sClient, Namespace: ns}
	if err := testutil.CollectAndCompare(c, strings.NewReader(strings.ReplaceAll(want, "NS", ns)),
		"shardkv_shardmap_config", "shardkv_shardmap_shards", "shardkv_shardmap_condition",
		"shardkv_replicagroup_members", "shardkv_replicagroup_ready_replicas", "shardkv_replicagroup_phase"); err != nil {
		t.Error(err)
	}
}
