//go:build e2e

package e2e

// The PrometheusScrape scenario: a real Prometheus (Debian's package, run
// on the host) scrapes the "demo" cluster and the operator the way the
// Prometheus Operator would from config/monitoring's PodMonitor and
// ServiceMonitor, and every dashboard query and alert expression is
// evaluated against what it scraped. It runs once the cluster has four
// groups, the workloads and the migrations behind it.
//
// The scrape configuration is made from the monitors' YAML (not copied
// by hand): the monitors' selectors and port names as keep rules, the
// labels the Prometheus Operator adds (namespace, pod, container, job,
// endpoint), then the monitors' own relabelings, all applied by
// Prometheus. Discovery is the one part emulated: Debian builds its
// Prometheus without Kubernetes discovery ("kubernetes_sd_configs not
// found"; NEWS.Debian: removed for its client library's dependencies),
// so the test lists the pods (role pod) and the Service's EndpointSlices
// (role endpoints) itself, and serves them to Prometheus's HTTP discovery
// with the __meta_kubernetes_* labels kubernetes_sd_configs gives
// (discovery/kubernetes of Prometheus 2.42: pod.go, endpoints.go). It
// lists the scenario's namespace (the PodMonitor selects any) and the
// operator's (where the ServiceMonitor is installed). The host reaches
// pod addresses directly; the host's root processes are not subject to
// NetworkPolicies on the local cluster, so spec.network.metricsNamespaces
// is not exercised here.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/prometheus/promql/parser"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
	"github.com/shardkv/shardkv/config/monitoring"
	"github.com/shardkv/shardkv/controllers"
)

// config/monitoring/kustomization.yaml installs the monitors in the
// operator's namespace, names prefixed promNamePrefix; the Prometheus
// Operator names a PodMonitor's job <namespace>/<name>. promSA is the
// ServiceAccount whose token scrapes the operator.
const (
	promNamePrefix = "shardkv-"
	promSA         = "prometheus-e2e"
	promInterval   = "2s"
)

// copyOnly are the series a replica serves only while one of its shards
// is being copied or is not Serving (pkg/node/metrics.go,
// docs/monitoring.md). The cluster is settled here, so a query of them
// may return nothing; it must return something whenever shardkv_shards
// says a shard is in such a state (checked at the same instant).
var copyOnly = map[string]string{
	"shardkv_shard_state_age_seconds":     `shardkv_shards{state!="Serving"} > 0`,
	"shardkv_migration_shard_lag_entries": `shardkv_shards{state=~"PreCopying|Pulling"} > 0`,
}

// mayReturn are the alerts whose expression may return series on this
// healthy cluster (their "for" keeps them from firing), and why.
var mayReturn = map[string]string{
	// hostPath volumes: every replica's data directory is on the host's
	// disk, shared with everything else; under 40% free and shrinking
	// during a load, it returns every replica (docs/monitoring.md).
	"ShardkvDiskFillingUp": "all replicas share the host's disk",
	// A reconcile that lost an optimistic-concurrency race (a conflict on
	// a status write) returns an error and is retried; the rate over 10m
	// sees it, the alert's for: 15m does not fire on it.
	"ShardkvOperatorReconcileErrors": "a transient reconcile error (write conflict) counts",
}

