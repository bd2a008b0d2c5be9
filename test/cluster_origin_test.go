package test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	dfs "github.com/dyadfs/dyadfs/fs"
)

// readOnlyDataset makes a dataset of n files (small ones, whose bytes
// travel with notices, and 1 MiB ones, transfers) and returns the
// read-only bind mount of it that nodes take as their parallel file
// system, and the files' digests.
func readOnlyDataset(t *testing.T, c *cluster, n int) (string, map[string]string) {
	t.Helper()
	pfs := filepath.Join(c.dir, "pfs")
	ro := filepath.Join(c.dir, "pfs-ro")
	os.MkdirAll(filepath.Join(pfs, "train"), 0o755)
	os.MkdirAll(ro, 0o755)
	want := make(map[string]string)
	for i := range n {
		size := 1 << 20
		if i%2 == 0 {
			size = 1000
		}
		rel := fmt.Sprintf("train/s%03d.bin", i)
		runOut("sh", "-c", fmt.Sprintf("head -c %d /dev/urandom > %s", size, filepath.Join(pfs, rel)))
		out, err := runOut("sh", "-c", sha256Cmd+filepath.Join(pfs, rel))
		if err != nil {
			t.Fatalf("digest of %s: %v %s", rel, err, out)
		}
		want[rel] = strings.Fields(out)[0]
	}
	// A directory only its owner (root) may enter.
	os.MkdirAll(filepath.Join(pfs, "private"), 0o700)
	os.WriteFile(filepath.Join(pfs, "private", "x"), []byte("secret\n"), 0o644)
	c.must("mount", "--bind", pfs, ro)
	t.Cleanup(func() { syscall.Unmount(ro, syscall.MNT_DETACH) })
	c.must("mount", "-o", "remount,bind,ro", ro)
	return ro, want
}

// TestClusterOrigin: a dataset under --origin (a parallel file system,
// mounted read-only) is read on two nodes. With --origin-publish the first
// node reads each file from the origin and publishes it, and the second
// fetches it from the first: the parallel file system is read once per
// file. Without it, both read the origin, and neither waits. A path in
// neither the namespace nor the origin waits as before. The origin is
// never written.
func TestClusterOrigin(t *testing.T) {
	const files = 20
	c := newClusterWith(t, clusterOptions{nodes: 0})
	origin, want := readOnlyDataset(t, c, files)
	pfs := filepath.Join(c.dir, "pfs")
	before, _ := runOut("sh", "-c", "cd "+pfs+" && find . -printf '%p %s %T@\\n' | sort")
	a := c.addNode("a", "--origin", origin, "--origin-publish", "-o", "allow_other")
	b := c.addNode("b", "--origin", origin, "--origin-publish", "-o", "allow_other")
	// Two more nodes, in a job of their own, read the origin without
	// publishing.
	plain := c.namespace + "-plain"
	p := c.addNode("p", "--origin", origin, "--namespace", plain)
	q := c.addNode("q", "--origin", origin, "--namespace", plain)

	readAll := func(n *node) {
		t.Helper()
		start := time.Now()
		for rel, sum := range want {
			if got := sha(n, rel); got != sum {
				t.Fatalf("%s reads %s as %s, want %s (the origin's)", n.name, rel, got, sum)
			}
		}
		t.Logf("%s read the %d files in %v", n.name, files, time.Since(start))
	}
	readAll(a)
	if st := a.status().DMD; st.OriginReads != files || st.OriginPublished != files {
		t.Fatalf("the first node read %d files from the origin and published %d, want %d", st.OriginReads, st.OriginPublished, files)
	}
	// A file brought from the origin keeps the origin's modification
	// time, here and on the node that fetched it (make and rsync compare
	// it).
	var ost syscall.Stat_t
	if err := syscall.Stat(filepath.Join(pfs, "train/s000.bin"), &ost); err != nil {
		t.Fatal(err)
	}
	mtime := fmt.Sprintf("%d.%09d\n", ost.Mtim.Sec, ost.Mtim.Nsec)
	if got := a.mustSh("stat -c %.9Y train/s000.bin"); got != mtime {
		t.Fatalf("a file brought from the origin has mtime %q, the origin's is %q", got, mtime)
	}
	readAll(b)
	if got := b.mustSh("stat -c %.9Y train/s000.bin"); got != mtime {
		t.Fatalf("a file brought from the origin, fetched by another node, has mtime %q, the origin's is %q", got, mtime)
	}
	st := b.status()
	if st.DMD.OriginReads != 0 {
		t.Fatalf("the second node read %d files from the origin, want none: the first published them", st.DMD.OriginReads)
	}
	if n := copyCount(st); n != files {
		t.Fatalf("the second node copied %d files from the first, want %d", n, files)
	}

	readAll(p)
	readAll(q)
	for _, n := range []*node{p, q} {
		st := n.status().DMD
		if st.OriginReads != files || st.OriginPublished != 0 || st.OpensWaited != 0 {
			t.Fatalf("%s without --origin-publish: %d read from the origin, %d published, %d opens waited; want %d, 0, 0",
				n.name, st.OriginReads, st.OriginPublished, st.OpensWaited, files)
		}
	}
	// Reading the origin again reads it again: nothing was brought here.
	if got := sha(p, "train/s001.bin"); got != want["train/s001.bin"] {
		t.Fatalf("second read from the origin: %s", got)
	}

	// A path published nowhere and not in the origin waits, as always.
	waiter := b.startSh("cat train/later.bin")
	b.waitStatus("a wait for a path the origin lacks", func(st dfs.Status) bool { return st.DMD.Waiting >= 1 })
	a.mustSh("echo produced > train/later.bin")
	if r := within(t, "the wait", bound, waiter); r.err != nil || r.stdout != "produced\n" {
		t.Fatalf("a wait for a path the origin lacks: %v", r)
	}

	// The origin's permissions hold, before and after a node brought
	// the file: another user cannot enter private/ on either node.
	const asNobody = "setpriv --reuid=65534 --regid=65534 --clear-groups "
	if r := a.sh(asNobody + "cat private/x"); r.err == nil || !strings.Contains(r.stderr, "Permission denied") {
		t.Fatalf("another user read private/x from the origin: %v", r)
	}
	if got := a.mustSh("cat private/x"); got != "secret\n" {
		t.Fatalf("root reads private/x as %q", got)
	}
	if r := b.sh(asNobody + "cat private/x"); r.err == nil || !strings.Contains(r.stderr, "Permission denied") {
		t.Fatalf("another user read private/x once published: %v", r)
	}
	if got := b.mustSh("stat -c %a private && cat private/x"); got != "700\nsecret\n" {
		t.Fatalf("on the second node, private/ and its file read %q, want mode 700 and the file", got)
	}

	after, _ := runOut("sh", "-c", "cd "+pfs+" && find . -printf '%p %s %T@\\n' | sort")
	if after != before {
		t.Fatalf("the origin changed:\nbefore\n%s\nafter\n%s", before, after)
	}
}
