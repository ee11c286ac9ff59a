package mtls

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"time"
)

// CA issues certificates for one cluster.
type CA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// clockSkew back-dates NotBefore so that a peer whose clock runs a little
// behind accepts a certificate issued a moment ago.
const clockSkew = 5 * time.Minute

// NewCA makes a self-signed CA valid from now for validity.
func NewCA(commonName string, validity time.Duration) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: commonName, Organization: []string{"shardkv"}},
		NotBefore: now.Add(-clockSkew), NotAfter: now.Add(validity),
		IsCA: true, BasicConstraintsValid: true, MaxPathLenZero: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{cert: cert, key: key}, nil
}

// ParseCA reads a CA's certificate and EC private key (PEM).
func ParseCA(certPEM, keyPEM []byte) (*CA, error) {
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, errors.New("CA: want a PEM certificate and a PEM key")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("CA certificate: %w", err)
	}
	if !cert.IsCA {
		return nil, fmt.Errorf("CA certificate %q is not a CA", cert.Subject.CommonName)
	}
	k, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("CA key: %w", err)
	}
	key, ok := k.(*ecdsa.PrivateKey)
	if !ok || !key.PublicKey.Equal(cert.PublicKey) {
		return nil, errors.New("CA key: not the EC key of the CA certificate")
	}
	return &CA{cert: cert, key: key}, nil
}

// CertPEM is the CA certificate, for peers' bundles.
func (ca *CA) CertPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.cert.Raw})
}

// KeyPEM is the CA's private key (PKCS #8).
func (ca *CA) KeyPEM() ([]byte, error) { return keyPEM(ca.key) }

// NotAfter is when the CA expires.
func (ca *CA) NotAfter() time.Time { return ca.cert.NotAfter }

// Request is what to put in a certificate.
type Request struct {
	Identity Identity
	// Hosts are DNS names and IP addresses for clients that check host
	// names (redis-cli --tls, curl); shardkv's own clients check the
	// identity instead.
	Hosts    []string
	Validity time.Duration
	// Now is the issue time (default: the clock); tests back-date
	// certificates with it.
	Now time.Time
}

// Issue makes a key and a certificate for req, usable to serve and to
// dial (replicas do both). It returns them as PEM.
func (ca *CA) Issue(req Request) (certPEM, keyPEMOut []byte, err error) {
	if _, err := ParseIdentity(req.Identity.String()); err != nil {
		return nil, nil, err
	}
	if req.Validity <= 0 {
		return nil, nil, errors.New("certificate validity must be positive")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := newSerial()
	if err != nil {
		return nil, nil, err
	}
	now := req.Now
	if now.IsZero() {
		now = time.Now()
	}
	notAfter := now.Add(req.Validity)
	if notAfter.After(ca.cert.NotAfter) {
		notAfter = ca.cert.NotAfter
	}
	cn := "shardkv " + req.Identity.String()
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: cn, Organization: []string{"shardkv"}},
		NotBefore: now.Add(-clockSkew), NotAfter: notAfter,
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		URIs:        []*url.URL{req.Identity.URI()},
	}
	for _, h := range req.Hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, nil, err
	}
	kp, err := keyPEM(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), kp, nil
}

// WriteFiles writes a certificate, its key and the CA bundle as the files
// of f, each through a temporary file and a rename, so that a reader
// never sees half a file. The key is readable by its owner only.
func WriteFiles(f Files, certPEM, keyPEM, caPEM []byte) error {
	for _, w := range []struct {
		path string
		data []byte
		mode os.FileMode
	}{{f.Key, keyPEM, 0o600}, {f.Cert, certPEM, 0o644}, {f.CA, caPEM, 0o644}} {
		if err := os.MkdirAll(filepath.Dir(w.path), 0o755); err != nil {
			return err
		}
		tmp := w.path + ".tmp"
		if err := os.WriteFile(tmp, w.data, w.mode); err != nil {
			return err
		}
		if err := os.Rename(tmp, w.path); err != nil {
			return err
		}
	}
	return nil
}

func keyPEM(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

func newSerial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
}
