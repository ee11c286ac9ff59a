// Package monitoring holds the Prometheus Operator manifests, the alert
// rules and the Grafana dashboard (YAML and JSON, applied with kustomize).
// Its Go code only reads them, for the tests that check them: this
// package's (against what the replicas and the operator export) and the
// e2e PrometheusScrape scenario (against a real Prometheus scraping a
// real cluster).
package monitoring

import (
	"embed"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"

	"sigs.k8s.io/yaml"
)

//go:embed podmonitor.yaml servicemonitor.yaml metrics_reader_binding.yaml prometheusrule.yaml grafana/shardkv.json
var files embed.FS

// File returns one of the embedded manifests by its path here
// ("podmonitor.yaml", "grafana/shardkv.json").
func File(name string) ([]byte, error) { return files.ReadFile(name) }

// Query is one PromQL expression and where it comes from ("alert X",
// "panel T", "variable V").
type Query struct{ Where, Expr string }

// Rule is one rule of a PrometheusRule (and of a Prometheus rule file:
// the groups marshal as one).
type Rule struct {
	Alert       string            `json:"alert,omitempty"`
	Record      string            `json:"record,omitempty"`
	Expr        string            `json:"expr"`
	For         string            `json:"for,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// RuleGroup is one group of rules.
type RuleGroup struct {
	Name  string `json:"name"`
	Rules []Rule `json:"rules"`
}

// PrometheusRule is prometheusrule.yaml.
type PrometheusRule struct {
	APIVersion string         `json:"apiVersion"`
	Kind       string         `json:"kind"`
	Metadata   map[string]any `json:"metadata"`
	Spec       struct {
		Groups []RuleGroup `json:"groups"`
	} `json:"spec"`
}

// Rules reads prometheusrule.yaml, strictly (an unknown field is an error).
func Rules() (*PrometheusRule, error) {
	var r PrometheusRule
	if err := unmarshal("prometheusrule.yaml", &r, true); err != nil {
		return nil, err
	}
	return &r, nil
}

// Alerts are the alert expressions, as "alert <name>".
func (r *PrometheusRule) Alerts() []Query {
	var out []Query
	for _, g := range r.Spec.Groups {
		for _, ru := range g.Rules {
			out = append(out, Query{"alert " + ru.Alert, ru.Expr})
		}
	}
	return out
}

// labelValues is a Grafana variable query: label_values(<selector>, <label>).
var labelValues = regexp.MustCompile(`^label_values\((.+),\s*[a-zA-Z_][a-zA-Z0-9_]*\)$`)

// Dashboard returns the panel and variable queries of grafana/shardkv.json
// (a variable's label_values(selector, label) as its selector), with
// Grafana's interval variables replaced (GrafanaVars); $namespace and
// $shardmap stay.
func Dashboard() ([]Query, error) {
	b, err := files.ReadFile("grafana/shardkv.json")
	if err != nil {
		return nil, err
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
		return nil, fmt.Errorf("grafana/shardkv.json: %w", err)
	}
	var out []Query
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			for _, tg := range p.Targets {
				out = append(out, Query{"panel " + p.Title, GrafanaVars(tg.Expr)})
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
			return nil, fmt.Errorf("variable %s: %w", v.Name, err)
		}
		m := labelValues.FindStringSubmatch(q.Query)
		if m == nil {
			return nil, fmt.Errorf("variable %s: %q is not label_values(selector, label)", v.Name, q.Query)
		}
		out = append(out, Query{"variable " + v.Name, GrafanaVars(m[1])})
	}
	return out, nil
}

// GrafanaVars replaces Grafana's interval variables; $namespace and the
// like only appear inside label matcher strings, which stay as they are.
func GrafanaVars(expr string) string {
	return strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h").Replace(expr)
}

// Relabeling is a Prometheus Operator RelabelConfig.
type Relabeling struct {
	SourceLabels []string `json:"sourceLabels,omitempty"`
	Separator    *string  `json:"separator,omitempty"`
	TargetLabel  string   `json:"targetLabel,omitempty"`
	Regex        string   `json:"regex,omitempty"`
	Replacement  *string  `json:"replacement,omitempty"`
	Action       string   `json:"action,omitempty"`
	Modulus      uint64   `json:"modulus,omitempty"`
}

// Selector is a Kubernetes label selector.
type Selector struct {
	MatchLabels      map[string]string `json:"matchLabels"`
	MatchExpressions []struct {
		Key      string   `json:"key"`
		Operator string   `json:"operator"`
		Values   []string `json:"values"`
	} `json:"matchExpressions"`
}

// Endpoint is a PodMonitor's podMetricsEndpoint or a ServiceMonitor's
// endpoint: the fields ours use.
type Endpoint struct {
	Port            string `json:"port"`
	Scheme          string `json:"scheme"`
	Path            string `json:"path"`
	Interval        string `json:"interval"`
	HonorLabels     bool   `json:"honorLabels"`
	BearerTokenFile string `json:"bearerTokenFile"`
	TLSConfig       *struct {
		InsecureSkipVerify bool `json:"insecureSkipVerify"`
	} `json:"tlsConfig"`
	Relabelings []Relabeling `json:"relabelings"`
}

// Monitor is podmonitor.yaml or servicemonitor.yaml.
type Monitor struct {
	Kind     string `json:"kind"`
	Metadata struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		NamespaceSelector struct {
			Any        bool     `json:"any"`
			MatchNames []string `json:"matchNames"`
		} `json:"namespaceSelector"`
		Selector     Selector   `json:"selector"`
		PodEndpoints []Endpoint `json:"podMetricsEndpoints"`
		Endpoints    []Endpoint `json:"endpoints"`
	} `json:"spec"`
}

// PodMonitor reads podmonitor.yaml.
func PodMonitor() (*Monitor, error) { return monitor("podmonitor.yaml") }

// ServiceMonitor reads servicemonitor.yaml.
func ServiceMonitor() (*Monitor, error) { return monitor("servicemonitor.yaml") }

func monitor(name string) (*Monitor, error) {
	var m Monitor
	if err := unmarshal(name, &m, false); err != nil {
		return nil, err
	}
	return &m, nil
}

// SDLabel is how Prometheus's Kubernetes discovery of role ("pod",
// "service") names a Kubernetes label of the object: app.kubernetes.io/name
// becomes __meta_kubernetes_pod_label_app_kubernetes_io_name.
func SDLabel(role, k8sLabel string) string {
	return "__meta_kubernetes_" + role + "_label_" + invalidLabelChar.ReplaceAllString(k8sLabel, "_")
}

var invalidLabelChar = regexp.MustCompile(`[^a-zA-Z0-9_]`)

func unmarshal(name string, v any, strict bool) error {
	b, err := files.ReadFile(name)
	if err != nil {
		return err
	}
	if strict {
		err = yaml.UnmarshalStrict(b, v)
	} else {
		err = yaml.Unmarshal(b, v)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}
