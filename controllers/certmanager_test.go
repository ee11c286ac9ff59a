package controllers

// spec.tls.mode CertManager against real cert-manager: its CRDs installed
// in the suite's API server and its controller (built from the module proxy
// by hack/build-cert-manager.sh) running as a child process against it,
// with a CA Issuer bootstrapped the usual way (a self-signed Issuer signs a
// CA Certificate, a CA Issuer signs with its Secret).

import (
	"bytes"
	"context"
	"crypto/x509"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
	"github.com/shardkv/shardkv/pkg/mtls"
)

// certManagerEnv names the directory hack/build-cert-manager.sh prints:
// bin/cert-manager-controller and crds/*.yaml.
const certManagerEnv = "SHARDKV_CERT_MANAGER_DIR"

// certManagerControllers are the controllers the tests run: Certificates,
// CertificateRequests (approved, signed by a SelfSigned or CA issuer) and
// the Issuers' readiness.
var certManagerControllers = []string{
	"issuers",
	"certificaterequests-approver", "certificaterequests-issuer-ca", "certificaterequests-issuer-selfsigned",
	"certificates-trigger", "certificates-issuing", "certificates-key-manager",
	"certificates-request-manager", "certificates-readiness", "certificates-revision-manager",
}

// requireCertManager returns cert-manager's directory, or skips t when it
// is not there; with SHARDKV_REQUIRE_ENVTEST set (make test, CI) it fails
// instead. A skip excuses the operator's cert-manager.io rights from the
// suite's RBAC audit: no test could use them.
func requireCertManager(t *testing.T) string {
	t.Helper()
	requireEnvtest(t)
	dir := os.Getenv(certManagerEnv)
	why := ""
	if dir == "" {
		why = certManagerEnv + " is not set"
	} else {
		for _, f := range []string{filepath.Join(dir, "bin", "cert-manager-controller"), filepath.Join(dir, "crds", "cert-manager.io_certificates.yaml")} {
			if _, err := os.Stat(f); err != nil {
				why = err.Error()
				break
			}
		}
	}
	if why == "" {
		return dir
	}
	why = "cert-manager is not built (" + why + "): run `make test`, or export " + certManagerEnv + "=$(hack/build-cert-manager.sh | tail -n 1)"
	if os.Getenv("SHARDKV_REQUIRE_ENVTEST") != "" {
		t.Fatal(why)
	}
	rules, _, err := configRole("role.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rules {
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					if g == "cert-manager.io" {
						notInAuditLog[permission{g, res, v}] = "the cert-manager tests were skipped: " + why
					}
				}
			}
		}
	}
	t.Skip(why)
	return ""
}

var certManagerCRDs sync.Mutex

// installCertManagerCRDs installs cert-manager's CRDs in the suite's API
// server unless they are there (the API server is shared by every test)
// and waits until they are served.
func installCertManagerCRDs(t *testing.T, dir string) {
	t.Helper()
	certManagerCRDs.Lock()
	defer certManagerCRDs.Unlock()
	ctx := context.Background()
	opts := envtest.CRDInstallOptions{Paths: []string{filepath.Join(dir, "crds")}, ErrorIfPathMissing: true}
	if err := envtest.ReadCRDFiles(&opts); err != nil {
		t.Fatal(err)
	}
	crds := opts.CRDs
	if len(crds) < 4 {
		t.Fatalf("%s/crds: %d CRDs, want Certificate, CertificateRequest, Issuer, ClusterIssuer", dir, len(crds))
	}
	var missing []string
	for _, c := range crds {
		have := &unstructured.Unstructured{}
		have.SetAPIVersion("apiextensions.k8s.io/v1")
		have.SetKind("CustomResourceDefinition")
		switch err := k8sClient.Get(ctx, client.ObjectKey{Name: c.Name}, have); {
		case apierrors.IsNotFound(err):
			missing = append(missing, c.Name)
		case err != nil:
			t.Fatal(err)
		}
	}
	if len(missing) == 0 {
		return
	}
	// Creates the missing ones (and sets any other to the same files).
	if err := envtest.CreateCRDs(testCfg, crds); err != nil {
		t.Fatalf("create cert-manager CRDs %v: %v", missing, err)
	}
	if err := envtest.WaitForCRDs(testCfg, crds, envtest.CRDInstallOptions{MaxTime: waitTimeout, PollInterval: pollEvery}); err != nil {
		t.Fatalf("cert-manager CRDs %v not served: %v", missing, err)
	}
}

