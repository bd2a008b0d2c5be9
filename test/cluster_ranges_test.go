package test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dyadfs/dyadfs/dtl/dtltest"
	dfs "github.com/dyadfs/dyadfs/fs"
)

// rangeReads is a Python program that reads 1 MiB at each offset given
// (in MiB) from the file named first, with pread or, for offsets written
// mNNN, through a mapping, and prints each read's SHA-256 or its errno.
const rangeReads = `
import hashlib, mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
for a in sys.argv[2:]:
    try:
        if a.startswith("m"):
            off = int(a[1:]) << 20
            m = mmap.mmap(fd, 1 << 20, mmap.MAP_SHARED, mmap.PROT_READ, offset=off)
            b = m[:]
            m.close()
        else:
            b = os.pread(fd, 1 << 20, int(a) << 20)
        print(a, hashlib.sha256(b).hexdigest())
    except OSError as e:
        print(a, "errno", e.errno)
`

// readRanges runs rangeReads on n and returns its lines by offset.
func readRanges(t *testing.T, n *node, file string, offs ...string) map[string]string {
	t.Helper()
	out := n.mustSh(fmt.Sprintf("python3 -c '%s' %s %s", rangeReads, file, strings.Join(offs, " ")))
	got := make(map[string]string)
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		k, v, _ := strings.Cut(line, " ")
		got[k] = v
	}
	return got
}

