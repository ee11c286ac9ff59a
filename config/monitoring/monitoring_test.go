package monitoring

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/promql/parser"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
	"sigs.k8s.io/yaml"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
	"github.com/shardkv/shardkv/controllers"
	"github.com/shardkv/shardkv/pkg/ctrler/ctrlerclient"
	"github.com/shardkv/shardkv/pkg/node"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// builtin are series Prometheus makes itself, not an exporter.
var builtin = []string{"up"}

// rules are the alert expressions of prometheusrule.yaml; every alert
// must have a severity and say what to do.
func rules(t *testing.T) []Query {
	t.Helper()
	f, err := Rules()
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range f.Spec.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				t.Errorf("group %s: a rule without an alert name", g.Name)
			}
			if r.Labels["severity"] == "" || r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("alert %s: needs a severity label and summary and description annotations", r.Alert)
			}
			if r.For != "" {
				if _, err := model.ParseDuration(r.For); err != nil {
					t.Errorf("alert %s: for %q: %v", r.Alert, r.For, err)
				}
			}
		}
	}
	out := f.Alerts()
	if len(out) < 4 {
		t.Fatalf("prometheusrule.yaml: only %d alerts", len(out))
	}
	return out
}

// dashboard are the panel and variable queries of grafana/shardkv.json.
func dashboard(t *testing.T) []Query {
	t.Helper()
	out, err := Dashboard()
	if err != nil {
		t.Fatal(err)
	}
	if len(out) < 10 {
		t.Fatalf("grafana/shardkv.json: only %d queries", len(out))
	}
	return out
}

// metricNames parses each query and returns the metric names it selects,
// with the queries that use each.
func metricNames(t *testing.T, qs []Query) map[string][]string {
	t.Helper()
	p := parser.NewParser(parser.Options{})
	out := map[string][]string{}
	for _, q := range qs {
		e, err := p.ParseExpr(q.Expr)
		if err != nil {
			t.Errorf("%s: %v\n%s", q.Where, err, q.Expr)
			continue
		}
		parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
			vs, ok := n.(*parser.VectorSelector)
			if !ok {
				return nil
			}
			name := vs.Name
			for _, m := range vs.LabelMatchers {
				if m.Name == model.MetricNameLabel {
					name = m.Value
				}
			}
			if name == "" {
				t.Errorf("%s: a selector without a metric name: %s", q.Where, vs)
				return nil
			}
			if !slices.Contains(out[name], q.Where) {
				out[name] = append(out[name], q.Where)
			}
			return nil
		})
	}
	return out
}

// exported are metric families by name, with their type.
type exported map[string]model.MetricType

// has reports whether series name is served: a family of that name, or a
// histogram's or summary's _bucket, _sum or _count.
func (ex exported) has(name string) bool {
	if _, ok := ex[name]; ok {
		return true
	}
	for _, suf := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suf)
		if !ok {
			continue
		}
		switch ex[base] {
		case model.MetricTypeHistogram:
			return true
		case model.MetricTypeSummary:
			return suf != "_bucket"
		}
	}
	return false
}

func freeAddrs(t *testing.T, n int) []string {
	t.Helper()
	var out []string
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		out = append(out, l.Addr().String())
	}
	return out
}

func startNode(t *testing.T, args ...string) *node.Node {
	t.Helper()
	o, err := node.ParseServe(append([]string{"--data-dir=" + t.TempDir(), "--log-level=warn"}, args...), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	n, err := node.Start(context.Background(), o, node.NewLogger("warn", os.Stderr))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Shutdown)
	return n
}

func scrape(t *testing.T, addr string) exported {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	out := exported{}
	for name, f := range fams {
		out[name] = model.MetricType(strings.ToLower(f.GetType().String()))
	}
	return out
}

