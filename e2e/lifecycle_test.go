//go:build e2e

package e2e

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
	"github.com/shardkv/shardkv/controllers"
)

// The solo cluster: ShardMap "solo" (8 shards, one controller replica)
// and its groups, one replica each. These scenarios run in order.
const solo = "solo"

// soloData is what deleteDecidedByReports writes and reads back.
var soloData = dataSet{sm: solo, ctrlers: 1, prefix: "e2e-solo:", keys: 2000, valueSize: 512}

// deleteLastGroup: deleting the only group holding data is refused, and
// goes ahead (drain, then finalize) once another group has joined. Its
// volume stays (pvcRetention: Retain).
func (e *env) deleteLastGroup(t *testing.T) {
	e.applyYAML(t, `apiVersion: shardkv.io/v1alpha1
kind: ShardMap
metadata:
  name: solo
spec:
  shards: 8
  controller:
    replicas: 1
    storage: {size: 64Mi}
  network:
    clients:
    - podSelector: {}     # the probes of RequirePass
`)
	e.applyGroup(t, solo, "solo-a", 1, "", "64Mi")
	e.waitSettled(t, settle, solo, map[string]int{"solo-a": 1})
	e.k(t, "delete", "replicagroup/solo-a", "--wait=false")
	e.waitCondition(t, "solo-a", shardkvv1.ConditionDraining, "False", "LastGroupHoldsData", "last group")
	e.checkEvents(t, "solo-a", "LastGroupHoldsData")
	// It stays refused, and the group keeps serving its shards.
	time.Sleep(10 * time.Second)
	rg := e.group(t, "solo-a")
	if rg == nil || rg.Status.Shards.Count != 8 {
		t.Fatalf("solo-a after the refusal: %+v", rg)
	}

	// Another group joins: the deletion goes ahead.
	e.applyYAML(t, soloBYAML()) // with requirePass (RequirePass)
	e.eventually(t, settle, "solo-a drained and gone once solo-b joined", func() (bool, string) {
		if rg := e.group(t, "solo-a"); rg != nil {
			return false, fmt.Sprintf("solo-a phase=%s draining=%s", rg.Status.Phase, condStatus(rg.Status.Conditions, shardkvv1.ConditionDraining))
		}
		return true, "gone"
	})
	e.waitSettled(t, settle, solo, map[string]int{"solo-b": 1})
	e.checkEvents(t, "solo-a", "Leave", "Finalize")
	if err := e.kube.Get(ctx(t), client.ObjectKey{Namespace: e.ns, Name: "data-solo-a-0"}, &corev1.PersistentVolumeClaim{}); err != nil {
		t.Errorf("pvcRetention Retain: the volume of deleted group solo-a: %v", err)
	}
}

// recreateOnRetainedVolume: a ReplicaGroup created under the name of the
// deleted solo-a finds its retained volume, which holds solo-a's data and
// an identity naming its old group id. The operator starts no pod on it
// and says why; with spec.retainedVolumes: Wipe it deletes it, and the
// group starts on a fresh one.
func (e *env) recreateOnRetainedVolume(t *testing.T) {
	var old corev1.PersistentVolumeClaim
	if err := e.kube.Get(ctx(t), client.ObjectKey{Namespace: e.ns, Name: "data-solo-a-0"}, &old); err != nil {
		t.Fatalf("the retained volume: %v", err)
	}
	e.applyGroup(t, solo, "solo-a", 1, "", "64Mi")
	e.waitCondition(t, "solo-a", shardkvv1.ConditionProgressing, "False", "RetainedVolumes", "data-solo-a-0")
	e.checkEvents(t, "solo-a", "RetainedVolumes")
	// No pod is started on it, and the volume is untouched.
	time.Sleep(5 * time.Second)
	if err := e.kube.Get(ctx(t), client.ObjectKey{Namespace: e.ns, Name: "solo-a"}, &appsv1.StatefulSet{}); !apierrors.IsNotFound(err) {
		t.Errorf("solo-a's StatefulSet exists (%v): a pod would start on another group's data", err)
	}
	var still corev1.PersistentVolumeClaim
	if err := e.kube.Get(ctx(t), client.ObjectKey{Namespace: e.ns, Name: "data-solo-a-0"}, &still); err != nil || still.UID != old.UID {
		t.Errorf("the retained volume changed under Refuse: %v (uid %s, was %s)", err, still.UID, old.UID)
	}

	e.k(t, "patch", "replicagroup/solo-a", "--type=merge", "-p", `{"spec":{"retainedVolumes":"Wipe"}}`)
	e.waitSettled(t, settle, solo, map[string]int{"solo-a": 1, "solo-b": 1})
	var now corev1.PersistentVolumeClaim
	if err := e.kube.Get(ctx(t), client.ObjectKey{Namespace: e.ns, Name: "data-solo-a-0"}, &now); err != nil || now.UID == old.UID {
		t.Errorf("after Wipe: volume %v, uid %s (the retained one was %s)", err, now.UID, old.UID)
	}
	e.checkEvents(t, "solo-a", "DeletePVC", "Join")
}