// startCertManager runs cert-manager's controller for namespace ns (as the
// API server's admin) until t ends. Its log is shown if t fails.
func startCertManager(t *testing.T, dir, ns string) {
	t.Helper()
	tmp := t.TempDir()
	kubeconfig := filepath.Join(tmp, "kubeconfig")
	kc := clientcmdapi.NewConfig()
	kc.Clusters["envtest"] = &clientcmdapi.Cluster{Server: testCfg.Host, CertificateAuthorityData: testCfg.CAData}
	kc.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: testCfg.CertData, ClientKeyData: testCfg.KeyData, Token: testCfg.BearerToken}
	kc.Contexts["envtest"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "admin"}
	kc.CurrentContext = "envtest"
	if err := clientcmd.WriteToFile(*kc, kubeconfig); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(tmp, "cert-manager.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(dir, "bin", "cert-manager-controller"),
		"--kubeconfig="+kubeconfig,
		"--leader-elect=false",
		"--namespace="+ns,
		"--cluster-resource-namespace="+ns,
		"--controllers="+strings.Join(certManagerControllers, ","),
		"--v=2")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Not left behind if the test binary dies.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start cert-manager: %v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		logFile.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
			if len(lines) > 60 {
				lines = lines[len(lines)-60:]
			}
			t.Logf("cert-manager's log (last %d lines):\n%s", len(lines), strings.Join(lines, "\n"))
		}
	})
	select {
	case err := <-exited:
		b, _ := os.ReadFile(logPath)
		t.Fatalf("cert-manager exited at once: %v\n%s", err, b)
	case <-time.After(500 * time.Millisecond):
	}
}

// cmObject is a cert-manager.io/v1 object of kind in ns.
func cmObject(kind, ns, name string, spec map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"spec": spec}}
	u.SetAPIVersion("cert-manager.io/v1")
	u.SetKind(kind)
	u.SetNamespace(ns)
	u.SetName(name)
	return u
}

func getCertificate(ns, name string) (*unstructured.Unstructured, error) {
	u := cmObject("Certificate", ns, name, nil)
	return u, get(context.Background(), ns, name, u)
}

// startOperatorForCertManager starts the ShardMap reconciler as the
// operator runs (cmd/manager): its cache holds only the Secrets labelled
// managed-by, so it sees cert-manager's Secrets only through the
// Certificates' secretTemplate.
func startOperatorForCertManager(t *testing.T, ns string) {
	t.Helper()
	if err := bindOperator(context.Background(), ns, "manager-role"); err != nil {
		t.Fatal(err)
	}
	newOperatorManager(t, ns, func(o *ctrl.Options) { o.Cache.ByObject = CacheByObject() }, setupShardMap(newFakeDataPlane()))
}

func certManagerShardMap(ns, name, issuer string) *shardkvv1.ShardMap {
	sm := testShardMap(ns, name, 8, 3)
	sm.Spec.TLS = &shardkvv1.TLSSpec{Mode: shardkvv1.TLSCertManager, IssuerRef: &shardkvv1.IssuerRef{Name: issuer},
		CertificateLifetime: &metav1.Duration{Duration: 24 * time.Hour}}
	return sm
}

// issued is a leaf Secret cert-manager filled, parsed.
type issued struct {
	secret *corev1.Secret
	cert   *x509.Certificate
}

