package test

import (
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/dyadfs/dyadfs/fs"
)

// TestRestartLosesNothing (point 6): a daemon restarted over the same
// backing directory serves the same files and publishes them again.
func TestRestartLosesNothing(t *testing.T) {
	m := newMount(t)
	mustSh(t, m.mnt, "mkdir -p a/b && echo one > a/b/one && echo two > two && dd if=/dev/urandom of=a/big bs=1M count=8 status=none")
	sum := mustSh(t, m.mnt, "cat a/b/one two; md5sum < a/big")
	m.waitPublished("a/big", 0)
	m.unmount()

	m.start()
	if got := mustSh(t, m.mnt, "cat a/b/one two; md5sum < a/big"); got != sum {
		t.Fatalf("after restart the files read %q, before %q", got, sum)
	}
	st := m.status()
	if st.DMD.ScanPublished != 3 || st.DMD.ScanIncomplete != 0 {
		t.Fatalf("restart scan published %d, incomplete %d; want 3 and 0", st.DMD.ScanPublished, st.DMD.ScanIncomplete)
	}
	for _, rel := range []string{"a/b/one", "two", "a/big"} {
		if _, ok := m.published(rel); !ok {
			t.Errorf("%s not published after restart", rel)
		}
	}
}

// TestCrashWhileWritingIsNotPublished: when the daemon dies while a file is
// open for writing, the restarted daemon does not take the half-written
// file for a complete one: it stays unpublished and readers wait until it
// is written again.
func TestCrashWhileWritingIsNotPublished(t *testing.T) {
	m := newMount(t, "--wait-timeout", "500ms")
	writer, stdin := startCmd(t, m.mnt, nil, "python3", "-c", `
import sys
f = open("half.dat", "w")
f.write("only the first half")
f.flush()
print("ready", flush=True)
sys.stdin.readline()
`)
	m.waitStatus("writer holds the file", func(st fs.Status) bool { return st.DMD.BusyFiles == 1 })
	mustSh(t, m.mnt, "echo complete > done.dat")
	m.waitPublished("done.dat", 0)

	// The daemon dies; its dead mount is cleaned up as an admin would.
	syscall.Kill(m.pid, syscall.SIGKILL)
	if !waitExit(m.pid, bound) {
		t.Fatal("daemon survived SIGKILL")
	}
	m.pid = 0
	stdin.Close()
	within(t, "writer", bound, writer)
	if out, err := runOut("fusermount3", "-u", "-z", m.mnt); err != nil {
		t.Fatalf("fusermount3 -u -z of the dead mount: %v %s", err, out)
	}

	m.start()
	st := m.status()
	if st.DMD.ScanIncomplete != 1 || st.DMD.ScanPublished != 1 {
		t.Fatalf("restart scan: incomplete %d, published %d; want 1 and 1", st.DMD.ScanIncomplete, st.DMD.ScanPublished)
	}
	if _, ok := m.published("half.dat"); ok {
		t.Fatal("half-written file published after the crash")
	}
	r := run(t, m.mnt, "cat", "half.dat")
	if r.err == nil || !strings.Contains(r.stderr, "Connection timed out") {
		t.Fatalf("cat of the half-written file: %v, want a wait that times out", r)
	}
	// Written again, it is published and readable.
	mustSh(t, m.mnt, "echo rewritten > half.dat")
	if got := mustSh(t, m.mnt, "cat half.dat"); got != "rewritten\n" {
		t.Fatalf("cat after rewrite: %q", got)
	}
	m.waitPublished("half.dat", 0)
	if b, _ := os.ReadFile(m.path("done.dat")); string(b) != "complete\n" {
		t.Fatalf("done.dat = %q", b)
	}
}