func (e *env) prometheusScrape(t *testing.T) {
	t0 := time.Now()
	bin := envOr("SHARDKV_E2E_PROMETHEUS", "/usr/bin/prometheus")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("Prometheus not found at %s (%v): apt-get install prometheus (Debian's package; .ci/run installs it)", bin, err)
	}
	pm, err1 := monitoring.PodMonitor()
	svcm, err2 := monitoring.ServiceMonitor()
	rules, err3 := monitoring.Rules()
	dashboard, err4 := monitoring.Dashboard()
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tokenFile := write("token", []byte(e.metricsReaderToken(t)))
	ruleFile := write("rules.yaml", mustYAML(t, map[string]any{"groups": rules.Spec.Groups}))
	podJob := operatorNS + "/" + promNamePrefix + pm.Metadata.Name
	sd := e.serveDiscovery(t)
	cfg := map[string]any{
		"global":     map[string]any{"scrape_interval": promInterval, "scrape_timeout": promInterval, "evaluation_interval": promInterval},
		"rule_files": []string{ruleFile},
		"scrape_configs": []any{
			scrapeConfig(t, pm, sd+"?role=pod&namespace="+e.ns, podJob, ""),
			scrapeConfig(t, svcm, sd+"?role=endpoints&namespace="+operatorNS, "", tokenFile),
		},
	}
	base := e.startPrometheus(t, bin, dir, write("prometheus.yml", mustYAML(t, cfg)))

	// Every pod of the demo cluster and every operator pod is a target,
	// up, with the labels the rules and the dashboard group by.
	want := e.wantTargets(t, podJob)
	var allUp time.Time
	e.eventually(t, time.Minute, "every target scraped twice, up", func() (bool, string) {
		ok, state := checkTargets(t, base, want, allUp)
		if t.Failed() {
			t.FailNow() // a target with wrong labels
		}
		if ok && allUp.IsZero() {
			// Up once: each has one good scrape. Wait for one more
			// after this moment (rates need two samples).
			allUp = time.Now()
			return false, state + "; waiting for a second scrape"
		}
		return ok, state
	})
	t.Logf("Prometheus scraped %d targets twice after %v", len(want), time.Since(t0).Round(time.Second))

	// Every query at one instant, so that they see the same samples.
	at := strconv.FormatFloat(float64(time.Now().UnixMilli())/1000, 'f', 3, 64)
	vars := strings.NewReplacer("$namespace", e.ns, "$shardmap", sm)
	for _, q := range dashboard {
		expr := vars.Replace(q.Expr)
		res, err := promQuery(base, expr, at)
		if err != nil {
			t.Errorf("%s: %v\n%s", q.Where, err, expr)
			continue
		}
		checkByLabels(t, q.Where, expr, res)
		if len(res) > 0 {
			continue
		}
		if why, ok := copyOnlyQuery(expr); ok {
			during, err := promQuery(base, why, at)
			if err != nil {
				t.Errorf("%s: %v", why, err)
			} else if len(during) > 0 {
				t.Errorf("%s: no series, although %s returns %s\n%s", q.Where, why, seriesList(during), expr)
			} else {
				t.Logf("%s: no series: no shard is being copied (%s is empty)", q.Where, why)
			}
			continue
		}
		t.Errorf("%s: no series on the loaded cluster\n%s", q.Where, expr)
	}
	for _, q := range rules.Alerts() {
		name := strings.TrimPrefix(q.Where, "alert ")
		res, err := promQuery(base, q.Expr, at)
		if err != nil {
			t.Errorf("%s: %v\n%s", q.Where, err, q.Expr)
			continue
		}
		checkByLabels(t, q.Where, q.Expr, res)
		res = e.ours(res)
		if len(res) == 0 {
			continue
		}
		if why, ok := mayReturn[name]; ok {
			t.Logf("%s returns %s (allowed: %s)", q.Where, seriesList(res), why)
			continue
		}
		// A blip (a heartbeat late on 2 busy cores) is what an alert's
		// "for" is for: fail only if it stays.
		for i := 0; i < 3 && err == nil && len(res) > 0; i++ {
			time.Sleep(2 * time.Second)
			if res, err = promQuery(base, q.Expr, ""); err != nil {
				t.Errorf("%s: %v\n%s", q.Where, err, q.Expr)
			}
			res = e.ours(res)
		}
		switch {
		case err != nil:
		case len(res) > 0:
			t.Errorf("%s returns %s on a healthy cluster, for 6s\n%s", q.Where, seriesList(res), q.Expr)
		default:
			t.Logf("%s: returned series once, then none (a blip)", q.Where)
		}
	}
	e.checkRuleHealth(t, base, len(rules.Alerts()))
	t.Logf("%d dashboard queries and %d alert expressions evaluated; scenario took %v",
		len(dashboard), len(rules.Alerts()), time.Since(t0).Round(time.Second))
}

