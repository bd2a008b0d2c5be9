package test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dyadfs/dyadfs/fs"
)

// releases is how many handles of managed files the daemon has released.
// close(2) returns before the kernel's RELEASE is handled, so tests that
// check what a release did wait for this count.
func (m *mount) releases() uint64 {
	st := m.status()
	return st.ReadReleases + st.DMD.WriteReleases
}

func (m *mount) waitReleases(n uint64) {
	m.t.Helper()
	m.waitStatus(fmt.Sprintf("%d releases", n), func(st fs.Status) bool { return st.ReadReleases+st.DMD.WriteReleases >= n })
}

// TestPublishOnLastWriterRelease: the record appears when the last of two
// writers lets go, and it says what the file is.
func TestPublishOnLastWriterRelease(t *testing.T) {
	m := newMount(t)
	before := m.releases()
	done, stdin := startCmd(t, m.mnt, nil, "python3", "-c", `
import sys
a = open("data.bin", "wb")
b = open("data.bin", "r+b")
a.write(b"x" * 1000)
a.close()
print("first closed", flush=True)
sys.stdin.readline()
b.seek(1000)
b.write(b"y" * 24)
b.close()
`)
	// After the first close has been released, nothing is published.
	m.waitReleases(before + 1)
	if rec, ok := m.published("data.bin"); ok {
		t.Fatalf("published while a writer still holds the file: %+v", rec)
	}
	fmt.Fprintln(stdin, "go")
	stdin.Close()
	if r := within(t, "writer", bound, done); r.err != nil {
		t.Fatal(r)
	}
	rec := m.waitPublished("data.bin", 0)
	st, err := os.Stat(m.path("data.bin"))
	if err != nil {
		t.Fatal(err)
	}
	if rec.Path != "data.bin" || rec.Owner != m.node || rec.Size != 1024 ||
		rec.Mode != uint32(st.Mode().Perm())|0o100000 || rec.MtimeNs != st.ModTime().UnixNano() || rec.Generation == 0 {
		t.Fatalf("record %+v does not describe the file (size 1024, mode %o, mtime %d)", rec, st.Mode().Perm(), st.ModTime().UnixNano())
	}
}

// TestReadingDoesNotRepublish: reads, and write opens that change nothing,
// leave the record as it was; a real change publishes a newer generation.
func TestReadingDoesNotRepublish(t *testing.T) {
	m := newMount(t)
	mustSh(t, m.mnt, "echo content > f")
	first := m.waitPublished("f", 0)
	before := m.releases()
	mustSh(t, m.mnt, "cat f >/dev/null; cat f >/dev/null; dd if=f of=/dev/null status=none")
	if r := python(t, m.mnt, `open("f", "rb").read(); open("f", "r+b").read()`); r.err != nil {
		t.Fatal(r)
	}
	m.waitReleases(before + 5)
	if rec, _ := m.published("f"); rec.Generation != first.Generation {
		t.Fatalf("reading republished f: generation %d -> %d", first.Generation, rec.Generation)
	}
	if n := m.status().DMD.Publishes; n != 1 {
		t.Fatalf("%d publishes, want 1", n)
	}
	mustSh(t, m.mnt, "echo more >> f")
	if rec := m.waitPublished("f", first.Generation); rec.Size != int64(len("content\nmore\n")) {
		t.Fatalf("republished record %+v", rec)
	}
}

// TestUnlinkUnpublishes: rm withdraws the record.
func TestUnlinkUnpublishes(t *testing.T) {
	m := newMount(t)
	mustSh(t, m.mnt, "echo x > gone")
	m.waitPublished("gone", 0)
	mustSh(t, m.mnt, "rm gone")
	if rec, ok := m.published("gone"); ok {
		t.Fatalf("unlinked file still published: %+v", rec)
	}
	if n := m.status().DMD.Unpublishes; n != 1 {
		t.Fatalf("%d unpublishes, want 1", n)
	}
}

// TestRenameMovesRecord: the write-then-rename pattern publishes the final
// name and wakes a reader waiting for it; the temporary name is withdrawn.
func TestRenameMovesRecord(t *testing.T) {
	m := newMount(t)
	reader := start(t, m.mnt, "cat", "final.dat")
	m.waitStatus("reader waiting", func(st fs.Status) bool { return st.DMD.Waiting == 1 })
	mustSh(t, m.mnt, "echo whole > final.tmp && mv final.tmp final.dat")
	r := within(t, "waiting cat", bound, reader)
	if r.err != nil || r.stdout != "whole\n" {
		t.Fatalf("cat: %v", r)
	}
	m.waitPublished("final.dat", 0)
	if _, ok := m.published("final.tmp"); ok {
		t.Fatal("temporary name still published after the rename")
	}
	mustSh(t, m.mnt, "mkdir -p d/sub && echo a > d/sub/a && mv d moved")
	m.waitPublished("moved/sub/a", 0)
	if _, ok := m.published("d/sub/a"); ok {
		t.Fatal("file under a renamed directory still published under the old name")
	}
}

// TestFsyncOnPublish: with the durability option (flag or DYAD_FSYNC_WRITE)
// data is fsynced before the file is published.
func TestFsyncOnPublish(t *testing.T) {
	for _, tc := range []struct {
		name  string
		env   []string
		flags []string
	}{
		{"flag", nil, []string{"--fsync-on-publish"}},
		{"env", []string{"DYAD_FSYNC_WRITE=1"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newMountEnv(t, tc.env, tc.flags...)
			mustSh(t, m.mnt, "echo durable > d1 && echo durable > d2")
			m.waitPublished("d2", 0)
			m.waitPublished("d1", 0)
			if n := m.status().DMD.Fsyncs; n != 2 {
				t.Fatalf("%d fsyncs before publish, want 2", n)
			}
		})
	}
	m := newMount(t)
	mustSh(t, m.mnt, "echo not-durable > d")
	m.waitPublished("d", 0)
	if n := m.status().DMD.Fsyncs; n != 0 {
		t.Fatalf("%d fsyncs without the option", n)
	}
}

