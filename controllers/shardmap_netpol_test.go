package controllers

// The cluster's NetworkPolicies in envtest: created owned by the ShardMap
// with the selectors and ports of networkpolicy_test.go's hand-written
// rules, updated when spec.network changes, recreated when deleted,
// deleted when Disabled; a policy the API server refuses makes Degraded
// NetworkPolicyFailed and a Warning Event; invalid specs are refused.

import (
	"context"
	"fmt"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
)

// clusterNetpols reads the policies of ShardMap demo in ns that it owns.
func clusterNetpols(ctx context.Context, ns string, sm *shardkvv1.ShardMap) (map[string]*networkingv1.NetworkPolicy, error) {
	var list networkingv1.NetworkPolicyList
	if err := k8sClient.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return nil, err
	}
	out := map[string]*networkingv1.NetworkPolicy{}
	for i := range list.Items {
		np := &list.Items[i]
		if !metav1.IsControlledBy(np, sm) {
			return nil, fmt.Errorf("NetworkPolicy %s is not controlled by the ShardMap: %v", np.Name, np.OwnerReferences)
		}
		out[np.Name] = np
	}
	return out, nil
}

// updateSM changes a ShardMap's spec, retrying conflicts (the reconciler
// writes its status meanwhile).
func updateSM(t *testing.T, ns, name string, f func(*shardkvv1.ShardMap)) {
	t.Helper()
	eventually(t, "update "+name, func() error {
		sm := &shardkvv1.ShardMap{}
		if err := get(context.Background(), ns, name, sm); err != nil {
			return err
		}
		f(sm)
		return k8sClient.Update(context.Background(), sm)
	})
}

func TestShardMapNetworkPolicies(t *testing.T) {
	ns := newNamespace(t)
	dp := newFakeDataPlane()
	startManager(t, ns, setupShardMap(dp, func(r *ShardMapReconciler) { r.OperatorNamespace = "shardkv-system" }))
	ctx := context.Background()

	sm := netpolSM()
	sm.Namespace = ns
	mustCreate(t, sm)
	want := wantNetpolRules("shardkv-system")
	eventually(t, "both NetworkPolicies with their rules", func() error {
		nps, err := clusterNetpols(ctx, ns, sm)
		if err != nil {
			return err
		}
		return checkNetpols(nps, want)
	})
	eventually(t, "Created Events", func() error {
		for _, name := range []string{"demo-ctrler", "demo-data"} {
			if err := hasEvent(ns, "demo", "Created", "created NetworkPolicy "+name); err != nil {
				return err
			}
		}
		return nil
	})
	// The StatefulSet comes after them.
	eventually(t, "controller StatefulSet", func() error { return get(ctx, ns, "demo-ctrler", &appsv1.StatefulSet{}) })

	// A change of spec.network reaches both policies.
	updateSM(t, ns, "demo", func(sm *shardkvv1.ShardMap) {
		sm.Spec.Network.ClientNamespaces = []string{"web"}
		sm.Spec.Network.Clients = nil
		sm.Spec.Network.MetricsNamespaces = nil
	})
	want = map[string][]networkingv1.NetworkPolicyIngressRule{
		"demo-ctrler": {
			ingress(tcpPorts(7000, 8080), memberPeers("demo", "shardkv-system")...),
			ingress(tcpPorts(7000), peerNamespaces("web")),
		},
		"demo-data": {
			ingress(tcpPorts(7000, 6379, 8080), memberPeers("demo", "shardkv-system")...),
			ingress(tcpPorts(7000, 6379), peerNamespaces("web")),
		},
	}
	eventually(t, "policies updated to clientNamespaces [web]", func() error {
		nps, err := clusterNetpols(ctx, ns, sm)
		if err != nil {
			return err
		}
		return checkNetpols(nps, want)
	})

	// Deleted by someone: recreated.
	if err := k8sClient.Delete(ctx, &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "demo-data"}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "demo-data recreated", func() error {
		nps, err := clusterNetpols(ctx, ns, sm)
		if err != nil {
			return err
		}
		return checkNetpols(nps, want)
	})

	// Disabled: both deleted.
	updateSM(t, ns, "demo", func(sm *shardkvv1.ShardMap) { sm.Spec.Network.Policies = shardkvv1.NetworkPoliciesDisabled })
	eventually(t, "policies deleted", func() error {
		nps, err := clusterNetpols(ctx, ns, sm)
		if err != nil {
			return err
		}
		if len(nps) > 0 {
			return fmt.Errorf("%d policies left", len(nps))
		}
		return nil
	})
}

// The default (no spec.network): Enabled, and only the cluster and the
// operator get in.
func TestShardMapNetworkPoliciesDefault(t *testing.T) {
	ns := newNamespace(t)
	dp := newFakeDataPlane()
	startManager(t, ns, setupShardMap(dp, func(r *ShardMapReconciler) { r.OperatorNamespace = "ops" }))
	sm := testShardMap(ns, "demo", 64, 3)
	mustCreate(t, sm)
	if err := get(context.Background(), ns, "demo", sm); err != nil {
		t.Fatal(err)
	}
	if sm.Spec.Network.Policies != shardkvv1.NetworkPoliciesEnabled {
		t.Errorf("spec.network.policies defaults to %q, want Enabled", sm.Spec.Network.Policies)
	}
	want := map[string][]networkingv1.NetworkPolicyIngressRule{
		"demo-ctrler": {ingress(tcpPorts(7000, 8080), memberPeers("demo", "ops")...)},
		"demo-data":   {ingress(tcpPorts(7000, 6379, 8080), memberPeers("demo", "ops")...)},
	}
	eventually(t, "default policies", func() error {
		nps, err := clusterNetpols(context.Background(), ns, sm)
		if err != nil {
			return err
		}
		return checkNetpols(nps, want)
	})
}

