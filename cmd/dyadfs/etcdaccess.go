package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/pflag"

	"github.com/dyadfs/dyadfs/hfl/store/etcd"
)

// etcdAccess is how a command reaches an etcd that sites run for many
// users: TLS with their CA and a client certificate, and etcd's own users.
type etcdAccess struct {
	CACert, Cert, Key  string
	User, PasswordFile string
	// InsecureSecret lets the job secret be kept in an etcd that anyone
	// reaching it can read.
	InsecureSecret bool
}

// etcdEnv lists the access's environment variables (flags win over them).
var etcdEnv = []struct {
	name, flag string
	field      func(a *etcdAccess) *string
}{
	{"DYADFS_ETCD_CACERT", "etcd-cacert", func(a *etcdAccess) *string { return &a.CACert }},
	{"DYADFS_ETCD_CERT", "etcd-cert", func(a *etcdAccess) *string { return &a.Cert }},
	{"DYADFS_ETCD_KEY", "etcd-key", func(a *etcdAccess) *string { return &a.Key }},
	{"DYADFS_ETCD_USER", "etcd-user", func(a *etcdAccess) *string { return &a.User }},
	{"DYADFS_ETCD_PASSWORD_FILE", "etcd-password-file", func(a *etcdAccess) *string { return &a.PasswordFile }},
}

// fromEnv sets what the environment says.
func (a *etcdAccess) fromEnv() error {
	for _, e := range etcdEnv {
		if v, ok := lookupEnv(e.name); ok {
			*e.field(a) = v
		}
	}
	if v, ok := lookupEnv(insecureSecretEnv); ok {
		b, err := parseBool(v)
		if err != nil {
			return fmt.Errorf("%s=%q: %v", insecureSecretEnv, v, err)
		}
		a.InsecureSecret = b
	}
	return nil
}

const insecureSecretEnv = "DYADFS_INSECURE_STORE_SECRET"

// flags binds the access's flags.
func (a *etcdAccess) flags(f *pflag.FlagSet, withSecret bool) {
	f.StringVar(&a.CACert, "etcd-cacert", a.CACert, "`FILE`: the CA that signed etcd's certificate (https:// stores; DYADFS_ETCD_CACERT)")
	f.StringVar(&a.Cert, "etcd-cert", a.Cert, "`FILE`: this node's client certificate for etcd (DYADFS_ETCD_CERT)")
	f.StringVar(&a.Key, "etcd-key", a.Key, "`FILE`: the client certificate's key (DYADFS_ETCD_KEY)")
	f.StringVar(&a.User, "etcd-user", a.User, "etcd user `NAME` (DYADFS_ETCD_USER)")
	f.StringVar(&a.PasswordFile, "etcd-password-file", a.PasswordFile, "`FILE` holding the etcd user's password, never given on the command line (DYADFS_ETCD_PASSWORD_FILE)")
	if withSecret {
		f.BoolVar(&a.InsecureSecret, "insecure-store-secret", a.InsecureSecret, "keep the generated job secret in an etcd reached without TLS client certificates or a user, where anyone who reaches etcd reads it and can join the job ("+insecureSecretEnv+")")
	}
}

// config is the etcd store's configuration for u.
func (a etcdAccess) config(u storeURL) (etcd.Config, error) {
	cfg := etcd.DefaultConfig(u.etcd...)
	if !u.tls && (a.CACert != "" || a.Cert != "" || a.Key != "") {
		return cfg, fmt.Errorf("--etcd-cacert, --etcd-cert and --etcd-key are for etcd over TLS: write the store as https://%s", u.addr)
	}
	if (a.Cert == "") != (a.Key == "") {
		return cfg, fmt.Errorf("--etcd-cert and --etcd-key go together")
	}
	if u.tls {
		tc := &tls.Config{MinVersion: tls.VersionTLS12}
		if a.CACert != "" {
			pem, err := os.ReadFile(a.CACert)
			if err != nil {
				return cfg, fmt.Errorf("--etcd-cacert: %w", err)
			}
			tc.RootCAs = x509.NewCertPool()
			if !tc.RootCAs.AppendCertsFromPEM(pem) {
				return cfg, fmt.Errorf("--etcd-cacert %s: no PEM certificate in it", a.CACert)
			}
		}
		if a.Cert != "" {
			pair, err := tls.LoadX509KeyPair(a.Cert, a.Key)
			if err != nil {
				return cfg, fmt.Errorf("--etcd-cert %s, --etcd-key %s: %w", a.Cert, a.Key, err)
			}
			tc.Certificates = []tls.Certificate{pair}
		}
		cfg.TLS = tc
	}
	if (a.User == "") != (a.PasswordFile == "") {
		return cfg, fmt.Errorf("--etcd-user and --etcd-password-file go together")
	}
	if a.User != "" {
		if st, err := os.Stat(a.PasswordFile); err == nil && st.Mode().Perm()&0o077 != 0 {
			return cfg, fmt.Errorf("--etcd-password-file %s can be read by other users: chmod 600 %s", a.PasswordFile, a.PasswordFile)
		}
		b, err := os.ReadFile(a.PasswordFile)
		if err != nil {
			return cfg, fmt.Errorf("--etcd-password-file: %w", err)
		}
		cfg.Username, cfg.Password = a.User, strings.TrimRight(string(b), "\r\n")
	}
	return cfg, nil
}