// deleteDecidedByReports: a group whose shards were handed to another
// (stop-and-copy moves) and which then left the config behind the
// operator's back, with its status at Pending (a lost write after its
// Join), is deleted while its shards wait to be pulled (the group that
// takes them is down). The operator must wait for the group's own report
// to show it drained, not take the phase to mean "never joined" and delete
// it with the only copy of its data. Every key written before is read back
// at the end.
func (e *env) deleteDecidedByReports(t *testing.T) {
	e.fill(t, soloData, 1)
	a, b := e.group(t, "solo-a"), e.group(t, "solo-b")
	gid := a.Status.GroupID
	var shards []string
	m := e.shardMap(t, solo)
	for s := range int(m.Spec.Shards) {
		if tableOwner(m, s) == gid {
			shards = append(shards, fmt.Sprint(s))
		}
	}
	if len(shards) == 0 {
		t.Fatalf("solo-a holds no shards: %+v", m.Status.Table)
	}
	kv := func(args ...string) string {
		return e.k(t, e.kvctl(solo, 1, args...)...)
	}

	var claimB corev1.PersistentVolumeClaim
	if err := e.kube.Get(ctx(t), client.ObjectKey{Namespace: e.ns, Name: "data-solo-b-0"}, &claimB); err != nil {
		t.Fatalf("solo-b's volume: %v", err)
	}
	t.Log("stopping the operator, and solo-b (which would take solo-a's shards)")
	e.scaleOperator(t, 0)
	operatorUp := false
	defer func() {
		if !operatorUp {
			e.scaleOperator(t, 1)
		}
	}()
	e.k(t, "scale", "statefulset/solo-b", "--replicas=0")
	e.eventually(t, 2*time.Minute, "solo-b's pod gone", func() (bool, string) {
		return len(e.pods(t, "solo-b")) == 0, fmt.Sprintf("%d pods", len(e.pods(t, "solo-b")))
	})
	for _, s := range shards {
		kv("move", s, fmt.Sprint(b.Status.GroupID), "--stop-and-copy")
	}
	t.Logf("shards %v handed to solo-b (down); kvctl leave %d:\n%s", shards, gid, kv("leave", fmt.Sprint(gid)))
	e.k(t, "patch", "replicagroup/solo-a", "--subresource=status", "--type=merge", "-p", `{"status":{"phase":"Pending"}}`)
	e.k(t, "delete", "replicagroup/solo-a", "--wait=false")
	e.scaleOperator(t, 1)
	operatorUp = true

	e.waitCondition(t, "solo-a", shardkvv1.ConditionDraining, "True", "WaitingForDrain", "BePulling")
	// And it stays: nothing lets it go while solo-b is down.
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		rg := e.group(t, "solo-a")
		if rg == nil || len(e.pods(t, "solo-a")) != 1 {
			t.Fatalf("solo-a (or its pod) was deleted while its shards waited to be pulled")
		}
		time.Sleep(2 * time.Second)
	}

	// solo-b's StatefulSet shrunk by hand is not a scale-in: its volume
	// (pvcRetention: Delete) is still the group's data, and stays.
	var still corev1.PersistentVolumeClaim
	if err := e.kube.Get(ctx(t), client.ObjectKey{Namespace: e.ns, Name: "data-solo-b-0"}, &still); err != nil || still.UID != claimB.UID {
		t.Fatalf("solo-b's volume was deleted while its StatefulSet was scaled to 0 by hand: %v (uid %s, was %s)", err, still.UID, claimB.UID)
	}
	t.Log("solo-b back: it pulls the shards, and solo-a drains")
	e.k(t, "scale", "statefulset/solo-b", "--replicas=1")
	e.eventually(t, settle, "solo-a drained and gone", func() (bool, string) {
		if rg := e.group(t, "solo-a"); rg != nil {
			return false, fmt.Sprintf("draining=%s", condStatus(rg.Status.Conditions, shardkvv1.ConditionDraining))
		}
		return true, "gone"
	})
	e.waitSettled(t, settle, solo, map[string]int{"solo-b": 1})
	evs := e.events(t, "ReplicaGroup", "solo-a", e.scenarioStart)
	if !containsPrefix(evs, "Finalize\t"+fmt.Sprintf("group %d has handed off and deleted every shard", gid)) {
		t.Errorf("solo-a was not finalized as drained; events:\n%s", strings.Join(evs, "\n"))
	}
	e.verify(t, soloData)
}

