package test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// POSIX conformance: pjdfstest, the suite filesystems run in their CI,
// passes on a one-node mount as on ext4; each class of behaviour it found
// wrong once has a test of its own, on one node and across two.

// pjdfstestRun is the runner beside the checkout (../shared/pjdfstest).
func pjdfstestRun(t *testing.T) string {
	t.Helper()
	run, err := filepath.Abs("../../shared/pjdfstest/run.sh")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(run); err != nil {
		t.Skipf("skipping: pjdfstest is not beside the checkout (%s missing)", run)
	}
	for _, prog := range []string{"prove", "cc"} {
		if _, err := exec.LookPath(prog); err != nil {
			t.Skipf("skipping: %s is not installed (Debian packages perl and gcc)", prog)
		}
	}
	return run
}

// TestPjdfstest runs the whole of pjdfstest (about 8,800 cases, as root
// and as other users) inside a one-node mount, as a declared producer (an
// open of a missing name is ENOENT at once, as the suite expects), and
// fails on any failing case.
func TestPjdfstest(t *testing.T) {
	run := pjdfstestRun(t)
	m := newMount(t, "-o", "allow_other")
	cmd := exec.Command(run, m.mnt)
	cmd.Dir = m.mnt
	cmd.Env = append(os.Environ(), "DYAD_PATH_PRODUCER="+m.mnt, "PJDFSTEST_CACHE="+filepath.Join(os.TempDir(), "pjdfstest-85a8aea"), "HARNESS_OPTIONS=j3")
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil || !strings.Contains(out.String(), "Result: PASS") {
			t.Fatalf("pjdfstest: %v\n%s", err, failures(out.String()))
		}
	case <-time.After(20 * time.Minute):
		cmd.Process.Kill()
		t.Fatalf("pjdfstest did not finish in 20 minutes:\n%s", failures(out.String()))
	}
}

