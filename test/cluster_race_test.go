package test

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/dyadfs/dyadfs/hfl"
	"github.com/dyadfs/dyadfs/internal/poll"
)

// Races across nodes, each found by running ordinary programs on three
// nodes at once: what the README promises holds while they race.

// loopFor is a shell loop that runs body for d.
func loopFor(d time.Duration, body string) string {
	return fmt.Sprintf("end=$(($(date +%%s)+%d)); while [ $(date +%%s) -lt $end ]; do %s; done", int(d.Seconds()), body)
}

// TestClusterOpenWhileRenamedOver: a reader's open of an existing file is
// never turned into an open of the mount's root (EISDIR) or of nothing
// (ENOENT, ESTALE) when a rename replaces the name on the reader's node
// between the kernel's LOOKUP and its OPEN, while the version it replaces
// came from another node; a stat of the name always finds a file.
func TestClusterOpenWhileRenamedOver(t *testing.T) {
	c := newCluster(t, 2)
	a, b := c.nodes[0], c.nodes[1]
	a.mustSh("head -c 65536 /dev/urandom > x")
	const d = 12 * time.Second
	writer := b.startSh(loopFor(d, "head -c 65536 /dev/urandom > x; sleep 0.1"))
	renamer := a.startSh(loopFor(d, "head -c 65536 /dev/urandom > x.tmp && mv x.tmp x; sleep 0.1"))
	reader := a.startSh(loopFor(d, "cat x >/dev/null 2>>../read-errors || true; n=$((n+1))") + "; echo $n")
	nowait := a.startSh("export DYADFS_WAIT=0; " + loopFor(d, "cat x >/dev/null 2>>../nowait-errors || true; n=$((n+1))") + "; echo $n")
	statter := a.startSh(loopFor(d, "stat -c %F x >>../stat-types 2>&1; n=$((n+1))") + "; echo $n")
	for _, ch := range []<-chan result{writer, renamer} {
		if r := <-ch; r.err != nil {
			t.Fatalf("a writer failed: %v", r)
		}
	}
	for _, x := range []struct {
		ch   <-chan result
		errs string
	}{{reader, "read-errors"}, {nowait, "nowait-errors"}, {statter, ""}} {
		r := <-x.ch
		if r.err != nil {
			t.Fatalf("a reader failed: %v", r)
		}
		if x.errs == "" {
			// A stat of the name, which always exists, says a file.
			t.Logf("%s stats", strings.TrimSpace(r.stdout))
			for _, l := range strings.Split(strings.TrimSpace(c.readFile("stat-types")), "\n") {
				if l != "regular file" {
					t.Errorf("a stat of an existing file while it was renamed over said %q", l)
					break
				}
			}
			continue
		}
		errs := c.readFile(x.errs)
		t.Logf("%s: %s opens", x.errs, strings.TrimSpace(r.stdout))
		if errs != "" {
			t.Errorf("opens of an existing file failed while it was renamed over (%s):\n%.2000s", x.errs, errs)
		}
	}
}

// raceCreates is a Python program that creates, writes and closes the
// files NAME-0 ... NAME-(n-1) in step with the other nodes: before each
// create it waits at a barrier (files in a directory outside the mount)
// until every node reached it. argv: dir of the mount, barrier dir, node,
// number of nodes, n, name, mode ("excl" or "trunc").
const raceCreates = `
import os, sys, time
mnt, bar, node, nodes, n, name, mode = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6], sys.argv[7]
os.chdir(mnt)
flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if mode == "excl" else os.O_TRUNC)
won = []
for i in range(n):
    open(os.path.join(bar, "%d.%s" % (i, node)), "w").close()
    deadline = time.time() + 30
    while len([f for f in os.listdir(bar) if f.startswith("%d." % i)]) < nodes:
        if time.time() > deadline:
            sys.exit("barrier %d: the other nodes did not come" % i)
        time.sleep(0.0005)
    try:
        fd = os.open("%s-%d" % (name, i), flags, 0o644)
    except FileExistsError:
        continue
    os.write(fd, ("%s wrote %s-%d\n" % (node, name, i)).encode() * 100)
    os.close(fd)
    won.append("%s-%d" % (name, i))
print(" ".join(won))
`

