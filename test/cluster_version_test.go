package test

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/dyadfs/dyadfs/fs"
)

// One version per path, close-to-open: a write anywhere works on the
// current version, and once the writer's close returned, every node reads
// that version or a newer one. Unlink and rename on any node are seen on
// every node, and nothing comes back after a restart.

// TestClusterOneVersionPerPath: the scenarios of a new user: an append on
// another node keeps the data, r+ opens work there, O_EXCL of a published
// name fails, a truncating write moves nothing, and the last writer owns
// the path.
func TestClusterOneVersionPerPath(t *testing.T) {
	c := newCluster(t, 3)
	a, b, z := c.nodes[0], c.nodes[1], c.nodes[2]
	a.mustSh("printf 'hello\\n' > x.txt")
	b.mustSh("echo more >> x.txt")
	for _, n := range c.nodes {
		if got := n.mustSh("cat x.txt"); got != "hello\nmore\n" {
			t.Fatalf("after an append on %s, %s reads %q", b.name, n.name, got)
		}
	}
	// An in-place edit through open(..., 'r+') on a third node.
	z.mustSh(`python3 -c "
f = open('x.txt', 'r+')
assert f.read(5) == 'hello'
f.seek(0)
f.write('HELLO')
f.close()"`)
	for _, n := range c.nodes {
		if got := n.mustSh("cat x.txt"); got != "HELLO\nmore\n" {
			t.Fatalf("after an edit on %s, %s reads %q", z.name, n.name, got)
		}
	}
	if rec, ok := a.published("x.txt"); !ok || rec.Owner != z.name || rec.Writing {
		t.Fatalf("x.txt's record %+v, %v: want %s, the last writer, as its owner", rec, ok, z.name)
	}
	// O_CREAT|O_EXCL of a name published elsewhere.
	if r := b.sh(`python3 -c "open('x.txt', 'x')"`); r.err == nil || !strings.Contains(r.stderr, "FileExistsError") {
		t.Fatalf("O_EXCL of a published name: %v", r)
	}
	// A truncating write moves nothing.
	before := copyCount(b.status())
	b.mustSh("printf new > x.txt")
	if n := copyCount(b.status()); n != before {
		t.Fatalf("a truncating write of another node's file copied it (%d copies, %d before)", n, before)
	}
	for _, n := range c.nodes {
		if got := n.mustSh("cat x.txt"); got != "new" {
			t.Fatalf("after a rewrite on %s, %s reads %q", b.name, n.name, got)
		}
	}
}

// TestClusterCloseToOpen: once a writer's close returned, an open that
// starts afterwards on any node reads that version (no waiting, no
// retrying), whichever node wrote it; a process that holds the file open
// keeps reading the version it opened.
func TestClusterCloseToOpen(t *testing.T) {
	c := newCluster(t, 3)
	// A reader that opened the first version keeps it, whole.
	c.nodes[0].mustSh("printf v-first > rw.txt")
	holder := c.nodes[1]
	ready := filepath.Join(c.dir, "holder-ready")
	argv := holder.argv("python3", "-c", `import os, sys
os.chdir(sys.argv[1])
f = open('rw.txt')
print(f.read(), flush=True)
open(sys.argv[2], 'w').close()
sys.stdin.readline()
f.seek(0)
print(f.read(), open('rw.txt').read(), flush=True)`, c.mnt, ready)
	done, stdin := startCmdFor(t, bound, "/", nil, argv[0], argv[1:]...)
	eventually(t, "the holder opened rw.txt", func() bool { _, err := os.Stat(ready); return err == nil })
	for round := 0; round < 12; round++ {
		writer, reader := c.nodes[round%3], c.nodes[(round+1)%3]
		v := fmt.Sprintf("v%d-%s", round, strings.Repeat("x", round*1000))
		writer.mustSh("printf " + v + " > rw.txt")
		for _, n := range []*node{reader, c.nodes[(round+2)%3]} {
			if got := n.mustSh("cat rw.txt"); got != v {
				t.Fatalf("round %d: after %s's close, %s reads %.20q..., want %.20q...", round, writer.name, n.name, got, v)
			}
		}
	}
	io.WriteString(stdin, "\n")
	stdin.Close()
	r := within(t, "the holder", bound, done)
	last := fmt.Sprintf("v11-%s", strings.Repeat("x", 11000))
	if r.err != nil || r.stdout != "v-first\nv-first "+last+"\n" {
		t.Fatalf("the process that held the first version read %.60q (err %v, stderr %.200q)", r.stdout, r.err, r.stderr)
	}
}