// TestClusterRanges: a 1 GiB file of another node, above the range
// threshold, read at 10 offsets of 1 MiB each moves less than 20 MiB, and
// the bytes are the owner's; so are a mapping's. A block corrupted on the
// way (here: on the owner's disk, behind its back) fails that read with
// EIO and is not kept, while other blocks read. After a restart the
// blocks here are read without a transfer; with --range-fill the rest
// comes aside, and the file is installed as a copy with the owner's
// bytes.
func TestClusterRanges(t *testing.T) {
	const mib = 1 << 20
	c := newClusterWith(t, clusterOptions{nodes: 0})
	a := c.addNode("a")
	b := c.addNode("b", "--range-threshold", "64MiB", "--metrics", ":9466")
	a.mustSh("head -c 1073741824 /dev/urandom > big")

	// A sparse file not fetched yet shows its owner's block count: du
	// and cp --sparse see what its data takes, not its size.
	a.mustSh("truncate -s 100M sparse && head -c 3000000 /dev/urandom | dd of=sparse bs=1M seek=7 conv=notrunc status=none")
	var shown, owners int
	fmt.Sscan(b.mustSh("stat -c %b sparse"), &shown)
	fmt.Sscan(a.mustSh("stat -c %b sparse"), &owners)
	if shown < owners*99/100 || shown > owners*101/100+8 { // the owner's filesystem may add an extent block since
		t.Fatalf("a sparse file of another node shows %d blocks, %d on its owner", shown, owners)
	}
	offs := []string{"0", "97", "194", "291", "388", "485", "582", "679", "776", "1023"}
	want := readRanges(t, a, "big", append(offs, "m500", "800", "801")...)

	got := readRanges(t, b, "big", offs...)
	for _, o := range offs {
		if got[o] != want[o] {
			t.Fatalf("1 MiB at %s MiB reads %s on the consumer, %s on the owner", o, got[o], want[o])
		}
	}
	r := b.status().DMD.Ranged
	if r.Bytes >= 20*mib || r.Opened != 1 || r.Open != 1 {
		t.Fatalf("10 reads of 1 MiB moved %d bytes in %d ranges (%d files opened in ranges, %d now); want less than 20 MiB, one file", r.Bytes, r.Fetches, r.Opened, r.Open)
	}
	metricsText := b.mustSh(`python3 -c 'import urllib.request, sys; sys.stdout.write(urllib.request.urlopen("http://` + b.ip + `:9466/metrics").read().decode())'`)
	if n := sample(metricsText, "dyadfs_ranged_range_bytes_total"); n != float64(r.Bytes) {
		t.Fatalf("metrics count %v bytes fetched in ranges, status %d", n, r.Bytes)
	}
	if _, err := os.Lstat(filepath.Join(b.backing, "big")); err == nil {
		t.Fatal("a file read in part is at its path in the consumer's backing directory")
	}
	if got := readRanges(t, b, "big", "m500"); got["m500"] != want["m500"] {
		t.Fatalf("a mapping of 1 MiB at 500 MiB reads %s, the owner's %s", got["m500"], want["m500"])
	}

	// A block whose bytes are not the ones published: EIO, not kept.
	dtltest.FlipByte(t, filepath.Join(a.backing, "big"), 800*mib+12345)
	got = readRanges(t, b, "big", "800", "801")
	if got["800"] != "errno 5" || got["801"] != want["801"] {
		t.Fatalf("reads of a corrupted block and the next: %v; want EIO and the owner's bytes", got)
	}
	if got := readRanges(t, b, "big", "800"); got["800"] != "errno 5" {
		t.Fatalf("a corrupted block read again: %v, want EIO again (not kept)", got)
	}
	if r := b.status().DMD.Ranged; r.Corrupt < 1 {
		t.Fatalf("status counts %d corrupt blocks, want at least 1", r.Corrupt)
	}
	dtltest.FlipByte(t, filepath.Join(a.backing, "big"), 800*mib+12345) // mended

	// A restart keeps what is here: the same reads move nothing.
	b.stop()
	b.start()
	if r := b.status().DMD.Ranged; r.Open != 1 || r.HereBytes < 11*mib {
		t.Fatalf("after a restart, %d files in ranges with %d bytes here; want 1 and the 11 MiB read", r.Open, r.HereBytes)
	}
	got = readRanges(t, b, "big", append(offs, "800")...)
	for _, o := range append(offs, "800") {
		if got[o] != want[o] {
			t.Fatalf("after a restart, 1 MiB at %s MiB reads %s, the owner's %s", o, got[o], want[o])
		}
	}
	if r := b.status().DMD.Ranged; r.Bytes > 2*mib {
		t.Fatalf("after a restart, reads of blocks here moved %d bytes", r.Bytes)
	}

	// copy_file_range out of a file read in ranges, into a file here.
	copied := b.mustSh(`python3 -c '
import hashlib, os
s = os.open("big", os.O_RDONLY)
d = os.open("part", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
left, off = 8 << 20, 300 << 20
while left > 0:
    c = os.copy_file_range(s, d, left, off)
    if c == 0:
        break
    left, off = left - c, off + c
os.lseek(d, 0, 0)
print(hashlib.sha256(os.read(d, 8 << 20)).hexdigest())
'`)
	if want := a.mustSh("dd if=big bs=1M skip=300 count=8 status=none | sha256sum | cut -d' ' -f1"); strings.TrimSpace(copied) != strings.TrimSpace(want) {
		t.Fatalf("8 MiB copied with copy_file_range from a file read in ranges: %s, the owner's %s", copied, want)
	}
	if n := b.status().Errnos["EOPNOTSUPP"]; n != 0 {
		t.Fatalf("%d requests answered EOPNOTSUPP", n)
	}

	// With --range-fill the rest comes aside once the file is opened,
	// while another program keeps a mapping of it: the copy is complete,
	// installed and read as any (opened while the mapping is held), and
	// the mapping reads on.
	b.stop()
	b.flags = append(b.flags, "--range-fill")
	b.start()
	heldFile, releaseFile := filepath.Join(c.dir, "held"), filepath.Join(c.dir, "release")
	held := b.startSh(fmt.Sprintf(`python3 -c '
import hashlib, mmap, os, time
fd = os.open("big", os.O_RDONLY)
m = mmap.mmap(fd, 1 << 20, mmap.MAP_SHARED, mmap.PROT_READ, offset=0)
first = hashlib.sha256(m[:]).hexdigest()
open("%s", "w").close()
for _ in range(2400):
    if os.path.exists("%s"):
        break
    time.sleep(0.05)
print(first, hashlib.sha256(m[:]).hexdigest())
'`, heldFile, releaseFile))
	eventually(t, "the mapping held", func() bool { _, err := os.Stat(heldFile); return err == nil })
	b.waitStatus("the file filled and installed", func(st dfs.Status) bool { return st.DMD.Ranged.Installed == 1 && st.DMD.Ranged.Open == 0 })
	st, err := os.Stat(filepath.Join(b.backing, "big"))
	if err != nil || st.Size() != 1<<30 {
		t.Fatalf("the completed copy: %v %v", st, err)
	}
	if orig, err := os.Stat(filepath.Join(a.backing, "big")); err != nil || !orig.ModTime().Equal(st.ModTime()) {
		t.Fatalf("the completed copy's mtime %v, the owner's %v (%v)", st.ModTime(), orig.ModTime(), err)
	}
	if got, want := sha(b, "big"), sha(a, "big"); got != want {
		t.Fatalf("the completed copy, opened while a mapping of the file read in ranges is held, reads %s, the owner's %s", got, want)
	}
	os.WriteFile(releaseFile, nil, 0o644)
	if r := <-held; r.err != nil || strings.TrimSpace(r.stdout) != want["0"]+" "+want["0"] {
		t.Fatalf("the mapping held while the file completed: %v, want the first MiB's hash twice (%s)", r, want["0"])
	}
	// The kernel sends the mapping's RELEASE after the process has gone,
	// so the files kept for it go a moment later.
	rangedDir := filepath.Join(b.backing, ".dyadfs", "ranged-b")
	eventually(t, "the ranged directory empty once the copy is complete and its last open released", func() bool {
		ents, _ := os.ReadDir(rangedDir)
		return len(ents) == 0
	})

	// A file read in part, removed on its owner while the reader's
	// daemon was down: its blocks go when the daemon starts again.
	b.stop()
	b.flags = b.flags[:len(b.flags)-1] // without --range-fill
	b.start()
	a.mustSh("head -c 73400320 /dev/urandom > mid")
	if got := readRanges(t, b, "mid", "0"); got["0"] != readRanges(t, a, "mid", "0")["0"] {
		t.Fatalf("1 MiB of a 70 MiB file read in ranges: %v", got)
	}
	if ents, _ := os.ReadDir(rangedDir); len(ents) == 0 {
		t.Fatal("nothing kept of a file read in part")
	}
	b.stop()
	a.mustSh("rm mid")
	b.start()
	if ents, _ := os.ReadDir(rangedDir); len(ents) != 0 {
		t.Fatalf("after a restart, the ranged directory keeps %d files of a file removed meanwhile", len(ents))
	}
}

