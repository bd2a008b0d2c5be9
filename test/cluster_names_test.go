package test

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dyadfs/dyadfs/internal/poll"
)

// One namespace on every node: names published anywhere are listed and
// stat-able everywhere, with their records' attributes, without moving
// data; the usual tools walk and copy trees produced elsewhere.

// treeScript makes, in the mount, a tree with a file of each kind of size,
// a symbolic link, an empty directory, modes and times of its own.
const treeScript = `mkdir -p tree/sub/empty tree/deep/er
printf hello > tree/a.txt
head -c 100000 /dev/urandom > tree/sub/b.bin
printf x > tree/deep/er/c
: > tree/zero
ln -s a.txt tree/link
ln -s ../a.txt tree/sub/up
chmod 640 tree/a.txt
chmod 600 tree/sub/b.bin
chown 65534:65534 tree/deep/er/c
touch -h -d '2020-01-02 03:04:05.123456789' tree/sub/b.bin tree/zero`

// describe lists a tree as find sees it: every entry's type, mode and
// owner, every file's size and mtime, every link's target.
const describe = `find tree -printf '%p %y %m %U:%G\n' | sort
find tree -type f -printf '%p %s %T@\n' | sort
find tree -type l -printf '%p -> %l\n' | sort`

// checksums lists the checksums of the files under dir.
func checksums(dir string) string {
	return fmt.Sprintf("cd %s && find . -type f | sort | xargs -r sha256sum", dir)
}

// TestClusterNamesEverywhere: a tree produced on one node is seen on the
// others as it is (ls -lR, find, du, stat), without a transfer; a path
// published nowhere is ENOENT at once; cp -r, rsync -a, tar and python3
// copy it whole.
func TestClusterNamesEverywhere(t *testing.T) {
	c := newCluster(t, 3)
	a, b, z := c.nodes[0], c.nodes[1], c.nodes[2]
	a.mustSh(treeScript)
	want := a.mustSh(describe)
	wantDu := a.mustSh("du -ab --apparent-size tree/a.txt tree/sub/b.bin tree/zero tree/deep/er/c")
	for _, n := range []*node{b, z} {
		// The last files' publishes follow their closes (the release
		// is asynchronous): the tree is whole everywhere soon after.
		var got string
		poll.Within(5*time.Second, func() bool { got = n.mustSh(describe); return got == want })
		if got != want {
			t.Fatalf("%s lists the tree as\n%s\nits producer as\n%s", n.name, got, want)
		}
		if got := n.mustSh("du -ab --apparent-size tree/a.txt tree/sub/b.bin tree/zero tree/deep/er/c"); got != wantDu {
			t.Fatalf("%s: du says\n%s\nthe producer\n%s", n.name, got, wantDu)
		}
		if got := n.mustSh("ls -lR tree | wc -l"); got != a.mustSh("ls -lR tree | wc -l") {
			t.Fatalf("%s: ls -lR shows %s lines, the producer %s", n.name, got, a.mustSh("ls -lR tree | wc -l"))
		}
		if got := n.mustSh("stat -c '%s %a %u' tree/sub/b.bin && readlink tree/link && test -d tree/sub/empty && echo dir"); got != "100000 600 0\na.txt\ndir\n" {
			t.Fatalf("%s: stat, readlink, test -d: %q", n.name, got)
		}
		if st := n.status(); copyCount(st) != 0 {
			t.Fatalf("%s: listing and stat made %d copies; nothing should move", n.name, copyCount(st))
		}
	}
	// A path published nowhere: ENOENT at once, for stat and for an open
	// whose process does not wait.
	start := time.Now()
	if r := b.sh("stat tree/none"); r.err == nil || !strings.Contains(r.stderr, "No such file") {
		t.Fatalf("stat of a missing path: %v", r)
	}
	if r := b.sh("DYADFS_WAIT=0 cat tree/none"); r.err == nil || !strings.Contains(r.stderr, "No such file") {
		t.Fatalf("cat of a missing path by a process that does not wait: %v", r)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("answering ENOENT took %v", took)
	}

	// Copies with the tools people use, on another node: the same bytes.
	wantSums := a.mustSh(checksums("tree"))
	out := filepath.Join(c.dir, "out-b")
	b.mustSh(fmt.Sprintf(`mkdir -p %[1]s
cp -r tree %[1]s/cp
rsync -a tree/ %[1]s/rsync/
tar cf %[1]s/t.tar tree && mkdir %[1]s/tar && tar xf %[1]s/t.tar -C %[1]s/tar`, out))
	for _, dir := range []string{"cp", "rsync", "tar/tree"} {
		if got := b.mustSh(checksums(filepath.Join(out, dir))); got != wantSums {
			t.Fatalf("%s copy on %s:\n%s\nwant\n%s", dir, b.name, got, wantSums)
		}
	}
	if got := b.mustSh(fmt.Sprintf("readlink %s/rsync/link && stat -c %%Y %s/rsync/sub/b.bin", out, out)); got != "a.txt\n1577934245\n" {
		t.Fatalf("rsync -a kept %q of the link and the mtime", got)
	}
	// python3 walks it and reads it too.
	py := `import os, hashlib
for root, dirs, files in sorted(os.walk('tree')):
    for f in sorted(files):
        p = os.path.join(root, f)
        if not os.path.islink(p):
            print(p, os.path.getsize(p), hashlib.sha256(open(p, 'rb').read()).hexdigest())`
	if got, wantPy := z.mustSh("python3 -c \""+py+"\""), a.mustSh("python3 -c \""+py+"\""); got != wantPy {
		t.Fatalf("python3 on %s:\n%s\nproducer:\n%s", z.name, got, wantPy)
	}
}