// readAll is a shell loop that prints, for each file, its writer (the
// first word) and its checksum.
func readAll(name string, n int) string {
	return fmt.Sprintf("for i in $(seq 0 %d); do f=%s-$i; printf '%%s %%s ' $f \"$(head -c 2 $f)\"; md5sum < $f || echo missing; done", n-1, name)
}

// differing returns the lines of reads (one per node) that differ.
func differing(nodes []*node, reads []string) []string {
	lines := make([][]string, len(reads))
	for i, r := range reads {
		lines[i] = strings.Split(strings.TrimSpace(r), "\n")
	}
	var out []string
	for j := range lines[0] {
		var row []string
		same := true
		for i := range lines {
			l := ""
			if j < len(lines[i]) {
				l = lines[i][j]
			}
			same = same && l == lines[0][j]
			row = append(row, nodes[i].name+": "+l)
		}
		if !same {
			out = append(out, strings.Join(row, " | "))
		}
	}
	return out
}

// TestClusterConcurrentCreates: three nodes create one new name at once,
// with O_CREAT|O_EXCL and with O_CREAT|O_TRUNC, write and close. Once
// every close returned, all nodes read the same version of every name
// (within a moment: the losers are told by the name's home), and a
// losing node's log says its file was replaced.
func TestClusterConcurrentCreates(t *testing.T) {
	c := newCluster(t, 3)
	const n = 50
	for _, mode := range []string{"excl", "trunc"} {
		bar := filepath.Join(c.dir, "barrier-"+mode)
		if err := os.Mkdir(bar, 0o755); err != nil {
			t.Fatal(err)
		}
		var chs []<-chan result
		for _, nd := range c.nodes {
			argv := nd.argv("python3", "-c", raceCreates, c.mnt, bar, nd.name, fmt.Sprint(len(c.nodes)), fmt.Sprint(n), mode, mode)
			ch, _ := startCmdFor(t, bound, "/", nil, argv[0], argv[1:]...)
			chs = append(chs, ch)
		}
		wrote := make([][]string, len(chs))
		for i, ch := range chs {
			r := <-ch
			if r.err != nil {
				t.Fatalf("%s: %s creates: %v", c.nodes[i].name, mode, r)
			}
			wrote[i] = strings.Fields(r.stdout)
		}
		closed := time.Now()
		var reads []string
		agree := poll.Within(2*time.Second, func() bool {
			reads = reads[:0]
			for _, nd := range c.nodes {
				reads = append(reads, nd.mustSh(readAll(mode, n)))
			}
			return reads[0] == reads[1] && reads[1] == reads[2]
		})
		if !agree {
			for _, l := range differing(c.nodes, reads) {
				t.Log(l)
				name := strings.Fields(strings.SplitN(l, ": ", 2)[1])[0]
				for _, nd := range c.nodes {
					t.Logf("%s locates %s: %s", nd.name, name, nd.mustSh("cat .dyadfs/locate/"+name))
				}
			}
			t.Fatalf("%s: the nodes still disagree %v after every close returned", mode, time.Since(closed).Round(time.Millisecond))
		}
		if strings.Contains(reads[0], "missing") {
			t.Fatalf("%s: a name is missing:\n%s", mode, reads[0])
		}
		// A node whose file lost says so in its log.
		winner := map[string]string{}
		for _, l := range strings.Split(strings.TrimSpace(reads[0]), "\n") {
			f := strings.Fields(l)
			winner[f[0]] = f[1]
		}
		losses := 0
		for i, nd := range c.nodes {
			for _, name := range wrote[i] {
				if winner[name] == nd.name {
					continue
				}
				losses++
				if !strings.Contains(nd.readLog(), `"file was replaced by another node's version; the version here is removed" path=`+name+" ") {
					t.Errorf("%s: %s's file %s lost to %s's, and its log does not say so", mode, nd.name, name, winner[name])
				}
			}
		}
		t.Logf("%s: %d files lost to another node's", mode, losses)
	}
}

