package kvctl

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/shardkv/shardkv/pkg/mtls"
)

// CA files in a `kvctl cert ca --out` directory.
const (
	caCertFile = "ca.crt"
	caKeyFile  = "ca.key"
)

func cmdCertCA(k *kvctl, args []string) error {
	fs := newFlags("cert ca")
	out := fs.String("out", "", "")
	name := fs.String("name", "shardkv", "")
	validity := fs.Duration("validity", 10*365*24*time.Hour, "")
	if _, err := k.parse(fs, args, 0, 0); err != nil {
		return err
	}
	if *out == "" {
		return usagef(nil, "--out=DIR is required")
	}
	if *validity <= 0 {
		return usagef(nil, "--validity must be positive")
	}
	keyPath := filepath.Join(*out, caKeyFile)
	if _, err := os.Stat(keyPath); err == nil {
		return fmt.Errorf("%s exists: refusing to replace a CA (certificates it issued would stop verifying); remove it first", keyPath)
	}
	ca, err := mtls.NewCA(*name, *validity)
	if err != nil {
		return err
	}
	keyPEM, err := ca.KeyPEM()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(*out, 0o700); err != nil {
		return err
	}
	if err := os.WriteFile(keyPath, keyPEM, 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(*out, caCertFile), ca.CertPEM(), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(k.stdout, "CA %q valid until %s: %s, %s\n", *name, ca.NotAfter().UTC().Format(time.RFC3339), filepath.Join(*out, caCertFile), keyPath)
	return nil
}

func cmdCertIssue(k *kvctl, args []string) error {
	fs := newFlags("cert issue")
	caDir := fs.String("ca", "", "")
	out := fs.String("out", "", "")
	hosts := fs.String("hosts", "", "")
	validity := fs.Duration("validity", 365*24*time.Hour, "")
	pos, err := k.parse(fs, args, 1, 1)
	if err != nil {
		return err
	}
	id, err := mtls.ParseIdentity(pos[0])
	if err != nil {
		return usagef(nil, "%v", err)
	}
	if *caDir == "" || *out == "" {
		return usagef(nil, "--ca=DIR (from 'kvctl cert ca') and --out=DIR are required")
	}
	if *validity <= 0 {
		return usagef(nil, "--validity must be positive")
	}
	ca, err := loadCA(*caDir)
	if err != nil {
		return err
	}
	var hs []string
	for _, h := range strings.Split(*hosts, ",") {
		if h = strings.TrimSpace(h); h != "" {
			hs = append(hs, h)
		}
	}
	certPEM, keyPEM, err := ca.Issue(mtls.Request{Identity: id, Hosts: hs, Validity: *validity})
	if err != nil {
		return err
	}
	files := mtls.FilesIn(*out)
	if err := mtls.WriteFiles(files, certPEM, keyPEM, ca.CertPEM()); err != nil {
		return err
	}
	fmt.Fprintf(k.stdout, "%s: %s, %s, %s\n", id, files.Cert, files.Key, files.CA)
	return nil
}

// loadCA reads the CA that `kvctl cert ca` wrote to dir.
func loadCA(dir string) (*mtls.CA, error) {
	c, err1 := os.ReadFile(filepath.Join(dir, caCertFile))
	key, err2 := os.ReadFile(filepath.Join(dir, caKeyFile))
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("--ca: %w", err)
	}
	return mtls.ParseCA(c, key)
}
