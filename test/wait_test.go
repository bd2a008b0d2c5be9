package test

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dyadfs/dyadfs/fs"
	"github.com/dyadfs/dyadfs/internal/poll"
)

// quick bounds operations that must not wait at all; if one takes this
// long it is blocked behind a waiting reader.
const quick = 10 * time.Second

func waiting(n int) func(fs.Status) bool {
	return func(st fs.Status) bool { return st.DMD.Waiting >= n }
}

// TestReaderBlocksWhileWriterHoldsFile (point 3): a reader that opens a
// file still open for writing on this node waits for the writer's release
// and then reads the complete file.
func TestReaderBlocksWhileWriterHoldsFile(t *testing.T) {
	m := newMount(t)
	writer, stdin := startCmd(t, m.mnt, nil, "python3", "-c", `
import sys
f = open("step7.dat", "w")
f.write("first half;")
f.flush()
print("half", flush=True)
sys.stdin.readline()
f.write("second half")
f.close()
`)
	m.waitStatus("writer registered", func(st fs.Status) bool { return st.DMD.BusyFiles == 1 })
	before := m.status().DMD.OpensWaited
	cat := start(t, m.mnt, "cat", "step7.dat")
	dd := start(t, m.mnt, "dd", "if=step7.dat", "status=none")
	m.waitStatus("readers waiting", func(st fs.Status) bool { return st.DMD.OpensWaited >= before+2 })
	for _, ch := range []<-chan result{cat, dd} {
		if r, waiting := notYet(ch); !waiting {
			t.Fatalf("a reader finished while the writer still held the file: %v", r)
		}
	}
	fmt.Fprintln(stdin, "go")
	stdin.Close()
	if r := within(t, "writer", bound, writer); r.err != nil {
		t.Fatal(r)
	}
	for name, ch := range map[string]<-chan result{"cat": cat, "dd": dd} {
		r := within(t, name, bound, ch)
		if r.err != nil || r.stdout != "first half;second half" {
			t.Fatalf("%s read %v, want the complete file", name, r)
		}
	}
}

// TestOpenWaitsForPublish (point 4): read-only opens of a path that does
// not exist yet, even below directories that do not exist yet, wait until
// it is published, whatever program does the open. (cp is not among them:
// it stats its source first, and stat of a missing path is ENOENT at once.
// `dyadfs wait` covers such tools.) Without passthrough the reader's data
// comes through the daemon and the page cache of the placeholder inode.
func TestOpenWaitsForPublish(t *testing.T) {
	for _, variant := range []struct {
		name  string
		flags []string
	}{
		{"passthrough", nil},
		{"no-passthrough", []string{"--passthrough=false"}},
	} {
		t.Run(variant.name, func(t *testing.T) { openWaitsForPublish(t, newMount(t, variant.flags...)) })
	}
}

func openWaitsForPublish(t *testing.T, m *mount) {
	out := t.TempDir()
	readers := map[string]<-chan result{
		"cat":         start(t, m.mnt, "cat", "run2/a/b.dat"),
		"dd":          start(t, m.mnt, "dd", "if=run2/a/b.dat", "status=none"),
		"python":      start(t, m.mnt, "python3", "-c", `import sys; sys.stdout.write(open("run2/a/b.dat").read())`),
		"sh":          start(t, m.mnt, "sh", "-c", "read line < run2/a/b.dat; echo \"$line\""),
		"dyadfs wait": start(t, m.mnt, "sh", "-ec", dyadfsBin+" wait run2/a/b.dat && cp run2/a/b.dat "+out+"/copy && cat "+out+"/copy"),
	}
	m.waitStatus("all readers waiting", func(st fs.Status) bool { return st.DMD.OpensWaited >= uint64(len(readers)) })
	for name, ch := range readers {
		if r, waiting := notYet(ch); !waiting {
			t.Fatalf("%s finished before the file existed: %v", name, r)
		}
	}
	mustSh(t, m.mnt, "mkdir -p run2/a && printf 'the payload\\n' > run2/a/b.dat")
	for name, ch := range readers {
		r := within(t, name, bound, ch)
		if r.err != nil {
			t.Fatalf("%s: %v", name, r)
		}
		if r.stdout != "the payload\n" {
			t.Fatalf("%s read %q", name, r.stdout)
		}
	}
	if b, err := os.ReadFile(out + "/copy"); err != nil || string(b) != "the payload\n" {
		t.Fatalf("cp copied %q, %v", b, err)
	}
}

