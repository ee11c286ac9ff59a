package mtls_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/shardkv/shardkv/pkg/mtls"
)

// syncBuf is a log sink the test reads while servers write.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func newCA(t *testing.T) *mtls.CA {
	t.Helper()
	ca, err := mtls.NewCA("test CA", 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// issue writes a certificate for id from ca into a fresh dir, trusting
// bundle (ca's own certificate if nil).
func issue(t *testing.T, ca *mtls.CA, id mtls.Identity, bundle []byte, req mtls.Request) mtls.Files {
	t.Helper()
	req.Identity = id
	if req.Validity == 0 {
		req.Validity = time.Hour
	}
	c, k, err := ca.Issue(req)
	if err != nil {
		t.Fatal(err)
	}
	if bundle == nil {
		bundle = ca.CertPEM()
	}
	f := mtls.FilesIn(t.TempDir())
	if err := mtls.WriteFiles(f, c, k, bundle); err != nil {
		t.Fatal(err)
	}
	return f
}

func load(t *testing.T, f mtls.Files, log *slog.Logger) *mtls.Source {
	t.Helper()
	s, err := mtls.Load(f, log)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// serve runs a gRPC health server with src's credentials; returns its
// address and its log.
func serve(t *testing.T, src *mtls.Source) (string, *syncBuf) {
	t.Helper()
	logs := &syncBuf{}
	log := slog.New(slog.NewTextHandler(logs, nil))
	srv := grpc.NewServer(grpc.Creds(src.ServerCredentials(mtls.NewRefusals(log, time.Hour))))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return lis.Addr().String(), logs
}

func check(addr string, opts ...grpc.DialOption) error {
	cc, err := grpc.NewClient("passthrough:///"+addr, opts...)
	if err != nil {
		return err
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_, err = healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
	return err
}

func TestIdentities(t *testing.T) {
	for _, s := range []string{"ctrler", "group/3", "admin", "admin/operator", "client", "client/app-1"} {
		id, err := mtls.ParseIdentity(s)
		if err != nil || id.String() != s {
			t.Fatalf("ParseIdentity(%q) = %v, %v", s, id, err)
		}
	}
	for _, s := range []string{"", "root", "group", "group/0", "group/x", "ctrler/1", "admin/a:b", "client/a/b"} {
		if _, err := mtls.ParseIdentity(s); err == nil {
			t.Errorf("ParseIdentity(%q) accepted", s)
		}
	}
	// The identity survives issuing: it is read from the certificate.
	ca := newCA(t)
	src := load(t, issue(t, ca, mtls.Identity{Role: mtls.RoleGroup, Group: 7}, nil, mtls.Request{}), nil)
	if got := src.Identity(); got != (mtls.Identity{Role: mtls.RoleGroup, Group: 7}) {
		t.Fatalf("identity %v", got)
	}
}

func TestLoadRefusesBadFiles(t *testing.T) {
	ca, other := newCA(t), newCA(t)
	id := mtls.Identity{Role: mtls.RoleCtrler}
	cases := map[string]struct {
		files mtls.Files
		want  string
	}{
		"not from the bundle's CA": {issue(t, other, id, ca.CertPEM(), mtls.Request{}), "does not verify"},
		"expired":                  {issue(t, ca, id, nil, mtls.Request{Now: time.Now().Add(-3 * time.Hour)}), "expired"},
		"partial":                  {mtls.Files{Cert: "x"}, "all three"},
	}
	for name, c := range cases {
		if _, err := mtls.Load(c.files, nil); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Load err = %v, want %q", name, err, c.want)
		}
	}
}

// TestRefusedHandshakes: a wrong CA, an expired certificate and plain text
// are refused, and each kind is logged once however often it is tried.
func TestRefusedHandshakes(t *testing.T) {
	ca, other := newCA(t), newCA(t)
	srvSrc := load(t, issue(t, ca, mtls.Identity{Role: mtls.RoleCtrler}, nil, mtls.Request{}), nil)
	addr, logs := serve(t, srvSrc)

	good := load(t, issue(t, ca, mtls.Identity{Role: mtls.RoleAdmin}, nil, mtls.Request{}), nil)
	if err := check(addr, grpc.WithTransportCredentials(good.ClientCredentials(mtls.AnyNode))); err != nil {
		t.Fatalf("a certificate from the CA: %v", err)
	}
	// A client from another CA (trusting the server's, so only the
	// server can refuse).
	wrong := load(t, issue(t, other, mtls.Identity{Role: mtls.RoleAdmin}, append(other.CertPEM(), ca.CertPEM()...), mtls.Request{}), nil)
	// An expired certificate: loaded while valid, then the clock passes
	// its end (issued 1h ago for 61 minutes, so it expires within a
	// minute; the server sees it expired only then, so issue it as
	// already expired and load it through a fresh bundle instead).
	expiredFiles := issue(t, ca, mtls.Identity{Role: mtls.RoleAdmin}, nil, mtls.Request{Now: time.Now().Add(-2 * time.Hour), Validity: time.Hour})
	expiredCert, err := tls.LoadX509KeyPair(expiredFiles.Cert, expiredFiles.Key)
	if err != nil {
		t.Fatal(err)
	}
	expiredCfg := good.ClientConfig(mtls.AnyNode)
	expiredCfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &expiredCert, nil }

	for i := 0; i < 5; i++ {
		if err := check(addr, grpc.WithTransportCredentials(wrong.ClientCredentials(mtls.AnyNode))); err == nil {
			t.Fatal("a client certificate from another CA was accepted")
		}
		if err := check(addr, grpc.WithTransportCredentials(insecure.NewCredentials())); err == nil {
			t.Fatal("plain text was accepted")
		}
		if err := check(addr, grpc.WithTransportCredentials(credentialsFrom(expiredCfg))); err == nil {
			t.Fatal("an expired client certificate was accepted")
		}
		// Over more than a second: an expired certificate's error names
		// the current time, which must not make each second a new kind of
		// refusal (it did: CI logged "expired" twice).
		time.Sleep(300 * time.Millisecond)
	}
	out := logs.String()
	for _, reason := range []string{"unknown authority", "first record does not look like a TLS handshake", "expired"} {
		if n := strings.Count(out, reason); n != 1 {
			t.Errorf("refusal %q logged %d times, want once:\n%s", reason, n, out)
		}
	}
}

// TestClientChecksServerIdentity: a dialer refuses a server that is not
// the identity it expects, and one from another CA.
func TestClientChecksServerIdentity(t *testing.T) {
	ca, other := newCA(t), newCA(t)
	client := load(t, issue(t, ca, mtls.Identity{Role: mtls.RoleGroup, Group: 1}, append(ca.CertPEM(), other.CertPEM()...), mtls.Request{}), nil)
	// A server that is a client certificate (not a replica).
	impostor, _ := serve(t, load(t, issue(t, ca, mtls.Identity{Role: mtls.RoleClient}, append(ca.CertPEM(), other.CertPEM()...), mtls.Request{}), nil))
	err := check(impostor, grpc.WithTransportCredentials(client.ClientCredentials(mtls.AnyNode)))
	if err == nil || !strings.Contains(err.Error(), "not a shardkv replica") {
		t.Fatalf("dialing a client-certificate server: %v", err)
	}
	g2, _ := serve(t, load(t, issue(t, ca, mtls.Identity{Role: mtls.RoleGroup, Group: 2}, nil, mtls.Request{}), nil))
	if err := check(g2, grpc.WithTransportCredentials(client.ClientCredentials(mtls.Exactly(mtls.Identity{Role: mtls.RoleGroup, Group: 1})))); err == nil || !strings.Contains(err.Error(), "want group/1") {
		t.Fatalf("group 1's Raft dialer reached group 2: %v", err)
	}
	if err := check(g2, grpc.WithTransportCredentials(client.ClientCredentials(mtls.AnyGroup))); err != nil {
		t.Fatalf("a data group dialing another: %v", err)
	}
	// The client trusts only ca now: a server from other is refused.
	client2 := load(t, issue(t, ca, mtls.Identity{Role: mtls.RoleAdmin}, nil, mtls.Request{}), nil)
	foreign, _ := serve(t, load(t, issue(t, other, mtls.Identity{Role: mtls.RoleCtrler}, append(ca.CertPEM(), other.CertPEM()...), mtls.Request{}), nil))
	if err := check(foreign, grpc.WithTransportCredentials(client2.ClientCredentials(mtls.AnyNode))); err == nil || !strings.Contains(err.Error(), "unknown authority") {
		t.Fatalf("a server from another CA: %v", err)
	}
}

// TestReload: new files are used by the next handshake without a restart;
// files that do not verify, or that name another identity, are refused
// once in the log and the old certificate is kept.
func TestReload(t *testing.T) {
	ca := newCA(t)
	id := mtls.Identity{Role: mtls.RoleCtrler}
	files := issue(t, ca, id, nil, mtls.Request{})
	logs := &syncBuf{}
	src := load(t, files, slog.New(slog.NewTextHandler(logs, nil)))
	addr, _ := serve(t, src)
	admin := load(t, issue(t, ca, mtls.Identity{Role: mtls.RoleAdmin}, nil, mtls.Request{}), nil)

	served := func() string {
		t.Helper()
		var serial string
		cfg := admin.ClientConfig(mtls.AnyNode)
		verify := cfg.VerifyConnection
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			serial = cs.PeerCertificates[0].SerialNumber.String()
			return verify(cs)
		}
		if err := check(addr, grpc.WithTransportCredentials(credentialsFrom(cfg))); err != nil {
			t.Fatal(err)
		}
		return serial
	}
	first := served()

	// Rotate: a new certificate for the same identity.
	c, k, err := ca.Issue(mtls.Request{Identity: id, Validity: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := mtls.WriteFiles(files, c, k, ca.CertPEM()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond) // past the recheck interval
	second := served()
	if second == first {
		t.Fatal("the server still presents the old certificate after the files changed")
	}
	if !strings.Contains(logs.String(), "TLS certificate reloaded") {
		t.Fatalf("reload not logged:\n%s", logs)
	}

	// A certificate for another identity is refused; the last one stays.
	c, k, _ = ca.Issue(mtls.Request{Identity: mtls.Identity{Role: mtls.RoleAdmin}, Validity: time.Hour})
	if err := mtls.WriteFiles(files, c, k, ca.CertPEM()); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		time.Sleep(1100 * time.Millisecond)
		if got := served(); got != second {
			t.Fatal("a certificate naming another identity was taken")
		}
	}
	if n := strings.Count(logs.String(), "cannot be used"); n != 1 {
		t.Fatalf("bad files logged %d times, want once:\n%s", n, logs)
	}
	// A half-written rotation (a key that is not the certificate's) too.
	if err := os.WriteFile(files.Key, k, 0o600); err != nil {
		t.Fatal(err)
	}
	c2, _, _ := ca.Issue(mtls.Request{Identity: id, Validity: time.Hour})
	if err := os.WriteFile(files.Cert, c2, 0o644); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond)
	if got := served(); got != second {
		t.Fatal("a mismatched key and certificate were taken")
	}
	if !strings.Contains(logs.String(), "private key does not match") {
		t.Fatalf("mismatch not logged:\n%s", logs)
	}
}

func TestRefusalsOncePerPeriod(t *testing.T) {
	logs := &syncBuf{}
	r := mtls.NewRefusals(slog.New(slog.NewTextHandler(logs, nil)), 200*time.Millisecond)
	for i := 0; i < 50; i++ {
		r.Refuse("a", "refused a")
		r.Refuse("b", "refused b")
	}
	if a, b := strings.Count(logs.String(), "refused a"), strings.Count(logs.String(), "refused b"); a != 1 || b != 1 {
		t.Fatalf("logged a %d and b %d times, want once each:\n%s", a, b, logs)
	}
	time.Sleep(250 * time.Millisecond)
	r.Refuse("a", "refused a")
	if !strings.Contains(logs.String(), "more_since_last_logged=49") {
		t.Fatalf("the second line does not count the quiet ones:\n%s", logs)
	}
}

func TestWriteFilesModes(t *testing.T) {
	ca := newCA(t)
	f := issue(t, ca, mtls.Identity{Role: mtls.RoleClient}, nil, mtls.Request{})
	st, err := os.Stat(f.Key)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("key mode %v", st.Mode().Perm())
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(f.Key), "tls.key.tmp")); err == nil {
		t.Fatal("temporary file left behind")
	}
}
