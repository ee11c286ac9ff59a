package mtls

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// Files names a certificate, its key and the CA bundle that every peer's
// certificate must chain to, as PEM files. The bundle may hold several
// CAs: during a CA rotation it holds the old and the new one.
type Files struct {
	Cert, Key, CA string
}

// FilesIn names the files of a Kubernetes TLS Secret (and cert-manager's)
// mounted at dir: tls.crt, tls.key, ca.crt.
func FilesIn(dir string) Files {
	return Files{Cert: filepath.Join(dir, "tls.crt"), Key: filepath.Join(dir, "tls.key"), CA: filepath.Join(dir, "ca.crt")}
}

// Enabled: any file is named (Validate checks that all are).
func (f Files) Enabled() bool { return f.Cert != "" || f.Key != "" || f.CA != "" }

// Validate: all three or none.
func (f Files) Validate() error {
	if f.Enabled() && (f.Cert == "" || f.Key == "" || f.CA == "") {
		return errors.New("TLS needs a certificate, its key and the CA bundle: give all three files or none")
	}
	return nil
}

// recheckEvery bounds how often a handshake re-reads the files. Kubernetes
// updates a mounted Secret within a minute or so; a second is plenty.
const recheckEvery = time.Second

// Source holds the current certificate, key and CA pool, re-read from
// disk when the files change. It is safe for concurrent use.
type Source struct {
	read func() ([3][]byte, error) // certificate, key, CA bundle (PEM)
	log  *slog.Logger

	mu      sync.Mutex
	checked time.Time
	raw     [3][]byte // the bytes of cur
	badRaw  [3][]byte // the last bytes refused, logged once
	cur     *material
}

type material struct {
	cert *tls.Certificate
	leaf *x509.Certificate
	id   Identity
	pool *x509.CertPool
}

// Load reads the files. The certificate must name a shardkv identity,
// chain to the CA bundle and be valid now.
func Load(f Files, log *slog.Logger) (*Source, error) {
	if err := f.Validate(); err != nil {
		return nil, err
	}
	if !f.Enabled() {
		return nil, errors.New("no TLS files given")
	}
	return LoadFunc(f.read, log)
}

// LoadFunc is Load for material kept elsewhere than in files (the
// operator reads it from a Kubernetes Secret): read returns the
// certificate, its key and the CA bundle as PEM, and is called again at
// most once a second on handshakes and on every Run tick.
func LoadFunc(read func() (certPEM, keyPEM, caPEM []byte, err error), log *slog.Logger) (*Source, error) {
	s := &Source{read: func() ([3][]byte, error) {
		c, k, ca, err := read()
		return [3][]byte{c, k, ca}, err
	}, log: log}
	raw, err := s.read()
	if err != nil {
		return nil, err
	}
	m, err := parse(raw, time.Now())
	if err != nil {
		return nil, err
	}
	s.raw, s.cur, s.checked = raw, m, time.Now()
	return s, nil
}

// Identity is whom this process's certificate names. It cannot change on
// reload.
func (s *Source) Identity() Identity {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur.id
}

// NotAfter is when the current certificate expires.
func (s *Source) NotAfter() time.Time { return s.current().leaf.NotAfter }

// Run re-reads the files every period until ctx ends, so that a rotation
// is picked up (and logged) even while no connection is made.
func (s *Source) Run(ctx context.Context, period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.reload(true)
		}
	}
}

// current is the material to use now, re-read if the last check is old.
func (s *Source) current() *material {
	s.reload(false)
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur
}

// reload re-reads the files (force: whatever the last check's age). New
// bytes that do not parse, or that name another identity, are refused and
// the old material kept: a rotation may write the files one at a time,
// and the next check sees them whole.
func (s *Source) reload(force bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	if !force && now.Sub(s.checked) < recheckEvery {
		return
	}
	s.checked = now
	raw, err := s.read()
	if err != nil {
		s.refuse(raw, err)
		return
	}
	if same(raw, s.raw) {
		return
	}
	m, err := parse(raw, now)
	if err == nil && m.id != s.cur.id {
		err = fmt.Errorf("the new certificate names %s, but this process is %s", m.id, s.cur.id)
	}
	if err != nil {
		s.refuse(raw, err)
		return
	}
	s.raw, s.cur = raw, m
	if s.log != nil {
		s.log.Info("TLS certificate reloaded", "identity", m.id, "serial", m.leaf.SerialNumber.String(), "not_after", m.leaf.NotAfter.UTC())
	}
}

