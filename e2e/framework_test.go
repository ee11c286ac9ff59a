//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
	"github.com/shardkv/shardkv/controllers"
)

// The operator's deployment, as config/default names it.
const (
	operatorNS     = "shardkv-system"
	operatorDeploy = "shardkv-controller-manager"
)

// env is one run's view of the cluster under test.
type env struct {
	root       string // repository root
	kubeconfig string
	ns         string // the namespace the scenarios run in
	image      string // the image the operator runs and deploys (config/manager)
	image2     string // a second tag of the same binaries, for the rolling update
	kube       client.WithWatch
	cs         kubernetes.Interface
	// scenarioStart is when the running scenario began: checkEvents
	// looks at the Events since then only.
	scenarioStart time.Time
	// fills are the data sets written so far (fill); ReadBack checks them.
	fills []dataSet
	// staleKey is a key of demo-a whose value is "old" on the volume of
	// the replica ScaleGroup removed last (demo-a-3's) and "new" in the
	// group: ReadinessIsRaftHealth reads it through that replica.
	staleKey string
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func newEnv(t *testing.T) *env {
	t.Helper()
	kc := os.Getenv("KUBECONFIG")
	if kc == "" {
		t.Fatal("KUBECONFIG is not set: the e2e tests need a cluster (hack/local-cluster.sh up prints the export line)")
	}
	_, file, _, _ := runtime.Caller(0)
	e := &env{
		root:       filepath.Dir(filepath.Dir(file)),
		kubeconfig: kc,
		ns:         envOr("SHARDKV_E2E_NAMESPACE", "shardkv-e2e"),
		image:      envOr("SHARDKV_E2E_IMAGE", "shardkv:dev"),
		image2:     envOr("SHARDKV_E2E_IMAGE2", "shardkv:dev2"),
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kc)
	if err != nil {
		t.Fatalf("kubeconfig %s: %v", kc, err)
	}
	cfg.QPS, cfg.Burst = 50, 100
	scheme := k8sruntime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := shardkvv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if e.kube, err = client.NewWithWatch(cfg, client.Options{Scheme: scheme}); err != nil {
		t.Fatalf("client: %v", err)
	}
	if e.cs, err = kubernetes.NewForConfig(cfg); err != nil {
		t.Fatalf("clientset: %v", err)
	}
	return e
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return c
}

// kubectl runs kubectl (in the repo root, so -k paths work) and returns its
// stdout; a failure fails the test with stderr.
func (e *env) kubectl(t *testing.T, args ...string) string {
	t.Helper()
	out, err := e.kubectlErr(args...)
	if err != nil {
		t.Fatalf("kubectl %s: %v", strings.Join(args, " "), err)
	}
	return out
}

func (e *env) kubectlErr(args ...string) (string, error) {
	c, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(c, envOr("KUBECTL", "kubectl"), args...)
	cmd.Dir = e.root
	cmd.Env = append(os.Environ(), "KUBECONFIG="+e.kubeconfig)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%w: %s", err, strings.TrimSpace(filterSkew(stderr.String())))
	}
	return stdout.String(), nil
}

