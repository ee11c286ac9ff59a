//go:build e2e

package e2e

// The NetworkPolicies scenario: the operator's policies (demo-ctrler,
// demo-data) are in place from Create on, so every scenario runs under
// them (the cluster's pods reach each other, the operator reaches them,
// the kubelet's probes pass). Here: a pod of a namespace that
// spec.network.clientNamespaces does not name cannot use the cluster,
// through the Redis port or through gRPC (controller and data groups),
// while a pod of a named namespace can; naming the first namespace too lets
// it in. Needs a cluster that enforces NetworkPolicies
// (hack/local-cluster.sh runs kube-network-policies).

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/shardkv/shardkv/controllers"
)

// Probe workloads: Go clients (gRPC to the controller and the groups) and
// Redis Cluster clients (the groups' Redis ports), light and with short
// timeouts.
const (
	probeGo    = "probe-go"
	probeRedis = "probe-redis"
)

func (e *env) networkPolicies(t *testing.T) {
	t0 := time.Now()
	smObj := e.shardMap(t, sm)
	for _, name := range []string{controllers.CtrlerName(sm), controllers.DataNetPolName(sm)} {
		np := &networkingv1.NetworkPolicy{}
		if err := e.kube.Get(ctx(t), client.ObjectKey{Namespace: e.ns, Name: name}, np); err != nil {
			t.Fatalf("NetworkPolicy %s: %v", name, err)
		}
		if !metav1.IsControlledBy(np, smObj) {
			t.Errorf("NetworkPolicy %s is not owned by ShardMap %s: %v", name, sm, np.OwnerReferences)
		}
	}

	allowed, denied := e.ns+"-clients", e.ns+"-others"
	for _, ns := range []string{allowed, denied} {
		e.extraNamespace(t, ns)
	}
	e.setClientNamespaces(t, allowed)

	var seeds []string
	for _, g := range []string{"demo-a", "demo-b", "demo-c"} {
		seeds = append(seeds, fmt.Sprintf("%s:%d", controllers.PodDNS(g, 0, e.ns), controllers.RESPPort))
	}
	load := []string{"--clients=2", "--keys=8", "--rate=10", "--op-timeout=3s"}
	probes := map[string][]string{
		probeGo:    append([]string{"--ctrler=" + e.ctrlerAddrs(sm, 3)}, load...),
		probeRedis: append([]string{"--redis=" + strings.Join(seeds, ",")}, load...),
	}
	for _, ns := range []string{allowed, denied} {
		for _, name := range []string{probeGo, probeRedis} {
			e.startWorkloadIn(t, ns, name, probes[name]...)
		}
	}
	for _, name := range []string{probeGo, probeRedis} {
		e.waitProbe(t, allowed, name)
	}
	t.Logf("clients in %s (named in clientNamespaces) served after %v", allowed, time.Since(t0).Round(time.Second))

	// The probes of the other namespace get nothing through, while those
	// of the named one keep succeeding.
	deadline := time.Now().Add(10 * time.Second)
	var last []string
	for time.Now().Before(deadline) {
		last = last[:0]
		for _, name := range []string{probeGo, probeRedis} {
			st, err := e.workloadStatusIn(t, denied, name)
			if err != nil {
				t.Fatalf("%s/%s: %v", denied, name, err)
			}
			if st.OK > 0 {
				t.Fatalf("%s/%s (namespace not in clientNamespaces) got through: %s", denied, name, st)
			}
			last = append(last, name+": "+st.String())
		}
		time.Sleep(time.Second)
	}
	t.Logf("clients in %s refused for 10s: %s", denied, strings.Join(last, "; "))
	for _, name := range []string{probeGo, probeRedis} {
		e.workloadProgressIn(t, allowed, name, 10, time.Minute)
	}

	// Naming the other namespace lets its clients in: it was the policy.
	t1 := time.Now()
	e.setClientNamespaces(t, allowed, denied)
	for _, name := range []string{probeGo, probeRedis} {
		e.waitProbe(t, denied, name)
	}
	t.Logf("clients in %s served %v after it was added to clientNamespaces", denied, time.Since(t1).Round(time.Second))
	e.workloadsProgress(t)
	t.Logf("NetworkPolicies scenario: %v", time.Since(t0).Round(time.Second))
}

// setClientNamespaces sets the ShardMap's spec.network.clientNamespaces and
// waits until the data groups' policy admits them.
func (e *env) setClientNamespaces(t *testing.T, names ...string) {
	t.Helper()
	e.k(t, "patch", "shardmap/"+sm, "--type=merge", "-p",
		fmt.Sprintf(`{"spec":{"network":{"clientNamespaces":["%s"]}}}`, strings.Join(names, `","`)))
	e.eventually(t, time.Minute, fmt.Sprintf("NetworkPolicy %s admits %v", controllers.DataNetPolName(sm), names), func() (bool, string) {
		np := &networkingv1.NetworkPolicy{}
		if err := e.kube.Get(ctx(t), client.ObjectKey{Namespace: e.ns, Name: controllers.DataNetPolName(sm)}, np); err != nil {
			return false, err.Error()
		}
		var have []string
		for _, r := range np.Spec.Ingress {
			for _, p := range r.From {
				if s := p.NamespaceSelector; s != nil && p.PodSelector == nil {
					have = append(have, s.MatchLabels["kubernetes.io/metadata.name"])
					for _, x := range s.MatchExpressions {
						have = append(have, x.Values...)
					}
				}
			}
		}
		for _, n := range names {
			if !slices.Contains(have, n) {
				return false, fmt.Sprintf("namespaces admitted: %v", have)
			}
		}
		return true, ""
	})
}

// waitProbe waits until probe workload name in ns has 10 successful
// operations.
func (e *env) waitProbe(t *testing.T, ns, name string) {
	t.Helper()
	e.eventually(t, 2*time.Minute, ns+"/"+name+" succeeding", func() (bool, string) {
		st, err := e.workloadStatusIn(t, ns, name)
		if err != nil {
			return false, err.Error()
		}
		return st.OK >= 10, st.String()
	})
}

// workloadProgressIn: workload name of ns completes min more operations
// within timeout.
func (e *env) workloadProgressIn(t *testing.T, ns, name string, min int64, timeout time.Duration) {
	t.Helper()
	st0, err := e.workloadStatusIn(t, ns, name)
	if err != nil {
		t.Fatal(err)
	}
	e.eventually(t, timeout, fmt.Sprintf("%s/%s completes %d more operations", ns, name, min), func() (bool, string) {
		st, err := e.workloadStatusIn(t, ns, name)
		if err != nil {
			return false, err.Error()
		}
		return st.OK-st0.OK >= min, st.String()
	})
}

// extraNamespace (re)creates namespace ns for this run and deletes it at
// the end (unless SHARDKV_E2E_KEEP is set).
func (e *env) extraNamespace(t *testing.T, ns string) {
	t.Helper()
	if _, err := e.kubectlErr("get", "namespace", ns); err == nil {
		_, _ = e.kubectlErr("delete", "namespace", ns, "--timeout=3m")
	}
	e.kubectl(t, "create", "namespace", ns)
	e.eventually(t, time.Minute, ns+" default ServiceAccount", func() (bool, string) {
		_, err := e.kubectlErr("-n", ns, "get", "serviceaccount", "default")
		return err == nil, fmt.Sprint(err)
	})
	if os.Getenv("SHARDKV_E2E_KEEP") == "" {
		t.Cleanup(func() { _, _ = e.kubectlErr("delete", "namespace", ns, "--wait=false") })
	}
}