// readIssued reads the Secret name and checks what every leaf needs: it
// names identity id, verifies against its own ca.crt for both server and
// client use, and has the given lifetime.
func readIssued(ns, name string, id mtls.Identity, lifetime time.Duration) (issued, error) {
	s := &corev1.Secret{}
	if err := get(context.Background(), ns, name, s); err != nil {
		return issued{}, err
	}
	c := firstCert(s.Data[corev1.TLSCertKey])
	if c == nil {
		return issued{}, fmt.Errorf("secret %s: no certificate in tls.crt", name)
	}
	if len(s.Data[corev1.TLSPrivateKeyKey]) == 0 {
		return issued{}, fmt.Errorf("secret %s: no tls.key", name)
	}
	if got, err := mtls.IdentityOf(c); err != nil || got != id {
		return issued{}, fmt.Errorf("secret %s names %v (%v), want %v", name, got, err, id)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(s.Data[corev1.ServiceAccountRootCAKey]) {
		return issued{}, fmt.Errorf("secret %s: no CA in ca.crt", name)
	}
	for _, u := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
		if _, err := c.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{u}}); err != nil {
			return issued{}, fmt.Errorf("secret %s: the certificate does not verify against its ca.crt for usage %v: %w", name, u, err)
		}
	}
	if life := c.NotAfter.Sub(c.NotBefore); life < lifetime-time.Hour || life > lifetime+time.Hour {
		return issued{}, fmt.Errorf("secret %s: lifetime %s, want %s", name, life, lifetime)
	}
	return issued{s, c}, nil
}