// A policy the API server refuses (an ipBlock whose except is not inside
// its cidr passes the CRD's checks but not NetworkPolicy validation):
// Degraded NetworkPolicyFailed with the error, a Warning Event, and once
// the spec is fixed the policy is created and Degraded goes.
func TestShardMapNetworkPolicyFailure(t *testing.T) {
	ns := newNamespace(t)
	dp := newFakeDataPlane()
	startManager(t, ns, setupShardMap(dp, func(r *ShardMapReconciler) { r.OperatorNamespace = "ops" }))
	ctx := context.Background()
	sm := testShardMap(ns, "demo", 64, 3)
	sm.Spec.Network.Clients = []shardkvv1.NetworkClient{{IPBlock: &shardkvv1.IPBlock{CIDR: "10.1.0.0/16", Except: []string{"10.2.0.0/24"}}}}
	mustCreate(t, sm)
	waitSM(t, ns, "demo", "Degraded NetworkPolicyFailed", func(sm *shardkvv1.ShardMap) error {
		return condIs(sm, shardkvv1.ConditionDegraded, metav1.ConditionTrue, ReasonNetworkPolicyFailed, "cannot create NetworkPolicy demo-ctrler")
	})
	eventually(t, "NetworkPolicyFailed Event", func() error {
		return hasEvent(ns, "demo", ReasonNetworkPolicyFailed, "cannot create NetworkPolicy demo-ctrler")
	})
	if err := get(ctx, ns, "demo-ctrler", &appsv1.StatefulSet{}); !apierrors.IsNotFound(err) {
		t.Errorf("the controller StatefulSet should wait for the policies: get: %v", err)
	}

	updateSM(t, ns, "demo", func(sm *shardkvv1.ShardMap) { sm.Spec.Network.Clients[0].IPBlock.Except = []string{"10.1.2.0/24"} })
	waitSM(t, ns, "demo", "Degraded cleared", func(sm *shardkvv1.ShardMap) error {
		for _, c := range sm.Status.Conditions {
			if c.Type == shardkvv1.ConditionDegraded {
				return fmt.Errorf("still Degraded: %s %s", c.Reason, c.Message)
			}
		}
		return nil
	})
	eventually(t, "policies and StatefulSet", func() error {
		nps, err := clusterNetpols(ctx, ns, sm)
		if err != nil {
			return err
		}
		if len(nps) != 2 {
			return fmt.Errorf("%d policies", len(nps))
		}
		return get(ctx, ns, "demo-ctrler", &appsv1.StatefulSet{})
	})
}

func TestShardMapNetworkValidation(t *testing.T) {
	ns := newNamespace(t)
	cases := []struct {
		name string
		set  func(*shardkvv1.NetworkSpec)
		msg  string
	}{
		{"empty client", func(n *shardkvv1.NetworkSpec) { n.Clients = []shardkvv1.NetworkClient{{}} },
			"a client needs podSelector, namespaceSelector or ipBlock"},
		{"ipBlock with selector", func(n *shardkvv1.NetworkSpec) {
			n.Clients = []shardkvv1.NetworkClient{{PodSelector: &metav1.LabelSelector{}, IPBlock: &shardkvv1.IPBlock{CIDR: "10.0.0.0/8"}}}
		}, "ipBlock cannot be combined"},
		{"bad cidr", func(n *shardkvv1.NetworkSpec) {
			n.Clients = []shardkvv1.NetworkClient{{IPBlock: &shardkvv1.IPBlock{CIDR: "10.0.0.300/8"}}}
		}, "cidr must be a CIDR"},
		{"bad port", func(n *shardkvv1.NetworkSpec) {
			n.Clients = []shardkvv1.NetworkClient{{PodSelector: &metav1.LabelSelector{}, Ports: []shardkvv1.ClientPort{"HTTP"}}}
		}, "Unsupported value: \"HTTP\""},
		{"bad namespace", func(n *shardkvv1.NetworkSpec) { n.ClientNamespaces = []string{"Apps_1"} }, "clientNamespaces[0]"},
		{"bad mode", func(n *shardkvv1.NetworkSpec) { n.Policies = "Off" }, "spec.network.policies"},
	}
	for i, c := range cases {
		sm := testShardMap(ns, fmt.Sprintf("bad-%d", i), 64, 3)
		c.set(&sm.Spec.Network)
		err := k8sClient.Create(context.Background(), sm)
		if err == nil || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%s: create: %v; want an error containing %q", c.name, err, c.msg)
		}
	}
	// Defaults of a client entry: both ports.
	sm := testShardMap(ns, "good", 64, 3)
	sm.Spec.Network.Clients = []shardkvv1.NetworkClient{{PodSelector: &metav1.LabelSelector{}}}
	mustCreate(t, sm)
	if err := get(context.Background(), ns, "good", sm); err != nil {
		t.Fatal(err)
	}
	if got := sm.Spec.Network.Clients[0].Ports; len(got) != 2 || got[0] != shardkvv1.ClientPortRedis || got[1] != shardkvv1.ClientPortGRPC {
		t.Errorf("client ports default to %v, want [Redis GRPC]", got)
	}
}