// TestClusterConcurrentWriters: two nodes rewrite one path at once, again
// and again. The last publish wins: every node ends reading the same
// version, each read is one whole version (never a mix), and the
// published generation only grows.
func TestClusterConcurrentWriters(t *testing.T) {
	c := newCluster(t, 3)
	a, b, r := c.nodes[0], c.nodes[1], c.nodes[2]
	const size = 200000
	whole := func(s string) bool {
		return len(s) == size && (strings.Count(s, "A") == size || strings.Count(s, "B") == size)
	}
	a.mustSh("printf start > cw.dat")
	var last uint64
	for round := 0; round < 8; round++ {
		var wg sync.WaitGroup
		for _, w := range []struct {
			n      *node
			letter string
		}{{a, "A"}, {b, "B"}} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				w.n.mustSh(fmt.Sprintf("head -c %d /dev/zero | tr '\\0' %s > cw.dat", size, w.letter))
			}()
		}
		// Reads while they write: each a whole version (the old one
		// counts: "start", or a previous round's).
		for i := 0; i < 5; i++ {
			got := r.mustSh("cat cw.dat")
			if !whole(got) && (round > 0 || got != "start") {
				t.Fatalf("round %d: read %d bytes, not one whole version: %.40q...", round, len(got), got)
			}
		}
		wg.Wait()
		// Every node settles on one version.
		var agreed string
		eventually(t, "nodes agree", func() bool {
			vs := map[string]bool{}
			for _, n := range c.nodes {
				vs[n.mustSh("cat cw.dat")] = true
			}
			if len(vs) != 1 {
				return false
			}
			for v := range vs {
				agreed = v
			}
			return true
		})
		if !whole(agreed) {
			t.Fatalf("round %d: the nodes agree on %d bytes that are not one writer's", round, len(agreed))
		}
		rec, ok := r.published("cw.dat")
		if !ok || rec.Generation <= last || rec.Writing {
			t.Fatalf("round %d: record %+v; want a complete version with a generation above %d", round, rec, last)
		}
		want := map[string]string{"A": a.name, "B": b.name}[agreed[:1]]
		if rec.Owner != want {
			t.Fatalf("round %d: the nodes read %s's version, the record names %s", round, want, rec.Owner)
		}
		last = rec.Generation
	}
}

// TestClusterUnlinkAndRenameEverywhere: names removed or moved on one node
// are gone or moved on every node (no stale copy is served), a directory
// holding other nodes' files moves by copy (mv falls back on EXDEV), and a
// file removed while its owner was down does not come back when it
// restarts.
func TestClusterUnlinkAndRenameEverywhere(t *testing.T) {
	c := newCluster(t, 3)
	a, b, z := c.nodes[0], c.nodes[1], c.nodes[2]
	a.mustSh("printf data > u.txt && printf keep > r1.txt && mkdir d && printf in > d/f")
	b.mustSh("cat u.txt r1.txt d/f > /dev/null") // b holds copies
	gone := func(n *node, rel string) {
		t.Helper()
		if r := n.sh("DYADFS_WAIT=0 cat " + rel); r.err == nil || !strings.Contains(r.stderr, "No such file") {
			t.Fatalf("%s still reads %s: %.200v", n.name, rel, r)
		}
		if r := n.sh("ls"); strings.Contains(r.stdout, rel+"\n") {
			t.Fatalf("%s still lists %s: %q", n.name, rel, r.stdout)
		}
	}
	// Unlink on a node that only has a copy.
	b.mustSh("rm u.txt")
	for _, n := range c.nodes {
		gone(n, "u.txt")
	}
	if a.mustSh("ls "+a.backing+"/u.txt 2>/dev/null || echo none") != "none\n" {
		t.Fatalf("the owner's backing directory still has u.txt")
	}
	// Rename on the owner: the copy elsewhere is not served under either name.
	a.mustSh("mv r1.txt r2.txt")
	for _, n := range c.nodes {
		gone(n, "r1.txt")
		if got := n.mustSh("cat r2.txt"); got != "keep" {
			t.Fatalf("%s reads r2.txt as %q", n.name, got)
		}
	}
	// Rename on another node of a file it does not have.
	z.mustSh("mv r2.txt r3.txt")
	for _, n := range c.nodes {
		gone(n, "r2.txt")
		if got := n.mustSh("cat r3.txt"); got != "keep" {
			t.Fatalf("%s reads r3.txt as %q", n.name, got)
		}
	}
	// A directory of another node's files moves by copy.
	b.mustSh("mv d d2")
	for _, n := range c.nodes {
		if got := n.mustSh("cat d2/f && (test -e d && echo d-left || true)"); got != "in" {
			t.Fatalf("after mv d d2 on %s, %s: %q", b.name, n.name, got)
		}
	}
	// Removed while its owner was down: it does not come back.
	a.mustSh("printf back > g.txt")
	b.mustSh("cat g.txt > /dev/null")
	a.stop()
	b.mustSh("rm g.txt")
	a.start()
	for _, n := range c.nodes {
		gone(n, "g.txt")
	}
	if a.mustSh("ls "+a.backing+"/g.txt 2>/dev/null || echo none") != "none\n" {
		t.Fatalf("the restarted owner kept g.txt in its backing directory")
	}
	// Rewritten while a node that had it was down: the restarted node
	// reads the new version.
	a.mustSh("printf old > w.txt")
	b.mustSh("cat w.txt > /dev/null")
	b.stop()
	z.mustSh("printf new > w.txt")
	b.start()
	if got := b.mustSh("cat w.txt"); got != "new" {
		t.Fatalf("after a restart, %s reads w.txt as %q", b.name, got)
	}
}

// TestClusterInvalidationReachesHolders: a rewrite is told to the nodes
// that hold the path (its copy, its record), and to no other.
func TestClusterInvalidationReachesHolders(t *testing.T) {
	c := newCluster(t, 4)
	a, b := c.nodes[0], c.nodes[1]
	a.mustSh("mkdir inv && printf one > inv/f")
	b.mustSh("cat inv/f > /dev/null")
	before := map[string]uint64{}
	for _, n := range c.nodes {
		before[n.name] = n.status().Locator.Notices.Broken
	}
	a.mustSh("printf two > inv/f")
	b.waitStatus("told of the rewrite", func(st fs.Status) bool { return st.Locator.Notices.Broken > before[b.name] })
	if got := b.mustSh("cat inv/f"); got != "two" {
		t.Fatalf("%s reads %q", b.name, got)
	}
	for _, n := range c.nodes[2:] {
		if got := n.status().Locator.Notices.Broken; got != before[n.name] {
			t.Errorf("%s, which never looked at inv/f, was told %d changes", n.name, got-before[n.name])
		}
	}
}