// growStorageRefused: growing solo-b's volume where the StorageClass
// cannot expand (the local cluster's host-path class) is refused by the
// API server; the operator says so, changes nothing, and the group keeps
// serving. Back at the old size, the condition clears.
func (e *env) growStorageRefused(t *testing.T) {
	var before corev1.PersistentVolumeClaim
	if err := e.kube.Get(ctx(t), client.ObjectKey{Namespace: e.ns, Name: "data-solo-b-0"}, &before); err != nil {
		t.Fatalf("solo-b's volume: %v", err)
	}
	e.waitCondition(t, "solo-b", shardkvv1.ConditionStorageApplied, "True", "Applied", "all 1 volumes are 64Mi")
	e.k(t, "patch", "replicagroup/solo-b", "--type=merge", "-p", `{"spec":{"storage":{"size":"128Mi"}}}`)
	e.waitCondition(t, "solo-b", shardkvv1.ConditionStorageApplied, "False", "ResizeRefused",
		"growing volume data-solo-b-0 from 64Mi to 128Mi was refused by the API server")
	e.checkEvents(t, "solo-b", "ResizeRefused")
	var after corev1.PersistentVolumeClaim
	if err := e.kube.Get(ctx(t), client.ObjectKey{Namespace: e.ns, Name: "data-solo-b-0"}, &after); err != nil || after.UID != before.UID {
		t.Fatalf("solo-b's volume after the refusal: %v (uid %s, was %s)", err, after.UID, before.UID)
	}
	if got := after.Spec.Resources.Requests[corev1.ResourceStorage]; got.String() != "64Mi" {
		t.Errorf("solo-b's volume asks for %s after the refusal, want 64Mi", got.String())
	}
	e.waitSettled(t, settle, solo, map[string]int{"solo-b": 1})
	e.k(t, "patch", "replicagroup/solo-b", "--type=merge", "-p", `{"spec":{"storage":{"size":"64Mi"}}}`)
	e.waitCondition(t, "solo-b", shardkvv1.ConditionStorageApplied, "True", "Applied", "all 1 volumes are 64Mi")
}

