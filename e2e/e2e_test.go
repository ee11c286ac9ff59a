//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
	"github.com/shardkv/shardkv/controllers"
	"github.com/shardkv/shardkv/pkg/kvcheck"
	"github.com/shardkv/shardkv/pkg/routing"
)

// Scenarios run in order against one cluster, one operator deployment and
// one ShardMap ("demo", from config/samples), while one workload records a
// history from the first scenario to the last; the last subtest checks it.
// hack/e2e.sh fails unless every run("...") below passed (no skip).
const (
	sm     = "demo"
	settle = 6 * time.Minute // generous: 2 shared cores run everything
)

func TestE2E(t *testing.T) {
	e := newEnv(t)
	e.deployOperator(t)
	e.freshNamespace(t)
	if t.Failed() {
		return
	}
	base := map[string]int{"demo-a": 3, "demo-b": 3, "demo-c": 3}
	run := func(name string, f func(t *testing.T)) {
		if !t.Run(name, f) {
			e.dump(t)
		}
	}

	run("Create", func(t *testing.T) {
		t0 := time.Now()
		e.k(t, "apply", "-k", "config/samples")
		e.waitSettled(t, settle, sm, base)
		t.Logf("create: all shards Serving after %v", time.Since(t0).Round(time.Second))
		e.checkStatusAgrees(t, base)
		e.startWorkloads(t, sm, []string{"demo-a", "demo-b", "demo-c"})
	})

	run("NetworkPolicies", func(t *testing.T) { e.networkPolicies(t) })

	run("ScaleGroup", func(t *testing.T) {
		t.Logf("before:\n%s", e.k(t, "get", "shardmaps,replicagroups", "-o", "wide"))
		e.k(t, "scale", "replicagroup/demo-a", "--replicas=5")
		e.waitSettled(t, settle, sm, map[string]int{"demo-a": 5, "demo-b": 3, "demo-c": 3})
		t.Logf("after scale to 5:\n%s", e.k(t, "get", "shardmaps,replicagroups", "-o", "wide"))
		e.checkEvents(t, "demo-a", "AddLearner", "Promote")
		e.workloadsProgress(t)

		e.k(t, "scale", "replicagroup/demo-a", "--replicas=3")
		e.waitSettled(t, settle, sm, base)
		t.Logf("after scale back to 3:\n%s", e.k(t, "get", "shardmaps,replicagroups", "-o", "wide"))
		e.checkEvents(t, "demo-a", "RemoveMember")
		e.checkStatefulSet(t, "demo-a", 3)
		// pvcRetention defaults to Retain: the removed replicas' PVCs stay.
		for _, pvc := range []string{"data-demo-a-3", "data-demo-a-4"} {
			if err := e.kube.Get(ctx(t), client.ObjectKey{Namespace: e.ns, Name: pvc}, &corev1.PersistentVolumeClaim{}); err != nil {
				t.Errorf("pvcRetention Retain: PVC %s: %v", pvc, err)
			}
		}
		e.checkMembersMatchPods(t, "demo-a")
		e.workloadsProgress(t)
	})

	run("AddGroup", func(t *testing.T) {
		// Data to move, so the migration lasts long enough to be seen.
		e.fill(t, "e2e-fill-a:", 30*time.Second)
		stop := e.watchMigrations(t, sm)
		e.applyGroup(t, "demo-d", 3, "Delete")
		e.eventually(t, settle, "demo-d joined and shards balanced", func() (bool, string) {
			ok, sst := smSettled(e.shardMap(t, sm), 4)
			rg := e.group(t, "demo-d")
			rok, rst := rgSettled(rg, 3)
			return ok && rok && rg.Status.Shards.Count == 16, sst + " | demo-d: " + rst
		})
		seen := stop()
		t.Logf("status.migrations as written by the operator:\n%s", strings.Join(seen, "\n"))
		if !slices.ContainsFunc(seen, func(m string) bool { return strings.Contains(m, "->demo-d ") }) {
			t.Errorf("status.migrations never listed the migration to demo-d")
		}
		for _, g := range []string{"demo-a", "demo-b", "demo-c", "demo-d"} {
			if n := e.group(t, g).Status.Shards.Count; n != 16 {
				t.Errorf("%s holds %d shards, want 16 of 64 over 4 groups", g, n)
			}
		}
		e.checkStatusAgrees(t, map[string]int{"demo-a": 3, "demo-b": 3, "demo-c": 3, "demo-d": 3})
		e.workloadsProgress(t)
	})

	run("LiveMove", func(t *testing.T) {
		// One shard large enough (about 16 MB, many snapshot chunks) that
		// the sample's copy rate limit (512 KiB/s) stretches its copy over
		// tens of seconds: status.migrations shows its progress mid-way,
		// under the running workloads. It goes to demo-d (pinned there
		// until demo-d is deleted below, which drops the pin).
		target := e.group(t, "demo-d").Status.GroupID
		sm0 := e.shardMap(t, sm)
		tag, shard := "", -1
		for i := 0; tag == ""; i++ {
			c := fmt.Sprintf("{e2e-mv-%d}", i)
			s := routing.ShardOf([]byte(c+"0"), int(sm0.Spec.Shards))
			if owner := tableOwner(sm0, s); owner != 0 && owner != target {
				tag, shard = c, s
			}
		}
		e.k(t, "exec", controllers.CtrlerName(sm)+"-0", "-c", "node", "--", "/kvctl", "--ctrler="+e.ctrlerAddrs(sm, 3),
			"bench", "--clients=16", "--duration=15s", "--read-ratio=0", "--keys=1000", "--value-size=16384", "--key-prefix="+tag)
		stop := e.watchMigrations(t, sm)
		out := e.k(t, "exec", controllers.CtrlerName(sm)+"-0", "-c", "node", "--", "/kvctl", "--ctrler="+e.ctrlerAddrs(sm, 3),
			"move", fmt.Sprint(shard), fmt.Sprint(target))
		t.Logf("kvctl move %d %d:\n%s", shard, target, out)
		e.eventually(t, settle, fmt.Sprintf("shard %d served by group %d", shard, target), func() (bool, string) {
			m := e.shardMap(t, sm)
			return tableOwner(m, shard) == target && m.Status.MigratingShards == 0,
				fmt.Sprintf("owner %d, migrating %d", tableOwner(m, shard), m.Status.MigratingShards)
		})
		seen := stop()
		t.Logf("status.migrations during the move:\n%s", strings.Join(seen, "\n"))
		if !slices.ContainsFunc(seen, func(m string) bool {
			i := strings.Index(m, `progress="`)
			var pct int
			if !strings.Contains(m, "->demo-d ") || i < 0 {
				return false
			}
			_, err := fmt.Sscanf(m[i+len(`progress="`):], "%d%%", &pct)
			return err == nil && pct > 0 && pct < 100
		}) {
			t.Errorf("status.migrations never showed the copy of shard %d to demo-d between 0 and 100%%", shard)
		}
		e.workloadsProgress(t)
	})

	run("DeleteGroup", func(t *testing.T) {
		e.k(t, "delete", "replicagroup/demo-d", "--wait=false")
		sawDraining := false
		e.eventually(t, settle, "demo-d drained and gone", func() (bool, string) {
			rg := e.group(t, "demo-d")
			if rg != nil {
				if rg.Status.Phase == "Draining" || condTrue(rg.Status.Conditions, shardkvv1.ConditionDraining) {
					sawDraining = true
				}
				return false, fmt.Sprintf("demo-d phase=%s shards=%d draining=%s", rg.Status.Phase, rg.Status.Shards.Count,
					condStatus(rg.Status.Conditions, shardkvv1.ConditionDraining))
			}
			return true, "demo-d deleted"
		})
		if !sawDraining {
			t.Logf("note: demo-d's Draining phase was not observed between polls")
		}
		e.waitSettled(t, settle, sm, base)
		// Its objects went with it; the PVCs follow pvcRetention: Delete.
		e.eventually(t, 2*time.Minute, "demo-d's objects gone", func() (bool, string) {
			var left []string
			if err := e.kube.Get(ctx(t), client.ObjectKey{Namespace: e.ns, Name: "demo-d"}, &appsv1.StatefulSet{}); !apierrors.IsNotFound(err) {
				left = append(left, "statefulset")
			}
			if err := e.kube.Get(ctx(t), client.ObjectKey{Namespace: e.ns, Name: "demo-d"}, &corev1.Service{}); !apierrors.IsNotFound(err) {
				left = append(left, "service")
			}
			var pvcs corev1.PersistentVolumeClaimList
			_ = e.kube.List(ctx(t), &pvcs, client.InNamespace(e.ns))
			for _, p := range pvcs.Items {
				if strings.HasPrefix(p.Name, "data-demo-d-") {
					left = append(left, "pvc/"+p.Name)
				}
			}
			return len(left) == 0, "left: " + strings.Join(left, ",")
		})
		e.checkStatusAgrees(t, base)
		e.workloadsProgress(t)
	})

	run("DeleteLastGroupRefused", func(t *testing.T) { e.deleteLastGroup(t) })

	run("PodFailures", func(t *testing.T) { e.podFailures(t) })

	run("RollingUpdate", func(t *testing.T) { e.rollingUpdate(t, base) })

	run("OperatorCrash", func(t *testing.T) { e.operatorCrash(t, base) })

	run("ControllerLeaderLoss", func(t *testing.T) { e.controllerLeaderLoss(t) })

	run("TLS", func(t *testing.T) { e.tlsCluster(t) })

	run("Linearizable", func(t *testing.T) {
		for _, name := range workloads {
			h := e.stopWorkload(t, name)
			res, err := kvcheck.Check(h.Ops, 5*time.Minute)
			if err != nil {
				t.Fatalf("%s: check: %v", name, err)
			}
			t.Logf("%s history: %s", name, res)
			t.Logf("%s log tail:\n%s", name, e.workloadLog(t, name))
			if !res.Linearizable {
				t.Errorf("%s: the history is not linearizable: %s", name, res)
			}
			if res.OK < 500 {
				t.Errorf("%s: only %d successful operations: too few to mean much", name, res.OK)
			}
		}
	})
}