// metricsReaderToken is a token of a ServiceAccount of the scenario's
// namespace that config/monitoring/metrics_reader_binding.yaml binds (its
// subject replaced) to the role that may read the operator's /metrics.
func (e *env) metricsReaderToken(t *testing.T) string {
	t.Helper()
	b, err := monitoring.File("metrics_reader_binding.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var crb map[string]any
	if err := yaml.Unmarshal(b, &crb); err != nil {
		t.Fatal(err)
	}
	meta := crb["metadata"].(map[string]any)
	name := e.ns + "-" + meta["name"].(string)
	meta["name"] = name
	crb["subjects"] = []any{map[string]any{"kind": "ServiceAccount", "name": promSA, "namespace": e.ns}}
	e.k(t, "create", "serviceaccount", promSA)
	t.Cleanup(func() { _, _ = e.kubectlErr("delete", "clusterrolebinding", name, "--ignore-not-found") })
	e.applyYAML(t, string(mustYAML(t, crb)))
	return strings.TrimSpace(e.k(t, "create", "token", promSA, "--duration=1h"))
}

func mustYAML(t *testing.T, v any) []byte {
	t.Helper()
	b, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// scrapeConfig is the scrape job the Prometheus Operator generates for a
// monitor's first endpoint (its relabelings in the same order), with
// the targets of sdURL (serveDiscovery). job is the PodMonitor's job
// label; a ServiceMonitor's is the Service's name.
func scrapeConfig(t *testing.T, m *monitoring.Monitor, sdURL, job, tokenFile string) map[string]any {
	t.Helper()
	eps, kind, obj, role := m.Spec.PodEndpoints, "podMonitor", "pod", "pod"
	if m.Kind == "ServiceMonitor" {
		eps, kind, obj, role = m.Spec.Endpoints, "serviceMonitor", "service", "endpoints"
	}
	if len(eps) != 1 {
		t.Fatalf("%s %s: %d endpoints, this scenario translates one", m.Kind, m.Metadata.Name, len(eps))
	}
	ep := eps[0]
	rel := []map[string]any{}
	keep := func(action string, src []string, regex string) {
		rel = append(rel, map[string]any{"action": action, "source_labels": src, "regex": regex})
	}
	set := func(src, target string) {
		rel = append(rel, map[string]any{"source_labels": []string{src}, "target_label": target})
	}
	keys := make([]string, 0, len(m.Spec.Selector.MatchLabels))
	for k := range m.Spec.Selector.MatchLabels {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	present := func(k string) string {
		return strings.Replace(monitoring.SDLabel(obj, k), "_label_", "_labelpresent_", 1)
	}
	for _, k := range keys {
		keep("keep", []string{monitoring.SDLabel(obj, k), present(k)}, "("+m.Spec.Selector.MatchLabels[k]+");true")
	}
	for _, x := range m.Spec.Selector.MatchExpressions {
		vals := "(" + strings.Join(x.Values, "|") + ");true"
		switch x.Operator {
		case "In":
			keep("keep", []string{monitoring.SDLabel(obj, x.Key), present(x.Key)}, vals)
		case "NotIn":
			keep("drop", []string{monitoring.SDLabel(obj, x.Key), present(x.Key)}, vals)
		case "Exists":
			keep("keep", []string{present(x.Key)}, "true")
		case "DoesNotExist":
			keep("drop", []string{present(x.Key)}, "true")
		default:
			t.Fatalf("%s: selector operator %q", m.Kind, x.Operator)
		}
	}
	if role == "pod" {
		keep("keep", []string{"__meta_kubernetes_pod_container_port_name"}, ep.Port)
	} else {
		keep("keep", []string{"__meta_kubernetes_endpoint_port_name"}, ep.Port)
	}
	keep("drop", []string{"__meta_kubernetes_pod_phase"}, "(Failed|Succeeded)")
	set("__meta_kubernetes_namespace", "namespace")
	if role == "endpoints" {
		set("__meta_kubernetes_service_name", "service")
	}
	set("__meta_kubernetes_pod_name", "pod")
	set("__meta_kubernetes_pod_container_name", "container")
	if role == "endpoints" {
		set("__meta_kubernetes_service_name", "job")
	} else {
		rel = append(rel, map[string]any{"target_label": "job", "replacement": job})
	}
	rel = append(rel, map[string]any{"target_label": "endpoint", "replacement": ep.Port})
	for _, r := range ep.Relabelings {
		c := map[string]any{}
		if len(r.SourceLabels) > 0 {
			c["source_labels"] = r.SourceLabels
		}
		if r.Separator != nil {
			c["separator"] = *r.Separator
		}
		if r.TargetLabel != "" {
			c["target_label"] = r.TargetLabel
		}
		if r.Regex != "" {
			c["regex"] = r.Regex
		}
		if r.Replacement != nil {
			c["replacement"] = *r.Replacement
		}
		if r.Action != "" {
			c["action"] = strings.ToLower(r.Action)
		}
		if r.Modulus != 0 {
			c["modulus"] = r.Modulus
		}
		rel = append(rel, c)
	}
	sc := map[string]any{
		"job_name":        fmt.Sprintf("%s/%s/%s%s/0", kind, operatorNS, promNamePrefix, m.Metadata.Name),
		"honor_labels":    ep.HonorLabels,
		"metrics_path":    ep.Path,
		"http_sd_configs": []any{map[string]any{"url": sdURL, "refresh_interval": "5s"}},
		"relabel_configs": rel,
	}
	if ep.Scheme != "" {
		sc["scheme"] = ep.Scheme
	}
	if ep.TLSConfig != nil {
		sc["tls_config"] = map[string]any{"insecure_skip_verify": ep.TLSConfig.InsecureSkipVerify}
	}
	if ep.BearerTokenFile != "" {
		// The monitor reads Prometheus's own ServiceAccount token; here
		// the token of metricsReaderToken's account stands in for it.
		sc["authorization"] = map[string]any{"credentials_file": tokenFile}
	}
	return sc
}

// startPrometheus runs Prometheus with config cfg and its TSDB in dir,
// listening on a free port of 127.0.0.1, until the test ends; it returns
// its URL once Prometheus is ready.
func (e *env) startPrometheus(t *testing.T, bin, dir, cfg string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	logf, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config.file="+cfg, "--storage.tsdb.path="+filepath.Join(dir, "tsdb"),
		"--storage.tsdb.retention.time=1h", "--web.listen-address="+addr)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	// Registered after t.TempDir, so it runs before the directory goes.
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("--- prometheus log\n%s", tail(string(b), 40))
		}
	})
	base := "http://" + addr
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case <-exited:
			b, _ := os.ReadFile(logf.Name())
			t.Fatalf("prometheus exited: %v\n%s", cmd.ProcessState, tail(string(b), 40))
		default:
		}
		if resp, err := http.Get(base + "/-/ready"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return base
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("prometheus on %s not ready after 30s", addr)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// wantTargets are the targets the monitors must yield, by pod, with the
// labels each must carry: every pod of ShardMap sm's controller group
// and of its ReplicaGroups, and every operator pod.
func (e *env) wantTargets(t *testing.T, podJob string) map[string]map[string]string {
	t.Helper()
	want := map[string]map[string]string{}
	add := func(set, component string) {
		for _, p := range e.pods(t, set) {
			want[p.Name] = map[string]string{"job": podJob, "namespace": e.ns, "pod": p.Name, "shardmap": sm,
				"component": component, "replicagroup": set}
		}
	}
	add(controllers.CtrlerName(sm), controllers.ComponentController)
	var rgs shardkvv1.ReplicaGroupList
	if err := e.kube.List(ctx(t), &rgs, client.InNamespace(e.ns)); err != nil {
		t.Fatal(err)
	}
	for _, rg := range rgs.Items {
		if rg.Spec.ShardMap == sm {
			add(rg.Name, controllers.ComponentGroup)
		}
	}
	var dep appsv1.Deployment
	if err := e.kube.Get(ctx(t), client.ObjectKey{Namespace: operatorNS, Name: operatorDeploy}, &dep); err != nil {
		t.Fatal(err)
	}
	var pods corev1.PodList
	if err := e.kube.List(ctx(t), &pods, client.InNamespace(operatorNS), client.MatchingLabels(dep.Spec.Selector.MatchLabels)); err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		want[p.Name] = map[string]string{"job": operatorDeploy + "-metrics-service", "namespace": operatorNS, "pod": p.Name}
	}
	return want
}

