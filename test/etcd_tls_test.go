package test

import (
	"context"
	"time"

	"errors"
	"fmt"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dyadfs/dyadfs/hfl/store/etcd/etcdtest"
)

// freePort is a TCP port on 127.0.0.1 that was free a moment ago.
func freePort(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return fmt.Sprint(ln.Addr().(*net.TCPAddr).Port)
}

// twoShare mounts nodes n1 and n2 with mount (how they reach the store,
// for failure messages) and checks that n2 reads the line text that n1
// writes.
func twoShare(t *testing.T, how, text string, mount func(node string) (mnt, out string, err error)) {
	t.Helper()
	m1, out, err := mount("n1")
	if err != nil {
		t.Fatalf("mount %s: %v\n%s", how, err, out)
	}
	m2, out, err := mount("n2")
	if err != nil {
		t.Fatalf("second mount %s: %v\n%s", how, err, out)
	}
	mustSh(t, m1, "echo "+text+" > f")
	if r := run(t, m2, "cat", "f"); r.err != nil || r.stdout != text+"\n" {
		t.Fatalf("the other node reads f: %v", r)
	}
}

// tlsFiles makes, with openssl, a CA, etcd's server certificate for
// 127.0.0.1 and a client certificate, all signed by the CA.
type tlsFiles struct {
	etcdtest.TLSFiles
	ClientCert, ClientKey string
}

func makeTLSFiles(t *testing.T) tlsFiles {
	t.Helper()
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Skip("openssl is not installed: the TLS certificates cannot be made")
	}
	dir := t.TempDir()
	p := func(name string) string { return filepath.Join(dir, name) }
	openssl := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("openssl", args...).CombinedOutput(); err != nil {
			t.Fatalf("openssl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	key := []string{"-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"}
	openssl(append(append([]string{"req", "-x509"}, key...), "-keyout", p("ca.key"), "-out", p("ca.pem"), "-days", "2", "-subj", "/CN=dyadfs test CA")...)
	sign := func(name, ext string) {
		os.WriteFile(p(name+".ext"), []byte(ext), 0o600)
		openssl(append(append([]string{"req"}, key...), "-keyout", p(name+".key"), "-out", p(name+".csr"), "-subj", "/CN="+name)...)
		openssl("x509", "-req", "-in", p(name+".csr"), "-CA", p("ca.pem"), "-CAkey", p("ca.key"), "-CAcreateserial",
			"-out", p(name+".pem"), "-days", "2", "-extfile", p(name+".ext"))
	}
	sign("etcd", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n")
	sign("node", "extendedKeyUsage=clientAuth\n")
	return tlsFiles{
		TLSFiles:   etcdtest.TLSFiles{CA: p("ca.pem"), Cert: p("etcd.pem"), Key: p("etcd.key")},
		ClientCert: p("node.pem"), ClientKey: p("node.key"),
	}
}

// TestEtcdTLS: daemons reach an etcd that requires TLS client certificates
// (as sites run a shared etcd) and keep the job secret there, out of
// strangers' reach: one publishes, another fetches. A daemon without a
// client certificate is refused before it mounts: as one that would keep
// the secret in reach of anyone, or, told to accept that, by etcd.
func TestEtcdTLS(t *testing.T) {
	requireEnv(t)
	files := makeTLSFiles(t)
	srv := etcdtest.StartTLS(t, files.TLSFiles)
	// Not told to accept a secret in clear: a client certificate is what
	// allows the generated secret.
	env := []string{"DYADFS_INSECURE_STORE_SECRET=0"}
	mountNode := func(node, port string, extra ...string) (string, string, error) {
		_, mnt, backing := mountDirs(t)
		args := append([]string{"mount", "--store", srv.URL(), "--etcd-cacert", files.CA,
			"--namespace", "tlsjob", "--node", node, "--listen", "127.0.0.1:" + port, "--backing", backing,
			"--log-file", filepath.Join(filepath.Dir(mnt), "dyadfs.log"), "--log-level", "debug"}, extra...)
		out, err := dyadfsEnv(t, env, append(args, mnt)...)
		if err == nil {
			t.Cleanup(func() { exec.Command("fusermount3", "-u", mnt).Run() })
		}
		return mnt, out, err
	}
	cert := []string{"--etcd-cert", files.ClientCert, "--etcd-key", files.ClientKey}
	twoShare(t, "with a client certificate", "over tls", func(node string) (string, string, error) {
		return mountNode(node, freePort(t), cert...)
	})

	var ee *exec.ExitError
	_, out, err := mountNode("n3", freePort(t))
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(out, "would be kept in clear") || strings.Count(strings.TrimSpace(out), "\n") != 0 {
		t.Fatalf("mount without a client certificate: %v, want exit 2 and one line\n%s", err, out)
	}
	_, out, err = mountNode("n3", freePort(t), "--insecure-store-secret")
	if !errors.As(err, &ee) || ee.ExitCode() != 7 || !strings.Contains(out, "https://"+srv.Endpoints()) || !strings.Contains(out, "client certificate") {
		t.Fatalf("mount without a client certificate, accepting the risk: %v, want exit 7 naming the store and the certificate\n%s", err, out)
	}
}

// TestEtcdUser: daemons reach an etcd that requires a user and password
// (its own access control, over plain HTTP) with --etcd-user and a
// password file, and may keep the generated job secret there; a wrong
// password fails the mount in one line, naming what to check.
func TestEtcdUser(t *testing.T) {
	requireEnv(t)
	srv := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	raw, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoints()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	for _, step := range []func() error{
		func() error { _, err := raw.UserAdd(ctx, "root", "root-password"); return err },
		func() error { _, err := raw.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := raw.UserAdd(ctx, "job42", "job-password"); return err },
		func() error { _, err := raw.UserGrantRole(ctx, "job42", "root"); return err },
		func() error { _, err := raw.AuthEnable(ctx); return err },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	dir := t.TempDir()
	password := func(name, pw string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(pw+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	env := []string{"DYADFS_INSECURE_STORE_SECRET=0"}
	mountNode := func(node, pwFile string) (string, string, error) {
		_, mnt, backing := mountDirs(t)
		out, err := dyadfsEnv(t, env, "mount", "--store", srv.URL(), "--etcd-user", "job42", "--etcd-password-file", pwFile,
			"--namespace", "userjob", "--node", node, "--listen", "127.0.0.1:"+freePort(t), "--backing", backing,
			"--log-file", filepath.Join(filepath.Dir(mnt), "dyadfs.log"), mnt)
		if err == nil {
			t.Cleanup(func() { exec.Command("fusermount3", "-u", mnt).Run() })
		}
		return mnt, out, err
	}
	good := password("good", "job-password")
	twoShare(t, "as an etcd user", "as a user", func(node string) (string, string, error) {
		return mountNode(node, good)
	})
	var ee *exec.ExitError
	_, out, err := mountNode("n3", password("bad", "not-it"))
	if !errors.As(err, &ee) || ee.ExitCode() != 7 || !strings.Contains(out, "invalid user ID or password") || strings.Count(strings.TrimSpace(out), "\n") != 0 {
		t.Fatalf("mount with a wrong password: %v, want exit 7 and one line saying the user or password is wrong\n%s", err, out)
	}
}