// filterSkew drops kubectl's client/server version-skew warning.
func filterSkew(s string) string {
	var keep []string
	for _, l := range strings.Split(s, "\n") {
		if !strings.Contains(l, "version difference") && !strings.Contains(l, "exceeds the supported minor version skew") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}

// k runs kubectl in the scenario namespace.
func (e *env) k(t *testing.T, args ...string) string {
	t.Helper()
	return e.kubectl(t, append([]string{"-n", e.ns}, args...)...)
}

// eventually polls f every interval until it reports done, logging each new
// state, and fails the test with the last state (and a dump of the cluster)
// after timeout.
func (e *env) eventually(t *testing.T, timeout time.Duration, what string, f func() (bool, string)) time.Duration {
	t.Helper()
	start := time.Now()
	last := ""
	for {
		done, state := f()
		if state != last {
			t.Logf("[%5.1fs] %s: %s", time.Since(start).Seconds(), what, state)
			last = state
		}
		if done {
			return time.Since(start)
		}
		if time.Since(start) > timeout {
			e.dump(t)
			t.Fatalf("%s: not done after %v; last state: %s", what, timeout, state)
		}
		time.Sleep(2 * time.Second)
	}
}

// dump logs what a person debugging a failure looks at first.
func (e *env) dump(t *testing.T) {
	t.Helper()
	for _, args := range [][]string{
		{"get", "shardmaps,replicagroups,statefulsets,pods,pvc", "-o", "wide"},
		{"get", "events", "--sort-by=.lastTimestamp"},
	} {
		out, err := e.kubectlErr(append([]string{"-n", e.ns}, args...)...)
		t.Logf("--- kubectl %s (err=%v)\n%s", strings.Join(args, " "), err, tail(out, 60))
	}
	for _, kind := range []string{"shardmaps", "replicagroups"} {
		out, _ := e.kubectlErr("-n", e.ns, "get", kind, "-o", "yaml")
		t.Logf("--- %s\n%s", kind, tail(out, 200))
	}
	out, _ := e.kubectlErr("-n", operatorNS, "logs", "deploy/"+operatorDeploy, "--tail=80")
	t.Logf("--- operator log\n%s", out)
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = append([]string{fmt.Sprintf("... (%d lines cut)", len(lines)-n)}, lines[len(lines)-n:]...)
	}
	return strings.Join(lines, "\n")
}

// shardMap returns the ShardMap, or nil if it does not exist.
func (e *env) shardMap(t *testing.T, name string) *shardkvv1.ShardMap {
	t.Helper()
	sm := &shardkvv1.ShardMap{}
	if err := e.kube.Get(ctx(t), client.ObjectKey{Namespace: e.ns, Name: name}, sm); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		t.Fatalf("get shardmap %s: %v", name, err)
	}
	return sm
}

// group returns the ReplicaGroup, or nil if it does not exist.
func (e *env) group(t *testing.T, name string) *shardkvv1.ReplicaGroup {
	t.Helper()
	rg := &shardkvv1.ReplicaGroup{}
	if err := e.kube.Get(ctx(t), client.ObjectKey{Namespace: e.ns, Name: name}, rg); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		t.Fatalf("get replicagroup %s: %v", name, err)
	}
	return rg
}

func condStatus(conds []metav1.Condition, typ string) string {
	c := meta.FindStatusCondition(conds, typ)
	if c == nil {
		return "?"
	}
	return fmt.Sprintf("%s(%s)", c.Status, c.Reason)
}

func condTrue(conds []metav1.Condition, typ string) bool {
	return meta.IsStatusConditionTrue(conds, typ)
}

// smSettled: the ShardMap is Ready and Balanced, with groups data groups,
// every shard Serving and nothing migrating.
func smSettled(sm *shardkvv1.ShardMap, groups int) (bool, string) {
	st := sm.Status
	state := fmt.Sprintf("config=%d groups=%d states=%v migrating=%d ready=%s balanced=%s observedGen=%d/%d",
		st.ConfigNum, st.GroupCount, st.ShardStates, st.MigratingShards,
		condStatus(st.Conditions, shardkvv1.ConditionReady), condStatus(st.Conditions, shardkvv1.ConditionBalanced),
		st.ObservedGeneration, sm.Generation)
	ok := condTrue(st.Conditions, shardkvv1.ConditionReady) && condTrue(st.Conditions, shardkvv1.ConditionBalanced) &&
		int(st.GroupCount) == groups && st.MigratingShards == 0 &&
		len(st.ShardStates) == 1 && st.ShardStates["Serving"] == sm.Spec.Shards &&
		st.ObservedGeneration == sm.Generation
	return ok, state
}