// TestShardMapCertManager: in mode CertManager the operator asks
// cert-manager for every certificate of the cluster (a Certificate per
// Secret, with the identity as URI SAN, owned like mode Managed's Secrets)
// and waits, saying so, until cert-manager has issued them; the Secrets
// cert-manager fills reach the operator's label-filtered cache, name the
// right identities and verify against their ca.crt; a new
// certificateLifetime updates the Certificates and cert-manager issues
// again.
func TestShardMapCertManager(t *testing.T) {
	dir := requireCertManager(t)
	ns := newNamespace(t)
	installCertManagerCRDs(t, dir)
	startCertManager(t, dir, ns)
	startOperatorForCertManager(t, ns)
	ctx := context.Background()

	// The CA comes after the ShardMap, so that each wait is seen: first
	// there is no Issuer, then an Issuer without its CA's Secret.
	mustCreate(t, certManagerShardMap(ns, "cm", "ca"))
	createGroup(t, ns, "cm-a", "cm", 1)
	leaves := []string{CtrlerTLSSecretName("cm"), AdminTLSSecretName("cm"), ClientTLSSecretName("cm"), GroupTLSSecretName("cm-a")}
	want := map[string]mtls.Identity{
		leaves[0]: {Role: mtls.RoleCtrler}, leaves[1]: {Role: mtls.RoleAdmin, Name: "operator"},
		leaves[2]: {Role: mtls.RoleClient, Name: "cm"}, leaves[3]: {Role: mtls.RoleGroup, Group: 1},
	}

	// Issuer "ca" does not exist yet: every Certificate is asked for, and
	// the ShardMap says what it waits for.
	waitSM(t, ns, "cm", "Progressing WaitingForTLS while Issuer ca does not exist", func(sm *shardkvv1.ShardMap) error {
		if err := condIs(sm, shardkvv1.ConditionProgressing, metav1.ConditionTrue, ReasonWaitingForTLS, "waiting for cert-manager to issue"); err != nil {
			return err
		}
		msg := condText(sm, shardkvv1.ConditionProgressing)
		for _, l := range leaves {
			if !strings.Contains(msg, l) {
				return fmt.Errorf("the wait does not name Secret %s: %q", l, msg)
			}
		}
		if !strings.Contains(msg, "Issuer ca does not exist in namespace "+ns) {
			return fmt.Errorf("the wait does not say that Issuer ca is missing: %q", msg)
		}
		return nil
	})
	t.Logf("while Issuer ca does not exist: %s", condText(mustGetSM(t, ns, "cm"), shardkvv1.ConditionProgressing))
	for _, l := range leaves {
		if s := (&corev1.Secret{}); get(ctx, ns, l, s) == nil && len(s.Data[corev1.TLSCertKey]) > 0 {
			t.Fatalf("Secret %s was issued without its Issuer", l)
		}
	}

	// The Certificates: one per Secret, as the operator wants them.
	sm := mustGetSM(t, ns, "cm")
	rg := &shardkvv1.ReplicaGroup{}
	if err := get(ctx, ns, "cm-a", rg); err != nil {
		t.Fatal(err)
	}
	for _, l := range leaves {
		c, err := getCertificate(ns, l)
		if err != nil {
			t.Fatalf("Certificate %s: %v", l, err)
		}
		var owner metav1.Object = sm
		if l == leaves[3] {
			owner = rg
		}
		if !metav1.IsControlledBy(c, owner) {
			t.Errorf("Certificate %s is not controlled by %s: %+v", l, owner.GetName(), c.GetOwnerReferences())
		}
		spec := c.Object["spec"].(map[string]any)
		if got, _, _ := unstructured.NestedStringSlice(spec, "uris"); len(got) != 1 || got[0] != want[l].URI().String() {
			t.Errorf("Certificate %s: uris %v, want [%s]", l, got, want[l].URI())
		}
		if got, _, _ := unstructured.NestedStringMap(spec, "issuerRef"); got["name"] != "ca" || got["kind"] != "Issuer" || got["group"] != "cert-manager.io" {
			t.Errorf("Certificate %s: issuerRef %v, want Issuer ca of cert-manager.io", l, got)
		}
		if got, _, _ := unstructured.NestedStringMap(spec, "secretTemplate", "labels"); got[LabelManagedBy] != ManagedBy || got[LabelInstance] != "cm" {
			t.Errorf("Certificate %s: secretTemplate labels %v, want %s=%s and %s=cm", l, got, LabelManagedBy, ManagedBy, LabelInstance)
		}
		if got, _, _ := unstructured.NestedString(spec, "secretName"); got != l {
			t.Errorf("Certificate %s: secretName %q", l, got)
		}
	}

	// The CA Issuer, whose Secret does not exist yet: not ready, and the
	// ShardMap says so with cert-manager's reason.
	mustCreate(t, cmObject("Issuer", ns, "ca", map[string]any{"ca": map[string]any{"secretName": "test-ca"}}))
	waitSM(t, ns, "cm", "Progressing WaitingForTLS while Issuer ca is not ready", func(sm *shardkvv1.ShardMap) error {
		return condIs(sm, shardkvv1.ConditionProgressing, metav1.ConditionTrue, ReasonWaitingForTLS, "Issuer ca is not ready (Ready=False")
	})
	t.Logf("while Issuer ca is not ready: %s", condText(mustGetSM(t, ns, "cm"), shardkvv1.ConditionProgressing))

	// Its CA, as cert-manager's bootstrap goes: a self-signed Issuer signs
	// a CA Certificate into Secret test-ca. Then cert-manager issues every
	// certificate of the cluster.
	mustCreate(t, cmObject("Issuer", ns, "selfsigned", map[string]any{"selfSigned": map[string]any{}}))
	mustCreate(t, cmObject("Certificate", ns, "test-ca", map[string]any{
		"isCA": true, "commonName": "shardkv test CA", "secretName": "test-ca", "duration": "720h",
		"privateKey": map[string]any{"algorithm": "ECDSA", "size": int64(256)},
		"issuerRef":  map[string]any{"name": "selfsigned", "kind": "Issuer", "group": "cert-manager.io"},
	}))
	got := map[string]issued{}
	eventuallyWithin(t, 2*waitTimeout, "cert-manager to issue every certificate", func() error {
		for _, l := range leaves {
			is, err := readIssued(ns, l, want[l], 24*time.Hour)
			if err != nil {
				return err
			}
			got[l] = is
		}
		return nil
	})
	ca := &corev1.Secret{}
	if err := get(ctx, ns, "test-ca", ca); err != nil {
		t.Fatal(err)
	}
	for l, is := range got {
		if !bytes.Equal(is.secret.Data[corev1.ServiceAccountRootCAKey], ca.Data[corev1.TLSCertKey]) {
			t.Errorf("Secret %s: ca.crt is not the CA Issuer's certificate", l)
		}
		if is.secret.Labels[LabelManagedBy] != ManagedBy || is.secret.Labels[LabelInstance] != "cm" {
			t.Errorf("Secret %s: labels %v", l, is.secret.Labels)
		}
	}
	if dns := got[leaves[0]].cert.DNSNames; len(dns) != 3 || dns[0] != "*."+CtrlerName("cm")+"."+ns+".svc" {
		t.Errorf("controller certificate DNS names %v", dns)
	}

	// The operator saw them (through its label-filtered cache): the wait
	// is over.
	waitSM(t, ns, "cm", "the TLS wait to clear", func(sm *shardkvv1.ShardMap) error {
		c := condText(sm, shardkvv1.ConditionProgressing)
		if strings.Contains(c, "cert-manager") {
			return fmt.Errorf("progressing: %s", c)
		}
		return nil
	})

	// The controller pods mount theirs.
	sts := &appsv1.StatefulSet{}
	eventually(t, "controller StatefulSet", func() error { return get(ctx, ns, CtrlerName("cm"), sts) })
	if v := sts.Spec.Template.Spec.Volumes; len(v) != 1 || v[0].Secret == nil || v[0].Secret.SecretName != leaves[0] {
		t.Errorf("controller pod volumes %+v, want the Secret %s", v, leaves[0])
	}

	// A new lifetime: the operator updates every Certificate, and
	// cert-manager issues again (a new key each time).
	eventually(t, "set certificateLifetime 48h", func() error {
		sm := mustGetSM(t, ns, "cm")
		sm.Spec.TLS.CertificateLifetime = &metav1.Duration{Duration: 48 * time.Hour}
		return k8sClient.Update(ctx, sm)
	})
	eventually(t, "the Certificates updated", func() error {
		for _, l := range leaves {
			c, err := getCertificate(ns, l)
			if err != nil {
				return err
			}
			d, _, _ := unstructured.NestedString(c.Object, "spec", "duration")
			if parsed, err := time.ParseDuration(d); err != nil || parsed != 48*time.Hour {
				return fmt.Errorf("Certificate %s: duration %q", l, d)
			}
		}
		return nil
	})
	eventuallyWithin(t, 2*waitTimeout, "cert-manager to issue again with the new lifetime", func() error {
		for _, l := range leaves {
			is, err := readIssued(ns, l, want[l], 48*time.Hour)
			if err != nil {
				return err
			}
			if is.cert.PublicKeyAlgorithm != x509.ECDSA || bytes.Equal(is.cert.RawSubjectPublicKeyInfo, got[l].cert.RawSubjectPublicKeyInfo) {
				return fmt.Errorf("Secret %s: the key was not renewed", l)
			}
		}
		return nil
	})
	expectEvent(t, ns, "cm", "Certificates", "updated cert-manager Certificate")
}