// TestStatusCommand: `dyadfs status` shows the counters users need.
func TestStatusCommand(t *testing.T) {
	m := newMount(t)
	mustSh(t, m.mnt, "echo a > a")
	m.waitPublished("a", 0)
	out, err := dyadfs(t, "status", m.mnt)
	if err != nil {
		t.Fatalf("dyadfs status: %v\n%s", err, out)
	}
	for _, want := range []string{"opens waited", "publishes", "passthrough", "hits local", "errors by errno"} {
		if !strings.Contains(out, want) {
			t.Errorf("status output lacks %q:\n%s", want, out)
		}
	}
	out, err = dyadfs(t, "status", "--json", m.mnt)
	if err != nil || !strings.Contains(out, `"publishes": 1`) {
		t.Fatalf("status --json: %v\n%s", err, out)
	}
	// A directory inside the mount, or a name published nowhere in it,
	// stands for the mount: its status comes at once (it used to open
	// x/.dyadfs/status, a name published nowhere, and wait for it).
	mustSh(t, m.mnt, "mkdir x")
	for _, p := range []string{"x", "x/not-yet"} {
		start := time.Now()
		out, err := dyadfs(t, "status", "--json", filepath.Join(m.mnt, p))
		if err != nil || !strings.Contains(out, `"publishes"`) || time.Since(start) > 10*time.Second {
			t.Fatalf("status of %s, inside the mount: %v after %v\n%s", p, err, time.Since(start), out)
		}
	}
}

// TestLargeWritesWithoutPassthrough: writes that reach the daemon (no
// passthrough; the kernel sends up to 1 MiB at once), which it passes on
// to the backing file in smaller pieces, land whole wherever they start:
// files written by dd in blocks of 1 MiB and of an odd size, and by
// python at unaligned offsets backwards, read back as their source.
func TestLargeWritesWithoutPassthrough(t *testing.T) {
	m := newMount(t, "--passthrough=false")
	src := filepath.Join(t.TempDir(), "src")
	mustSh(t, "", "head -c 7340033 /dev/urandom > "+src)
	mustSh(t, m.mnt, "dd if="+src+" of=blocks bs=1M status=none && dd if="+src+" of=odd bs=1000003 status=none")
	mustSh(t, m.mnt, `python3 - `+src+` <<'EOF'
import os, sys
data = open(sys.argv[1], "rb").read()
fd = os.open("backwards", os.O_WRONLY | os.O_CREAT, 0o644)
step = (1 << 20) + 5
for off in reversed(range(3, len(data), step)):
    os.pwrite(fd, data[off:off + step], off)
os.pwrite(fd, data[:3], 0)
os.close(fd)
EOF`)
	for _, name := range []string{"blocks", "odd", "backwards"} {
		mustSh(t, m.mnt, "cmp "+src+" "+name)
	}
}

// TestFullBackingWithoutPassthrough: a write that reaches the daemon and
// finds the backing filesystem full fails with ENOSPC, as it would there.
func TestFullBackingWithoutPassthrough(t *testing.T) {
	requireEnv(t)
	root, mnt, backing := mountDirs(t)
	if out, err := runOut("mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", backing); err != nil {
		t.Fatalf("mount tmpfs: %v %s", err, out)
	}
	t.Cleanup(func() { runOut("umount", "-l", backing) })
	m := &mount{t: t, mnt: mnt, backing: backing, logFile: filepath.Join(root, "dyadfs.log"), node: "node-a"}
	m.args = []string{"--passthrough=false"}
	m.start()
	r := run(t, mnt, "dd", "if=/dev/zero", "of=big", "bs=1M", "count=8")
	if r.err == nil || !strings.Contains(r.stderr, "No space left on device") {
		t.Fatalf("dd into a full backing directory: %v, want ENOSPC", r)
	}
}

// TestCopyFileRange: copy_file_range between two files of the mount is
// served (between their backing files), by cp and by python, and never
// answered EOPNOTSUPP, which would have the kernel ask again at every call.
func TestCopyFileRange(t *testing.T) {
	m := newMount(t)
	mustSh(t, m.mnt, "head -c 3000001 /dev/urandom > src && cp src by-cp")
	mustSh(t, m.mnt, `python3 -c '
import os
s = os.open("src", os.O_RDONLY)
d = os.open("by-python", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
n = os.fstat(s).st_size
while n > 0:
    c = os.copy_file_range(s, d, n)
    if c == 0:
        break
    n -= c
os.close(d)
'`)
	want := mustSh(t, m.mnt, "cmp src by-cp && cmp src by-python && echo same")
	if strings.TrimSpace(want) != "same" {
		t.Fatalf("copies differ: %q", want)
	}
	st := m.status()
	if o := st.Ops["copy_file_range"]; o.Count == 0 || o.Errors != 0 {
		t.Fatalf("copy_file_range: %+v, want served without errors", o)
	}
	if n := st.Errnos["EOPNOTSUPP"]; n != 0 {
		t.Fatalf("%d requests answered EOPNOTSUPP", n)
	}
}