// TestClusterListingOfEveryNode: a directory that several nodes write into
// lists every node's files on every node, each name once.
func TestClusterListingOfEveryNode(t *testing.T) {
	c := newCluster(t, 3)
	for _, n := range c.nodes {
		n.mustSh("mkdir -p shared && for i in 1 2 3; do echo " + n.name + " > shared/" + n.name + "-$i; done")
	}
	// A new file's name is published right after its last close (the
	// release is asynchronous): every node lists it soon.
	want := "n0-1 n0-2 n0-3 n1-1 n1-2 n1-3 n2-1 n2-2 n2-3"
	for _, n := range c.nodes {
		var got string
		eventually(t, n.name+" lists every node's files", func() bool {
			got = strings.Join(strings.Fields(n.mustSh("ls shared")), " ")
			return got == want
		})
	}
	// rmdir of a directory that holds other nodes' files fails.
	if r := c.nodes[0].sh("rm -f shared/n0-* && rmdir shared"); r.err == nil || !strings.Contains(r.stderr, "not empty") {
		t.Fatalf("rmdir of a directory with other nodes' files: %v", r)
	}
}

// TestClusterHDF5Elsewhere: an HDF5 file written with h5py on one node is
// read with h5py and numpy on another.
func TestClusterHDF5Elsewhere(t *testing.T) {
	const py = "/usr/bin/python3"
	if err := exec.Command(py, "-c", "import h5py, numpy").Run(); err != nil {
		t.Skipf("skipping: %s cannot import h5py and numpy (python3-h5py, python3-numpy): run scripts/setup.sh", py)
	}
	c := newCluster(t, 2)
	a, b := c.nodes[0], c.nodes[1]
	a.mustSh(py + ` -c "
import h5py, numpy
with h5py.File('data.h5', 'w') as f:
    f.create_dataset('x', data=numpy.arange(100000, dtype='float64').reshape(100, 1000))
    f['x'].attrs['unit'] = 'm'
"`)
	got := b.mustSh(py + ` -c "
import h5py, numpy
with h5py.File('data.h5', 'r') as f:
    x = f['x'][...]
    print(x.shape, float(x.sum()), f['x'].attrs['unit'])
"`)
	if got != "(100, 1000) 4999950000.0 m\n" {
		t.Fatalf("h5py on the other node read %q", got)
	}
}