// deleteShardMap: a deleted ShardMap stays, with its controller group,
// while a ReplicaGroup of it is not deleted, and says so; once its last
// group is deleted too, that group goes without a drain (the whole
// cluster's data goes), then the ShardMap and its controller group. The
// controller's volume stays.
func (e *env) deleteShardMap(t *testing.T) {
	e.k(t, "delete", "shardmap/"+solo, "--wait=false")
	var msg string
	e.eventually(t, time.Minute, "the ShardMap waits for solo-b", func() (bool, string) {
		m := e.shardMap(t, solo)
		if m == nil {
			return false, "the ShardMap is gone while solo-b is not deleted"
		}
		c := meta.FindStatusCondition(m.Status.Conditions, shardkvv1.ConditionProgressing)
		if c == nil {
			return false, "no Progressing condition"
		}
		msg = c.Message
		return c.Reason == "WaitingForReplicaGroups" && strings.Contains(c.Message, "ReplicaGroups solo-b are not"), c.Reason + ": " + c.Message
	})
	t.Logf("ShardMap %s: %s", solo, msg)
	e.waitCondition(t, "solo-b", shardkvv1.ConditionProgressing, "False", "ClusterDeleting", "the ShardMap is being deleted")
	// It stays, and so does its controller: solo-b still serves.
	time.Sleep(5 * time.Second)
	if m := e.shardMap(t, solo); m == nil {
		t.Fatal("the ShardMap went while solo-b is not deleted")
	}
	for _, p := range e.pods(t, "solo-ctrler") {
		if p.DeletionTimestamp != nil {
			t.Fatalf("controller pod %s is terminating while solo-b needs it", p.Name)
		}
	}
	if len(e.pods(t, "solo-ctrler")) == 0 {
		t.Fatal("no controller pod while solo-b needs it")
	}
	e.k(t, "get", "replicagroup/solo-b") // still there, readable
	evs := e.events(t, "ShardMap", solo, e.scenarioStart)
	if !containsPrefix(evs, "WaitingForReplicaGroups\t") {
		t.Errorf("no WaitingForReplicaGroups Event; events:\n%s", strings.Join(evs, "\n"))
	}

	e.k(t, "delete", "replicagroup/solo-b", "--wait=false")
	e.eventually(t, 2*time.Minute, "solo-b and the ShardMap gone", func() (bool, string) {
		var left []string
		if e.group(t, "solo-b") != nil {
			left = append(left, "replicagroup/solo-b")
		}
		if e.shardMap(t, solo) != nil {
			left = append(left, "shardmap/"+solo)
		}
		if err := e.kube.Get(ctx(t), client.ObjectKey{Namespace: e.ns, Name: "solo-ctrler"}, &appsv1.StatefulSet{}); !apierrors.IsNotFound(err) {
			left = append(left, "statefulset/solo-ctrler")
		}
		return len(left) == 0, "left: " + strings.Join(left, ",")
	})
	if evs := e.events(t, "ReplicaGroup", "solo-b", e.scenarioStart); !containsPrefix(evs, "Finalize\tthe ShardMap and all its ReplicaGroups are being deleted") {
		t.Errorf("solo-b was not finalized as the cluster's deletion; events:\n%s", strings.Join(evs, "\n"))
	}
	if err := e.kube.Get(ctx(t), client.ObjectKey{Namespace: e.ns, Name: "data-solo-ctrler-0"}, &corev1.PersistentVolumeClaim{}); err != nil {
		t.Errorf("the controller's volume: %v (it stays when the ShardMap goes)", err)
	}
}

// scaleOperator sets the operator's replicas and waits for that many
// manager pods to run (and none to linger).
func (e *env) scaleOperator(t *testing.T, n int) {
	t.Helper()
	e.kubectl(t, "-n", operatorNS, "scale", "deploy/"+operatorDeploy, fmt.Sprintf("--replicas=%d", n))
	if n > 0 {
		e.kubectl(t, "-n", operatorNS, "rollout", "status", "deploy/"+operatorDeploy, "--timeout=3m")
		return
	}
	e.eventually(t, 2*time.Minute, "operator stopped", func() (bool, string) {
		var pods corev1.PodList
		if err := e.kube.List(ctx(t), &pods, client.InNamespace(operatorNS), client.MatchingLabels{"app.kubernetes.io/component": "manager"}); err != nil {
			return false, err.Error()
		}
		return len(pods.Items) == 0, fmt.Sprintf("%d manager pods", len(pods.Items))
	})
}

func containsPrefix(list []string, prefix string) bool {
	for _, s := range list {
		if strings.HasPrefix(s, prefix) {
			return true
		}
	}
	return false
}

// waitCondition waits until ReplicaGroup name's condition typ has status
// and reason and a message that contains sub, and logs the message. The
// group gone fails it.
func (e *env) waitCondition(t *testing.T, name, typ, status, reason, sub string) {
	t.Helper()
	var msg string
	e.eventually(t, 2*time.Minute, fmt.Sprintf("%s: %s %s %s", name, typ, status, reason), func() (bool, string) {
		rg := e.group(t, name)
		if rg == nil {
			return false, name + " is gone"
		}
		c := meta.FindStatusCondition(rg.Status.Conditions, typ)
		if c == nil {
			return false, "no " + typ + " condition"
		}
		msg = c.Message
		return string(c.Status) == status && c.Reason == reason && strings.Contains(c.Message, sub),
			fmt.Sprintf("%s=%s %s: %s", typ, c.Status, c.Reason, c.Message)
	})
	t.Logf("%s %s: %s", typ, reason, msg)
}

