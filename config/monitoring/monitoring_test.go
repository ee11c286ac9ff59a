// Package monitoring holds the Prometheus Operator manifests, the alert
// rules and the Grafana dashboard (YAML and JSON, applied with kustomize);
// this test checks them against what the replicas and the operator really
// export.
package monitoring

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
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

// query is one PromQL expression and where it comes from.
type query struct{ where, expr string }

// ruleFile is the part of a PrometheusRule this test reads.
type ruleFile struct {
	APIVersion string         `json:"apiVersion"`
	Kind       string         `json:"kind"`
	Metadata   map[string]any `json:"metadata"`
	Spec       struct {
		Groups []struct {
			Name  string `json:"name"`
			Rules []struct {
				Alert       string            `json:"alert"`
				Record      string            `json:"record"`
				Expr        string            `json:"expr"`
				For         string            `json:"for"`
				Labels      map[string]string `json:"labels"`
				Annotations map[string]string `json:"annotations"`
			} `json:"rules"`
		} `json:"groups"`
	} `json:"spec"`
}

// rules are the alert expressions of prometheusrule.yaml; every alert
// must have a severity and say what to do.
func rules(t *testing.T) []query {
	t.Helper()
	b, err := os.ReadFile("prometheusrule.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var f ruleFile
	if err := yaml.UnmarshalStrict(b, &f); err != nil {
		t.Fatalf("prometheusrule.yaml: %v", err)
	}
	var out []query
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
			out = append(out, query{"alert " + r.Alert, r.Expr})
		}
	}
	if len(out) < 4 {
		t.Fatalf("prometheusrule.yaml: only %d alerts", len(out))
	}
	return out
}

// labelValues is a Grafana variable query: label_values(<selector>, <label>).
var labelValues = regexp.MustCompile(`^label_values\((.+),\s*[a-zA-Z_][a-zA-Z0-9_]*\)$`)

// dashboard are the panel and variable queries of grafana/shardkv.json,
// with Grafana's variables replaced by values PromQL accepts.
func dashboard(t *testing.T) []query {
	t.Helper()
	b, err := os.ReadFile("grafana/shardkv.json")
	if err != nil {
		t.Fatal(err)
	}
	type panel struct {
		Title   string  `json:"title"`
		Panels  []panel `json:"panels"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	}
	var d struct {
		Panels     []panel `json:"panels"`
		Templating struct {
			List []struct {
				Name  string          `json:"name"`
				Type  string          `json:"type"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("grafana/shardkv.json: %v", err)
	}
	var out []query
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			for _, tg := range p.Targets {
				out = append(out, query{"panel " + p.Title, grafanaVars(tg.Expr)})
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct{ Query string }
		if err := json.Unmarshal(v.Query, &q); err != nil {
			t.Fatalf("variable %s: %v", v.Name, err)
		}
		m := labelValues.FindStringSubmatch(q.Query)
		if m == nil {
			t.Fatalf("variable %s: %q is not label_values(selector, label)", v.Name, q.Query)
		}
		out = append(out, query{"variable " + v.Name, grafanaVars(m[1])})
	}
	if len(out) < 10 {
		t.Fatalf("grafana/shardkv.json: only %d queries", len(out))
	}
	return out
}

// grafanaVars replaces Grafana's interval variables; $namespace and the
// like only appear inside label matcher strings, which stay as they are.
func grafanaVars(expr string) string {
	return strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h").Replace(expr)
}

// metricNames parses each query and returns the metric names it selects,
// with the queries that use each.
func metricNames(t *testing.T, qs []query) map[string][]string {
	t.Helper()
	p := parser.NewParser(parser.Options{})
	out := map[string][]string{}
	for _, q := range qs {
		e, err := p.ParseExpr(q.expr)
		if err != nil {
			t.Errorf("%s: %v\n%s", q.where, err, q.expr)
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
				t.Errorf("%s: a selector without a metric name: %s", q.where, vs)
				return nil
			}
			if !slices.Contains(out[name], q.where) {
				out[name] = append(out[name], q.where)
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

// promLabel is how Prometheus's Kubernetes discovery names a pod label.
func promLabel(k8sLabel string) string {
	return "__meta_kubernetes_pod_label_" + regexp.MustCompile(`[^a-zA-Z0-9_]`).ReplaceAllString(k8sLabel, "_")
}

// TestPodMonitorMatchesPods: the PodMonitor selects the labels the
// operator puts on its pods (controllers' constants), on the port name
// its containers use, and its relabelings read those labels.
func TestPodMonitorMatchesPods(t *testing.T) {
	b, err := os.ReadFile("podmonitor.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var pm struct {
		Spec struct {
			Selector struct {
				MatchLabels      map[string]string `json:"matchLabels"`
				MatchExpressions []struct {
					Key      string   `json:"key"`
					Operator string   `json:"operator"`
					Values   []string `json:"values"`
				} `json:"matchExpressions"`
			} `json:"selector"`
			Endpoints []struct {
				Port        string `json:"port"`
				Path        string `json:"path"`
				Relabelings []struct {
					SourceLabels []string `json:"sourceLabels"`
					TargetLabel  string   `json:"targetLabel"`
				} `json:"relabelings"`
			} `json:"podMetricsEndpoints"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(b, &pm); err != nil {
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
	if len(pm.Spec.Endpoints) != 1 || pm.Spec.Endpoints[0].Port != "http" || pm.Spec.Endpoints[0].Path != "/metrics" {
		t.Fatalf("endpoints %+v, want port http (%d), /metrics", pm.Spec.Endpoints, controllers.HTTPPort)
	}
	want := map[string]string{"shardmap": promLabel(controllers.LabelInstance), "component": promLabel(controllers.LabelComponent),
		"replicagroup": promLabel(controllers.LabelGroup)}
	known := []string{want["shardmap"], want["component"], want["replicagroup"]}
	for _, r := range pm.Spec.Endpoints[0].Relabelings {
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
