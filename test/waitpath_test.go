package test

import (
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