// readinessIsRaftHealth: a pod that is not a member of its group is not
// Ready, so the group's PodDisruptionBudget does not count it. Here
// demo-a's StatefulSet is grown to 4 by hand while the ShardMap is paused:
// demo-a-3 starts on the volume ScaleGroup's scale-in left (a removed
// replica) and is never added. Counted as available (readiness as "the
// process answers"), it would let the budget (2 of 3 voters) allow two
// evictions among the three voters: a lost quorum.
func (e *env) readinessIsRaftHealth(t *testing.T) {
	const g = "demo-a"
	e.k(t, "patch", "shardmap/"+sm, "--type=merge", "-p", `{"spec":{"paused":true}}`)
	paused := true
	defer func() {
		if paused {
			e.k(t, "patch", "shardmap/"+sm, "--type=merge", "-p", `{"spec":{"paused":false}}`)
		}
	}()
	e.k(t, "scale", "statefulset/"+g, "--replicas=4")
	pod := g + "-3"
	e.eventually(t, 2*time.Minute, pod+" running", func() (bool, string) {
		var p corev1.Pod
		if err := e.kube.Get(ctx(t), client.ObjectKey{Namespace: e.ns, Name: pod}, &p); err != nil {
			return false, err.Error()
		}
		for _, c := range p.Status.ContainerStatuses {
			if c.Started != nil && *c.Started && c.State.Running != nil {
				return true, "running"
			}
		}
		return false, string(p.Status.Phase)
	})
	// What the removed replica answers for a key changed since its
	// removal: never its old value (nor none); an error or a redirect.
	if e.staleKey != "" {
		// Until the replica answers (its port may not be open yet).
		var v string
		var err error
		e.eventually(t, time.Minute, pod+" answers GET "+e.staleKey, func() (bool, string) {
			v, err = e.redisGet(t, pod, controllers.RESPPort, e.staleKey)
			var re redis.Error
			return err == nil || errors.As(err, &re), fmt.Sprintf("%q %v", v, err)
		})
		t.Logf("GET %s through %s (removed replica): %q, %v", e.staleKey, pod, v, err)
		if err == nil || errors.Is(err, redis.Nil) {
			t.Errorf("%s, a removed replica, answered GET %s with %q (%v): the key is %q since its removal", pod, e.staleKey, v, err, "new")
		}
		leader := e.group(t, g).Status.Leader
		if v, err := e.redisGet(t, leader, controllers.RESPPort, e.staleKey); err != nil || v != "new" {
			t.Errorf("GET %s through the leader %s: %q, %v; want \"new\"", e.staleKey, leader, v, err)
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		var p corev1.Pod
		if err := e.kube.Get(ctx(t), client.ObjectKey{Namespace: e.ns, Name: pod}, &p); err != nil {
			t.Fatalf("%s: %v", pod, err)
		}
		if podReady(p) {
			t.Fatalf("%s is Ready, but it is not a member of %s", pod, g)
		}
		var pdb policyv1.PodDisruptionBudget
		if err := e.kube.Get(ctx(t), client.ObjectKey{Namespace: e.ns, Name: g}, &pdb); err != nil {
			t.Fatalf("pdb %s: %v", g, err)
		}
		if pdb.Status.CurrentHealthy != 3 || pdb.Status.DisruptionsAllowed != 1 {
			t.Fatalf("pdb %s: %d healthy, %d disruptions allowed; want 3 and 1 (the three voters, one may go)",
				g, pdb.Status.CurrentHealthy, pdb.Status.DisruptionsAllowed)
		}
		time.Sleep(2 * time.Second)
	}
	// What the kubelet's last failed probe got: /readyz's reason.
	last := ""
	for _, ev := range e.events(t, "Pod", pod, e.scenarioStart) {
		if strings.HasPrefix(ev, "Unhealthy\t") {
			last = ev
		}
	}
	t.Logf("%s: %s", pod, last)
	e.k(t, "scale", "statefulset/"+g, "--replicas=3")
	e.k(t, "patch", "shardmap/"+sm, "--type=merge", "-p", `{"spec":{"paused":false}}`)
	paused = false
	e.waitSettled(t, settle, sm, map[string]int{"demo-a": 3, "demo-b": 3, "demo-c": 3})
	e.checkMembersMatchPods(t, g)
	e.workloadsProgress(t)
}

// specMoves: a shard pinned to a group by the ShardMap's spec.moves moves
// there (Moved); dropping the pin releases it to placement (Unpinned), and
// the cluster is balanced again.
func (e *env) specMoves(t *testing.T) {
	from, to := e.group(t, "demo-a").Status.GroupID, e.group(t, "demo-b").Status.GroupID
	m0 := e.shardMap(t, sm)
	shard := -1
	for s := range int(m0.Spec.Shards) {
		if tableOwner(m0, s) == from {
			shard = s
			break
		}
	}
	if shard < 0 {
		t.Fatalf("demo-a holds no shard: %+v", m0.Status.Table)
	}
	e.k(t, "patch", "shardmap/"+sm, "--type=merge", "-p", fmt.Sprintf(`{"spec":{"moves":[{"shard":%d,"group":"demo-b"}]}}`, shard))
	e.eventually(t, settle, fmt.Sprintf("shard %d pinned to demo-b", shard), func() (bool, string) {
		m := e.shardMap(t, sm)
		return tableOwner(m, shard) == to && m.Status.MigratingShards == 0,
			fmt.Sprintf("owner %d, migrating %d", tableOwner(m, shard), m.Status.MigratingShards)
	})
	e.k(t, "patch", "shardmap/"+sm, "--type=merge", "-p", `{"spec":{"moves":null}}`)
	e.waitSettled(t, settle, sm, map[string]int{"demo-a": 3, "demo-b": 3, "demo-c": 3, "demo-d": 3})
	evs := e.events(t, "ShardMap", sm, e.scenarioStart)
	if !containsPrefix(evs, fmt.Sprintf("Moved\tpinned shard %d to demo-b", shard)) || !containsPrefix(evs, fmt.Sprintf("Unpinned\tunpinned shard %d", shard)) {
		t.Errorf("want Moved and Unpinned Events for shard %d; events:\n%s", shard, strings.Join(evs, "\n"))
	}
	e.workloadsProgress(t)
}

// evictionKeepsQuorum: a node drain evicts through the Eviction API, which
// the groups' PodDisruptionBudgets guard. With one of demo-a's three
// voters evicted, a second eviction is refused until the first is back
// and caught up (ready is Raft health): a drain never takes a quorum.
func (e *env) evictionKeepsQuorum(t *testing.T) {
	const g = "demo-a"
	pods := e.pods(t, g)
	if len(pods) != 3 {
		t.Fatalf("%s has %d pods", g, len(pods))
	}
	evict := func(p corev1.Pod) error {
		return e.kube.SubResource("eviction").Create(ctx(t), &p,
			&policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace}})
	}
	if err := evict(pods[1]); err != nil {
		t.Fatalf("first eviction (%s): %v", pods[1].Name, err)
	}
	t.Logf("evicted %s", pods[1].Name)
	err := evict(pods[2])
	if !apierrors.IsTooManyRequests(err) {
		t.Fatalf("second eviction (%s) while %s is away: %v, want 429 (the budget allows no more)", pods[2].Name, pods[1].Name, err)
	}
	t.Logf("second eviction refused: %v", err)
	e.eventually(t, 2*time.Minute, pods[1].Name+" back and ready", func() (bool, string) {
		for _, p := range e.pods(t, g) {
			if p.Name == pods[1].Name {
				return p.UID != pods[1].UID && podReady(p), fmt.Sprintf("uid %s ready %v", p.UID, podReady(p))
			}
		}
		return false, "absent"
	})
	// The budget's controller counts the new pod, then allows one again.
	e.eventually(t, time.Minute, "the second eviction allowed", func() (bool, string) {
		err := evict(pods[2])
		return err == nil, fmt.Sprint(err)
	})
	e.waitSettled(t, settle, sm, map[string]int{"demo-a": 3, "demo-b": 3, "demo-c": 3, "demo-d": 3})
	e.checkMembersMatchPods(t, g)
	e.workloadsProgress(t)
}