// deployOperator applies config/default (CRDs, RBAC, the manager) and waits
// for the manager to be available.
func (e *env) deployOperator(t *testing.T) {
	t.Helper()
	e.kubectl(t, "apply", "--server-side", "--force-conflicts", "-k", "config/default")
	if e.image != "shardkv:dev" {
		e.kubectl(t, "-n", operatorNS, "set", "image", "deploy/"+operatorDeploy, "manager="+e.image)
	}
	e.kubectl(t, "-n", operatorNS, "rollout", "status", "deploy/"+operatorDeploy, "--timeout=3m")
}

// freshNamespace (re)creates the scenario namespace.
func (e *env) freshNamespace(t *testing.T) {
	t.Helper()
	if _, err := e.kubectlErr("get", "namespace", e.ns); err == nil {
		t.Logf("namespace %s exists from an earlier run: deleting it", e.ns)
		e.deleteNamespace(t)
	}
	// Pod Security "restricted" is enforced in the namespace: the API
	// server refuses any pod of the scenarios (the operator's, the
	// workloads') that is not restricted (docs/security.md).
	e.kubectl(t, "create", "namespace", e.ns)
	e.kubectl(t, "label", "namespace", e.ns, "pod-security.kubernetes.io/enforce=restricted",
		"pod-security.kubernetes.io/enforce-version=latest")
	e.eventually(t, time.Minute, "default ServiceAccount", func() (bool, string) {
		_, err := e.kubectlErr("-n", e.ns, "get", "serviceaccount", "default")
		return err == nil, fmt.Sprint(err)
	})
	// The label is in force: a pod that may escalate privileges is refused.
	bad := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "not-restricted", Namespace: e.ns},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: e.image}}},
	}
	if err := e.kube.Create(ctx(t), bad, client.DryRunAll); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "PodSecurity") {
		t.Errorf("namespace %s: a pod that is not restricted was not refused by PodSecurity: %v", e.ns, err)
	}
	if os.Getenv("SHARDKV_E2E_KEEP") == "" {
		t.Cleanup(func() { e.deleteNamespace(t) })
	}
}

