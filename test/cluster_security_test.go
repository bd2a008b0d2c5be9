package test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dyadfs/dyadfs/dtl"
	"github.com/dyadfs/dyadfs/dtl/tcp"
	"github.com/dyadfs/dyadfs/fs"
)

func init() {
	// dtl-get WIRE ADDR PATH SECRET-FILE: ask the transport (tcp or ucx)
	// at ADDR for PATH and print "ok SIZE" or the refusal.
	helpers["dtl-get"] = func(args []string) int {
		wireName, args := args[0], args[1:]
		secret, err := os.ReadFile(args[2])
		if err != nil {
			fmt.Println(err)
			return 1
		}
		cfg := dtl.DefaultConfig()
		cfg.Node, cfg.Listen, cfg.Secret = "probe", "127.0.0.1:0", []byte(strings.TrimSpace(string(secret)))
		cfg.DialTimeout, cfg.StallTimeout = 5*time.Second, 5*time.Second
		var t dtl.Transport
		if wireName == "ucx" {
			t, err = newUCX(cfg)
		} else {
			t, err = tcp.New(cfg)
		}
		if err != nil {
			fmt.Println(err)
			return 1
		}
		defer t.Close()
		dst, err := os.CreateTemp("", "dtl-get-")
		if err != nil {
			fmt.Println(err)
			return 1
		}
		defer os.Remove(dst.Name())
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		info, err := t.Fetch(ctx, args[0], dtl.Request{Path: args[1]}, dtl.NewSink(dst))
		for _, e := range []struct {
			err  error
			name string
		}{
			{dtl.ErrOutside, "outside"}, {dtl.ErrNotPublished, "not-published"}, {dtl.ErrBusy, "busy"},
			{dtl.ErrNotFound, "not-found"}, {dtl.ErrUnauthorized, "unauthorized"},
		} {
			if errors.Is(err, e.err) {
				fmt.Println(e.name)
				return 0
			}
		}
		if err != nil {
			fmt.Println("error:", err)
			return 0
		}
		fmt.Println("ok", info.Size)
		return 0
	}
}

// TestClusterTransportRefusals: the owner serves only published, complete
// files of its own backing store, and only to peers holding the job secret.
func TestClusterTransportRefusals(t *testing.T) {
	forEachWire(t, func(t *testing.T, w wire) {
		c := newClusterOn(t, w, 0)
		c.secret = filepath.Join(c.dir, "secret")
		os.WriteFile(c.secret, []byte("0123456789abcdef0123456789abcdef\n"), 0o600)
		wrong := filepath.Join(c.dir, "wrong-secret")
		os.WriteFile(wrong, []byte("fedcba9876543210fedcba9876543210\n"), 0o600)
		a := c.addNode("n0")
		b := c.addNode("n1")

		a.mustSh("echo published > ok.dat && mkdir sub && ln -s /etc/passwd sub/escape && ln -s /etc sub/etcdir")
		a.waitStatus("published", func(st fs.Status) bool { return st.DMD.Publishes >= 1 })
		// A file put into the backing directory behind dyadfs's back is not
		// published.
		os.WriteFile(filepath.Join(a.backing, "unpublished.dat"), []byte("x"), 0o644)
		// A file still being written.
		argv := a.argv("sh", "-c", "cd "+c.mnt+" && exec 3>busy.dat && echo partial >&3 && read x")
		writer, stdin := startCmd(t, "/", nil, argv[0], argv[1:]...)
		a.waitStatus("writer holds busy.dat", func(st fs.Status) bool { return st.DMD.BusyFiles == 1 })

		addr := a.ip + ":" + dtlPort
		get := func(path, secret string) string {
			t.Helper()
			out, err := b.run(helperCmd("dtl-get", w.name, addr, path, secret)...)
			if err != nil {
				t.Fatalf("dtl-get %s: %v %s", path, err, out)
			}
			return strings.TrimSpace(out)
		}
		for _, tc := range []struct{ path, secret, want string }{
			{"ok.dat", c.secret, "ok 10"},
			{"../etc/passwd", c.secret, "outside"},
			{"/etc/passwd", c.secret, "outside"},
			{"sub/escape", c.secret, "outside"},
			{"sub/etcdir/passwd", c.secret, "outside"},
			{".dyadfs/tmp", c.secret, "outside"},
			{"unpublished.dat", c.secret, "not-published"},
			{"busy.dat", c.secret, "busy"},
			{"missing.dat", c.secret, "not-found"},
			{"ok.dat", wrong, "unauthorized"},
		} {
			if got := get(tc.path, tc.secret); got != tc.want {
				t.Errorf("request for %q: %s, want %s", tc.path, got, tc.want)
			}
		}
		fmt.Fprintln(stdin, "done")
		stdin.Close()
		within(t, "writer", bound, writer)
		log := a.readLog()
		for _, want := range []string{"../etc/passwd", "sub/escape", "unpublished.dat"} {
			if !strings.Contains(log, want) {
				t.Errorf("the owner's log has no line about the refused %q", want)
			}
		}
	})
}

