package controllers

// The cluster's NetworkPolicies as built from the spec (pure): selectors,
// peers and ports of every rule, written out here by hand; and the
// planner's NetworkPolicy steps.

import (
	"fmt"
	"maps"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
)

func tcpPorts(ports ...int) []networkingv1.NetworkPolicyPort {
	out := make([]networkingv1.NetworkPolicyPort, len(ports))
	for i, p := range ports {
		out[i] = networkingv1.NetworkPolicyPort{Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(intstr.FromInt(p))}
	}
	return out
}

func peerPods(l map[string]string) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{MatchLabels: l}}
}

func peerNamespaces(names ...string) networkingv1.NetworkPolicyPeer {
	if len(names) == 1 {
		return networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": names[0]}}}
	}
	return networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
		{Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpIn, Values: names}}}}
}

// The cluster's own pods and the operator's.
func memberPeers(sm, operatorNS string) []networkingv1.NetworkPolicyPeer {
	out := []networkingv1.NetworkPolicyPeer{peerPods(map[string]string{"app.kubernetes.io/name": "shardkv", "app.kubernetes.io/instance": sm})}
	if operatorNS != "" {
		op := peerNamespaces(operatorNS)
		op.PodSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/name": "shardkv-operator"}}
		out = append(out, op)
	}
	return out
}

func ingress(ports []networkingv1.NetworkPolicyPort, from ...networkingv1.NetworkPolicyPeer) networkingv1.NetworkPolicyIngressRule {
	return networkingv1.NetworkPolicyIngressRule{From: from, Ports: ports}
}

// netpolSM is a ShardMap with every kind of network setting.
func netpolSM() *shardkvv1.ShardMap {
	sm := testShardMap("ns1", "demo", 64, 3)
	sm.Spec.Network = shardkvv1.NetworkSpec{
		ClientNamespaces: []string{"apps", "batch"},
		Clients: []shardkvv1.NetworkClient{
			{PodSelector: &metav1.LabelSelector{}}, // every pod of ns1, default ports: both
			{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "cache"}}, Ports: []shardkvv1.ClientPort{shardkvv1.ClientPortRedis}},
			{IPBlock: &shardkvv1.IPBlock{CIDR: "192.0.2.0/24"}, Ports: []shardkvv1.ClientPort{shardkvv1.ClientPortGRPC}},
		},
		MetricsNamespaces: []string{"monitoring"},
	}
	return sm
}

// wantNetpolRules are the expected rules of the policies of netpolSM, by
// policy name, written out.
func wantNetpolRules(operatorNS string) map[string][]networkingv1.NetworkPolicyIngressRule {
	both := []networkingv1.NetworkPolicyPeer{peerNamespaces("apps", "batch"), {PodSelector: &metav1.LabelSelector{}}}
	redisOnly := networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "cache"}}}
	grpcOnly := networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "192.0.2.0/24"}}
	return map[string][]networkingv1.NetworkPolicyIngressRule{
		"demo-ctrler": {
			ingress(tcpPorts(7000, 8080), memberPeers("demo", operatorNS)...),
			ingress(tcpPorts(7000), both...),
			// Redis-only clients have no port on the controller.
			ingress(tcpPorts(7000), grpcOnly),
			ingress(tcpPorts(8080), peerNamespaces("monitoring")),
		},
		"demo-data": {
			ingress(tcpPorts(7000, 6379, 8080), memberPeers("demo", operatorNS)...),
			ingress(tcpPorts(7000, 6379), both...),
			ingress(tcpPorts(6379), redisOnly),
			ingress(tcpPorts(7000), grpcOnly),
			ingress(tcpPorts(8080), peerNamespaces("monitoring")),
		},
	}
}

