package controllers

// The NetworkPolicies of a cluster (spec.network), built from its
// ShardMap: <sm>-ctrler selects the controller pods and <sm>-data the pods
// of every ReplicaGroup of the cluster (by label, so a new group is covered
// from its first pod). Each admits, port by port:
//
//   - the cluster's own pods (same namespace, labels name=shardkv and
//     instance=<sm>) and the operator's pods: every port of the pod (Raft and
//     migrations between groups, the operator's gRPC calls);
//   - clients (spec.network.clientNamespaces and clients): the client
//     ports, Redis (data groups) and gRPC (data groups and controller), or
//     those an entry names;
//   - metrics scrapers (spec.network.metricsNamespaces): the HTTP port.
//
// Nothing else: the policies are of type Ingress, so everything not
// admitted is refused by an enforcing network plugin. Egress is left open.
// Ports are numbers (the same the pods' containerPorts name), which every
// enforcer supports.

import (
	"maps"
	"os"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
)

// ctrlerPortNames are the controller pods' ports, by name (objects.go's
// portNumber); the data-group pods' depend on spec.tls (groupPortNames).
var ctrlerPortNames = []string{"grpc", "http"}

// groupPortNames are the data-group pods' ports: Redis is 6379, 6380 over
// TLS, or both (respPorts).
func groupPortNames(sm *shardkvv1.ShardMap) []string {
	return slices.Concat([]string{"grpc"}, respPorts(sm), []string{"http"})
}

// DataNetPolName is the NetworkPolicy of ShardMap sm's data-group pods; the
// controller pods' is CtrlerName(sm).
func DataNetPolName(sm string) string { return sm + "-data" }

// OperatorPodLabels select the operator's pods (config/manager).
var OperatorPodLabels = map[string]string{LabelName: "shardkv-operator"}

// namespaceNameLabel is set by the API server on every namespace to its name.
const namespaceNameLabel = "kubernetes.io/metadata.name"