// rgSettled: the group is Serving with exactly n healthy voters, one of
// them the leader, and its pods all Ready.
func rgSettled(rg *shardkvv1.ReplicaGroup, n int) (bool, string) {
	if rg == nil {
		return false, "absent"
	}
	st := rg.Status
	roles := map[string]int{}
	healthy := 0
	for _, m := range st.Members {
		roles[m.Role]++
		if m.Healthy {
			healthy++
		}
	}
	state := fmt.Sprintf("phase=%s replicas=%d ready=%d members=%d roles=%v healthy=%d leader=%s shards=%d progressing=%s observedGen=%d/%d",
		st.Phase, st.Replicas, st.ReadyReplicas, len(st.Members), roles, healthy, st.Leader, st.Shards.Count,
		condStatus(st.Conditions, shardkvv1.ConditionProgressing), st.ObservedGeneration, rg.Generation)
	if c := meta.FindStatusCondition(st.Conditions, shardkvv1.ConditionProgressing); c != nil && c.Status == metav1.ConditionTrue {
		state += " (" + c.Message + ")"
	}
	ok := st.Phase == "Serving" && int(st.Replicas) == n && int(st.ReadyReplicas) == n && len(st.Members) == n &&
		healthy == n && roles["leader"] == 1 && roles["follower"] == n-1 && st.Leader != "" &&
		condTrue(st.Conditions, shardkvv1.ConditionReady) && st.ObservedGeneration == rg.Generation
	return ok, state
}

// waitSettled waits for the ShardMap and the named groups (name -> replicas).
func (e *env) waitSettled(t *testing.T, timeout time.Duration, sm string, groups map[string]int) {
	t.Helper()
	names := make([]string, 0, len(groups))
	for g := range groups {
		names = append(names, g)
	}
	slices.Sort(names)
	e.eventually(t, timeout, "cluster settled", func() (bool, string) {
		okAll, states := true, []string{}
		for _, g := range names {
			ok, s := rgSettled(e.group(t, g), groups[g])
			okAll = okAll && ok
			if !ok {
				states = append(states, g+": "+s)
			}
		}
		ok, s := smSettled(e.shardMap(t, sm), len(groups))
		okAll = okAll && ok
		if !ok {
			states = append(states, sm+": "+s)
		}
		if okAll {
			return true, "all settled"
		}
		return false, strings.Join(states, "; ")
	})
}

// pods returns the pods of a StatefulSet by ordinal order.
func (e *env) pods(t *testing.T, set string) []corev1.Pod {
	t.Helper()
	var list corev1.PodList
	if err := e.kube.List(ctx(t), &list, client.InNamespace(e.ns)); err != nil {
		t.Fatalf("list pods: %v", err)
	}
	var out []corev1.Pod
	for _, p := range list.Items {
		if strings.HasPrefix(p.Name, set+"-") && p.Labels["apps.kubernetes.io/pod-index"] != "" {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b corev1.Pod) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// ctrlerAddrs is the --ctrler list for clients inside the cluster.
func (e *env) ctrlerAddrs(sm string, n int) string {
	return strings.Join(controllers.CtrlerAddrs(sm, n, e.ns), ",")
}

// kvctlStatus runs `kvctl status --json` inside a controller pod (the
// first that answers: one may be restarting).
func (e *env) kvctlStatus(t *testing.T, sm string) kvctlStatusJSON {
	t.Helper()
	var errs []string
	for i := range 3 {
		pod := fmt.Sprintf("%s-%d", controllers.CtrlerName(sm), i)
		out, err := e.kubectlErr("-n", e.ns, "exec", pod, "-c", "node", "--",
			"/kvctl", "--ctrler="+e.ctrlerAddrs(sm, 3), "--json", "status")
		if err != nil {
			errs = append(errs, pod+": "+err.Error())
			continue
		}
		var st kvctlStatusJSON
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			t.Fatalf("kvctl status --json: %v\n%s", err, out)
		}
		return st
	}
	t.Fatalf("kvctl status: %s", strings.Join(errs, "; "))
	return kvctlStatusJSON{}
}

// kvctlStatusJSON is the part of `kvctl status --json` the tests read.
type kvctlStatusJSON struct {
	NShards    int    `json:"nshards"`
	ConfigNum  uint64 `json:"config_num"`
	Settled    bool   `json:"settled"`
	Controller struct {
		Leader     uint64 `json:"leader"`
		LeaderAddr string `json:"leader_addr"`
		Term       uint64 `json:"term"`
		Members    []struct {
			ID        uint64 `json:"id"`
			Addr      string `json:"addr"`
			Role      string `json:"role"`
			Learner   bool   `json:"learner"`
			Reachable bool   `json:"reachable"`
		} `json:"members"`
	} `json:"controller"`
	Groups []struct {
		GID         uint64 `json:"gid"`
		InConfig    bool   `json:"in_config"`
		OwnedShards int    `json:"owned_shards"`
	} `json:"groups"`
}

// podOfAddr maps "demo-ctrler-1.demo-ctrler.ns.svc:7000" to "demo-ctrler-1".
func podOfAddr(addr string) string {
	host, _, _ := strings.Cut(addr, ":")
	pod, _, _ := strings.Cut(host, ".")
	return pod
}

// events returns the reasons and messages ("Reason\tmessage") of the
// Events about an object last seen at or after since, oldest first.
// Events' times have a resolution of one second.
func (e *env) events(t *testing.T, kind, name string, since time.Time) []string {
	t.Helper()
	var list corev1.EventList
	if err := e.kube.List(ctx(t), &list, client.InNamespace(e.ns)); err != nil {
		t.Fatalf("list events: %v", err)
	}
	cut := since.Truncate(time.Second)
	var evs []corev1.Event
	for _, ev := range list.Items {
		if ev.InvolvedObject.Kind == kind && ev.InvolvedObject.Name == name && !lastSeen(ev).Before(cut) {
			evs = append(evs, ev)
		}
	}
	slices.SortStableFunc(evs, func(a, b corev1.Event) int { return a.CreationTimestamp.Compare(b.CreationTimestamp.Time) })
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i] = ev.Reason + "\t" + ev.Message
	}
	return out
}