// deleteNamespace removes everything, finalizers included: a group the
// operator refuses to drain (the last one) would otherwise hold it forever.
func (e *env) deleteNamespace(t *testing.T) {
	_, _ = e.kubectlErr("delete", "namespace", e.ns, "--wait=false")
	deadline := time.Now().Add(3 * time.Minute)
	for time.Now().Before(deadline) {
		if _, err := e.kubectlErr("get", "namespace", e.ns); err != nil {
			return
		}
		out, _ := e.kubectlErr("-n", e.ns, "get", "replicagroups", "-o", "name")
		for _, rg := range strings.Fields(out) {
			_, _ = e.kubectlErr("-n", e.ns, "patch", rg, "--type=merge", "-p", `{"metadata":{"finalizers":null}}`)
		}
		time.Sleep(2 * time.Second)
	}
	t.Errorf("namespace %s still exists after 3m", e.ns)
}

// fill writes for d through kvctl bench in a controller pod: load, and
// data for migrations and snapshots.
func (e *env) fill(t *testing.T, prefix string, d time.Duration) {
	t.Helper()
	out := e.k(t, "exec", controllers.CtrlerName(sm)+"-0", "-c", "node", "--", "/kvctl", "--ctrler="+e.ctrlerAddrs(sm, 3),
		"bench", "--clients=16", "--duration="+d.String(), "--read-ratio=0", "--keys=20000", "--value-size=1024", "--key-prefix="+prefix)
	t.Logf("fill %s:\n%s", prefix, out)
}