func mustGetSM(t *testing.T, ns, name string) *shardkvv1.ShardMap {
	t.Helper()
	sm := &shardkvv1.ShardMap{}
	if err := get(context.Background(), ns, name, sm); err != nil {
		t.Fatal(err)
	}
	return sm
}

// condText is the message of sm's condition typ ("" without it).
func condText(sm *shardkvv1.ShardMap, typ string) string {
	for _, c := range sm.Status.Conditions {
		if c.Type == typ {
			return c.Reason + ": " + c.Message
		}
	}
	return ""
}

// TestDesiredCertificateCommonName: the common name is left out where
// cert-manager would refuse it (over 64 characters); the identity is in
// the URI SAN either way.
func TestDesiredCertificateCommonName(t *testing.T) {
	for _, name := range []string{"short", strings.Repeat("x", 50)} {
		sm := certManagerShardMap("ns", name, "ca")
		for _, l := range wantLeaves(sm, nil) {
			spec := desiredCertificate(sm, l, time.Hour, *sm.Spec.TLS.IssuerRef).Object["spec"].(map[string]any)
			cn, _ := spec["commonName"].(string)
			if len(cn) > maxCommonName || (len(name) < 10 && cn != "shardkv "+l.Identity.String()) {
				t.Errorf("ShardMap %s, %s: commonName %q", name, l.Secret, cn)
			}
			if uris, _ := spec["uris"].([]any); len(uris) != 1 || uris[0] != l.Identity.URI().String() {
				t.Errorf("ShardMap %s, %s: uris %v", name, l.Secret, uris)
			}
		}
	}
}