// TestClusterInodeNumbersStay: a file shows one inode number on every
// node, before its bytes arrive, once they are here, and after it is
// fetched again; a hard link of another node's file fails with EXDEV
// (hard links are per node) and changes nothing, and the owner's file
// stays its own.
func TestClusterInodeNumbersStay(t *testing.T) {
	c := newCluster(t, 3)
	a, b, z := c.nodes[0], c.nodes[1], c.nodes[2]
	ino := func(n *node, name string) string {
		t.Helper()
		return strings.TrimSpace(n.mustSh("stat -c %i " + name))
	}
	a.mustSh("echo x > h")
	want := ino(a, "h")
	for _, n := range []*node{b, z} {
		if got := ino(n, "h"); got != want {
			t.Fatalf("%s shows h as inode %s before its bytes arrive; %s shows %s", n.name, got, a.name, want)
		}
		// readdir's d_ino is stat's.
		if got := strings.Fields(n.mustSh("ls -i h"))[0]; got != want {
			t.Fatalf("%s lists h as inode %s, stat says %s", n.name, got, want)
		}
	}
	if r := b.sh("ln h h2"); r.err == nil || !strings.Contains(r.stderr, "Invalid cross-device link") {
		t.Fatalf("a hard link of another node's file: %v; want EXDEV", r)
	}
	if got := b.mustSh("cat h"); got != "x\n" {
		t.Fatalf("%s reads %q", b.name, got)
	}
	if got := ino(b, "h"); got != want {
		t.Fatalf("%s shows h as inode %s once it is here; it was %s", b.name, got, want)
	}
	if got := ino(a, "h"); got != want {
		t.Fatalf("%s's h became inode %s; it was %s", a.name, got, want)
	}
	if rec, ok := a.published("h"); !ok || rec.Owner != a.name {
		t.Fatalf("h's record %+v, %v: the link attempt must leave it %s's", rec, ok, a.name)
	}
	if strings.Contains(a.readLog(), "file was replaced") {
		t.Fatalf("%s's file was replaced:\n%s", a.name, a.readLog())
	}
	// Rewritten in place on its owner, and fetched again: the same file.
	a.mustSh("echo y > h")
	if got := b.mustSh("cat h"); got != "y\n" {
		t.Fatalf("%s reads %q after the rewrite", b.name, got)
	}
	for _, n := range c.nodes {
		if got := ino(n, "h"); got != want {
			t.Fatalf("%s shows h as inode %s after a rewrite in place; it was %s", n.name, got, want)
		}
	}
	// Appended to on another node: still the same file, everywhere.
	z.mustSh("echo z >> h")
	for _, n := range c.nodes {
		if got := n.mustSh("cat h"); got != "y\nz\n" {
			t.Fatalf("%s reads %q after the append", n.name, got)
		}
		if got := ino(n, "h"); got != want {
			t.Fatalf("%s shows h as inode %s after an append on %s; it was %s", n.name, got, z.name, want)
		}
	}
	// A rename takes the number along; a new file gets another.
	b.mustSh("mv h moved")
	for _, n := range c.nodes {
		if got := ino(n, "moved"); got != want {
			t.Fatalf("%s shows the renamed file as inode %s; it was %s", n.name, got, want)
		}
	}
	b.mustSh("echo new > h")
	if got := ino(a, "h"); got == want {
		t.Fatalf("a new file at the old name shows the old file's inode %s", got)
	}
	// Restarted, a node shows the numbers it showed.
	before := ino(b, "moved")
	b.stop()
	b.start()
	if got := ino(b, "moved"); got != before {
		t.Fatalf("after a restart %s shows the file as inode %s; it was %s", b.name, got, before)
	}
}

// TestClusterGitClone: git clone of a repository in the mount, into the
// mount, works from every node, with hard links (git links the objects
// and checks that each link is its source; it falls back to a copy where
// a link is refused), and the clones are clean.
func TestClusterGitClone(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("skipping: git is not installed: run scripts/setup.sh")
	}
	c := newCluster(t, 3)
	a := c.nodes[0]
	// git probes for files it may create: it waits for none of them.
	git := "DYADFS_WAIT=0 git -c user.name=t -c user.email=t@t -c init.defaultBranch=main -c safe.directory='*'"
	a.mustSh(`mkdir repo && cd repo && ` + git + ` init -q && for i in 1 2 3 4 5; do echo $i > f$i; done && mkdir d && echo deep > d/g && ` + git + ` add . && ` + git + ` commit -qm one && echo 6 > f6 && ` + git + ` add f6 && ` + git + ` commit -qm two`)
	for _, n := range []*node{c.nodes[1], a, c.nodes[2], c.nodes[1]} {
		dest := "clone-" + n.name + fmt.Sprint(time.Now().UnixNano())
		n.mustSh(git + " clone -q repo " + dest + " && cd " + dest + " && " + git + " fsck --full --strict && test -z \"$(" + git + " status --porcelain)\" && test \"$(cat d/g)\" = deep")
		// Cloned again from the clone, on another node.
		other := c.nodes[(indexOf(c.nodes, n)+1)%len(c.nodes)]
		other.mustSh(git + " clone -q " + dest + " " + dest + "-again && cd " + dest + "-again && " + git + " fsck --full --strict && test -z \"$(" + git + " status --porcelain)\"")
	}
}