// checkNetpols compares policies with the expected selectors, types and rules.
func checkNetpols(nps map[string]*networkingv1.NetworkPolicy, want map[string][]networkingv1.NetworkPolicyIngressRule) error {
	selectors := map[string]map[string]string{
		"demo-ctrler": {"app.kubernetes.io/name": "shardkv", "app.kubernetes.io/instance": "demo", "app.kubernetes.io/component": "controller"},
		"demo-data":   {"app.kubernetes.io/name": "shardkv", "app.kubernetes.io/instance": "demo", "app.kubernetes.io/component": "group"},
	}
	if got := slices.Sorted(maps.Keys(nps)); !slices.Equal(got, []string{"demo-ctrler", "demo-data"}) {
		return fmt.Errorf("policies %v, want demo-ctrler and demo-data", got)
	}
	for name, np := range nps {
		if !equality.Semantic.DeepEqual(np.Spec.PodSelector, metav1.LabelSelector{MatchLabels: selectors[name]}) {
			return fmt.Errorf("%s: podSelector %v, want %v", name, np.Spec.PodSelector, selectors[name])
		}
		if !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) {
			return fmt.Errorf("%s: policyTypes %v, want [Ingress]", name, np.Spec.PolicyTypes)
		}
		if !equality.Semantic.DeepEqual(np.Spec.Ingress, want[name]) {
			return fmt.Errorf("%s: ingress\n got %+v\nwant %+v", name, np.Spec.Ingress, want[name])
		}
	}
	return nil
}

func TestNetworkPolicyRules(t *testing.T) {
	sm := netpolSM()
	for _, opNS := range []string{"shardkv-system", ""} {
		nps := desiredNetworkPolicies(sm, opNS)
		if err := checkNetpols(nps, wantNetpolRules(opNS)); err != nil {
			t.Errorf("operator namespace %q: %v", opNS, err)
		}
		for _, np := range nps {
			if np.Namespace != "ns1" || np.Labels[LabelManagedBy] != ManagedBy || np.Annotations[annotationSpecHash] == "" {
				t.Errorf("%s: namespace %s labels %v annotations %v", np.Name, np.Namespace, np.Labels, np.Annotations)
			}
		}
	}
}

// No client settings: only the cluster and the operator get in.
func TestNetworkPolicyDefaultDeniesOthers(t *testing.T) {
	sm := testShardMap("ns1", "demo", 64, 3)
	nps := desiredNetworkPolicies(sm, "op")
	want := map[string][]networkingv1.NetworkPolicyIngressRule{
		"demo-ctrler": {ingress(tcpPorts(7000, 8080), memberPeers("demo", "op")...)},
		"demo-data":   {ingress(tcpPorts(7000, 6379, 8080), memberPeers("demo", "op")...)},
	}
	if err := checkNetpols(nps, want); err != nil {
		t.Error(err)
	}
	sm.Spec.Network.Policies = shardkvv1.NetworkPoliciesDisabled
	if nps := desiredNetworkPolicies(sm, "op"); len(nps) != 0 {
		t.Errorf("policies Disabled: want none, got %v", slices.Sorted(maps.Keys(nps)))
	}
}

// Every rule names its sources (a rule without any would admit everyone),
// and the cluster's own rule covers every port the pods listen on.
func TestNetworkPolicyCoversEveryPort(t *testing.T) {
	for _, tls := range []*shardkvv1.TLSSpec{nil, {Mode: shardkvv1.TLSManaged}, {Mode: shardkvv1.TLSManaged, Redis: shardkvv1.RedisTLSAndPlain}} {
		sm := netpolSM()
		sm.Spec.TLS = tls
		checkNetworkPolicyPorts(t, sm)
		// Clients reach Redis wherever the pods serve it: over TLS too.
		data := desiredNetworkPolicies(sm, "op")[DataNetPolName("demo")]
		var clientPorts []int32
		for _, r := range data.Spec.Ingress[1:] {
			for _, p := range r.Ports {
				clientPorts = append(clientPorts, p.Port.IntVal)
			}
		}
		for _, name := range respPorts(sm) {
			if !slices.Contains(clientPorts, portNumber(name)) {
				t.Errorf("TLS %+v: no client rule admits Redis port %d (client ports %v)", tls, portNumber(name), clientPorts)
			}
		}
	}
}

