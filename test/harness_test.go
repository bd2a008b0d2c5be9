// Package test holds dyadfs's integration tests: they build the real
// dyadfs binary, mount real filesystems with it and run real programs (sh,
// cat, dd, cp, python3) against them.
package test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dyadfs/dyadfs/internal/poll"

	"golang.org/x/sys/unix"

	"github.com/dyadfs/dyadfs/fs"
	"github.com/dyadfs/dyadfs/hfl"
)

var (
	dyadfsBin  string // the dyadfs binary under test
	skipReason string // why these tests cannot run here, if they cannot
)

// binEnv names a dyadfs binary to test instead of building this tree's.
const binEnv = "DYADFS_TEST_BIN"

// bound caps every wait in these tests; a test that reaches it has found a
// hang, not a slow machine.
const bound = 60 * time.Second

func TestMain(m *testing.M) {
	if runHelper() {
		return
	}
	skipReason = missingPrerequisite()
	// The tests' etcd has no TLS or users: let the daemons keep their
	// generated job secret there (tests of the refusal unset this).
	os.Setenv("DYADFS_INSECURE_STORE_SECRET", "1")
	dir, err := os.MkdirTemp("", "dyadfs-test-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Chmod(dir, 0o755) // tests run the binary as other users too
	if bin := os.Getenv(binEnv); skipReason == "" && bin != "" {
		// A binary built elsewhere: scripts/bench.sh compares releases.
		dyadfsBin = bin
		unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
	} else if skipReason == "" {
		dyadfsBin = filepath.Join(dir, "dyadfs")
		args := []string{"build", "-o", dyadfsBin}
		if raceEnabled {
			args = append(args, "-race")
		}
		// The binary under test has the test binary's own build tags.
		if tags := strings.TrimSpace(fluxTag + " " + ucxTag); tags != "" {
			args = append(args, "-tags", strings.ReplaceAll(tags, " ", ","))
		}
		out, err := exec.Command("go", append(args, "github.com/dyadfs/dyadfs/cmd/dyadfs")...).CombinedOutput()
		if err != nil {
			fmt.Fprintf(os.Stderr, "build dyadfs: %v\n%s", err, out)
			os.RemoveAll(dir)
			os.Exit(1)
		}
		// Daemons are orphaned when `dyadfs mount` returns; as a
		// subreaper this process inherits them and can reap them.
		unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func missingPrerequisite() string {
	if os.Geteuid() != 0 {
		return "the integration tests mount filesystems and need root"
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		return "/dev/fuse is missing"
	}
	for _, prog := range []string{"fusermount3", "python3", "dd", "cp", "sh", "cat"} {
		if _, err := exec.LookPath(prog); err != nil {
			return prog + " is not installed: run scripts/setup.sh"
		}
	}
	return ""
}

func requireEnv(t testing.TB) {
	t.Helper()
	if skipReason != "" {
		t.Skip("skipping: " + skipReason)
	}
}

// mount is one dyadfs mount made by the real binary.
type mount struct {
	t       *testing.T
	mnt     string
	backing string
	logFile string
	node    string
	args    []string
	env     []string
	pid     int
}

// newMount mounts dyadfs over a fresh backing directory with extra flags.
func newMount(t *testing.T, flags ...string) *mount {
	t.Helper()
	return newMountEnv(t, nil, flags...)
}

// mountDirs makes a test directory holding an empty mountpoint and backing
// directory.
// removeDefaultLog removes, when the test ends, the log a daemon mounted
// at mountpoint without --log-file writes in the temporary directory.
func removeDefaultLog(t testing.TB, mountpoint string) {
	name := strings.Trim(strings.ReplaceAll(mountpoint, "/", "-"), "-")
	t.Cleanup(func() { os.Remove(filepath.Join(os.TempDir(), "dyadfs-"+name+".log")) })
}

func mountDirs(t *testing.T) (root, mnt, backing string) {
	t.Helper()
	root = t.TempDir()
	mnt, backing = filepath.Join(root, "mnt"), filepath.Join(root, "backing")
	for _, d := range []string{mnt, backing} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return root, mnt, backing
}

// newMountEnv is newMount with extra environment variables for dyadfs.
func newMountEnv(t *testing.T, env []string, flags ...string) *mount {
	t.Helper()
	requireEnv(t)
	root, mnt, backing := mountDirs(t)
	m := &mount{
		t:       t,
		mnt:     mnt,
		backing: backing,
		logFile: filepath.Join(root, "dyadfs.log"),
		node:    "node-a",
	}
	m.args, m.env = flags, env
	m.start()
	return m
}

// start runs `dyadfs mount`, which returns once the mount is ready.
func (m *mount) start() {
	m.t.Helper()
	args := append([]string{"mount", "--backing", m.backing, "--node", m.node, "--log-file", m.logFile, "--log-level", "debug"}, m.args...)
	args = append(args, m.mnt)
	out, err := dyadfsEnv(m.t, m.env, args...)
	if err != nil {
		m.t.Fatalf("dyadfs mount: %v\n%s\nlog:\n%s", err, out, m.readLog())
	}
	m.pid = m.status().PID
	m.t.Cleanup(m.cleanup)
}

func (m *mount) path(rel string) string { return filepath.Join(m.mnt, rel) }

func (m *mount) readLog() string {
	b, _ := os.ReadFile(m.logFile)
	return string(b)
}

// status reads the mount's status file.
func (m *mount) status() fs.Status {
	m.t.Helper()
	data, err := os.ReadFile(filepath.Join(m.mnt, ".dyadfs", "status"))
	if err != nil {
		m.t.Fatalf("read status: %v", err)
	}
	var st fs.Status
	if err := json.Unmarshal(data, &st); err != nil {
		m.t.Fatalf("parse status: %v", err)
	}
	return st
}

// waitStatus polls the status file until cond holds.
func (m *mount) waitStatus(what string, cond func(fs.Status) bool) {
	m.t.Helper()
	eventually(m.t, what, func() bool { return cond(m.status()) })
}

// eventually polls cond until it holds. Polling is the only way to observe
// another process's progress that has no event; it is bounded.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	poll.Until(t, bound, what, cond)
}

// unmount unmounts with fusermount3 and waits for the daemon to exit.
func (m *mount) unmount() {
	m.t.Helper()
	if out, err := runOut("fusermount3", "-u", m.mnt); err != nil {
		m.t.Fatalf("fusermount3 -u: %v: %s", err, out)
	}
	if !waitExit(m.pid, bound) {
		m.t.Fatalf("daemon %d still running %v after unmount; log:\n%s", m.pid, bound, m.readLog())
	}
	m.pid = 0
}

// cleanup removes the mount and the daemon whatever state they are in.
func (m *mount) cleanup() {
	if isMounted(m.mnt) {
		exec.Command("fusermount3", "-u", "-z", m.mnt).Run()
	}
	if m.pid != 0 && !waitExit(m.pid, 10*time.Second) {
		syscall.Kill(m.pid, syscall.SIGKILL)
		waitExit(m.pid, 10*time.Second)
	}
	log := m.readLog()
	if strings.Contains(log, "panic in a FUSE handler") {
		m.t.Errorf("the daemon logged a panic")
	}
	if m.t.Failed() {
		m.t.Logf("dyadfs log of %s:\n%s", m.mnt, log)
	}
	if isMounted(m.mnt) {
		m.t.Errorf("%s is still mounted after cleanup", m.mnt)
	}
}

// waitExit waits for process pid to end and reaps it.
func waitExit(pid int, limit time.Duration) bool {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return true // already gone
	}
	defer unix.Close(fd)
	// The Go runtime's preemption signals interrupt poll: retry EINTR with
	// what is left of the limit.
	deadline := time.Now().Add(limit)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return false
		}
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, int(left.Milliseconds())+1)
		if err == unix.EINTR {
			continue
		}
		if n != 1 {
			return false
		}
		break
	}
	var ws unix.WaitStatus
	unix.Wait4(pid, &ws, unix.WNOHANG, nil)
	return true
}