func (e *env) applyGroup(t *testing.T, name string, replicas int, retention string) {
	t.Helper()
	e.applyYAML(t, fmt.Sprintf(`apiVersion: shardkv.io/v1alpha1
kind: ReplicaGroup
metadata:
  name: %s
spec:
  shardMap: %s
  replicas: %d
  pvcRetention: %s
  storage:
    size: 256Mi
`, name, sm, replicas, retention))
}

func (e *env) applyYAML(t *testing.T, y string) {
	t.Helper()
	f := filepath.Join(t.TempDir(), "obj.yaml")
	if err := os.WriteFile(f, []byte(y), 0o644); err != nil {
		t.Fatal(err)
	}
	e.k(t, "apply", "-f", f)
}

// checkStatusAgrees compares the ShardMap's and groups' status with what
// the controller itself says (`kvctl status` in a controller pod), and the
// kubectl columns with the status.
func (e *env) checkStatusAgrees(t *testing.T, groups map[string]int) {
	t.Helper()
	e.eventually(t, time.Minute, "CRD status agrees with kvctl status", func() (bool, string) {
		s := e.shardMap(t, sm)
		kv := e.kvctlStatus(t, sm)
		var diffs []string
		if uint64(s.Status.ConfigNum) != kv.ConfigNum {
			diffs = append(diffs, fmt.Sprintf("configNum %d vs kvctl %d", s.Status.ConfigNum, kv.ConfigNum))
		}
		if kv.NShards != int(s.Spec.Shards) {
			diffs = append(diffs, fmt.Sprintf("shards %d vs kvctl %d", s.Spec.Shards, kv.NShards))
		}
		owned := map[uint64]int{}
		inConfig := 0
		for _, g := range kv.Groups {
			if g.InConfig {
				inConfig++
				owned[g.GID] = g.OwnedShards
			}
		}
		if inConfig != len(groups) {
			diffs = append(diffs, fmt.Sprintf("kvctl shows %d groups in the config, want %d", inConfig, len(groups)))
		}
		for name := range groups {
			rg := e.group(t, name)
			if got, want := int(rg.Status.Shards.Count), owned[uint64(rg.Status.GroupID)]; got != want {
				diffs = append(diffs, fmt.Sprintf("%s (gid %d) status shards %d vs kvctl %d", name, rg.Status.GroupID, got, want))
			}
		}
		if !kv.Settled {
			diffs = append(diffs, "kvctl: not settled")
		}
		return len(diffs) == 0, strings.Join(diffs, "; ")
	})
	// The printer columns show the status.
	out := e.k(t, "get", "shardmap", sm, "--no-headers")
	s := e.shardMap(t, sm)
	want := fmt.Sprintf(`^%s\s+%d\s+%d\s+%d\s+0\s+True\s+`, sm, s.Status.ConfigNum, len(groups), s.Spec.Shards)
	if !regexp.MustCompile(want).MatchString(out) {
		t.Errorf("kubectl get shardmap: %q does not match %q", out, want)
	}
	for name, n := range groups {
		rg := e.group(t, name)
		out := e.k(t, "get", "replicagroup", name, "--no-headers")
		want := fmt.Sprintf(`^%s\s+%d\s+Serving\s+%d\s+%d\s+%d\s+%s\s+`, name, rg.Status.GroupID, n, n, rg.Status.Shards.Count, rg.Status.Leader)
		if !regexp.MustCompile(want).MatchString(out) {
			t.Errorf("kubectl get replicagroup: %q does not match %q", out, want)
		}
	}
}