func indexOf(nodes []*node, n *node) int {
	for i, m := range nodes {
		if m == n {
			return i
		}
	}
	return -1
}

// rewriteAndRead is a Python program that, for a while, rewrites one file
// with O_TRUNC (a whole version: one token repeated) and reads it, each
// at random, and reports what went wrong: reads that failed (by errno) and
// reads that were not one whole version. argv: file, seconds, node, size.
const rewriteAndRead = `
import errno, json, os, random, sys, time
name, secs, node, size = sys.argv[1], float(sys.argv[2]), sys.argv[3], int(sys.argv[4])
errs, partial, reads, writes, bad = {}, 0, 0, 0, []
end = time.time() + secs
while time.time() < end:
    if random.random() < 0.3:
        tok = ("%s-%012d|" % (node, random.randrange(10**12))).encode()
        with open(name, "wb") as f:
            f.write((tok * (size // len(tok) + 1))[:size])
        writes += 1
    else:
        try:
            t0 = time.time()
            with open(name, "rb") as f:
                data = f.read()
                st = os.fstat(f.fileno())
        except OSError as e:
            k = errno.errorcode.get(e.errno, str(e.errno))
            errs[k] = errs.get(k, 0) + 1
            continue
        reads += 1
        tok = data[:data.index(b"|") + 1] if b"|" in data else b"x"  # the first version
        if len(data) != size or not tok or (tok * (size // len(tok) + 1))[:size] != data:
            partial += 1
            if len(bad) < 3:
                toks = sorted(set(data.split(b"|")))
                bad.append("%d bytes, %d tokens: %r, opened at %s, size then %d, inode %d" % (len(data), len(toks), [t[:30] for t in toks[:4]],
                    time.strftime("%H:%M:%S", time.gmtime(t0)) + ("%.3f" % (t0 % 1))[1:], st.st_size, st.st_ino))
    time.sleep(random.random() * 0.01)
print(json.dumps({"errors": errs, "partial": partial, "reads": reads, "writes": writes, "bad": bad}))
`

// TestClusterRewrittenWhileSent: three nodes rewrite one file with
// O_TRUNC and read it, all at once. Every read is one whole version and no
// open fails: a copy that changed on its owner while it was sent is
// fetched again in the version that replaced it, not refused as damaged;
// and nothing is published without its checksum.
func TestClusterRewrittenWhileSent(t *testing.T) {
	c := newCluster(t, 3)
	const size = 1 << 20
	c.nodes[0].mustSh(fmt.Sprintf("head -c %d /dev/zero | tr '\\0' x > v", size))
	var chs []<-chan result
	for _, n := range c.nodes {
		argv := n.argv("python3", "-c", rewriteAndRead, filepath.Join(c.mnt, "v"), "15", n.name, fmt.Sprint(size))
		ch, _ := startCmdFor(t, bound, "/", nil, argv[0], argv[1:]...)
		chs = append(chs, ch)
	}
	for i, ch := range chs {
		r := <-ch
		n := c.nodes[i]
		if r.err != nil {
			t.Fatalf("%s: %v", n.name, r)
		}
		t.Logf("%s: %s", n.name, strings.TrimSpace(r.stdout))
		var got struct {
			Errors  map[string]int
			Partial int
			Reads   int
		}
		if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
			t.Fatalf("%s: %v: %q", n.name, err, r.stdout)
		}
		if len(got.Errors) > 0 || got.Partial > 0 || got.Reads == 0 {
			t.Errorf("%s: %d reads, failed opens %v, %d reads not one whole version", n.name, got.Reads, got.Errors, got.Partial)
		}
	}
	for _, n := range c.nodes {
		log := n.readLog()
		for _, bad := range []string{"copy does not match its published checksum", "publishing it without"} {
			if strings.Contains(log, bad) {
				t.Errorf("%s's log says %q", n.name, bad)
			}
		}
	}
}