// TestWaitTimeout: --wait-timeout bounds the wait; the open fails with
// ETIMEDOUT.
func TestWaitTimeout(t *testing.T) {
	m := newMount(t, "--wait-timeout", "300ms")
	r := run(t, m.mnt, "cat", "never/there.dat")
	if r.err == nil || !strings.Contains(r.stderr, "Connection timed out") {
		t.Fatalf("cat of a never-published file: %v, want ETIMEDOUT", r)
	}
	if n := m.status().DMD.WaitTimeouts; n != 1 {
		t.Fatalf("%d timeouts counted, want 1", n)
	}
}

// openHelper starts the test binary's helper that opens path with a SIGUSR1
// handler installed and reports the errno.
func openHelper(t *testing.T, dir, path string) (*exec.Cmd, *bufio.Reader) {
	t.Helper()
	cmd := exec.Command(os.Args[0], path)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), helperEnv+"=open")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	r := bufio.NewReader(stdout)
	if line, _ := r.ReadString('\n'); line != "ready\n" {
		t.Fatalf("helper said %q", line)
	}
	return cmd, r
}

func readLine(t *testing.T, r *bufio.Reader) string {
	t.Helper()
	ch := make(chan string, 1)
	go func() {
		line, _ := r.ReadString('\n')
		ch <- strings.TrimSpace(line)
	}()
	return within(t, "helper output", bound, ch)
}

// TestSignalInterruptsWait: a signal ends a waiting open with EINTR.
func TestSignalInterruptsWait(t *testing.T) {
	m := newMount(t)
	cmd, out := openHelper(t, m.mnt, "missing.dat")
	m.waitStatus("helper waiting", waiting(1))
	cmd.Process.Signal(syscall.SIGUSR1)
	if got := readLine(t, out); got != syscall.EINTR.Error() {
		t.Fatalf("interrupted open: %q, want %q", got, syscall.EINTR.Error())
	}
	if n := m.status().DMD.WaitInterrupts; n != 1 {
		t.Fatalf("%d interrupts counted, want 1", n)
	}
}

// TestLazyUnmountEndsWaits: unmounting ends every wait (ENOTCONN) and the
// daemon exits.
func TestLazyUnmountEndsWaits(t *testing.T) {
	m := newMount(t)
	cat := start(t, m.mnt, "cat", "a/missing")
	cmd, out := openHelper(t, m.mnt, "b/missing")
	m.waitStatus("readers waiting", waiting(2))
	if o, err := exec.Command("fusermount3", "-u", "-z", m.mnt).CombinedOutput(); err != nil {
		t.Fatalf("fusermount3 -u -z: %v %s", err, o)
	}
	if got := readLine(t, out); got != syscall.ENOTCONN.Error() {
		t.Fatalf("open during unmount: %q, want %q", got, syscall.ENOTCONN.Error())
	}
	cmd.Wait()
	if r := within(t, "cat", bound, cat); r.err == nil {
		t.Fatalf("cat succeeded after unmount: %v", r)
	}
	if !waitExit(m.pid, bound) {
		t.Fatalf("daemon still running after the lazy unmount")
	}
	m.pid = 0
}

// TestSignalsUnmount: SIGTERM or SIGINT to the daemon ends waits and
// unmounts; a file open at that moment stays readable (the mount is detached
// lazily) and the daemon exits once it is closed.
func TestSignalsUnmount(t *testing.T) {
	for _, tc := range []struct {
		sig   syscall.Signal
		flags []string
	}{
		{syscall.SIGTERM, nil},
		{syscall.SIGINT, []string{"--passthrough=false"}},
	} {
		t.Run(tc.sig.String(), func(t *testing.T) {
			m := newMount(t, tc.flags...)
			mustSh(t, m.mnt, "echo data > open.dat")
			ready := filepath.Join(t.TempDir(), "ready")
			holder, stdin := startCmd(t, m.mnt, nil, "sh", "-c", "exec 3<open.dat; touch "+ready+"; read x; cat <&3")
			eventually(t, "holder has the file open", func() bool { _, err := os.Stat(ready); return err == nil })
			cat := start(t, m.mnt, "cat", "missing")
			m.waitStatus("reader waiting", waiting(1))
			syscall.Kill(m.pid, tc.sig)
			if r := within(t, "cat", bound, cat); r.err == nil {
				t.Fatalf("cat succeeded after %v: %v", tc.sig, r)
			}
			eventually(t, "detached", func() bool { return !isMounted(m.mnt) })
			if waitExit(m.pid, 0) {
				t.Fatal("daemon exited while a file on its mount was open")
			}
			fmt.Fprintln(stdin, "go")
			stdin.Close()
			if r := within(t, "holder", bound, holder); r.err != nil || r.stdout != "data\n" {
				t.Fatalf("reading an open file after the lazy unmount: %v", r)
			}
			if !waitExit(m.pid, bound) {
				t.Fatalf("daemon still running after %v and the last close", tc.sig)
			}
			m.pid = 0
		})
	}
}