// failures keeps prove's report of what failed, and the summary.
func failures(out string) string {
	var keep []string
	for _, l := range strings.Split(out, "\n") {
		if !strings.HasSuffix(l, " ok") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}

// longPathScript makes, below the working directory, directories whose
// path is 4,000 bytes long (longer than PATH_MAX once joined to the
// backing directory's own path), and works on a file at the end of them:
// create, write, rename, link, truncate, stat, read, unlink, rmdir.
const longPathScript = `import os
names = ['%03d' % i + 'd' * 196 for i in range(20)]   # 20 x 200 bytes
deep = '/'.join(names)
assert len(deep) > 3990, len(deep)
p = ''
for n in names:
    p = n if not p else p + '/' + n
    os.mkdir(p)
f = deep + '/f'
fd = os.open(f, os.O_CREAT | os.O_WRONLY, 0o640)
os.write(fd, b'long path')
os.close(fd)
os.rename(f, deep + '/g')
os.link(deep + '/g', deep + '/h')
os.truncate(deep + '/h', 4)
print(oct(os.stat(deep + '/g').st_mode & 0o777), open(deep + '/g').read())
os.unlink(deep + '/h')
`

// longPathCheck reads the file the script left, from another node.
const longPathCheck = `import os
deep = '/'.join('%03d' % i + 'd' * 196 for i in range(20))
print(oct(os.stat(deep + '/g').st_mode & 0o777), open(deep + '/g').read())
`

// modesScript creates files and directories under three umasks and prints
// the modes they got.
const modesScript = `import os
for umask, fmode, dmode in ((0, 0o620, 0o777), (0o002, 0o666, 0o775), (0o022, 0o666, 0o777)):
    os.umask(umask)
    f, d = 'f%03o' % umask, 'd%03o' % umask
    os.close(os.open(f, os.O_CREAT | os.O_WRONLY, fmode))
    os.mkdir(d, dmode)
`

// modesCheck prints the modes modesScript's files and directories have.
const modesCheck = `import os
for umask in (0, 0o002, 0o022):
    f, d = 'f%03o' % umask, 'd%03o' % umask
    print(f, oct(os.stat(f).st_mode & 0o7777), d, oct(os.stat(d).st_mode & 0o7777))
`

const wantModes = "f000 0o620 d000 0o777\nf002 0o664 d002 0o775\nf022 0o644 d022 0o755\n"

// TestLongPathsAndModes: paths as long as the mount takes, and creation
// modes exactly as the caller's umask makes them, on one node.
func TestLongPathsAndModes(t *testing.T) {
	m := newMount(t)
	if r := python(t, m.mnt, longPathScript); r.err != nil || r.stdout != "0o640 long\n" {
		t.Fatalf("long paths: %v", r)
	}
	if r := python(t, m.mnt, modesScript+modesCheck); r.err != nil || r.stdout != wantModes {
		t.Fatalf("creation modes:\n%s\nwant\n%s(%v)", r.stdout, wantModes, r)
	}
}

// TestClusterLongPathsAndModes: the same across two nodes: the other node
// reads the long path, and shows the modes the creator's umask made (the
// records carry them).
func TestClusterLongPathsAndModes(t *testing.T) {
	c := newCluster(t, 2)
	a, b := c.nodes[0], c.nodes[1]
	for name, script := range map[string]string{"long.py": longPathScript, "check.py": longPathCheck, "modes.py": modesScript, "modes-check.py": modesCheck} {
		if err := os.WriteFile(filepath.Join(c.dir, name), []byte(script), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	py := func(n *node, name string) string {
		return n.mustSh(fmt.Sprintf("python3 %s", filepath.Join(c.dir, name)))
	}
	if got := py(a, "long.py"); got != "0o640 long\n" {
		t.Fatalf("long paths on the producer: %q", got)
	}
	if got := py(b, "check.py"); got != "0o640 long\n" {
		t.Fatalf("long paths on the other node: %q", got)
	}
	py(a, "modes.py")
	for _, n := range c.nodes {
		if got := py(n, "modes-check.py"); got != wantModes {
			t.Fatalf("creation modes on %s:\n%s\nwant\n%s", n.name, got, wantModes)
		}
	}
}

// TestOtherUsersPermissions: a user moves its subdirectory between two
// directories it may write, and cannot move one it may not write (its
// ".." would change); a write by a user other than the owner clears the
// set-user-ID and set-group-ID bits.
func TestOtherUsersPermissions(t *testing.T) {
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Skip("skipping: setpriv (util-linux) is not installed")
	}
	m := newMount(t, "-o", "allow_other")
	asNobody := func(script string) result {
		return run(t, m.mnt, "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c", script)
	}
	mustSh(t, m.mnt, "mkdir -m 777 a b && mkdir a/sub && chown 65534:65534 a/sub")
	if r := asNobody("import os; os.rename('a/sub', 'b/sub'); print('moved')"); r.err != nil || r.stdout != "moved\n" {
		t.Fatalf("nobody moving its directory between two directories it may write: %v", r)
	}
	mustSh(t, m.mnt, "chmod 555 b/sub")
	if r := asNobody("import os\ntry:\n    os.rename('b/sub', 'a/sub')\nexcept PermissionError:\n    print('EACCES')"); r.err != nil || r.stdout != "EACCES\n" {
		t.Fatalf("nobody moving a directory it may not write: %v, want EACCES", r)
	}
	for _, mode := range []string{"4777", "2777", "6777"} {
		mustSh(t, m.mnt, "rm -f s && : > s && chmod "+mode+" s")
		r := asNobody("import os\nfd = os.open('s', os.O_RDWR)\nos.write(fd, b'x')\nprint(oct(os.fstat(fd).st_mode & 0o7777))\nos.close(fd)")
		if r.err != nil || r.stdout != "0o777\n" {
			t.Fatalf("a %s file written by another user: %v, want its set-ID bits cleared", mode, r)
		}
		if got := mustSh(t, m.mnt, "stat -c %a s"); got != "777\n" {
			t.Fatalf("a %s file written by another user is %s, want 777", mode, got)
		}
	}
}