// holdCreated creates a file (a CREATE: O_EXCL), writes "first" and
// closes it, which publishes it, while a forked child keeps the created
// descriptor open: the kernel keeps the create's handle, and with it the
// inode's backing file. Then it keeps an O_PATH descriptor of the same
// inode and makes the file ready (argv[2]). Once a line comes on its
// standard input (the file was replaced from another node meanwhile) it
// opens the file again through that descriptor with O_TRUNC, which
// reaches the daemon as an open of the created inode with no look up of
// the name, writes "third" and prints what the open did. argv: file,
// ready file.
const holdCreated = `
import errno, os, sys
fd = os.open(sys.argv[1], os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
os.write(fd, b"first")
created = os.fstat(fd).st_ino
r, w = os.pipe()
if os.fork() == 0:
    os.close(w)
    os.read(r, 1)
    os._exit(0)
os.close(r)
os.close(fd)
pfd = os.open(sys.argv[1], os.O_PATH)
if os.fstat(pfd).st_ino != created:
    print("not the created inode")
    sys.exit(1)
open(sys.argv[2], "w").close()
if sys.stdin.readline() == "":
    sys.exit(1)  # the test ended first
try:
    fd = os.open("/proc/self/fd/%d" % pfd, os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, b"third")
    finally:
        os.close(fd)
    print("written")
except OSError as e:
    print(errno.errorcode[e.errno])
`

// TestClusterTruncatedThroughHeldCreate: a file created on one node is
// replaced from another while the create's descriptor is still open on
// the first (an inherited copy of it), and the first node then rewrites it
// with O_TRUNC through the created inode. The open fails (ESTALE) and the
// other node's version stays: with passthrough the kernel sends the
// writes of every open of an inode to the backing file of its first
// handle while any is open, so the rewrite cannot be given a new file.
// Before, it was, and that file was published empty (seen once in CI,
// under rapid rewrites from three nodes).
func TestClusterTruncatedThroughHeldCreate(t *testing.T) {
	c := newCluster(t, 2)
	a, b := c.nodes[0], c.nodes[1]
	if p := a.status().Passthrough; p != "on" {
		t.Skipf("needs FUSE passthrough, which is %s", p)
	}
	ready := filepath.Join(t.TempDir(), "ready")
	argv := a.argv("python3", "-c", holdCreated, filepath.Join(c.mnt, "v"), ready)
	held, stdin := startCmdFor(t, bound, "/", nil, argv[0], argv[1:]...)
	defer stdin.Close()
	eventually(t, "v created and held by "+a.name, func() bool {
		if r, running := notYet(held); !running {
			t.Fatalf("the holder ended early: %v", r)
		}
		_, err := os.Stat(ready)
		return err == nil
	})
	if rec, ok := a.published("v"); !ok || rec.Size != 5 {
		t.Fatalf("v after its create: %+v, want 5 bytes published", rec)
	}
	b.mustSh("printf second > v")
	eventually(t, "v published by "+b.name, func() bool {
		rec, ok := a.published("v")
		return ok && rec.Owner == b.name && rec.Size == 6
	})
	fmt.Fprintln(stdin, "go")
	r := within(t, "the rewrite through the created inode", bound, held)
	if r.err != nil || r.stdout != "ESTALE\n" {
		t.Fatalf("the rewrite through the created inode: %v, want ESTALE", r)
	}
	for _, n := range []*node{a, b} {
		if got := n.mustSh("cat v"); got != "second" {
			t.Errorf("%s reads %q, want %q", n.name, got, "second")
		}
	}
	if rec, ok := a.published("v"); !ok || rec.Owner != b.name || rec.Size != 6 {
		t.Errorf("published: %+v, want %s's 6 bytes", rec, b.name)
	}
}

// timedLoop is a Python program that, for a while, either rewrites a file
// (role "write": 8 KiB every 50 ms) or reads it (role "read"), timing
// each open-to-close, and reports the longest and what failed. argv: file,
// seconds, role.
const timedLoop = `
import errno, json, os, sys, time
name, secs, role = sys.argv[1], float(sys.argv[2]), sys.argv[3]
longest, n, errs, i = 0.0, 0, {}, 0
end = time.time() + secs
while time.time() < end:
    t = time.time()
    try:
        if role == "write":
            with open(name, "wb") as f:
                f.write(("%08d" % i).encode() * 1024)
            i += 1
        else:
            with open(name, "rb") as f:
                f.read()
    except OSError as e:
        k = errno.errorcode.get(e.errno, str(e.errno))
        errs[k] = errs.get(k, 0) + 1
    longest = max(longest, time.time() - t)
    n += 1
    if role == "write":
        time.sleep(0.05)
print(json.dumps({"longest": longest, "n": n, "errors": errs, "last": i - 1}))
`