// nodeMetrics starts a controller replica and a data-group replica in this
// process, joins the group (so it serves shards and gRPC calls were made),
// and scrapes both.
func nodeMetrics(t *testing.T) exported {
	t.Helper()
	a := freeAddrs(t, 5) // ctrler gRPC, HTTP; group gRPC, HTTP, Redis
	startNode(t, "--role=ctrler", "--id=1", "--listen="+a[0], "--peers=1="+a[0], "--http="+a[1], "--shards=16")
	startNode(t, "--role=group", "--group=1", "--id=1", "--listen="+a[2], "--peers=1="+a[2], "--http="+a[3],
		"--ctrler="+a[0], "--resp="+a[4])
	cc, err := ctrlerclient.New([]string{a[0]})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := cc.Join(ctx, &shardkvpb.Group{Gid: 1, Servers: []*shardkvpb.Server{{Id: 1, Addr: a[2]}}}); err != nil {
		t.Fatal(err)
	}
	for {
		ex := scrape(t, a[3])
		for k, v := range scrape(t, a[1]) {
			ex[k] = v
		}
		if ex.has("shardkv_raft_voters_reachable") && ex.has("shardkv_grpc_request_duration_seconds") {
			return ex
		}
		if ctx.Err() != nil {
			t.Fatalf("the group did not come up: %v", ex)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// operatorMetrics are what the manager's registry serves: controller-runtime's
// controller and work-queue metrics (a controller named like ours, started
// and run once) and StatusCollector's gauges over a ShardMap and a
// ReplicaGroup with a full status.
func operatorMetrics(t *testing.T) exported {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ran := make(chan struct{}, 1)
	c, err := controller.NewUnmanaged("shardmap", controller.Options{Reconciler: reconcile.Func(func(context.Context, reconcile.Request) (reconcile.Result, error) {
		select {
		case ran <- struct{}{}:
		default:
		}
		return reconcile.Result{}, nil
	})})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Watch(source.Func(func(_ context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
		q.Add(reconcile.Request{})
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	go c.Start(ctx)
	select {
	case <-ran:
	case <-time.After(30 * time.Second):
		t.Fatal("the controller did not reconcile")
	}
	time.Sleep(100 * time.Millisecond) // its metrics are updated after Reconcile returns

	s := runtime.NewScheme()
	if err := shardkvv1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	sm := &shardkvv1.ShardMap{ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "demo"},
		Status: shardkvv1.ShardMapStatus{ConfigNum: 3, GroupCount: 1, MigratingShards: 1, ControllerReadyReplicas: 3,
			ShardStates: map[string]int32{"Serving": 15, "Pulling": 1},
			Conditions:  []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue, Reason: "Serving", LastTransitionTime: metav1.Now()}}}}
	rg := &shardkvv1.ReplicaGroup{ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "demo-a"},
		Spec: shardkvv1.ReplicaGroupSpec{ShardMap: "demo", Replicas: ptr.To[int32](3)},
		Status: shardkvv1.ReplicaGroupStatus{Phase: "Serving", Replicas: 3, ReadyReplicas: 3, Shards: shardkvv1.ShardSummary{Count: 16},
			Members:    []shardkvv1.Member{{ID: 1, Role: "leader", Healthy: true}},
			Conditions: []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue, Reason: "Serving", LastTransitionTime: metav1.Now()}}}}
	reg := prometheus.NewRegistry()
	reg.MustRegister(controllers.StatusCollector{Reader: fake.NewClientBuilder().WithScheme(s).WithObjects(sm, rg).Build()})

	out := exported{}
	for _, g := range []prometheus.Gatherer{crmetrics.Registry, reg} {
		fams, err := g.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fams {
			out[f.GetName()] = model.MetricType(strings.ToLower(f.GetType().String()))
		}
	}
	return out
}

// TestQueriesUseExportedMetrics: every expression of the alert rules and
// the dashboard parses as PromQL, and every metric it names is one the
// replicas or the operator really export. A replica's families that
// appear only in some states (a shard being copied, an error seen) count
// when the replica's collector describes them (node.MetricNames).
func TestQueriesUseExportedMetrics(t *testing.T) {
	qs := append(rules(t), dashboard(t)...)
	used := metricNames(t, qs)
	if t.Failed() {
		t.FailNow()
	}

	scraped := nodeMetrics(t)
	described := exported{}
	for _, n := range node.MetricNames() {
		described[n] = model.MetricTypeUnknown
	}
	for name := range scraped {
		if _, ok := described[name]; !ok {
			t.Errorf("the replicas serve %s, which node.MetricNames does not list", name)
		}
	}
	for name, typ := range scraped {
		described[name] = typ
	}
	op := operatorMetrics(t)

	var names []string
	for n := range used {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, name := range names {
		switch {
		case slices.Contains(builtin, name):
		case scraped.has(name) || op.has(name):
		case described.has(name):
			t.Logf("%s: described by the replicas' collector, not served in this scrape (appears in some states only)", name)
		default:
			t.Errorf("%s is exported by neither the replicas nor the operator; used by: %s", name, strings.Join(used[name], "; "))
		}
	}
	t.Logf("%d queries, %d metric names checked", len(qs), len(names))
}

// TestManifestsParse: every YAML document here is valid YAML with a kind.
func TestManifestsParse(t *testing.T) {
	files, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if !strings.HasSuffix(f.Name(), ".yaml") {
			continue
		}
		b, err := os.ReadFile(f.Name())
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := yaml.UnmarshalStrict(b, &m); err != nil {
			t.Errorf("%s: %v", f.Name(), err)
			continue
		}
		if m["kind"] == nil {
			t.Errorf("%s: no kind", f.Name())
		}
	}
}