func isMounted(dir string) bool {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && f[4] == dir {
			return true
		}
	}
	return false
}

// runOut runs a command, bounded, and returns its combined output.
func runOut(name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// dyadfs runs the dyadfs binary and returns its combined output.
func dyadfs(t testing.TB, args ...string) (string, error) {
	t.Helper()
	return dyadfsEnv(t, nil, args...)
}

// dyadfsEnv runs the dyadfs binary with extra environment variables.
func dyadfsEnv(t testing.TB, env []string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	cmd := exec.CommandContext(ctx, dyadfsBin, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// locate returns the record the mount's locator holds for rel, or false.
func (m *mount) locate(rel string) (fs.Located, bool) {
	m.t.Helper()
	data, err := os.ReadFile(filepath.Join(m.mnt, ".dyadfs", "locate", url.PathEscape(rel)))
	if errors.Is(err, os.ErrNotExist) {
		return fs.Located{}, false
	}
	if err != nil {
		m.t.Fatalf("locate %s: %v", rel, err)
	}
	var l fs.Located
	if err := json.Unmarshal(data, &l); err != nil {
		m.t.Fatalf("locate %s: %v", rel, err)
	}
	return l, true
}

// published returns the global store's record of rel, if there is one.
func (m *mount) published(rel string) (hfl.Record, bool) {
	l, ok := m.locate(rel)
	if !ok || l.Published == nil {
		return hfl.Record{}, false
	}
	return *l.Published, true
}

// waitPublished waits until rel is published with a generation above after.
func (m *mount) waitPublished(rel string, after uint64) hfl.Record {
	m.t.Helper()
	var rec hfl.Record
	m.waitStatus(rel+" published", func(fs.Status) bool {
		r, ok := m.published(rel)
		rec = r
		return ok && r.Generation > after
	})
	return rec
}

// result is what a program run printed and how it ended.
type result struct {
	stdout, stderr string
	err            error
}

func (r result) String() string {
	return fmt.Sprintf("err=%v stdout=%q stderr=%q", r.err, r.stdout, r.stderr)
}

// run runs a program to completion, bounded.
func run(t testing.TB, dir string, name string, args ...string) result {
	t.Helper()
	return <-start(t, dir, name, args...)
}

// start starts a program and returns a channel that delivers its result.
// The program is killed when the test ends.
func start(t testing.TB, dir string, name string, args ...string) <-chan result {
	t.Helper()
	done, _ := startCmd(t, dir, nil, name, args...)
	return done
}

// startCmd starts a program with extra environment; it returns its result
// channel and its stdin, which the caller may write to and must close.
func startCmd(t testing.TB, dir string, env []string, name string, args ...string) (<-chan result, io.WriteCloser) {
	t.Helper()
	return startCmdFor(t, bound, dir, env, name, args...)
}

// startCmdFor is startCmd with the program killed after limit.
func startCmdFor(t testing.TB, limit time.Duration, dir string, env []string, name string, args ...string) (<-chan result, io.WriteCloser) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	// The program and what it starts form a process group, killed as one
	// when the bound passes or the test ends: a grandchild holding the
	// output pipes must not keep the test waiting.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	stdin, err := cmd.StdinPipe()
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatalf("start %s: %v", name, err)
	}
	done := make(chan result, 1)
	go func() {
		err := cmd.Wait()
		cancel()
		done <- result{stdout.String(), stderr.String(), err}
	}()
	t.Cleanup(func() {
		stdin.Close()
		cancel()
	})
	return done, stdin
}

// sh runs a shell script.
func sh(t testing.TB, dir, script string) result {
	t.Helper()
	return run(t, dir, "sh", "-ec", script)
}

// mustSh runs a shell script and fails the test if it fails.
func mustSh(t testing.TB, dir, script string) string {
	t.Helper()
	r := sh(t, dir, script)
	if r.err != nil {
		t.Fatalf("sh -ec %q: %v", script, r)
	}
	return r.stdout
}

// python runs a python3 program.
func python(t testing.TB, dir, prog string, args ...string) result {
	t.Helper()
	return run(t, dir, "python3", append([]string{"-c", prog}, args...)...)
}

// within fails the test if ch does not deliver within limit: the operation
// it stands for is blocked.
func within[T any](t testing.TB, what string, limit time.Duration, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(limit):
		t.Fatalf("%s did not finish within %v: it is blocked", what, limit)
	}
	var zero T
	return zero
}

// notYet reports whether ch has not delivered yet, and if it has, what.
func notYet[T any](ch <-chan T) (T, bool) {
	select {
	case v := <-ch:
		return v, false
	default:
		var zero T
		return zero, true
	}
}