// homeOrder returns the nodes of c in the order they would be the home of
// directory dir: rendezvous hashing, FNV-1a of node, NUL and the
// directory's key (see hfl's notices), with the default key shape.
func homeOrder(c *cluster, dir string) []string {
	key := c.namespace + "/" + hfl.DYADKey(dir, hfl.DefaultKeyDepth, hfl.DefaultKeyBins)
	score := func(node string) uint64 {
		h := fnv.New64a()
		h.Write([]byte(node))
		h.Write([]byte{0})
		h.Write([]byte(key))
		return h.Sum64()
	}
	var nodes []string
	for _, n := range c.nodes {
		nodes = append(nodes, n.name)
	}
	sort.Slice(nodes, func(i, j int) bool { return score(nodes[i]) > score(nodes[j]) })
	return nodes
}

type timed struct {
	Longest float64
	N       int
	Errors  map[string]int
	Last    int
}

func parseTimed(t *testing.T, who string, r result) timed {
	t.Helper()
	if r.err != nil {
		t.Fatalf("%s: %v", who, r)
	}
	var got timed
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
		t.Fatalf("%s: %v: %q", who, err, r.stdout)
	}
	t.Logf("%s: %s", who, strings.TrimSpace(r.stdout))
	return got
}

// TestClusterCutReader: a node that holds a path is cut off for 6 s while
// another node rewrites the path every 50 ms and a third, the path's
// home, reads it. The home does not wait on the silent holder: it drops
// the holder's promises within a short bound (the holder is told when it
// is back, and asks again), so the writer's closes return within the
// bound the README gives (the lease TTL plus 5 s) and the node never cut
// is not held up; once back, the cut node reads the last version.
func TestClusterCutReader(t *testing.T) {
	c := newCluster(t, 3)
	a, b, z := c.nodes[0], c.nodes[1], c.nodes[2]
	// A directory whose home is z, and would be b without z: z started
	// last, so for a while it passes changes on to b too (the handoff),
	// which must not wait on b either.
	dir := ""
	for i := 0; dir == ""; i++ {
		d := fmt.Sprintf("d%d", i)
		if homeOrder(c, d)[0] == z.name && homeOrder(c, d)[1] == b.name {
			dir = d
		}
	}
	a.mustSh("mkdir " + dir + " && echo x > " + dir + "/f")
	var l struct{ Home string }
	if err := json.Unmarshal([]byte(a.mustSh("cat .dyadfs/locate/"+dir+"%2Ff")), &l); err != nil || l.Home != z.name {
		t.Fatalf("%s's home is %q (%v); the test computed %s", dir, l.Home, err, z.name)
	}
	file := filepath.Join(c.mnt, dir, "f")
	for _, n := range []*node{b, z} {
		n.mustSh("cat " + dir + "/f > /dev/null") // holders
	}
	const secs = 18
	start := func(n *node, role string) <-chan result {
		argv := n.argv("python3", "-c", timedLoop, file, fmt.Sprint(secs), role)
		ch, _ := startCmdFor(t, bound, "/", nil, argv[0], argv[1:]...)
		return ch
	}
	writer, cutReader, homeReader := start(a, "write"), start(b, "read"), start(z, "read")
	time.Sleep(4 * time.Second)
	b.linkDown()
	time.Sleep(6 * time.Second)
	b.linkUp()
	w := parseTimed(t, a.name+" writes", <-writer)
	parseTimed(t, b.name+" reads (cut)", <-cutReader)
	h := parseTimed(t, z.name+" reads (home)", <-homeReader)
	const limit = 2*time.Second + 5*time.Second // the lease TTL the tests use, plus 5 s
	if took := time.Duration(w.Longest * float64(time.Second)); took > limit || len(w.Errors) > 0 {
		t.Errorf("the writer's longest close took %v (errors %v); want at most %v", took.Round(time.Millisecond), w.Errors, limit)
	}
	if took := time.Duration(h.Longest * float64(time.Second)); took > limit || len(h.Errors) > 0 {
		t.Errorf("a reader on %s, never cut, waited %v (errors %v); want at most %v", z.name, took.Round(time.Millisecond), h.Errors, limit)
	}
	want := strings.Repeat(fmt.Sprintf("%08d", w.Last), 1024)
	for _, n := range c.nodes {
		var got string
		if !poll.Within(5*time.Second, func() bool { got = n.mustSh("cat " + dir + "/f"); return got == want }) {
			t.Errorf("%s reads %.16q..., not the last version %.16q...", n.name, got, want)
		}
	}
}