func (s *Source) refuse(raw [3][]byte, err error) {
	if same(raw, s.badRaw) {
		return
	}
	s.badRaw = raw
	if s.log != nil {
		s.log.Error("TLS files changed but cannot be used; keeping the certificate loaded before", "err", err)
	}
}

func same(a, b [3][]byte) bool {
	return bytes.Equal(a[0], b[0]) && bytes.Equal(a[1], b[1]) && bytes.Equal(a[2], b[2])
}

func (f Files) read() (certPEM, keyPEM, caPEM []byte, err error) {
	var raw [3][]byte
	for i, p := range []string{f.Cert, f.Key, f.CA} {
		if raw[i], err = os.ReadFile(p); err != nil {
			return nil, nil, nil, fmt.Errorf("read TLS file: %w", err)
		}
	}
	return raw[0], raw[1], raw[2], nil
}

func parse(raw [3][]byte, now time.Time) (*material, error) {
	cert, err := tls.X509KeyPair(raw[0], raw[1])
	if err != nil {
		return nil, fmt.Errorf("TLS certificate and key: %w", err)
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		return nil, fmt.Errorf("TLS certificate: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(raw[2]) {
		return nil, errors.New("TLS CA bundle: no PEM certificate in it")
	}
	id, err := IdentityOf(leaf)
	if err != nil {
		return nil, err
	}
	if _, err := leaf.Verify(verifyOptions(pool, cert.Certificate[1:], now, x509.ExtKeyUsageAny)); err != nil {
		return nil, fmt.Errorf("TLS certificate %q does not verify against the CA bundle: %w", leaf.Subject.CommonName, err)
	}
	return &material{cert: &cert, leaf: leaf, id: id, pool: pool}, nil
}

func verifyOptions(pool *x509.CertPool, chain [][]byte, now time.Time, usage x509.ExtKeyUsage) x509.VerifyOptions {
	inter := x509.NewCertPool()
	for _, der := range chain {
		if c, err := x509.ParseCertificate(der); err == nil {
			inter.AddCert(c)
		}
	}
	return x509.VerifyOptions{Roots: pool, Intermediates: inter, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{usage}}
}

// ServerConfig is a TLS server configuration on the current material:
// auth says whether a client certificate is required (gRPC), optional
// (the Redis and HTTP ports, where a password or token may stand in), or
// not asked for. A client certificate given must chain to the CA bundle.
func (s *Source) ServerConfig(auth tls.ClientAuthType, nextProtos ...string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			m := s.current()
			return &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{*m.cert},
				ClientCAs: m.pool, ClientAuth: auth, NextProtos: nextProtos}, nil
		},
	}
}

// ClientConfig is a TLS client configuration on the current material. The
// server's certificate must chain to the CA bundle and name an identity
// that accept takes. Host names are not checked: replicas are dialed by
// addresses that change, and the identity is what matters.
func (s *Source) ClientConfig(accept Accept) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		// Verified by VerifyConnection against the current CA bundle and
		// by identity: a static RootCAs would not see a rotation.
		InsecureSkipVerify: true, //nolint:gosec // see VerifyConnection
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return s.current().cert, nil
		},
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("server sent no certificate")
			}
			m := s.current()
			leaf := cs.PeerCertificates[0]
			var chain [][]byte
			for _, c := range cs.PeerCertificates[1:] {
				chain = append(chain, c.Raw)
			}
			if _, err := leaf.Verify(verifyOptions(m.pool, chain, time.Now(), x509.ExtKeyUsageServerAuth)); err != nil {
				return fmt.Errorf("server certificate %q: %w", leaf.Subject.CommonName, err)
			}
			id, err := IdentityOf(leaf)
			if err != nil {
				return err
			}
			return accept(id)
		},
	}
}