// serviceAccountNamespaceFile holds the namespace of a pod's service
// account, i.e. the pod's namespace.
const serviceAccountNamespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// podNamespace is the namespace the operator runs in ("" outside a pod).
func podNamespace() string {
	b, err := os.ReadFile(serviceAccountNamespaceFile)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// netPolsEnabled: spec.network.policies is not Disabled.
func netPolsEnabled(sm *shardkvv1.ShardMap) bool {
	return sm.Spec.Network.Policies != shardkvv1.NetworkPoliciesDisabled
}

// desiredNetworkPolicies are the cluster's policies by name (none when
// spec.network.policies is Disabled). operatorNS is the operator's
// namespace ("": unknown, no rule admits the operator).
func desiredNetworkPolicies(sm *shardkvv1.ShardMap, operatorNS string) map[string]*networkingv1.NetworkPolicy {
	if !netPolsEnabled(sm) {
		return nil
	}
	ctrler := networkPolicy(sm, CtrlerName(sm.Name), ComponentController, ctrlerSelectorLabels(sm), ctrlerPortNames, operatorNS)
	data := networkPolicy(sm, DataNetPolName(sm.Name), ComponentGroup, map[string]string{
		LabelName:      "shardkv",
		LabelInstance:  sm.Name,
		LabelComponent: ComponentGroup,
	}, groupPortNames(sm), operatorNS)
	return map[string]*networkingv1.NetworkPolicy{ctrler.Name: ctrler, data.Name: data}
}

// networkPolicy is the policy of the pods of selector, which listen on
// ports.
func networkPolicy(sm *shardkvv1.ShardMap, name, component string, selector map[string]string, ports []string, operatorNS string) *networkingv1.NetworkPolicy {
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: sm.Namespace, Labels: map[string]string{
			LabelName:      "shardkv",
			LabelInstance:  sm.Name,
			LabelComponent: component,
			LabelManagedBy: ManagedBy,
		}},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: selector},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			// An empty list admits nothing; every rule below has peers,
			// since a rule without any would admit everyone.
			Ingress: []networkingv1.NetworkPolicyIngressRule{},
		},
	}
	add := func(peers []networkingv1.NetworkPolicyPeer, names ...string) {
		names = slices.DeleteFunc(slices.Clone(names), func(n string) bool { return !slices.Contains(ports, n) })
		if len(peers) == 0 || len(names) == 0 {
			return
		}
		np.Spec.Ingress = append(np.Spec.Ingress, networkingv1.NetworkPolicyIngressRule{From: peers, Ports: policyPorts(names)})
	}

	// The cluster's pods and the operator: every port.
	members := []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{
		LabelName:     "shardkv",
		LabelInstance: sm.Name,
	}}}}
	if operatorNS != "" {
		members = append(members, networkingv1.NetworkPolicyPeer{
			NamespaceSelector: namespacesSelector([]string{operatorNS}),
			PodSelector:       &metav1.LabelSelector{MatchLabels: maps.Clone(OperatorPodLabels)},
		})
	}
	add(members, ports...)

	// Clients, grouped by the ports they may reach: both, Redis only,
	// gRPC only.
	net := sm.Spec.Network
	var both, redis, grpc []networkingv1.NetworkPolicyPeer
	if len(net.ClientNamespaces) > 0 {
		both = append(both, networkingv1.NetworkPolicyPeer{NamespaceSelector: namespacesSelector(net.ClientNamespaces)})
	}
	for _, c := range net.Clients {
		peer := networkingv1.NetworkPolicyPeer{
			PodSelector:       c.PodSelector.DeepCopy(),
			NamespaceSelector: c.NamespaceSelector.DeepCopy(),
		}
		if b := c.IPBlock; b != nil {
			peer.IPBlock = &networkingv1.IPBlock{CIDR: b.CIDR, Except: slices.Clone(b.Except)}
		}
		r, g := clientPorts(c)
		switch {
		case r && g:
			both = append(both, peer)
		case r:
			redis = append(redis, peer)
		case g:
			grpc = append(grpc, peer)
		}
	}
	add(both, "grpc", "resp", "resp-tls")
	add(redis, "resp", "resp-tls")
	add(grpc, "grpc")

	// Metrics scrapers: the HTTP port.
	if len(net.MetricsNamespaces) > 0 {
		add([]networkingv1.NetworkPolicyPeer{{NamespaceSelector: namespacesSelector(net.MetricsNamespaces)}}, "http")
	}
	setAnnotation(np, annotationSpecHash, contentHash(np.Spec))
	return np
}

// clientPorts: whether client c may reach the Redis and the gRPC ports
// (no ports listed: both, the API's default).
func clientPorts(c shardkvv1.NetworkClient) (redis, grpc bool) {
	if len(c.Ports) == 0 {
		return true, true
	}
	return slices.Contains(c.Ports, shardkvv1.ClientPortRedis), slices.Contains(c.Ports, shardkvv1.ClientPortGRPC)
}

// namespacesSelector selects the namespaces named names.
func namespacesSelector(names []string) *metav1.LabelSelector {
	if len(names) == 1 {
		return &metav1.LabelSelector{MatchLabels: map[string]string{namespaceNameLabel: names[0]}}
	}
	values := slices.Clone(names)
	slices.Sort(values)
	values = slices.Compact(values)
	return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
		Key: namespaceNameLabel, Operator: metav1.LabelSelectorOpIn, Values: values,
	}}}
}

// policyPorts are the TCP ports named names, by number.
func policyPorts(names []string) []networkingv1.NetworkPolicyPort {
	out := make([]networkingv1.NetworkPolicyPort, len(names))
	for i, n := range names {
		port := intstr.FromInt32(portNumber(n))
		out[i] = networkingv1.NetworkPolicyPort{Protocol: ptr.To(corev1.ProtocolTCP), Port: &port}
	}
	return out
}
