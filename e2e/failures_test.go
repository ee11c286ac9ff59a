//go:build e2e

package e2e

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
	"github.com/shardkv/shardkv/controllers"
)

// podFailures: a leader pod deleted, a follower pod deleted, and a follower
// force-deleted together with its PVC (a lost disk).
func (e *env) podFailures(t *testing.T) {
	const g = "demo-b"
	base := map[string]int{"demo-a": 3, "demo-b": 3, "demo-c": 3}

	old := e.group(t, g).Status.Leader
	e.k(t, "delete", "pod", old, "--wait=false")
	d := e.eventually(t, 2*time.Minute, g+" elects a new leader", func() (bool, string) {
		rg := e.group(t, g)
		return rg.Status.Leader != "" && rg.Status.Leader != old, fmt.Sprintf("old=%s leader=%q", old, rg.Status.Leader)
	})
	t.Logf("leader %s deleted: new leader %s in status after %v (status lags the election by up to one reconcile)",
		old, e.group(t, g).Status.Leader, d.Round(100*time.Millisecond))
	e.waitSettled(t, settle, sm, base)
	e.workloadsProgress(t)

	follower := e.follower(t, g)
	e.k(t, "delete", "pod", follower.Pod)
	e.waitSettled(t, settle, sm, base)
	e.workloadsProgress(t)

	// More writes, on top of the workloads' since the run began, so that
	// the group's log is compacted past its first entries (a snapshot
	// every 10000 entries, 5000 kept): a replica with an empty disk then
	// has to catch up from a snapshot (checked below).
	e.fill(t, dataSet{sm: sm, ctrlers: 3, prefix: "e2e-fill-b:", keys: 5000, valueSize: 1024}, 1)

	lost := e.follower(t, g)
	pvc := "data-" + lost.Pod
	var claim corev1.PersistentVolumeClaim
	if err := e.kube.Get(ctx(t), client.ObjectKey{Namespace: e.ns, Name: pvc}, &claim); err != nil {
		t.Fatalf("pvc %s: %v", pvc, err)
	}
	oldUID := claim.UID
	t.Logf("losing the disk of %s (member %d): deleting PVC %s and force-deleting the pod", lost.Pod, lost.ID, pvc)
	e.k(t, "delete", "pvc", pvc, "--wait=false")
	e.k(t, "delete", "pod", lost.Pod, "--grace-period=0", "--force")
	e.eventually(t, settle, lost.Pod+" replaced by a new member on a new disk", func() (bool, string) {
		var c corev1.PersistentVolumeClaim
		err := e.kube.Get(ctx(t), client.ObjectKey{Namespace: e.ns, Name: pvc}, &c)
		disk := "new"
		switch {
		case err != nil:
			disk = "absent"
		case c.UID == oldUID:
			disk = "old (terminating)"
		}
		rg := e.group(t, g)
		var now []string
		replaced := false
		for _, m := range rg.Status.Members {
			now = append(now, fmt.Sprintf("%d@%s/%s", m.ID, m.Pod, m.Role))
			if m.Pod == lost.Pod && m.ID != lost.ID && m.Role == "follower" && m.Healthy {
				replaced = true
			}
			if m.ID == lost.ID {
				replaced = false
			}
		}
		ok, st := rgSettled(rg, 3)
		return replaced && ok && disk == "new", fmt.Sprintf("disk=%s members=%v %s", disk, now, st)
	})
	e.waitSettled(t, settle, sm, base)
	e.checkEvents(t, g, "RemoveMember", "AddLearner", "Promote")
	logs := e.k(t, "logs", lost.Pod, "-c", "node")
	if !strings.Contains(logs, "restored snapshot") {
		t.Errorf("%s did not catch up through a snapshot (no \"restored snapshot\" in its log)", lost.Pod)
	}
	e.workloadsProgress(t)
}

// follower returns a healthy non-leader member of group g.
func (e *env) follower(t *testing.T, g string) shardkvv1.Member {
	t.Helper()
	for _, m := range e.group(t, g).Status.Members {
		if m.Role == "follower" && m.Healthy {
			return m
		}
	}
	t.Fatalf("%s has no healthy follower", g)
	return shardkvv1.Member{}
}