// promTarget is an active target of /api/v1/targets.
type promTarget struct {
	Labels     map[string]string `json:"labels"`
	ScrapePool string            `json:"scrapePool"`
	ScrapeURL  string            `json:"scrapeUrl"`
	LastError  string            `json:"lastError"`
	LastScrape time.Time         `json:"lastScrape"`
	Health     string            `json:"health"`
}

// checkTargets: Prometheus's active targets are exactly want's pods, each
// up (and, if since is set, scraped after it), with want's labels.
func checkTargets(t *testing.T, base string, want map[string]map[string]string, since time.Time) (bool, string) {
	t.Helper()
	var data struct {
		ActiveTargets []promTarget `json:"activeTargets"`
	}
	if err := promAPI(base, "/api/v1/targets", url.Values{"state": {"active"}}, &data); err != nil {
		return false, err.Error()
	}
	var bad []string
	seen := map[string]bool{}
	up := 0
	for _, tg := range data.ActiveTargets {
		pod := tg.Labels["pod"]
		w, ok := want[pod]
		switch {
		case !ok:
			bad = append(bad, fmt.Sprintf("unexpected target %s %v", tg.ScrapeURL, tg.Labels))
			continue
		case seen[pod]:
			bad = append(bad, fmt.Sprintf("pod %s scraped twice (%s)", pod, tg.ScrapeURL))
		case tg.Health != "up":
			bad = append(bad, fmt.Sprintf("%s %s: %s (%s)", pod, tg.ScrapeURL, tg.Health, tg.LastError))
		case tg.LastScrape.Before(since):
			bad = append(bad, pod+": no scrape since the first round")
		default:
			up++
		}
		seen[pod] = true
		for k, v := range w {
			if tg.Labels[k] != v {
				// Wrong labels never right themselves: the caller stops.
				t.Errorf("target %s: label %s=%q, want %q (all: %v)", pod, k, tg.Labels[k], v, tg.Labels)
			}
		}
	}
	for pod := range want {
		if !seen[pod] {
			bad = append(bad, "no target for pod "+pod)
		}
	}
	slices.Sort(bad)
	state := fmt.Sprintf("%d/%d targets up", up, len(want))
	if len(bad) > 0 {
		state += ": " + strings.Join(bad, "; ")
	}
	return len(bad) == 0, state
}