// lastSeen is when an Event (or the last of its series) happened.
func lastSeen(ev corev1.Event) time.Time {
	at := ev.CreationTimestamp.Time
	for _, t := range []time.Time{ev.LastTimestamp.Time, ev.EventTime.Time} {
		if t.After(at) {
			at = t
		}
	}
	if ev.Series != nil && ev.Series.LastObservedTime.After(at) {
		at = ev.Series.LastObservedTime.Time
	}
	return at
}

// watchMigrations records every migration the ShardMap's status lists, as
// the operator writes it (a watch sees each write; polling could miss a
// short migration). The returned func stops it and returns what it saw.
func (e *env) watchMigrations(t *testing.T, name string) func() []string {
	t.Helper()
	return watchStatus(t, e, &shardkvv1.ShardMapList{}, name, func(s *shardkvv1.ShardMap) []string {
		var seen []string
		for _, m := range s.Status.Migrations {
			seen = append(seen, fmt.Sprintf("config %d: %s->%s shards=%d phase=%s/%s keys=%d/%d progress=%q",
				s.Status.ConfigNum, m.Source, m.Target, m.Shards, m.Phase, m.CopyPhase, m.Keys, m.TotalKeys, m.Progress))
		}
		return seen
	})
}

// watchGroup records each write of a ReplicaGroup's phase and Draining
// condition ("phase=Draining draining=WaitingForDrain").
func (e *env) watchGroup(t *testing.T, name string) func() []string {
	t.Helper()
	return watchStatus(t, e, &shardkvv1.ReplicaGroupList{}, name, func(rg *shardkvv1.ReplicaGroup) []string {
		d := ""
		if c := meta.FindStatusCondition(rg.Status.Conditions, shardkvv1.ConditionDraining); c != nil {
			d = c.Reason
		}
		return []string{fmt.Sprintf("phase=%s draining=%s", rg.Status.Phase, d)}
	})
}

// watchStatus watches the objects of list's kind in the namespace and
// records what f makes of each write of the one called name. The returned
// func stops it and returns what it saw, repeats dropped.
func watchStatus[T client.Object](t *testing.T, e *env, list client.ObjectList, name string, f func(T) []string) func() []string {
	t.Helper()
	c, cancel := context.WithCancel(context.Background())
	w, err := e.kube.Watch(c, list, client.InNamespace(e.ns))
	if err != nil {
		cancel()
		t.Fatalf("watch: %v", err)
	}
	done := make(chan []string)
	go func() {
		var seen []string
		for ev := range w.ResultChan() {
			if o, ok := ev.Object.(T); ok && o.GetName() == name {
				seen = append(seen, f(o)...)
			}
		}
		done <- slices.Compact(seen)
	}()
	return func() []string {
		w.Stop()
		cancel()
		return <-done
	}
}