func checkNetworkPolicyPorts(t *testing.T, sm *shardkvv1.ShardMap) {
	t.Helper()
	rg := &shardkvv1.ReplicaGroup{ObjectMeta: metav1.ObjectMeta{Namespace: "ns1", Name: "demo-a"}, Spec: shardkvv1.ReplicaGroupSpec{ShardMap: "demo"}}
	pods := map[string]corev1.PodTemplateSpec{
		"demo-ctrler": (&ShardMapReconciler{DefaultImage: "x"}).ctrlerPodTemplate(sm, 3),
		"demo-data":   (&ReplicaGroupReconciler{DefaultImage: "x"}).podTemplate(rg, sm, 1, 3),
	}
	for name, np := range desiredNetworkPolicies(sm, "op") {
		for i, r := range np.Spec.Ingress {
			if len(r.From) == 0 || len(r.Ports) == 0 {
				t.Errorf("%s rule %d: from %v ports %v: a rule must name its sources and ports", name, i, r.From, r.Ports)
			}
		}
		var listen, admitted []int32
		for _, p := range pods[name].Spec.Containers[0].Ports {
			listen = append(listen, p.ContainerPort)
		}
		for _, p := range np.Spec.Ingress[0].Ports {
			admitted = append(admitted, p.Port.IntVal)
		}
		if !slices.Equal(listen, admitted) {
			t.Errorf("%s: the cluster's own rule admits ports %v; its pods listen on %v", name, admitted, listen)
		}
		// The policy selects the pods.
		for k, v := range np.Spec.PodSelector.MatchLabels {
			if pods[name].Labels[k] != v {
				t.Errorf("%s: podSelector %s=%s does not match the pods' labels %v", name, k, v, pods[name].Labels)
			}
		}
	}
}

func TestPlanNetworkPolicies(t *testing.T) {
	sm := netpolSM()
	observed := func() *smObserved {
		return &smObserved{Name: "demo", Namespace: "ns1", Replicas: 3, Bootstrap: 3, Pods: map[int]*podView{},
			WantNetPols: desiredNetworkPolicies(sm, "op"), NetPols: map[string]*networkingv1.NetworkPolicy{}}
	}
	o := observed()
	// Policies come first, before the StatefulSet, in name order.
	for _, want := range []string{"CreateNetworkPolicy(demo-ctrler)", "CreateNetworkPolicy(demo-data)", "CreateStatefulSet"} {
		pl := planShardMap(o)
		if got := pl.Step.String(); got != want && !(want == "CreateStatefulSet" && pl.Step.Kind == smStepCreateStatefulSet) {
			t.Fatalf("step %s, want %s", got, want)
		}
		if pl.Step.Object != "" {
			o.NetPols[pl.Step.Object] = o.WantNetPols[pl.Step.Object].DeepCopy()
		}
	}

	// A changed spec updates both.
	sm2 := netpolSM()
	sm2.Spec.Network.ClientNamespaces = []string{"apps"}
	o.WantNetPols = desiredNetworkPolicies(sm2, "op")
	if st, ok := planNetworkPolicies(o, &smPlan{}); !ok || st.String() != "UpdateNetworkPolicy(demo-ctrler)" {
		t.Errorf("after a spec change: %v %v, want UpdateNetworkPolicy(demo-ctrler)", st, ok)
	}
	o.NetPols["demo-ctrler"] = o.WantNetPols["demo-ctrler"]
	if st, ok := planNetworkPolicies(o, &smPlan{}); !ok || st.String() != "UpdateNetworkPolicy(demo-data)" {
		t.Errorf("after the first update: %v %v, want UpdateNetworkPolicy(demo-data)", st, ok)
	}
	o.NetPols["demo-data"] = o.WantNetPols["demo-data"]
	if st, ok := planNetworkPolicies(o, &smPlan{}); ok {
		t.Errorf("up to date: step %v", st)
	}

	// Disabled: both deleted.
	o.WantNetPols = nil
	if st, ok := planNetworkPolicies(o, &smPlan{}); !ok || st.String() != "DeleteNetworkPolicy(demo-ctrler)" {
		t.Errorf("disabled: %v %v, want DeleteNetworkPolicy(demo-ctrler)", st, ok)
	}

	// A policy of that name the ShardMap does not own: left alone, Degraded.
	o = observed()
	o.NetPolConflicts = []string{"demo-ctrler"}
	pl := planShardMap(o)
	if pl.Step.String() != "CreateNetworkPolicy(demo-data)" || pl.Degraded.Reason != ReasonConflict {
		t.Errorf("conflict: step %s degraded %+v", pl.Step, pl.Degraded)
	}
}