// memberAt is the id of group g's member on pod, failing if none.
func (e *env) memberAt(t *testing.T, g, pod string) int64 {
	t.Helper()
	for _, m := range e.group(t, g).Status.Members {
		if m.Pod == pod {
			return m.ID
		}
	}
	t.Fatalf("%s: no member on pod %s", g, pod)
	return 0
}

// scaleOutOnRetainedVolume: group g, back at 3 after a scale-in that kept
// its removed replicas' volumes (pvcRetention: Retain), scales out to 4
// again. Pod g-3 starts on the volume of replica removed (removed from
// the group: ids are never reused), which holds the data of the time it
// was removed. The operator must not let that replica serve: it deletes
// the claim and the pod (RecreateReplica, reason StaleReplica, docs/
// operator.md), the pod comes back on an empty volume under a fresh id
// and joins (AddLearner, Promote). The pod is never Ready on the old
// volume. Then back to 3.
func (e *env) scaleOutOnRetainedVolume(t *testing.T, g string, removed int64, groups map[string]int) {
	pod, claim := g+"-3", "data-"+g+"-3"
	var old, other corev1.PersistentVolumeClaim
	if err := e.kube.Get(ctx(t), keyOf(e.ns, claim), &old); err != nil {
		t.Fatalf("retained volume %s: %v", claim, err)
	}
	if err := e.kube.Get(ctx(t), keyOf(e.ns, "data-"+g+"-4"), &other); err != nil {
		t.Fatalf("retained volume data-%s-4: %v", g, err)
	}
	t0 := time.Now()
	out := map[string]int{}
	for k, v := range groups {
		out[k] = v
	}
	out[g] = 4
	e.k(t, "scale", "replicagroup/"+g, "--replicas=4")
	// Settled at 4, watching that the pod is never Ready on the old volume.
	var readyOnOld []string
	e.eventually(t, settle, g+" settled at 4 on "+pod, func() (bool, string) {
		var p corev1.Pod
		var c corev1.PersistentVolumeClaim
		if e.kube.Get(ctx(t), keyOf(e.ns, pod), &p) == nil && e.kube.Get(ctx(t), keyOf(e.ns, claim), &c) == nil &&
			c.UID == old.UID && podReady(p) {
			readyOnOld = append(readyOnOld, fmt.Sprintf("%s (uid %s) Ready at %s", pod, p.UID, time.Now().Format(time.TimeOnly)))
		}
		ok, st := rgSettled(e.group(t, g), 4)
		return ok, fmt.Sprintf("%s: %s; claim uid %s (retained %s)", g, st, c.UID, old.UID)
	})
	e.waitSettled(t, settle, sm, out)
	t.Logf("%s: settled at 4 after %v", g, time.Since(t0).Round(time.Second))
	if len(readyOnOld) > 0 {
		t.Errorf("%s was Ready on the volume of removed replica %d: %v", pod, removed, readyOnOld)
	}
	var now corev1.PersistentVolumeClaim
	if err := e.kube.Get(ctx(t), keyOf(e.ns, claim), &now); err != nil || now.UID == old.UID {
		t.Errorf("%s: %v, uid %s: want a fresh claim, not the retained one (uid %s) of removed replica %d", claim, err, now.UID, old.UID, removed)
	}
	if id := e.memberAt(t, g, pod); id == removed {
		t.Errorf("%s is member %d again: the removed replica's id", pod, id)
	}
	evs := e.events(t, "ReplicaGroup", g, t0)
	for _, want := range []string{
		fmt.Sprintf("RecreateReplica\tpod %s runs replica %d, which was removed from the group", pod, removed),
		"AddLearner\t", "Promote\t",
	} {
		if !containsPrefix(evs, want) {
			t.Errorf("%s: no Event %q among:\n%s", g, want, strings.Join(evs, "\n"))
		}
	}
	e.checkMembersMatchPods(t, g)
	e.workloadsProgress(t)

	// A key written while the replica on g-3 is a voter, then changed once
	// it is removed: ReadinessIsRaftHealth reads it through that replica.
	// (A follower answers a read with MOVED to the leader, so what the
	// replica has applied cannot be read through it here.)
	key := e.keyOfGroup(t, sm, e.group(t, g).Status.GroupID, "e2e-stale:")
	e.k(t, e.kvctl(sm, 3, "put", key, "old")...)
	v, err := e.redisGet(t, pod, controllers.RESPPort, key)
	t.Logf("GET %s through %s (a follower): %q, %v", key, pod, v, err)
	e.k(t, "scale", "replicagroup/"+g, "--replicas=3")
	e.waitSettled(t, settle, sm, groups)
	e.checkMembersMatchPods(t, g)
	e.k(t, e.kvctl(sm, 3, "put", key, "new")...)
	e.staleKey = key
	// The other retained volume was left alone throughout.
	var still corev1.PersistentVolumeClaim
	if err := e.kube.Get(ctx(t), keyOf(e.ns, other.Name), &still); err != nil || still.UID != other.UID {
		t.Errorf("%s: %v, uid %s (was %s): a volume beyond the StatefulSet changed", other.Name, err, still.UID, other.UID)
	}
	t.Logf("%s: scale-out on a retained volume and back to 3 in %v", g, time.Since(t0).Round(time.Second))
}