// TestAlertRules runs promtool (Debian's prometheus package) on the rules:
// `promtool check rules` on them as they are (expressions, durations,
// annotation templates), and `promtool test rules` with
// testdata/alerts_test.yaml on a copy without annotations, so the tests
// say when each alert fires and with which labels, not its wording.
func TestAlertRules(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool not found: apt-get install prometheus (Debian's package has it)")
	}
	b, err := os.ReadFile("prometheusrule.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var pr struct {
		Spec struct {
			Groups []map[string]any `json:"groups"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(b, &pr); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(name string, v any) string {
		out, err := yaml.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, out, 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	full := write("full.yaml", map[string]any{"groups": pr.Spec.Groups})
	for _, g := range pr.Spec.Groups {
		rs, _ := g["rules"].([]any)
		for _, r := range rs {
			delete(r.(map[string]any), "annotations")
		}
	}
	write("rules.yaml", map[string]any{"groups": pr.Spec.Groups})
	tests, err := os.ReadFile("testdata/alerts_test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "alerts_test.yaml"), tests, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"check", "rules", full}, {"test", "rules", "alerts_test.yaml"}} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args[:2], " "), err, out)
		}
	}
}

// TestPodMonitorMatchesPods: the PodMonitor selects the labels the
// operator puts on its pods (controllers' constants), on the port name
// its containers use, and its relabelings read those labels.
func TestPodMonitorMatchesPods(t *testing.T) {
	pm, err := PodMonitor()
	if err != nil {
		t.Fatal(err)
	}
	sel := pm.Spec.Selector
	if len(sel.MatchLabels) != 2 || sel.MatchLabels[controllers.LabelName] != "shardkv" || sel.MatchLabels[controllers.LabelManagedBy] != controllers.ManagedBy {
		t.Errorf("matchLabels %v, want %s=shardkv, %s=%s", sel.MatchLabels, controllers.LabelName, controllers.LabelManagedBy, controllers.ManagedBy)
	}
	if len(sel.MatchExpressions) != 1 || sel.MatchExpressions[0].Key != controllers.LabelComponent ||
		!slices.Equal(sel.MatchExpressions[0].Values, []string{controllers.ComponentGroup, controllers.ComponentController}) {
		t.Errorf("matchExpressions %+v, want %s in [%s %s]", sel.MatchExpressions, controllers.LabelComponent, controllers.ComponentGroup, controllers.ComponentController)
	}
	if len(pm.Spec.PodEndpoints) != 1 || pm.Spec.PodEndpoints[0].Port != "http" || pm.Spec.PodEndpoints[0].Path != "/metrics" {
		t.Fatalf("endpoints %+v, want port http (%d), /metrics", pm.Spec.PodEndpoints, controllers.HTTPPort)
	}
	want := map[string]string{"shardmap": SDLabel("pod", controllers.LabelInstance), "component": SDLabel("pod", controllers.LabelComponent),
		"replicagroup": SDLabel("pod", controllers.LabelGroup)}
	known := []string{want["shardmap"], want["component"], want["replicagroup"]}
	for _, r := range pm.Spec.PodEndpoints[0].Relabelings {
		for _, s := range r.SourceLabels {
			if !slices.Contains(known, s) {
				t.Errorf("relabeling to %s reads %s, not a label the operator sets", r.TargetLabel, s)
			}
		}
		if w, ok := want[r.TargetLabel]; ok && len(r.SourceLabels) == 1 {
			if r.SourceLabels[0] != w {
				t.Errorf("%s comes from %s, want %s", r.TargetLabel, r.SourceLabels[0], w)
			}
			delete(want, r.TargetLabel)
		}
	}
	if len(want) > 0 {
		t.Errorf("no relabeling sets %v", want)
	}
}