// linkThenUnlink writes files the way git writes its objects: each under
// a temporary name, closed, linked to its real name, the temporary name
// unlinked at once (while the kernel still sends the closed file's
// release). argv: directory, count.
const linkThenUnlink = `
import os, sys
d, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    tmp = os.path.join(d, "tmp_obj_%d" % i)
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o444)
    os.write(fd, b"blob %d\n" % i)
    os.close(fd)
    os.link(tmp, os.path.join(d, "obj_%d" % i))
    os.unlink(tmp)
`

// TestClusterLinkThenUnlink: a name unlinked right after its file was
// closed and linked elsewhere is gone on every node; no release of the
// closed file publishes it again. (Such a name, left published, made
// another node's git clone wait for an object file that no longer
// exists.) Two writers on each node, so that the daemons take requests
// out of order.
func TestClusterLinkThenUnlink(t *testing.T) {
	c := newCluster(t, 2)
	const each = 150
	var dirs []string
	var chs []<-chan result
	for _, n := range c.nodes {
		for i := 0; i < 2; i++ {
			dir := fmt.Sprintf("objects/%s-%d", n.name, i)
			n.mustSh("mkdir -p " + dir)
			dirs = append(dirs, dir)
			argv := n.argv("python3", "-c", linkThenUnlink, filepath.Join(c.mnt, dir), fmt.Sprint(each))
			ch, _ := startCmdFor(t, bound, "/", nil, argv[0], argv[1:]...)
			chs = append(chs, ch)
		}
	}
	for _, ch := range chs {
		if r := <-ch; r.err != nil {
			t.Fatalf("writing: %v", r)
		}
	}
	for _, n := range c.nodes {
		for _, dir := range dirs {
			out := n.mustSh(fmt.Sprintf("ls %s | grep -c '^obj_' || true; ls %s | grep '^tmp_obj' || true", dir, dir))
			if strings.TrimSpace(out) != fmt.Sprint(each) {
				t.Fatalf("%s lists in %s, of %d objects and no temporary names:\n%s", n.name, dir, each, out)
			}
		}
	}
	c.nodes[1].mustSh(fmt.Sprintf("cat %s/obj_0 %s/obj_%d | grep -c blob | grep -qx 2", dirs[0], dirs[0], each-1))
}

// TestClusterNoWaitOpenOfRemovedFile: a reader that does not wait for
// missing files (DYADFS_WAIT=0) opens a file that another node is
// rewriting: it waits for the writer, as close-to-open asks; when the
// writer removes the file instead, the open fails with ENOENT, as on one
// disk, rather than wait for a publish the reader never asked to wait for.
func TestClusterNoWaitOpenOfRemovedFile(t *testing.T) {
	c := newCluster(t, 2)
	a, b := c.nodes[0], c.nodes[1]
	a.mustSh("echo v1 > f")
	b.mustSh("test \"$(cat f)\" = v1")
	// The claim of the rewrite is told before echo's close of its copy
	// of the descriptor returns; "claimed", created after it, is seen on
	// b once b was told (the store may hold the claim before then).
	writer := a.startSh("exec 3>f; echo v2 >&3; : > claimed; sleep 2; rm f")
	eventually(t, "the rewrite told to the store and to "+b.name, func() bool {
		rec, ok := b.published("f")
		return ok && rec.Writing && b.sh("test -e claimed").err == nil
	})
	start := time.Now()
	r := b.sh("DYADFS_WAIT=0 cat f")
	took := time.Since(start)
	if r.err == nil || !strings.Contains(r.stderr, "No such file") {
		t.Fatalf("cat of a file removed while it was rewritten: %v after %v; want ENOENT", r, took)
	}
	if took > 15*time.Second {
		t.Fatalf("cat failed after %v; want it to wait for the writer (about 2 s), not longer", took)
	}
	if w := <-writer; w.err != nil {
		t.Fatalf("writer: %v", w)
	}
}