// rollingUpdate upgrades the cluster to a second tag of the image by its
// ShardMap's spec.image alone: the controller group first, then one data
// group at a time, each one pod at a time, leader last, with no failed
// operation in either workload.
func (e *env) rollingUpdate(t *testing.T, base map[string]int) {
	st0 := e.workloadSnapshot(t)
	rollStart := time.Now()
	sets := []string{controllers.CtrlerName(sm), "demo-a", "demo-b", "demo-c"}
	logs := e.followLogs(t, sets...)
	// One field upgrades the whole cluster.
	e.k(t, "patch", "shardmap/"+sm, "--type=merge", "-p", fmt.Sprintf(`{"spec":{"image":%q}}`, e.image2))
	e.eventually(t, 2*settle, "every pod runs "+e.image2, func() (bool, string) {
		var old []string
		for _, s := range sets {
			for _, p := range e.pods(t, s) {
				if p.Spec.Containers[0].Image != e.image2 || !podReady(p) {
					old = append(old, p.Name)
				}
			}
		}
		return len(old) == 0, "not yet rolled or not ready: " + strings.Join(old, ",")
	})
	e.waitSettled(t, settle, sm, base)
	e.checkRollOrder(t, rollStart, sets)
	// The controller's leader is handed off before its pod goes.
	if evs := e.events(t, "ShardMap", sm, rollStart); !containsPrefix(evs, "TransferLeader\trolling update: moving the controller's leadership from ") {
		t.Errorf("the controller group's roll moved no leadership; events:\n%s", strings.Join(evs, "\n"))
	}
	for g := range base {
		evs := e.events(t, "ReplicaGroup", g, rollStart)
		if !containsPrefix(evs, "RollingUpdate\trolling update: 3 pods to restart") || !containsPrefix(evs, "RollingUpdate\trolling update done") {
			t.Errorf("%s: no roll slot taken and released; events:\n%s", g, strings.Join(evs, "\n"))
		}
		restarts, transfers := 0, 0
		for _, ev := range evs {
			switch {
			case strings.HasPrefix(ev, "RestartPod\t"):
				restarts++
			case strings.HasPrefix(ev, "TransferLeader\t"):
				transfers++
			}
		}
		t.Logf("%s: %d RestartPod, %d TransferLeader events during the roll", g, restarts, transfers)
		if restarts != 3 || transfers < 1 {
			t.Errorf("%s: want 3 pod restarts and a leadership transfer before the leader's; events:\n%s", g, strings.Join(evs, "\n"))
		}
	}
	e.workloadsProgress(t)
	e.checkNoWorkloadErrors(t, st0, "the roll")
	// The restarted pods' own words on what went wrong, lost otherwise.
	warned := logs.stop()
	if t.Failed() {
		for _, pod := range slices.Sorted(maps.Keys(warned)) {
			t.Logf("--- %s: warnings and errors during the roll\n%s", pod, tail(strings.Join(warned[pod], "\n"), 40))
		}
	}
}

// checkRollOrder checks the order of an upgrade from the creation times of
// the pods that replaced those of sets (the controller's first): every
// controller pod before any data pod, and each data group's pods all
// before, or all after, another's (one group of a cluster at a time).
func (e *env) checkRollOrder(t *testing.T, since time.Time, sets []string) {
	t.Helper()
	type span struct {
		set         string
		first, last time.Time
	}
	var spans []span
	for _, s := range sets {
		var sp span
		sp.set = s
		for _, p := range e.pods(t, s) {
			c := p.CreationTimestamp.Time
			if c.Before(since.Truncate(time.Second)) {
				t.Errorf("%s was not restarted by the upgrade (created %s)", p.Name, c.Format(time.TimeOnly))
				continue
			}
			if sp.first.IsZero() || c.Before(sp.first) {
				sp.first = c
			}
			if c.After(sp.last) {
				sp.last = c
			}
		}
		t.Logf("%s: pods replaced from %s to %s", s, sp.first.Format(time.TimeOnly), sp.last.Format(time.TimeOnly))
		spans = append(spans, sp)
	}
	for i, a := range spans {
		for _, b := range spans[i+1:] {
			if i == 0 && b.first.Before(a.last) {
				t.Errorf("%s's pods were replaced from %s, before the controller group's last at %s", b.set, b.first.Format(time.TimeOnly), a.last.Format(time.TimeOnly))
			}
			if i > 0 && b.first.Before(a.last) && a.first.Before(b.last) {
				t.Errorf("%s (%s-%s) and %s (%s-%s) rolled together", a.set, a.first.Format(time.TimeOnly), a.last.Format(time.TimeOnly),
					b.set, b.first.Format(time.TimeOnly), b.last.Format(time.TimeOnly))
			}
		}
	}
}

