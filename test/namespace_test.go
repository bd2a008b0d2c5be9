package test

import (
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"

	"github.com/dyadfs/dyadfs/fs"
)

// TestRenameRacingRelease: the write-then-rename pattern publishes the final
// name even when the rename races the kernel's asynchronous RELEASE (slowed
// here by fsync-on-publish), and readers waiting for the final names wake.
func TestRenameRacingRelease(t *testing.T) {
	m := newMount(t, "--fsync-on-publish", "--wait-timeout", "30s")
	const n = 40
	var readers []<-chan result
	for i := 0; i < n; i++ {
		readers = append(readers, start(t, m.mnt, "cat", fmt.Sprintf("out%d.dat", i)))
	}
	m.waitStatus("readers waiting", waiting(n))
	mustSh(t, m.mnt, fmt.Sprintf("for i in $(seq 0 %d); do echo $i > tmp$i && mv tmp$i out$i.dat; done", n-1))
	for i, ch := range readers {
		if r := within(t, "reader", bound, ch); r.err != nil || r.stdout != fmt.Sprintf("%d\n", i) {
			t.Fatalf("reader of out%d.dat: %v", i, r)
		}
	}
	for i := 0; i < n; i++ {
		m.waitPublished(fmt.Sprintf("out%d.dat", i), 0)
		if _, ok := m.published(fmt.Sprintf("tmp%d", i)); ok {
			t.Fatalf("tmp%d is still published after its rename", i)
		}
	}
}

// TestHardLinkWhileOpen: a file linked to a second name while it is written
// is published under both names.
func TestHardLinkWhileOpen(t *testing.T) {
	m := newMount(t)
	reader := start(t, m.mnt, "cat", "x1")
	m.waitStatus("reader waiting", waiting(1))
	if r := python(t, m.mnt, `
import os
f = open("x1", "w")
f.write("linked")
os.link("x1", "x2")
f.close()
`); r.err != nil {
		t.Fatal(r)
	}
	if r := within(t, "reader", bound, reader); r.err != nil || r.stdout != "linked" {
		t.Fatalf("reader of x1: %v", r)
	}
	m.waitPublished("x1", 0)
	m.waitPublished("x2", 0)
}

// TestUnlinkRightAfterClose: writing and unlinking in a tight loop, with
// several appenders on one file, never trips the daemon (it would log a
// panic, which the harness checks) and leaves nothing busy or published.
func TestUnlinkRightAfterClose(t *testing.T) {
	m := newMount(t, "--fsync-on-publish")
	var work []<-chan result
	for w := 0; w < 3; w++ {
		work = append(work, start(t, m.mnt, "sh", "-c", fmt.Sprintf("for i in $(seq 1 200); do echo $i > f%d; rm f%d; echo $i >> shared; done", w, w)))
	}
	for _, ch := range work {
		if r := within(t, "writer", bound, ch); r.err != nil {
			t.Fatal(r)
		}
	}
	m.waitStatus("all writers released", func(st fs.Status) bool { return st.DMD.WriteReleases == st.DMD.WriteOpens })
	st := m.status()
	if st.Panics != 0 || st.DMD.BusyFiles != 0 {
		t.Fatalf("after the loop: %d panics, %d busy files", st.Panics, st.DMD.BusyFiles)
	}
	for w := 0; w < 3; w++ {
		if _, ok := m.published(fmt.Sprintf("f%d", w)); ok {
			t.Fatalf("f%d is published after its unlink", w)
		}
	}
}

// TestWaitedNameBecomesDirectory: a reader waiting for a file gives up with
// EISDIR when a directory takes the name.
func TestWaitedNameBecomesDirectory(t *testing.T) {
	m := newMount(t)
	reader := start(t, m.mnt, "cat", "thing")
	m.waitStatus("reader waiting", waiting(1))
	mustSh(t, m.mnt, "mkdir thing")
	if r := within(t, "reader", bound, reader); r.err == nil || !strings.Contains(r.stderr, "Is a directory") {
		t.Fatalf("reader: %v, want EISDIR", r)
	}
}

// TestDyadfsWait: dyadfs wait returns once the files are published, and
// exits with code 10 when its timeout passes first.
func TestDyadfsWait(t *testing.T) {
	m := newMount(t)
	w := start(t, m.mnt, dyadfsBin, "wait", "a", "b/c")
	m.waitStatus("waiting", waiting(2))
	mustSh(t, m.mnt, "echo a > a && mkdir b && echo c > b/c")
	if r := within(t, "dyadfs wait", bound, w); r.err != nil {
		t.Fatalf("dyadfs wait: %v", r)
	}
	cmd := exec.Command(dyadfsBin, "wait", "--timeout", "200ms", m.path("a"), m.path("never"))
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 10 || !strings.Contains(string(out), "200ms") ||
		!strings.Contains(string(out), "1 of 2") || !strings.Contains(string(out), m.path("never")) {
		t.Fatalf("dyadfs wait --timeout: %v %q, want exit 10 naming the file given up on", err, out)
	}
}

// TestAllowOther: with -o allow_other other users use the mount; the kernel
// checks permissions, and so does a waiting open, which the kernel could not
// check against a file that did not exist yet.
func TestAllowOther(t *testing.T) {
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Skip("skipping: setpriv (util-linux) is not installed")
	}
	m := newMount(t, "-o", "allow_other")
	asNobody := func(script string) <-chan result {
		return start(t, m.mnt, "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sh", "-c", script)
	}
	mustSh(t, m.mnt, "echo open > open.dat && echo secret > secret.dat && chmod 600 secret.dat && mkdir private && chmod 700 private")
	if r := within(t, "nobody", bound, asNobody("cat open.dat")); r.err != nil || r.stdout != "open\n" {
		t.Fatalf("nobody reading a 0644 file: %v", r)
	}
	if r := within(t, "nobody", bound, asNobody("cat secret.dat")); r.err == nil || !strings.Contains(r.stderr, "Permission denied") {
		t.Fatalf("nobody reading a 0600 file: %v, want EACCES", r)
	}
	if r := within(t, "nobody", bound, asNobody(dyadfsBin+" status .")); r.err != nil {
		t.Fatalf("dyadfs status as nobody: %v", r)
	}
	if r := within(t, "nobody", bound, asNobody("cat private/x")); r.err == nil || !strings.Contains(r.stderr, "Permission denied") {
		t.Fatalf("nobody opening below a 0700 directory: %v, want EACCES at once", r)
	}
	// Waiting opens: for a readable file, for a private one, and for a
	// file in a directory, not there yet, that nobody may enter.
	readable := asNobody("cat later-open.dat")
	private := asNobody("cat later-secret.dat")
	hidden := asNobody("cat private2/later.dat")
	m.waitStatus("nobody waiting", waiting(3))
	mustSh(t, m.mnt, "echo later > later-open.dat && (umask 077; echo hush > later-secret.dat) && mkdir -m 700 private2 && echo hidden > private2/later.dat")
	if r := within(t, "nobody", bound, readable); r.err != nil || r.stdout != "later\n" {
		t.Fatalf("nobody waiting for a 0644 file: %v", r)
	}
	for name, ch := range map[string]<-chan result{"a 0600 file": private, "a file in a 0700 directory": hidden} {
		if r := within(t, "nobody", bound, ch); r.err == nil || !strings.Contains(r.stderr, "Permission denied") {
			t.Fatalf("nobody waiting for %s: %v, want EACCES", name, r)
		}
	}
}