// checkEvents fails unless the group's Events include each reason.
func (e *env) checkEvents(t *testing.T, rg string, reasons ...string) {
	t.Helper()
	evs := e.events(t, "ReplicaGroup", rg)
	for _, r := range reasons {
		if !slices.ContainsFunc(evs, func(ev string) bool { return strings.HasPrefix(ev, r+"\t") }) {
			t.Errorf("%s: no %s Event among:\n%s", rg, r, strings.Join(evs, "\n"))
		}
	}
}

func (e *env) checkStatefulSet(t *testing.T, name string, replicas int32) {
	t.Helper()
	var sts appsv1.StatefulSet
	if err := e.kube.Get(ctx(t), client.ObjectKey{Namespace: e.ns, Name: name}, &sts); err != nil {
		t.Fatalf("statefulset %s: %v", name, err)
	}
	if sts.Spec.Replicas == nil || *sts.Spec.Replicas != replicas {
		t.Errorf("statefulset %s: spec.replicas=%v, want %d", name, sts.Spec.Replicas, replicas)
	}
}

// checkMembersMatchPods: one member per pod, ordinals 0..n-1.
func (e *env) checkMembersMatchPods(t *testing.T, name string) {
	t.Helper()
	rg := e.group(t, name)
	var pods []string
	for _, p := range e.pods(t, name) {
		pods = append(pods, p.Name)
	}
	var members []string
	for _, m := range rg.Status.Members {
		members = append(members, m.Pod)
	}
	slices.Sort(members)
	if !slices.Equal(pods, members) {
		t.Errorf("%s: members on pods %v, pods %v", name, members, pods)
	}
}

func (e *env) deleteLastGroup(t *testing.T) {
	// A cluster of its own with one group, so the main one keeps its data.
	e.applyYAML(t, `apiVersion: shardkv.io/v1alpha1
kind: ShardMap
metadata:
  name: solo
spec:
  shards: 8
  controller:
    replicas: 1
    storage: {size: 64Mi}
---
apiVersion: shardkv.io/v1alpha1
kind: ReplicaGroup
metadata:
  name: solo-a
spec:
  shardMap: solo
  replicas: 1
  storage: {size: 64Mi}
`)
	e.waitSettled(t, settle, "solo", map[string]int{"solo-a": 1})
	e.k(t, "delete", "replicagroup/solo-a", "--wait=false")
	var msg string
	e.eventually(t, 2*time.Minute, "deletion of the last group refused", func() (bool, string) {
		rg := e.group(t, "solo-a")
		if rg == nil {
			return false, "solo-a is gone: the deletion was executed"
		}
		c := meta.FindStatusCondition(rg.Status.Conditions, shardkvv1.ConditionDraining)
		if c == nil {
			return false, "no Draining condition yet"
		}
		msg = c.Message
		return c.Reason == "LastGroupHoldsData", fmt.Sprintf("Draining=%s reason=%s: %s", c.Status, c.Reason, c.Message)
	})
	t.Logf("condition message: %s", msg)
	e.checkEvents(t, "solo-a", "LastGroupHoldsData")
	// It stays refused, and the group keeps serving its shards.
	time.Sleep(10 * time.Second)
	rg := e.group(t, "solo-a")
	if rg == nil || rg.Status.Shards.Count != 8 {
		t.Fatalf("solo-a after the refusal: %+v", rg)
	}
	// Tear the solo cluster down: drop the finalizer (the user's way to
	// say "discard the data"), then the ShardMap.
	e.k(t, "patch", "replicagroup/solo-a", "--type=merge", "-p", `{"metadata":{"finalizers":null}}`)
	e.k(t, "delete", "shardmap/solo", "--wait=true", "--timeout=2m")
}

// tableOwner is shard s's owner (group id) in the ShardMap's status table.
func tableOwner(m *shardkvv1.ShardMap, s int) int64 {
	for _, r := range m.Status.Table {
		if int(r.First) <= s && s <= int(r.Last) {
			return r.GroupID
		}
	}
	return 0
}
