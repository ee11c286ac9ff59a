package controllers

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
)

// TestMetricsSecureServing: the manager's metrics endpoint as cmd/manager
// serves it by default (MetricsServerOptions with --metrics-secure):
// HTTPS only; a scrape without a token is refused (401), one with the
// token of a ServiceAccount not allowed /metrics too (403), and one whose
// ServiceAccount is bound to config/rbac's metrics-reader gets the
// metrics. The manager runs as the operator's ServiceAccount with only
// config/rbac's metrics-auth-role for its TokenReviews and
// SubjectAccessReviews (rbac_test.go).
func TestMetricsSecureServing(t *testing.T) {
	ns := newNamespace(t)
	ctx := context.Background()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	newOperatorManager(t, ns, func(o *ctrl.Options) { o.Metrics = MetricsServerOptions(addr, true, "", false) })

	// Two ServiceAccounts: a scraper bound to metrics-reader, a stranger
	// bound to nothing.
	for _, name := range []string{"scraper", "stranger"} {
		mustCreate(t, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}})
	}
	mustCreate(t, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: ns + "-metrics-reader"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "metrics-reader"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: "scraper"}},
	})
	token := map[string]string{}
	for _, name := range []string{"scraper", "stranger"} {
		if token[name], err = serviceAccountToken(ctx, testCfg, ns, name); err != nil {
			t.Fatal(err)
		}
	}

	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		// The certificate is self-signed (no --metrics-cert-path).
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // a test of authentication, not of the certificate
	scrape := func(scheme, token string) (int, string, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, scheme+"://"+addr+"/metrics", nil)
		if err != nil {
			return 0, "", err
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := hc.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), err
	}
	eventually(t, "the metrics endpoint answers", func() error {
		_, _, err := scrape("https", "")
		return err
	})
	code, body, err := scrape("https", "")
	if err != nil || code != http.StatusUnauthorized {
		t.Errorf("no token: %d %q %v, want 401", code, body, err)
	}
	// A token the API server cannot parse: controller-runtime's filter
	// answers 500 ("Authentication failed": the TokenReview says why it
	// is not authenticated, which the delegating authenticator turns into
	// an error) rather than 401; refused either way.
	code, body, err = scrape("https", "not-a-token")
	if err != nil || (code != http.StatusUnauthorized && code != http.StatusInternalServerError) || strings.Contains(body, "# TYPE") {
		t.Errorf("a made-up token: %d %q %v, want 401 or 500 and no metrics", code, body, err)
	}
	code, body, err = scrape("https", token["stranger"])
	if err != nil || code != http.StatusForbidden {
		t.Errorf("a ServiceAccount without metrics-reader: %d %q %v, want 403", code, body, err)
	}
	// The reader's grant may take a moment to reach the authorizer's
	// cache of RBAC objects.
	eventually(t, "the scraper gets the metrics", func() error {
		code, body, err := scrape("https", token["scraper"])
		if err != nil {
			return err
		}
		if code != http.StatusOK || !strings.Contains(body, "# TYPE rest_client_requests_total") {
			return fmt.Errorf("scraper: %d %.300q", code, body)
		}
		return nil
	})
	// Only HTTPS is served.
	if code, _, err := scrape("http", token["scraper"]); err == nil && code == http.StatusOK {
		t.Errorf("plain HTTP scrape answered %d", code)
	}
}
