package controllers

import (
	"cmp"
	"context"
	"slices"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
)

// StatusCollector exports the ShardMaps' and ReplicaGroups' status as
// Prometheus gauges, read from the manager's cache at scrape time: it holds
// no state of its own, so the numbers are never older than the status.
// (controller-runtime adds its own reconcile and work-queue metrics.)
type StatusCollector struct {
	Reader client.Reader
	// Namespace limits it to one namespace; "" means all.
	Namespace string
}

var (
	mLabels      = []string{"namespace", "shardmap"}
	rgLabels     = []string{"namespace", "shardmap", "replicagroup"}
	descConfig   = prometheus.NewDesc("shardkv_shardmap_config", "The latest config number of the cluster.", mLabels, nil)
	descGroups   = prometheus.NewDesc("shardkv_shardmap_groups", "Data groups in the latest config.", mLabels, nil)
	descShards   = prometheus.NewDesc("shardkv_shardmap_shards", "Shards by state on their owner.", append(slices.Clone(mLabels), "state"), nil)
	descMigr     = prometheus.NewDesc("shardkv_shardmap_migrating_shards", "Shards moving between groups.", mLabels, nil)
	descCtrlR    = prometheus.NewDesc("shardkv_shardmap_controller_ready_replicas", "Ready pods of the controller group.", mLabels, nil)
	descSMCond   = prometheus.NewDesc("shardkv_shardmap_condition", "1 if the condition is True, 0 if False, -1 if Unknown.", append(slices.Clone(mLabels), "type", "reason"), nil)
	descRGRepl   = prometheus.NewDesc("shardkv_replicagroup_replicas", "Raft members of the group.", rgLabels, nil)
	descRGReady  = prometheus.NewDesc("shardkv_replicagroup_ready_replicas", "Ready pods of the group.", rgLabels, nil)
	descRGWant   = prometheus.NewDesc("shardkv_replicagroup_desired_replicas", "spec.replicas.", rgLabels, nil)
	descRGShards = prometheus.NewDesc("shardkv_replicagroup_shards", "Shards the group owns.", rgLabels, nil)
	descRGRoles  = prometheus.NewDesc("shardkv_replicagroup_members", "Members by role and health.", append(slices.Clone(rgLabels), "role", "healthy"), nil)
	descRGPhase  = prometheus.NewDesc("shardkv_replicagroup_phase", "1 for the group's phase.", append(slices.Clone(rgLabels), "phase"), nil)
	descRGCond   = prometheus.NewDesc("shardkv_replicagroup_condition", "1 if the condition is True, 0 if False, -1 if Unknown.", append(slices.Clone(rgLabels), "type", "reason"), nil)
)

// Describe implements prometheus.Collector.
func (c StatusCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descConfig, descGroups, descShards, descMigr, descCtrlR, descSMCond,
		descRGRepl, descRGReady, descRGWant, descRGShards, descRGRoles, descRGPhase, descRGCond} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c StatusCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	conds := func(d *prometheus.Desc, cs []metav1.Condition, labels ...string) {
		for _, cnd := range cs {
			v := -1.0
			switch cnd.Status {
			case metav1.ConditionTrue:
				v = 1
			case metav1.ConditionFalse:
				v = 0
			}
			gauge(d, v, append(slices.Clone(labels), cnd.Type, cnd.Reason)...)
		}
	}

	var sms shardkvv1.ShardMapList
	if err := c.Reader.List(ctx, &sms, client.InNamespace(c.Namespace)); err == nil {
		for _, sm := range sms.Items {
			l := []string{sm.Namespace, sm.Name}
			gauge(descConfig, float64(sm.Status.ConfigNum), l...)
			gauge(descGroups, float64(sm.Status.GroupCount), l...)
			gauge(descMigr, float64(sm.Status.MigratingShards), l...)
			gauge(descCtrlR, float64(sm.Status.ControllerReadyReplicas), l...)
			states := make([]string, 0, len(sm.Status.ShardStates))
			for s := range sm.Status.ShardStates {
				states = append(states, s)
			}
			slices.Sort(states)
			for _, s := range states {
				gauge(descShards, float64(sm.Status.ShardStates[s]), append(slices.Clone(l), s)...)
			}
			conds(descSMCond, sm.Status.Conditions, l...)
		}
	}
	var rgs shardkvv1.ReplicaGroupList
	if err := c.Reader.List(ctx, &rgs, client.InNamespace(c.Namespace)); err == nil {
		for _, rg := range rgs.Items {
			l := []string{rg.Namespace, rg.Spec.ShardMap, rg.Name}
			gauge(descRGRepl, float64(rg.Status.Replicas), l...)
			gauge(descRGReady, float64(rg.Status.ReadyReplicas), l...)
			if rg.Spec.Replicas != nil {
				gauge(descRGWant, float64(*rg.Spec.Replicas), l...)
			}
			gauge(descRGShards, float64(rg.Status.Shards.Count), l...)
			// Members by role and health, in a fixed order.
			roles := map[[2]string]int{}
			for _, m := range rg.Status.Members {
				roles[[2]string{m.Role, strconv.FormatBool(m.Healthy)}]++
			}
			keys := make([][2]string, 0, len(roles))
			for k := range roles {
				keys = append(keys, k)
			}
			slices.SortFunc(keys, func(a, b [2]string) int { return cmp.Or(cmp.Compare(a[0], b[0]), cmp.Compare(a[1], b[1])) })
			for _, k := range keys {
				gauge(descRGRoles, float64(roles[k]), append(slices.Clone(l), k[0], k[1])...)
			}
			if rg.Status.Phase != "" {
				gauge(descRGPhase, 1, append(slices.Clone(l), rg.Status.Phase)...)
			}
			conds(descRGCond, rg.Status.Conditions, l...)
		}
	}
}
