package controllers

import (
	"crypto/tls"

	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

// LeaderElectionID is the name of the manager replicas' leader election
// Lease (cmd/manager --leader-elect).
const LeaderElectionID = "shardkv-operator"

// MetricsServerOptions are the options of the manager's metrics endpoint
// at addr ("0" disables it), as kubebuilder v4 scaffolds them. With secure
// it is served over HTTPS, and every request must carry a bearer token
// that the API server authenticates (a TokenReview) and authorizes (a
// SubjectAccessReview for "get" on the non-resource URL /metrics): the
// operator needs config/rbac/metrics_auth_role.yaml, a scraper
// config/rbac/metrics_reader_role.yaml. The certificate is tls.crt and
// tls.key from certDir when they exist there (reloaded when they change),
// else a self-signed one made in memory at start. HTTP/2 is off unless
// enableHTTP2: its rapid-reset and stream-flood weaknesses
// (CVE-2023-44487, CVE-2023-39325) are not worth it for a scrape.
func MetricsServerOptions(addr string, secure bool, certDir string, enableHTTP2 bool) metricsserver.Options {
	o := metricsserver.Options{BindAddress: addr, SecureServing: secure}
	if !enableHTTP2 {
		o.TLSOpts = append(o.TLSOpts, func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} })
	}
	if secure {
		o.FilterProvider = filters.WithAuthenticationAndAuthorization
		if certDir != "" {
			o.CertDir = certDir
		}
	}
	return o
}