// TestClusterRangedThenWhole: many readers of one large input file on a
// node, as the ranks of a job: the first reads it in ranges until it is
// whole and installed, the next ones open the copy (with passthrough)
// while the first still holds the file; once the first closes, a reader
// that opens while another holds the copy still opens and reads the
// owner's bytes.
func TestClusterRangedThenWhole(t *testing.T) {
	c := newClusterWith(t, clusterOptions{nodes: 0})
	a := c.addNode("a")
	b := c.addNode("b", "--range-threshold", "64MiB")
	a.mustSh("head -c 83886080 /dev/urandom > f")
	want := sha(a, "f")
	flag := filepath.Join(c.dir, "installed")
	res := b.startSh(fmt.Sprintf(`python3 -c '
import hashlib, os, time
def whole(fd):
    h, off = hashlib.sha256(), 0
    while True:
        b = os.pread(fd, 1 << 20, off)
        if not b:
            return h.hexdigest()
        h.update(b)
        off += len(b)
first = os.open("f", os.O_RDONLY)
sums = [whole(first)]
for _ in range(2400):
    if os.path.exists("%s"):
        break
    time.sleep(0.05)
second = os.open("f", os.O_RDONLY)
sums.append(whole(second))
os.close(first)
time.sleep(0.5)
third = os.open("f", os.O_RDONLY)
sums.append(whole(third))
os.close(third)
os.close(second)
print(" ".join(sums))
'`, flag))
	b.waitStatus("the file read in ranges installed", func(st dfs.Status) bool { return st.DMD.Ranged.Installed == 1 })
	os.WriteFile(flag, nil, 0o644)
	r := <-res
	if r.err != nil {
		t.Fatalf("three readers of a file read in ranges, then whole: %v\n%s\n%s", r.err, r.stdout, r.stderr)
	}
	if got := strings.Fields(r.stdout); len(got) != 3 || got[0] != want || got[1] != want || got[2] != want {
		t.Fatalf("three readers read %v, the owner's %s", got, want)
	}
}
