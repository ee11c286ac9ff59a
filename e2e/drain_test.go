//go:build e2e

package e2e

import (
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
	"github.com/shardkv/shardkv/controllers"
)

// nodeDrain: a real `kubectl drain` of the node, limited to demo-a's pods
// (--pod-selector: never the operator, CoreDNS or the other groups). The
// cluster has one node, so an evicted pod cannot come back until the node
// is uncordoned. The group's PodDisruptionBudget (minAvailable 2 of 3)
// lets the drain evict exactly one pod and refuses the others: the drain
// retries them until its timeout and names the budget. The group keeps a
// quorum and serves, with no client-visible error; once uncordoned, the
// evicted pod comes back and the group settles again.
func (e *env) nodeDrain(t *testing.T) {
	const g = "demo-a"
	groups := e.groupsOf(t, sm)
	e.waitSettled(t, settle, sm, groups)
	pods := e.pods(t, g)
	if len(pods) != 3 {
		t.Fatalf("%s has %d pods, want 3", g, len(pods))
	}
	node := pods[0].Spec.NodeName
	before := map[string]types.UID{}
	for _, p := range pods {
		if p.Spec.NodeName != node {
			t.Fatalf("%s on node %s, %s on %s: the scenario expects one node", p.Name, p.Spec.NodeName, pods[0].Name, node)
		}
		before[p.Name] = p.UID
	}
	// The budget allows one disruption now (the last scenario's evicted
	// pod is back and counted).
	e.eventually(t, time.Minute, "pdb "+g+" allows 1 disruption", func() (bool, string) {
		pdb := e.pdb(t, g)
		return pdb.Spec.MinAvailable != nil && pdb.Spec.MinAvailable.IntValue() == 2 && pdb.Status.DisruptionsAllowed == 1,
			fmt.Sprintf("minAvailable %v, healthy %d, disruptions allowed %d", pdb.Spec.MinAvailable, pdb.Status.CurrentHealthy, pdb.Status.DisruptionsAllowed)
	})

	// Uncordon whatever happens: a cordoned node leaves every later pod
	// Pending.
	var once sync.Once
	uncordon := func() {
		once.Do(func() {
			if out, err := e.kubectlErr("uncordon", node); err != nil {
				t.Errorf("kubectl uncordon %s: %v", node, err)
			} else {
				t.Logf("%s", strings.TrimSpace(out))
			}
		})
	}
	t.Cleanup(uncordon)

	st0 := e.workloadSnapshot(t)
	sel := fmt.Sprintf("%s=%s,%s=%s", controllers.LabelInstance, sm, controllers.LabelGroup, g)
	t0 := time.Now()
	out, err := e.kubectlErr("drain", node, "--pod-selector="+sel, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=20s")
	took := time.Since(t0).Round(time.Second)
	t.Logf("kubectl drain %s --pod-selector=%s (%v): err=%v\n%s", node, sel, took, err, out)
	if err == nil {
		t.Errorf("kubectl drain completed: the budget should have stopped it at one pod of %s", g)
	}
	all := out
	if err != nil {
		all += "\n" + err.Error()
	}
	evicted := regexp.MustCompile(`pod/(`+g+`-\d+) evicted`).FindAllStringSubmatch(all, -1)
	if len(evicted) != 1 {
		t.Errorf("kubectl drain evicted %d pods of %s (%v), want 1: the budget allows one", len(evicted), g, evicted)
	}
	// The others were refused by the budget, each of them, and retried.
	refused := map[string]bool{}
	for _, m := range regexp.MustCompile(`error when evicting pods/"(`+g+`-\d+)" -n "[^"]+" \(will retry after 5s\): Cannot evict pod as it would violate the pod's disruption budget`).FindAllStringSubmatch(all, -1) {
		refused[m[1]] = true
	}
	for _, p := range pods {
		if want := len(evicted) == 0 || p.Name != evicted[0][1]; refused[p.Name] != want {
			t.Errorf("kubectl drain: %s refused by the disruption budget: %v, want %v", p.Name, refused[p.Name], want)
		}
	}

	// Still cordoned: exactly one pod is gone (its replacement cannot be
	// scheduled), the budget allows nothing more, and the group serves.
	var n corev1.Node
	if err := e.kube.Get(ctx(t), client.ObjectKey{Name: node}, &n); err != nil || !n.Spec.Unschedulable {
		t.Errorf("node %s after the drain: unschedulable=%v (%v), want cordoned", node, n.Spec.Unschedulable, err)
	}
	var gone []string
	for _, p := range e.pods(t, g) {
		if p.UID != before[p.Name] {
			gone = append(gone, fmt.Sprintf("%s (now %s)", p.Name, p.Status.Phase))
		}
	}
	if len(e.pods(t, g)) < 3 { // the replacement not even created yet
		gone = append(gone, "a pod not yet recreated")
	}
	t.Logf("replaced pods of %s: %v", g, gone)
	if len(gone) != 1 {
		t.Errorf("%s: %d pods replaced by the drain (%v), want 1", g, len(gone), gone)
	}
	if pdb := e.pdb(t, g); pdb.Status.DisruptionsAllowed != 0 {
		t.Errorf("pdb %s during the drain: %d disruptions allowed, want 0 (healthy %d)", g, pdb.Status.DisruptionsAllowed, pdb.Status.CurrentHealthy)
	}
	rg := e.group(t, g)
	_, st := rgSettled(rg, 3)
	t.Logf("%s during the drain: %s", g, st)
	if rg.Status.Phase != "Serving" || rg.Status.Leader == "" {
		t.Errorf("%s during the drain: phase %s, leader %q: want Serving with a leader", g, rg.Status.Phase, rg.Status.Leader)
	}
	e.workloadsProgress(t)
	e.checkNoWorkloadErrors(t, st0, "the drain")

	uncordon()
	e.waitSettled(t, settle, sm, groups)
	e.checkMembersMatchPods(t, g)
	e.checkNoWorkloadErrors(t, st0, "the drain and the uncordon")
	t.Logf("node drain: %v in all", time.Since(t0).Round(time.Second))
}

// groupsOf is ShardMap name's ReplicaGroups (name -> spec.replicas).
func (e *env) groupsOf(t *testing.T, name string) map[string]int {
	t.Helper()
	var list shardkvv1.ReplicaGroupList
	if err := e.kube.List(ctx(t), &list, client.InNamespace(e.ns)); err != nil {
		t.Fatalf("list replicagroups: %v", err)
	}
	out := map[string]int{}
	for _, rg := range list.Items {
		if rg.Spec.ShardMap == name && rg.DeletionTimestamp == nil {
			out[rg.Name] = int(ptr.Deref(rg.Spec.Replicas, 3))
		}
	}
	return out
}

func (e *env) pdb(t *testing.T, name string) *policyv1.PodDisruptionBudget {
	t.Helper()
	var pdb policyv1.PodDisruptionBudget
	if err := e.kube.Get(ctx(t), keyOf(e.ns, name), &pdb); err != nil {
		t.Fatalf("pdb %s: %v", name, err)
	}
	return &pdb
}