// TestManyWaiters: many readers wait for many files at once; each gets its
// own file when it is published.
func TestManyWaiters(t *testing.T) {
	m := newMount(t)
	const n = 64
	readers := make([]<-chan result, n)
	for i := range readers {
		readers[i] = start(t, m.mnt, "cat", fmt.Sprintf("many/d%d/f%d", i%8, i))
	}
	m.waitStatus("all waiting", waiting(n))
	var script strings.Builder
	for i := 0; i < n; i++ {
		fmt.Fprintf(&script, "mkdir -p many/d%d && echo %d > many/d%d/f%d\n", i%8, i, i%8, i)
	}
	mustSh(t, m.mnt, script.String())
	for i, ch := range readers {
		if r := within(t, "reader", bound, ch); r.err != nil || r.stdout != fmt.Sprintf("%d\n", i) {
			t.Fatalf("reader %d: %v", i, r)
		}
	}
	if st := m.status(); st.DMD.Waiting != 0 {
		t.Fatalf("%d paths still waited for", st.DMD.Waiting)
	}
}

// TestWaitingBlocksNothingElse (point 5): while readers wait for missing
// paths in a directory, everything else in that directory answers at once:
// stat and test -e say ENOENT, creates (O_CREAT, O_CREAT|O_EXCL), mkdir,
// rename, link and ls work, and a producer on the same node creates the
// very file the reader waits for.
func TestWaitingBlocksNothingElse(t *testing.T) {
	m := newMount(t)
	mustSh(t, m.mnt, "mkdir run1")
	reader := start(t, m.mnt, "cat", "run1/step7.dat")
	deep := start(t, m.mnt, "cat", "run1/later/deep.dat")
	m.waitStatus("readers waiting", waiting(2))

	steps := []struct{ name, script string }{
		{"stat", "! stat run1/step7.dat 2>/dev/null"},
		{"test -e", "! test -e run1/step7.dat && ! test -e run1/later"},
		{"touch (O_CREAT)", "touch run1/new1"},
		{"O_CREAT|O_EXCL", `python3 -c 'import os; os.close(os.open("run1/new2", os.O_CREAT|os.O_EXCL|os.O_WRONLY))'`},
		{"mkdir", "mkdir run1/d"},
		{"rename", "mv run1/new1 run1/renamed"},
		{"link", "ln run1/renamed run1/hard"},
		{"ls", "ls run1 >/dev/null"},
		{"create another file", "echo other > run1/other.dat"},
	}
	for _, s := range steps {
		r := within(t, s.name, quick, start(t, m.mnt, "sh", "-ec", s.script))
		if r.err != nil {
			t.Fatalf("%s while a reader waits: %v", s.name, r)
		}
		if r, waiting := notYet(reader); !waiting {
			t.Fatalf("the reader stopped waiting after %s: %v", s.name, r)
		}
	}
	got := mustSh(t, m.mnt, "ls run1 | sort | tr '\\n' ' '")
	if got != "d hard new2 other.dat renamed " {
		t.Fatalf("ls run1 = %q", got)
	}
	// The producer writes the awaited file in that same directory.
	r := within(t, "producer", quick, start(t, m.mnt, "sh", "-ec", "echo produced > run1/step7.dat"))
	if r.err != nil {
		t.Fatal(r)
	}
	if r := within(t, "reader", bound, reader); r.err != nil || r.stdout != "produced\n" {
		t.Fatalf("reader: %v", r)
	}
	mustSh(t, m.mnt, "mkdir run1/later && echo deep > run1/later/deep.dat")
	if r := within(t, "deep reader", bound, deep); r.err != nil || r.stdout != "deep\n" {
		t.Fatalf("deep reader: %v", r)
	}
}

// TestWaitingReaderIsNotAFile: while a reader waits, the path looks absent
// to everyone else (no placeholder leaks into stat or listings).
func TestWaitingReaderIsNotAFile(t *testing.T) {
	m := newMount(t)
	reader := start(t, m.mnt, "cat", "ghost")
	m.waitStatus("reader waiting", waiting(1))
	for i := 0; i < 20; i++ {
		if _, err := os.Stat(m.path("ghost")); !os.IsNotExist(err) {
			t.Fatalf("stat of a waited-for path: %v, want ENOENT", err)
		}
	}
	if entries, _ := os.ReadDir(m.mnt); len(entries) != 0 {
		t.Fatalf("root lists %v while only a reader waits", entries)
	}
	mustSh(t, m.mnt, "echo boo > ghost")
	if r := within(t, "reader", bound, reader); r.stdout != "boo\n" {
		t.Fatalf("reader: %v", r)
	}
}