func podReady(p corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// operatorCrash kills the operator in the middle of a scale-in.
func (e *env) operatorCrash(t *testing.T, base map[string]int) {
	const g = "demo-c"
	e.k(t, "scale", "replicagroup/"+g, "--replicas=5")
	e.waitSettled(t, settle, sm, map[string]int{"demo-a": 3, "demo-b": 3, "demo-c": 5})
	// The scale-in starts, and the ShardMap is paused at once, so the
	// scale-in is certainly unfinished when the operator dies: a killed
	// process runs on for a moment (a force-deleted pod's container is
	// killed by the kubelet a little later), long enough, once, to finish
	// a 5 -> 3 scale-in on its own.
	e.k(t, "scale", "replicagroup/"+g, "--replicas=3")
	e.k(t, "patch", "shardmap/"+sm, "--type=merge", "-p", `{"spec":{"paused":true}}`)
	e.eventually(t, 2*time.Minute, "scale-in under way, then paused", func() (bool, string) {
		rg := e.group(t, g)
		c := condStatus(rg.Status.Conditions, shardkvv1.ConditionProgressing)
		return strings.Contains(c, "Paused") && rg.Status.ObservedGeneration == rg.Generation,
			fmt.Sprintf("members=%d progressing=%s", len(rg.Status.Members), c)
	})
	out := e.kubectl(t, "-n", operatorNS, "get", "pods", "-l", "app.kubernetes.io/component=manager", "-o", "name")
	t.Logf("killing the operator (%s) mid scale-in; members now %d", strings.TrimSpace(out), len(e.group(t, g).Status.Members))
	e.kubectl(t, "-n", operatorNS, "delete", "pod", "-l", "app.kubernetes.io/component=manager", "--grace-period=0", "--force")
	e.kubectl(t, "-n", operatorNS, "rollout", "status", "deploy/"+operatorDeploy, "--timeout=3m")
	var sts appsv1.StatefulSet
	if err := e.kube.Get(ctx(t), client.ObjectKey{Namespace: e.ns, Name: g}, &sts); err != nil {
		t.Fatalf("statefulset %s: %v", g, err)
	}
	rg := e.group(t, g)
	t.Logf("after the kill: %d members, StatefulSet at %d", len(rg.Status.Members), *sts.Spec.Replicas)
	if len(rg.Status.Members) <= 3 && *sts.Spec.Replicas <= 3 {
		t.Fatalf("the scale-in finished before the operator was killed: %d members, StatefulSet at %d", len(rg.Status.Members), *sts.Spec.Replicas)
	}
	e.k(t, "patch", "shardmap/"+sm, "--type=merge", "-p", `{"spec":{"paused":false}}`)
	e.waitSettled(t, settle, sm, base)
	// The scale-in was still under way at the kill: the new operator,
	// once it held the leader lease (the killed one held it until it
	// expired), took some of its steps.
	lease, err := e.cs.CoordinationV1().Leases(operatorNS).Get(ctx(t), controllers.LeaderElectionID, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("leader lease: %v", err)
	}
	acquired := lease.Spec.AcquireTime.Time
	var after []string
	for _, ev := range e.events(t, "ReplicaGroup", g, acquired.Add(time.Second)) {
		if strings.HasPrefix(ev, "RemoveMember\t") || strings.HasPrefix(ev, "ScaleStatefulSet\t") {
			after = append(after, ev)
		}
	}
	t.Logf("the new operator (%s) leads since %s; its scale-in steps:\n%s", ptrStr(lease.Spec.HolderIdentity),
		acquired.Format(time.RFC3339), strings.Join(after, "\n"))
	if len(after) == 0 {
		t.Errorf("the scale-in had finished before the operator was killed: no scale-in step after the new operator took the lease")
	}
	e.checkStatefulSet(t, g, 3)
	e.checkMembersMatchPods(t, g)
	e.workloadsProgress(t)
}

// controllerLeaderLoss deletes the controller group's leader pod just as
// the config that adds a new group commits: the groups must learn it, and
// move a quarter of the shards, across the controller's election.
func (e *env) controllerLeaderLoss(t *testing.T) {
	st0 := e.kvctlStatus(t, sm).Controller
	leader := podOfAddr(st0.LeaderAddr)
	if !strings.HasPrefix(leader, controllers.CtrlerName(sm)+"-") {
		t.Fatalf("controller leader %q is not a controller pod", leader)
	}
	e.applyGroup(t, sm, "demo-e", 3, "Delete", "256Mi")
	deadline := time.Now().Add(settle)
	for {
		s := e.shardMap(t, sm)
		if s.Status.GroupCount == 4 {
			if ok, st := smSettled(s, 4); ok {
				t.Fatalf("the migration finished before the controller leader could be killed: %s", st)
			}
			t.Logf("config %d adds demo-e; deleting the controller leader %s now (shard states %v, migrating %d)",
				s.Status.ConfigNum, leader, s.Status.ShardStates, s.Status.MigratingShards)
			break
		}
		if time.Now().After(deadline) {
			e.dump(t)
			t.Fatalf("demo-e never joined: %+v", s.Status)
		}
		time.Sleep(200 * time.Millisecond)
	}
	e.k(t, "delete", "pod", leader, "--wait=false")
	e.waitSettled(t, 2*settle, sm, map[string]int{"demo-a": 3, "demo-b": 3, "demo-c": 3, "demo-e": 3})
	// An election took place: the term moved on (the restarted pod may
	// win it again).
	st1 := e.kvctlStatus(t, sm).Controller
	t.Logf("controller leader: %s in term %d before, %s in term %d after", leader, st0.Term, podOfAddr(st1.LeaderAddr), st1.Term)
	if st1.Term <= st0.Term {
		t.Errorf("the controller's term did not move on (%d, then %d): no election after its leader's pod was deleted", st0.Term, st1.Term)
	}
	for _, g := range []string{"demo-a", "demo-b", "demo-c", "demo-e"} {
		if n := e.group(t, g).Status.Shards.Count; n != 16 {
			t.Errorf("%s holds %d shards, want 16", g, n)
		}
	}
	e.workloadsProgress(t)
}

// controllerDiskLoss: a controller follower loses its disk (its claim
// deleted, its pod force-deleted). The pod comes back empty under a fresh
// replica id; the operator adds it as a learner, promotes it and removes
// the old id, so the group is three healthy voters again, with no failed
// operation in either workload.
func (e *env) controllerDiskLoss(t *testing.T) {
	st0 := e.workloadSnapshot(t)
	name := controllers.CtrlerName(sm)
	leader := podOfAddr(e.kvctlStatus(t, sm).Controller.LeaderAddr)
	lost := ""
	for _, p := range e.pods(t, name) {
		if p.Name != leader {
			lost = p.Name
		}
	}
	if lost == "" {
		t.Fatalf("no controller follower (leader %s)", leader)
	}
	pvc := "data-" + lost
	var claim corev1.PersistentVolumeClaim
	if err := e.kube.Get(ctx(t), client.ObjectKey{Namespace: e.ns, Name: pvc}, &claim); err != nil {
		t.Fatalf("pvc %s: %v", pvc, err)
	}
	t.Logf("losing the disk of controller follower %s (leader %s): deleting PVC %s and force-deleting the pod", lost, leader, pvc)
	e.k(t, "delete", "pvc", pvc, "--wait=false")
	e.k(t, "delete", "pod", lost, "--grace-period=0", "--force")
	e.eventually(t, settle, "the controller group whole again", func() (bool, string) {
		var c corev1.PersistentVolumeClaim
		if err := e.kube.Get(ctx(t), client.ObjectKey{Namespace: e.ns, Name: pvc}, &c); err != nil || c.UID == claim.UID {
			return false, "waiting for a new volume"
		}
		evs := e.events(t, "ShardMap", sm, e.scenarioStart)
		var steps []string
		for _, k := range []string{"AddLearner", "Promote", "RemoveMember"} {
			if containsPrefix(evs, k+"\t") {
				steps = append(steps, k)
			}
		}
		m := e.shardMap(t, sm)
		return len(steps) == 3 && m.Status.ControllerReadyReplicas == 3,
			fmt.Sprintf("steps %v, %d controller pods ready", steps, m.Status.ControllerReadyReplicas)
	})
	for _, ev := range e.events(t, "ShardMap", sm, e.scenarioStart) {
		t.Logf("event: %s", ev)
	}
	e.waitSettled(t, settle, sm, map[string]int{"demo-a": 3, "demo-b": 3, "demo-c": 3, "demo-e": 3})
	e.workloadsProgress(t)
	e.checkNoWorkloadErrors(t, st0, "the controller's disk loss")
}

func ptrStr(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}
