package node

import (
	"bytes"
	"context"
	"crypto/subtle"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/shardkv/shardkv/pkg/grpcdial"
	"github.com/shardkv/shardkv/pkg/mtls"
)

// security is a replica's TLS material and what it allows; nil when TLS is
// off, and then every method gives plaintext.
type security struct {
	src  *mtls.Source
	self mtls.Identity
	log  *slog.Logger
}

// loadSecurity reads --tls-*: the certificate must name this replica's
// role and group, so that a certificate copied to the wrong pod fails at
// start, not at every peer.
func loadSecurity(o *Options, log *slog.Logger) (*security, error) {
	if !o.TLS.Enabled() {
		return nil, nil
	}
	src, err := mtls.Load(o.TLS, log.With("tls", "certificate"))
	if err != nil {
		return nil, fmt.Errorf("--tls-cert: %w", err)
	}
	want := mtls.Identity{Role: mtls.RoleCtrler}
	if o.Role == "group" {
		want = mtls.Identity{Role: mtls.RoleGroup, Group: o.Group}
	}
	if err := mtls.Exactly(want)(src.Identity()); err != nil {
		return nil, fmt.Errorf("--tls-cert names %s, but this replica is %s", src.Identity(), want)
	}
	log.Info("mutual TLS on", "identity", src.Identity(), "not_after", src.NotAfter().UTC())
	return &security{src: src, self: src.Identity(), log: log}, nil
}

// run re-reads the files every few seconds until ctx ends.
func (s *security) run(ctx context.Context) {
	if s != nil {
		s.src.Run(ctx, 5*time.Second)
	}
}

// member accepts only replicas of this replica's own group.
func (s *security) member() mtls.Accept {
	if s == nil {
		return nil
	}
	return mtls.Exactly(s.self)
}

// creds are the client credentials for dialing peers that accept takes.
func (s *security) creds(accept mtls.Accept) credentials.TransportCredentials {
	if s == nil {
		return nil
	}
	return s.src.ClientCredentials(accept)
}

// dialOptions are grpcdial's options with creds(accept).
func (s *security) dialOptions(accept mtls.Accept) []grpc.DialOption {
	return grpcdial.OptionsWith(s.creds(accept))
}

// serverOptions: TLS credentials and the authorizer's interceptors (first
// in the chain, so nothing runs for a refused call).
func (s *security) serverOptions() (opts []grpc.ServerOption, unary []grpc.UnaryServerInterceptor, stream []grpc.StreamServerInterceptor) {
	if s == nil {
		return nil, nil, nil
	}
	a := newAuthorizer(s.self, s.log.With("tls", "authz"))
	return []grpc.ServerOption{grpc.Creds(s.src.ServerCredentials(mtls.NewRefusals(s.log.With("tls", "handshake"), time.Minute)))},
		[]grpc.UnaryServerInterceptor{a.unary}, []grpc.StreamServerInterceptor{a.stream}
}

// httpGuard opens the HTTP endpoints to a bearer token (--http-token-file)
// or an admin client certificate, and the --http-open paths to anyone.
// With neither TLS nor a token configured, everything is open, as before.
type httpGuard struct {
	open      []string
	tokenFile string
	tls       bool
	refusals  *mtls.Refusals

	mu      sync.Mutex
	checked time.Time
	token   []byte
}

func newHTTPGuard(o *Options, tlsOn bool, log *slog.Logger) *httpGuard {
	return &httpGuard{open: o.HTTPOpen, tokenFile: o.HTTPTokenFile, tls: tlsOn, refusals: mtls.NewRefusals(log.With("api", "http"), time.Minute)}
}

func (g *httpGuard) on() bool { return g.tls || g.tokenFile != "" }

// currentToken re-reads the token file at most once a second, so that a
// rotated Secret takes effect without a restart. An unreadable or empty
// file opens nothing.
func (g *httpGuard) currentToken() []byte {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.tokenFile == "" {
		return nil
	}
	if time.Since(g.checked) >= time.Second {
		g.checked = time.Now()
		b, err := os.ReadFile(g.tokenFile)
		if err != nil {
			b = nil
		}
		g.token = bytes.TrimSpace(b)
	}
	return g.token
}

func (g *httpGuard) allowed(r *http.Request) bool {
	if !g.on() || slices.Contains(g.open, r.URL.Path) {
		return true
	}
	if tok := g.currentToken(); len(tok) > 0 {
		if got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && subtle.ConstantTimeCompare([]byte(got), tok) == 1 {
			return true
		}
	}
	if r.TLS != nil && len(r.TLS.VerifiedChains) > 0 {
		if id, err := mtls.IdentityOf(r.TLS.VerifiedChains[0][0]); err == nil && id.Role == mtls.RoleAdmin {
			return true
		}
	}
	return false
}

// slowRefusal delays an unauthorized HTTP answer, so guessing tokens is
// slow.
const slowRefusal = 200 * time.Millisecond

func (g *httpGuard) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if g.allowed(r) {
			h.ServeHTTP(w, r)
			return
		}
		host := r.RemoteAddr
		if i := strings.LastIndexByte(host, ':'); i >= 0 {
			host = host[:i]
		}
		g.refusals.Refuse("http "+host+" "+r.URL.Path, "HTTP request refused: no valid token or admin certificate", "peer", host, "path", r.URL.Path)
		time.Sleep(slowRefusal)
		w.Header().Set("WWW-Authenticate", `Bearer realm="shardkv"`)
		http.Error(w, "unauthorized: send 'Authorization: Bearer <token>' or an admin client certificate; open paths: "+strings.Join(g.open, ","), http.StatusUnauthorized)
	})
}
