package controllers

import (
	"fmt"
	"strconv"
	"strings"
)

// Ports every shardkv pod uses.
const (
	GRPCPort = 7000 // Raft, admin and client gRPC
	RESPPort = 6379 // Redis protocol (data groups)
	HTTPPort = 8080 // /healthz, /readyz, /metrics
)

// Labels on everything the operator creates.
const (
	LabelName      = "app.kubernetes.io/name"      // always "shardkv"
	LabelInstance  = "app.kubernetes.io/instance"  // the ShardMap's name
	LabelComponent = "app.kubernetes.io/component" // "controller" or "group"
	LabelManagedBy = "app.kubernetes.io/managed-by"
	LabelGroup     = "shardkv.io/replicagroup" // the ReplicaGroup's name (data group pods)
	ManagedBy      = "shardkv-operator"
)

// Finalizer keeps a ReplicaGroup until its shards are drained.
const Finalizer = "shardkv.io/drain"

// ShardMapFinalizer keeps a ShardMap, and so its controller group (owned
// objects go only once their owner is gone), until its ReplicaGroups are
// gone: they drain through that controller.
const ShardMapFinalizer = "shardkv.io/replicagroups"

// CtrlerName is the name of the controller group's StatefulSet, headless
// Service and PodDisruptionBudget of ShardMap sm.
func CtrlerName(sm string) string { return sm + "-ctrler" }

// PodDNS is the stable DNS name of pod <set>-<ordinal> behind the headless
// Service named like the StatefulSet.
func PodDNS(set string, ordinal int, namespace string) string {
	return fmt.Sprintf("%s-%d.%s.%s.svc", set, ordinal, set, namespace)
}

// podGRPCAddr is the gRPC address pod <set>-<ordinal> advertises (its
// --advertise): the one Raft memberships and the controller's config list.
func podGRPCAddr(set string, ordinal int, namespace string) string {
	return fmt.Sprintf("%s:%d", PodDNS(set, ordinal, namespace), GRPCPort)
}

// PeersFlag is --peers for the first n replicas of a StatefulSet: replica
// ids 1..n at ordinals 0..n-1.
func PeersFlag(set string, n int, namespace string) string {
	parts := make([]string, n)
	for i := range n {
		parts[i] = fmt.Sprintf("%d=%s", i+1, podGRPCAddr(set, i, namespace))
	}
	return strings.Join(parts, ",")
}

// CtrlerAddrs are the controller replicas' gRPC addresses (DNS) for a
// controller group of n replicas.
func CtrlerAddrs(sm string, n int, namespace string) []string {
	out := make([]string, n)
	for i := range n {
		out[i] = podGRPCAddr(CtrlerName(sm), i, namespace)
	}
	return out
}

// ordinalOf is the ordinal of the pod of set rg whose advertised address
// addr is ("<rg>-<i>.<rg>.<ns>.svc:<port>"); -1 if it is not one.
func ordinalOf(rg, ns, addr string) int {
	host, _, _ := strings.Cut(addr, ":")
	pod, rest, ok := strings.Cut(host, ".")
	if !ok || rest != fmt.Sprintf("%s.%s.svc", rg, ns) {
		return -1
	}
	return podOrdinal(rg, pod)
}

// podOrdinal is i of pod "<rg>-<i>" (-1 if the name is not one).
func podOrdinal(rg, pod string) int {
	s, ok := strings.CutPrefix(pod, rg+"-")
	if !ok || s == "" || (len(s) > 1 && s[0] == '0') {
		return -1
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return -1
	}
	return n
}