// TestThousandWaitingOpens: 1,000 opens wait at once for files published
// nowhere yet. Each parks one goroutine in the daemon (the request's own:
// whatever ends a wait, it ends it through one registration), each is
// listed, and each reads its file once it is published.
func TestThousandWaitingOpens(t *testing.T) {
	m := newMount(t)
	mustSh(t, m.mnt, "mkdir k")
	before := m.status().Goroutines
	const n = 1000
	readers := make([]<-chan result, n)
	for i := range readers {
		readers[i] = start(t, m.mnt, "cat", fmt.Sprintf("k/f%d", i))
	}
	m.waitStatus("all waiting", func(st fs.Status) bool { return len(st.Waiters) >= n })
	st := m.status()
	// A few more for the status read itself and the server's readers.
	if extra := st.Goroutines - before; extra > n+32 {
		t.Fatalf("%d goroutines more with %d opens waiting (%d before): want at most one per waiting open", extra, n, before)
	} else {
		t.Logf("%d goroutines more with %d opens waiting", extra, n)
	}
	mustSh(t, m.mnt, fmt.Sprintf("cd k && for i in $(seq 0 %d); do echo $i > f$i; done", n-1))
	for i, ch := range readers {
		if r := within(t, "reader", bound, ch); r.err != nil || r.stdout != fmt.Sprintf("%d\n", i) {
			t.Fatalf("reader %d: %v", i, r)
		}
	}
	m.waitStatus("no waits left", func(st fs.Status) bool { return len(st.Waiters) == 0 && st.DMD.Waiting == 0 })
}

// traced reports whether every thread of pid is traced.
func traced(pid int) bool {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil || len(tasks) == 0 {
		return false
	}
	for _, task := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/status", pid, task.Name()))
		if err != nil || strings.Contains(string(b), "TracerPid:\t0\n") {
			return false
		}
	}
	return true
}

// TestClusterWaitingOpenLooksTwice: the wait of an open looks at the
// backing file once, however long it waits and whatever it hears
// meanwhile; with the kernel's LOOKUP before it, twice. The file then
// comes from its owner (from the notice's bytes here) and is opened. The
// notice of the commit is looked at once more, as every node that hears
// of a change looks at what it has at the path.
func TestClusterWaitingOpenLooksTwice(t *testing.T) {
	if _, err := exec.LookPath("strace"); err != nil {
		t.Skip("strace is missing: run scripts/setup.sh")
	}
	c := newCluster(t, 2)
	a, n := c.nodes[0], c.nodes[1]
	a.mustSh("mkdir st && echo other > st/other")
	n.mustSh("cat st/other >/dev/null")

	trace := filepath.Join(t.TempDir(), "trace")
	strace := exec.Command("strace", "-f", "-qq", "-e", "trace=stat,lstat,newfstatat,statx", "-o", trace, "-p", fmt.Sprint(n.pid))
	if err := strace.Start(); err != nil {
		t.Fatalf("strace: %v", err)
	}
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			strace.Process.Signal(syscall.SIGINT)
			strace.Wait()
		}
	}
	defer stop()
	poll.Until(t, bound, "strace attached to every thread", func() bool { return traced(n.pid) })

	reader := n.startSh("cat st/f")
	n.waitStatus("the open waits", func(st fs.Status) bool { return len(st.Waiters) == 1 })
	time.Sleep(300 * time.Millisecond) // lets time pass: past the grace, the wait is on the store too
	a.mustSh("echo produced > st/f")
	if r := within(t, "reader", bound, reader); r.err != nil || r.stdout != "produced\n" {
		t.Fatalf("reader: %v", r)
	}
	stop()
	b, err := os.ReadFile(trace)
	if err != nil {
		t.Fatal(err)
	}
	target := `"` + filepath.Join(n.backing, "st", "f") + `"`
	var looks []string
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, target) {
			looks = append(looks, line)
		}
	}
	if len(looks) > 3 {
		t.Fatalf("the daemon looked at %s %d times for one waiting open, want at most 3 (LOOKUP, the wait, the commit told):\n%s", target, len(looks), strings.Join(looks, "\n"))
	}
	t.Logf("%d looks at the backing file:\n%s", len(looks), strings.Join(looks, "\n"))
}
