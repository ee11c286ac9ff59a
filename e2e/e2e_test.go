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
		e.scenarioStart = time.Now()
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
		removed := e.memberAt(t, "demo-a", "demo-a-3") // the replica the scale-in removes

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
		e.scaleOutOnRetainedVolume(t, "demo-a", removed, base)
	})

	run("ReadinessIsRaftHealth", func(t *testing.T) { e.readinessIsRaftHealth(t) })

	run("AddGroup", func(t *testing.T) {
		// Data to move, so the migration lasts long enough to be seen.
		e.fill(t, dataSet{sm: sm, ctrlers: 3, prefix: "e2e-fill-a:", keys: 5000, valueSize: 1024}, 1)
		stop := e.watchMigrations(t, sm)
		e.applyGroup(t, sm, "demo-d", 3, "Delete", "256Mi")
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
		// One shard large enough (about 10 MB, many snapshot chunks) that
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
		e.fill(t, dataSet{sm: sm, ctrlers: 3, prefix: tag, keys: 600, valueSize: 16384}, 1)
		stop := e.watchMigrations(t, sm)
		out := e.k(t, e.kvctl(sm, 3, "move", fmt.Sprint(shard), fmt.Sprint(target))...)
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

	run("SpecMoves", func(t *testing.T) { e.specMoves(t) })

	run("PrometheusScrape", func(t *testing.T) { e.prometheusScrape(t) })

	run("EvictionKeepsQuorum", func(t *testing.T) { e.evictionKeepsQuorum(t) })

	run("NodeDrain", func(t *testing.T) { e.nodeDrain(t) })

	run("DeleteGroup", func(t *testing.T) {
		st0 := e.workloadSnapshot(t)
		stop := e.watchGroup(t, "demo-d")
		e.k(t, "delete", "replicagroup/demo-d", "--wait=false")
		e.eventually(t, settle, "demo-d drained and gone", func() (bool, string) {
			rg := e.group(t, "demo-d")
			if rg != nil {
				return false, fmt.Sprintf("demo-d phase=%s shards=%d draining=%s", rg.Status.Phase, rg.Status.Shards.Count,
					condStatus(rg.Status.Conditions, shardkvv1.ConditionDraining))
			}
			return true, "demo-d deleted"
		})
		// Every status write, watched: it left, waited for its shards to
		// move, and was finalized as drained.
		seen := stop()
		t.Logf("demo-d's status writes:\n%s", strings.Join(seen, "\n"))
		for _, want := range []string{"phase=Draining draining=WaitingForDrain", "draining=Drained"} {
			if !slices.ContainsFunc(seen, func(s string) bool { return strings.Contains(s, want) }) {
				t.Errorf("demo-d's status never showed %q", want)
			}
		}
		e.checkEvents(t, "demo-d", "Leave", "Finalize")
		// Clients that still map demo-d's old slots to its pods are
		// redirected by them until they have moved: not one operation
		// fails because the pods went away.
		e.workloadsProgress(t)
		e.checkNoWorkloadErrors(t, st0, "the deletion of demo-d")
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
			if err := e.kube.List(ctx(t), &pvcs, client.InNamespace(e.ns)); err != nil {
				return false, "list claims: " + err.Error()
			}
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

	// A cluster of its own ("solo"), so the main one keeps its data: the
	// lifecycle paths that need a group left alone or the operator down.
	run("DeleteLastGroupRefused", func(t *testing.T) { e.deleteLastGroup(t) })

	run("RequirePass", func(t *testing.T) { e.requirePass(t) })

	run("RecreateOnRetainedVolume", func(t *testing.T) { e.recreateOnRetainedVolume(t) })

	run("DeleteDecidedByReports", func(t *testing.T) { e.deleteDecidedByReports(t) })

	run("GrowStorageRefused", func(t *testing.T) { e.growStorageRefused(t) })

	run("DeleteShardMap", func(t *testing.T) { e.deleteShardMap(t) })

	run("PodFailures", func(t *testing.T) { e.podFailures(t) })

	run("RollingUpdate", func(t *testing.T) { e.rollingUpdate(t, base) })

	run("OperatorCrash", func(t *testing.T) { e.operatorCrash(t, base) })

	run("ControllerLeaderLoss", func(t *testing.T) { e.controllerLeaderLoss(t) })

	run("ControllerDiskLoss", func(t *testing.T) { e.controllerDiskLoss(t) })

	run("ControllerResize", func(t *testing.T) { e.controllerResize(t) })

	run("TLS", func(t *testing.T) { e.tlsCluster(t) })

	run("ReadBack", func(t *testing.T) {
		// Every fill of the run, read back in full after every scenario
		// (migrations, drains, lost disks, rolls) had its turn.
		for _, d := range e.fills {
			if d.sm == sm { // the solo cluster's was read back before it went
				e.verify(t, d)
			}
		}
	})

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
	// The local cluster's kubelet syncs Secret volumes every 10 s
	// (hack/local-cluster.sh): a CA rotation need not wait the default
	// 2 minutes per step for them (TLS scenario).
	e.kubectl(t, "-n", operatorNS, "patch", "deploy/"+operatorDeploy, "--type=json", "-p",
		`[{"op":"add","path":"/spec/template/spec/containers/0/args/-","value":"--tls-propagation=45s"}]`)
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
		out, _ := e.kubectlErr("-n", e.ns, "get", "replicagroups,shardmaps", "-o", "name")
		for _, obj := range strings.Fields(out) {
			_, _ = e.kubectlErr("-n", e.ns, "patch", obj, "--type=merge", "-p", `{"metadata":{"finalizers":null}}`)
		}
		time.Sleep(2 * time.Second)
	}
	t.Errorf("namespace %s still exists after 3m", e.ns)
}

// kvctl is the kubectl arguments that run kvctl with args in ShardMap
// sm's first controller pod, against its ctrlers controller replicas.
func (e *env) kvctl(sm string, ctrlers int, args ...string) []string {
	return append([]string{"exec", controllers.CtrlerName(sm) + "-0", "-c", "node", "--", "/kvctl", "--ctrler=" + e.ctrlerAddrs(sm, ctrlers)}, args...)
}

// dataSet is what one kvctl fill wrote: keys <prefix>0..keys-1 in
// ShardMap sm, each with a value made from its name.
type dataSet struct {
	sm, prefix      string
	ctrlers         int
	keys, valueSize int
}

func (d dataSet) flags() []string {
	return []string{fmt.Sprintf("--keys=%d", d.keys), fmt.Sprintf("--value-size=%d", d.valueSize), "--key-prefix=" + d.prefix}
}

// fill writes d (every key, passes times) through kvctl fill in a
// controller pod: load, and data for migrations and snapshots. The run
// reads every fill back at the end (ReadBack).
func (e *env) fill(t *testing.T, d dataSet, passes int) {
	t.Helper()
	out := e.k(t, e.kvctl(d.sm, d.ctrlers, append([]string{"fill", "--clients=16", fmt.Sprintf("--passes=%d", passes)}, d.flags()...)...)...)
	t.Logf("fill %s: %s", d.prefix, strings.TrimSpace(out))
	e.fills = append(e.fills, d)
}

// verify reads d back in full: every key there, with its value.
func (e *env) verify(t *testing.T, d dataSet) {
	t.Helper()
	out, err := e.kubectlErr(append([]string{"-n", e.ns}, e.kvctl(d.sm, d.ctrlers, append([]string{"verify", "--clients=16"}, d.flags()...)...)...)...)
	if err != nil {
		t.Errorf("%s: data lost: %v", d.prefix, err)
		return
	}
	t.Logf("verify %s: %s", d.prefix, strings.TrimSpace(out))
}

// applyGroup creates or updates ReplicaGroup name of ShardMap shardMap
// (pvcRetention left to its default when retention is "").
func (e *env) applyGroup(t *testing.T, shardMap, name string, replicas int, retention, size string) {
	t.Helper()
	y := fmt.Sprintf(`apiVersion: shardkv.io/v1alpha1
kind: ReplicaGroup
metadata:
  name: %s
spec:
  shardMap: %s
  replicas: %d
  storage: {size: %s}
`, name, shardMap, replicas, size)
	if retention != "" {
		y += "  pvcRetention: " + retention + "\n"
	}
	e.applyYAML(t, y)
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
	want := fmt.Sprintf(`^%s\s+%d\s+%d\s+%d\s+%d\s+0\s+True\s+`, sm, s.Status.ConfigNum, s.Status.ControllerVoters, len(groups), s.Spec.Shards)
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

// checkEvents fails unless the group's Events since the scenario began
// include each reason.
func (e *env) checkEvents(t *testing.T, rg string, reasons ...string) {
	t.Helper()
	evs := e.events(t, "ReplicaGroup", rg, e.scenarioStart)
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

// tableOwner is shard s's owner (group id) in the ShardMap's status table.
func tableOwner(m *shardkvv1.ShardMap, s int) int64 {
	for _, r := range m.Status.Table {
		if int(r.First) <= s && s <= int(r.Last) {
			return r.GroupID
		}
	}
	return 0
}