// TestClusterDuplicateNodeID: a second daemon started with a node id that a
// running daemon of the job already has is refused with a one-line message
// and its own exit code, and leaves no mount; the first keeps serving.
func TestClusterDuplicateNodeID(t *testing.T) {
	c := newCluster(t, 2)
	a, b := c.nodes[0], c.nodes[1]
	a.mustSh("echo mine > f")
	mnt, backing := filepath.Join(c.dir, "dup-mnt"), filepath.Join(c.dir, "dup-backing")
	os.Mkdir(mnt, 0o755)
	os.Mkdir(backing, 0o755)
	args := []string{dyadfsBin, "mount", "--store", "etcd://" + etcdAddr, "--namespace", c.namespace,
		"--node", a.name, "--listen", b.ip + ":7448", "--backing", backing,
		"--log-file", filepath.Join(c.dir, "dup.log"), "--lease-ttl", "2s"}
	if c.secret != "" {
		args = append(args, "--secret-file", c.secret)
	}
	out, err := b.run(append(args, mnt)...)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 12 {
		t.Fatalf("second daemon as node %s: %v, want exit code 12; output %q", a.name, err, out)
	}
	if strings.Count(out, "\n") != 1 || !strings.Contains(out, "node id is in use") || !strings.Contains(out, a.ip) {
		t.Fatalf("second daemon printed %q, want one line naming the running daemon's address", out)
	}
	if _, err := b.run("mountpoint", "-q", mnt); err == nil {
		t.Fatalf("%s is mounted after the refusal", mnt)
	}
	if got := b.mustSh("cat f"); got != "mine\n" {
		t.Fatalf("b read %q from a after the refusal", got)
	}
}

// TestClusterOtherSecretRefused: a node given another job secret than the
// job's nodes use is refused at mount, with one line naming the node that
// holds the job's secret and what to copy, and its own exit code; it
// does not mount and then fail every transfer with EIO.
func TestClusterOtherSecretRefused(t *testing.T) {
	c := newCluster(t, 2)
	a, b := c.nodes[0], c.nodes[1]
	mnt, backing := filepath.Join(c.dir, "other-mnt"), filepath.Join(c.dir, "other-backing")
	os.Mkdir(mnt, 0o755)
	os.Mkdir(backing, 0o755)
	secret := filepath.Join(c.dir, "other-secret")
	if err := os.WriteFile(secret, []byte("another secret, 32 bytes long..\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := b.run(dyadfsBin, "mount", "--store", "etcd://"+etcdAddr, "--namespace", c.namespace,
		"--node", "other", "--listen", b.ip+":7448", "--backing", backing,
		"--log-file", filepath.Join(c.dir, "other.log"), "--secret-file", secret, mnt)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 16 {
		t.Fatalf("a node with another secret: %v, want exit code 16; output %q", err, out)
	}
	if strings.Count(out, "\n") != 1 || !strings.Contains(out, "job secrets differ") || !strings.Contains(out, "node "+a.name) || !strings.Contains(out, "copy") {
		t.Fatalf("a node with another secret printed %q, want one line naming node %s and what to copy", out, a.name)
	}
	if _, err := b.run("mountpoint", "-q", mnt); err == nil {
		t.Fatalf("%s is mounted after the refusal", mnt)
	}
}