// promAPI GETs a Prometheus API path and decodes its data into out.
func promAPI(base, path string, q url.Values, out any) error {
	resp, err := http.Get(base + path + "?" + q.Encode())
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var r struct {
		Status    string          `json:"status"`
		Data      json.RawMessage `json:"data"`
		ErrorType string          `json:"errorType"`
		Error     string          `json:"error"`
		Warnings  []string        `json:"warnings"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return fmt.Errorf("%s: HTTP %d: %w", path, resp.StatusCode, err)
	}
	if r.Status != "success" {
		return fmt.Errorf("%s: %s: %s", path, r.ErrorType, r.Error)
	}
	if len(r.Warnings) > 0 {
		return fmt.Errorf("%s: warnings: %s", path, strings.Join(r.Warnings, "; "))
	}
	return json.Unmarshal(r.Data, out)
}

// promQuery evaluates expr at time at ("" for now) and returns its series
// (labels only); the result must be an instant vector.
func promQuery(base, expr, at string) ([]map[string]string, error) {
	q := url.Values{"query": {expr}}
	if at != "" {
		q.Set("time", at)
	}
	var data struct {
		ResultType string `json:"resultType"`
		Result     []struct {
			Metric map[string]string `json:"metric"`
		} `json:"result"`
	}
	if err := promAPI(base, "/api/v1/query", q, &data); err != nil {
		return nil, err
	}
	if data.ResultType != "vector" {
		return nil, fmt.Errorf("result type %s, want vector", data.ResultType)
	}
	out := make([]map[string]string, len(data.Result))
	for i, r := range data.Result {
		out[i] = r.Metric
	}
	return out, nil
}

// ours are the series of this run's namespace, and those without one
// (the operator's controllers).
func (e *env) ours(res []map[string]string) []map[string]string {
	return slices.DeleteFunc(slices.Clone(res), func(m map[string]string) bool {
		ns, ok := m["namespace"]
		return ok && ns != e.ns
	})
}

func seriesList(res []map[string]string) string {
	var s []string
	for _, m := range res {
		s = append(s, fmt.Sprint(m))
	}
	if len(s) > 5 {
		s = append(s[:5], fmt.Sprintf("... (%d in all)", len(res)))
	}
	return strings.Join(s, ", ")
}

// copyOnlyQuery reports whether expr reads a copyOnly series, and the
// query that says whether one should exist.
func copyOnlyQuery(expr string) (string, bool) {
	for name, during := range copyOnly {
		if strings.Contains(expr, name) {
			return during, true
		}
	}
	return "", false
}

// checkByLabels: every series of an aggregation carries each label of its
// outermost "by (...)" (le aside), non-empty; a series of a replica
// (labelled component) carries the PodMonitor's labels.
func checkByLabels(t *testing.T, where, expr string, res []map[string]string) {
	t.Helper()
	p, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		t.Errorf("%s: %v", where, err)
		return
	}
	by := resultLabels(p)
	for _, m := range res {
		want := by
		if by == nil && m["component"] != "" {
			want = []string{"namespace", "pod", "shardmap", "component", "replicagroup"}
		}
		for _, l := range want {
			if m[l] == "" {
				t.Errorf("%s: a series without %s: %v\n%s", where, l, m, expr)
			}
		}
	}
}

// resultLabels are the labels of the outermost aggregation's "by" clause
// (nil if there is none, or it is "without").
func resultLabels(e parser.Expr) []string {
	switch n := e.(type) {
	case *parser.AggregateExpr:
		if n.Without {
			return nil
		}
		return slices.DeleteFunc(slices.Clone(n.Grouping), func(l string) bool { return l == "le" })
	case *parser.BinaryExpr:
		if l := resultLabels(n.LHS); l != nil {
			return l
		}
		return resultLabels(n.RHS)
	case *parser.ParenExpr:
		return resultLabels(n.Expr)
	case *parser.StepInvariantExpr:
		return resultLabels(n.Expr)
	case *parser.Call:
		for _, a := range n.Args {
			if l := resultLabels(a); l != nil {
				return l
			}
		}
	}
	return nil
}

// checkRuleHealth: Prometheus loaded the rules and evaluated every one
// without error (the same expressions, by its rule manager).
func (e *env) checkRuleHealth(t *testing.T, base string, n int) {
	t.Helper()
	type rule struct {
		Name      string `json:"name"`
		Health    string `json:"health"`
		LastError string `json:"lastError"`
		State     string `json:"state"`
	}
	var data struct {
		Groups []struct {
			Rules []rule `json:"rules"`
		} `json:"groups"`
	}
	e.eventually(t, 30*time.Second, "Prometheus evaluated every rule", func() (bool, string) {
		if err := promAPI(base, "/api/v1/rules", url.Values{}, &data); err != nil {
			return false, err.Error()
		}
		var rs []rule
		for _, g := range data.Groups {
			rs = append(rs, g.Rules...)
		}
		unknown := 0
		for _, r := range rs {
			if r.Health == "unknown" {
				unknown++
			}
		}
		return len(rs) == n && unknown == 0, fmt.Sprintf("%d of %d rules loaded, %d not evaluated yet", len(rs), n, unknown)
	})
	for _, g := range data.Groups {
		for _, r := range g.Rules {
			if r.Health != "ok" {
				t.Errorf("rule %s: health %s: %s", r.Name, r.Health, r.LastError)
			}
			if r.State != "inactive" {
				t.Logf("rule %s: %s", r.Name, r.State)
			}
		}
	}
}

// sdGroup is a target group of Prometheus's HTTP discovery.
type sdGroup struct {
	Targets []string          `json:"targets"`
	Labels  map[string]string `json:"labels"`
}

// serveDiscovery serves, until the test ends, what kubernetes_sd_configs
// would discover: ?role=pod or ?role=endpoints, &namespace=ns. It returns
// its URL.
func (e *env) serveDiscovery(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, cancel := context.WithTimeout(r.Context(), 30*time.Second)
		defer cancel()
		ns := r.URL.Query().Get("namespace")
		var gs []sdGroup
		var err error
		switch role := r.URL.Query().Get("role"); role {
		case "pod":
			gs, err = e.podTargets(c, ns)
		case "endpoints":
			gs, err = e.endpointsTargets(c, ns)
		default:
			err = fmt.Errorf("role %q", role)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(gs)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// sdPresent is the label kubernetes_sd_configs sets to "true" when the
// object has Kubernetes label k.
func sdPresent(role, k string) string {
	return strings.Replace(monitoring.SDLabel(role, k), "_label_", "_labelpresent_", 1)
}

// podMeta are the labels kubernetes_sd_configs gives every target of a
// pod (role pod, and role endpoints for an endpoint backed by a pod).
func podMeta(p *corev1.Pod) map[string]string {
	m := map[string]string{
		"__meta_kubernetes_namespace":     p.Namespace,
		"__meta_kubernetes_pod_name":      p.Name,
		"__meta_kubernetes_pod_ip":        p.Status.PodIP,
		"__meta_kubernetes_pod_node_name": p.Spec.NodeName,
		"__meta_kubernetes_pod_host_ip":   p.Status.HostIP,
		"__meta_kubernetes_pod_uid":       string(p.UID),
		"__meta_kubernetes_pod_phase":     string(p.Status.Phase),
		"__meta_kubernetes_pod_ready":     "unknown",
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			m["__meta_kubernetes_pod_ready"] = strings.ToLower(string(c.Status))
		}
	}
	for k, v := range p.Labels {
		m[monitoring.SDLabel("pod", k)] = v
		m[sdPresent("pod", k)] = "true"
	}
	return m
}

// podTargets: role pod, one target per container port of each pod with
// an address (a container without ports: one on the pod's address).
func (e *env) podTargets(c context.Context, ns string) ([]sdGroup, error) {
	var pods corev1.PodList
	if err := e.kube.List(c, &pods, client.InNamespace(ns)); err != nil {
		return nil, err
	}
	gs := []sdGroup{}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Status.PodIP == "" {
			continue
		}
		for _, ctr := range p.Spec.Containers {
			ports := ctr.Ports
			if len(ports) == 0 {
				ports = []corev1.ContainerPort{{}}
			}
			for _, port := range ports {
				l := podMeta(p)
				l["__meta_kubernetes_pod_container_name"] = ctr.Name
				l["__meta_kubernetes_pod_container_image"] = ctr.Image
				l["__meta_kubernetes_pod_container_init"] = "false"
				addr := p.Status.PodIP
				if port.ContainerPort != 0 {
					l["__meta_kubernetes_pod_container_port_name"] = port.Name
					l["__meta_kubernetes_pod_container_port_number"] = strconv.Itoa(int(port.ContainerPort))
					l["__meta_kubernetes_pod_container_port_protocol"] = string(port.Protocol)
					addr = net.JoinHostPort(addr, strconv.Itoa(int(port.ContainerPort)))
				}
				gs = append(gs, sdGroup{Targets: []string{addr}, Labels: l})
			}
		}
	}
	return gs, nil
}

// endpointsTargets: role endpoints, one target per address and port of
// each Service's endpoints (read from its EndpointSlices), with the
// Service's labels and, for an address backed by a pod, the pod's.
func (e *env) endpointsTargets(c context.Context, ns string) ([]sdGroup, error) {
	var svcs corev1.ServiceList
	if err := e.kube.List(c, &svcs, client.InNamespace(ns)); err != nil {
		return nil, err
	}
	gs := []sdGroup{}
	for _, svc := range svcs.Items {
		var eslices discoveryv1.EndpointSliceList
		if err := e.kube.List(c, &eslices, client.InNamespace(ns), client.MatchingLabels{discoveryv1.LabelServiceName: svc.Name}); err != nil {
			return nil, err
		}
		for _, es := range eslices.Items {
			for _, ep := range es.Endpoints {
				var pod *corev1.Pod
				if ref := ep.TargetRef; ref != nil && ref.Kind == "Pod" {
					pod = &corev1.Pod{}
					if err := e.kube.Get(c, client.ObjectKey{Namespace: ns, Name: ref.Name}, pod); err != nil {
						pod = nil
					}
				}
				for _, port := range es.Ports {
					if port.Port == nil || len(ep.Addresses) == 0 {
						continue
					}
					l := map[string]string{}
					if pod != nil {
						l = podMeta(pod)
						for _, ctr := range pod.Spec.Containers {
							for _, cp := range ctr.Ports {
								if cp.ContainerPort == *port.Port {
									l["__meta_kubernetes_pod_container_name"] = ctr.Name
									l["__meta_kubernetes_pod_container_port_name"] = cp.Name
								}
							}
						}
					}
					l["__meta_kubernetes_namespace"] = ns
					l["__meta_kubernetes_endpoints_name"] = svc.Name
					l["__meta_kubernetes_service_name"] = svc.Name
					for k, v := range svc.Labels {
						l[monitoring.SDLabel("service", k)] = v
						l[sdPresent("service", k)] = "true"
					}
					if port.Name != nil {
						l["__meta_kubernetes_endpoint_port_name"] = *port.Name
					}
					if port.Protocol != nil {
						l["__meta_kubernetes_endpoint_port_protocol"] = string(*port.Protocol)
					}
					l["__meta_kubernetes_endpoint_ready"] = strconv.FormatBool(ep.Conditions.Ready == nil || *ep.Conditions.Ready)
					if ep.TargetRef != nil {
						l["__meta_kubernetes_endpoint_address_target_kind"] = ep.TargetRef.Kind
						l["__meta_kubernetes_endpoint_address_target_name"] = ep.TargetRef.Name
					}
					gs = append(gs, sdGroup{Targets: []string{net.JoinHostPort(ep.Addresses[0], strconv.Itoa(int(*port.Port)))}, Labels: l})
				}
			}
		}
	}
	return gs, nil
}
