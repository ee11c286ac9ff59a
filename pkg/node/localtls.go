package node

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/grpc"

	"github.com/shardkv/shardkv/pkg/grpcdial"
	"github.com/shardkv/shardkv/pkg/mtls"
)

// node local --tls: one CA for the cluster under DataDir/tls/ca, one
// certificate per process under DataDir/tls/<name>, and an admin
// certificate for kvctl and the supervisor under DataDir/tls/admin. What
// exists is kept, so a resumed cluster keeps its certificates.

// localCertValidity is long: a local cluster is for trying things out, and
// rotation is shown by replacing the files (docs/security.md).
const localCertValidity = 5 * 365 * 24 * time.Hour

func (o *LocalOptions) tlsDir() string      { return filepath.Join(o.DataDir, "tls") }
func (o *LocalOptions) adminTLSDir() string { return filepath.Join(o.tlsDir(), "admin") }

func (o *LocalOptions) tlsArgs(p *proc) []string {
	if !o.TLS {
		return nil
	}
	f := mtls.FilesIn(filepath.Join(o.tlsDir(), p.name))
	// The kubelet-style readiness check stays open; metrics need the
	// admin certificate.
	return []string{"--tls-cert=" + f.Cert, "--tls-key=" + f.Key, "--tls-ca=" + f.CA, "--http-open=/healthz,/readyz"}
}

// makeCerts makes the CA and the certificates that do not exist yet.
func (o *LocalOptions) makeCerts(all []*proc) error {
	caDir := filepath.Join(o.tlsDir(), "ca")
	certPath, keyPath := filepath.Join(caDir, "ca.crt"), filepath.Join(caDir, "ca.key")
	var ca *mtls.CA
	certPEM, err1 := os.ReadFile(certPath)
	keyPEM, err2 := os.ReadFile(keyPath)
	switch {
	case err1 == nil && err2 == nil:
		if ca, err1 = mtls.ParseCA(certPEM, keyPEM); err1 != nil {
			return err1
		}
	case errors.Is(err1, os.ErrNotExist) && errors.Is(err2, os.ErrNotExist):
		if ca, err1 = mtls.NewCA("shardkv local CA", 10*localCertValidity); err1 != nil {
			return err1
		}
		k, err := ca.KeyPEM()
		if err != nil {
			return err
		}
		if err := os.MkdirAll(caDir, 0o700); err != nil {
			return err
		}
		if err := os.WriteFile(keyPath, k, 0o600); err != nil {
			return err
		}
		if err := os.WriteFile(certPath, ca.CertPEM(), 0o644); err != nil {
			return err
		}
	default:
		return fmt.Errorf("the CA in %s is incomplete: %v", caDir, errors.Join(err1, err2))
	}
	issue := func(dir string, id mtls.Identity) error {
		f := mtls.FilesIn(dir)
		if _, err := os.Stat(f.Cert); err == nil {
			return nil
		}
		c, k, err := ca.Issue(mtls.Request{Identity: id, Hosts: []string{o.Host, "localhost"}, Validity: localCertValidity})
		if err != nil {
			return err
		}
		return mtls.WriteFiles(f, c, k, ca.CertPEM())
	}
	if err := issue(o.adminTLSDir(), mtls.Identity{Role: mtls.RoleAdmin, Name: "local"}); err != nil {
		return err
	}
	for _, p := range all {
		id := mtls.Identity{Role: mtls.RoleCtrler}
		if p.role == "group" {
			id = mtls.Identity{Role: mtls.RoleGroup, Group: p.gid}
		}
		if err := issue(filepath.Join(o.tlsDir(), p.name), id); err != nil {
			return err
		}
	}
	return nil
}

// adminDialOptions are what the supervisor dials the controller with.
func (o *LocalOptions) adminDialOptions() ([]grpc.DialOption, error) {
	if !o.TLS {
		return grpcdial.Options(), nil
	}
	src, err := mtls.Load(mtls.FilesIn(o.adminTLSDir()), nil)
	if err != nil {
		return nil, err
	}
	return grpcdial.OptionsWith(src.ClientCredentials(mtls.AnyNode)), nil
}
