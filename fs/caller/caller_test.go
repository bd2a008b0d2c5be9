package caller

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dyadfs/dyadfs/internal/poll"
)

func TestParseSyscall(t *testing.T) {
	c, err := parseSyscall([]byte("257 0xffffff9c 0x7ffd1234 0x0 0x0 0x0 0x0 0x7ffd0000 0x7f00000\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Nr != 257 || !c.Open || c.Args[0] != 0xffffff9c || c.Args[1] != 0x7ffd1234 {
		t.Fatalf("parsed %+v", c)
	}
	if _, err := parseSyscall([]byte("running\n")); err == nil {
		t.Fatal("parsed 'running'")
	}
	c, err = parseSyscall([]byte("332 0x1 0x2 0x3 0x4 0x5 0x6 0x7 0x8"))
	if err != nil || c.Open {
		t.Fatalf("statx parsed as %+v, %v", c, err)
	}
}

func TestRoleOf(t *testing.T) {
	cases := []struct {
		target, rel string
		want        Intent
	}{
		{"/mnt/dmd/run1/step7.dat", "run1", Traverse},
		{"/mnt/dmd/run1/step7.dat", "run1/step7.dat", OpenFile},
		{"/mnt/dmd/run2/a/b.dat", "run2/a", Traverse},
		{"/mnt/dmd/run2/run2", "run2", Traverse},
		{"/mnt/dmd/run2/run2", "run2/run2", OpenFile},
		{"/mnt/dmd/x", "y", Other},
		// Reached through a symlink elsewhere: fall back on names.
		{"/scratch/run1/f", "run1/f", OpenFile},
		{"/scratch/run1/f", "run1", Traverse},
		{"/scratch/run1/f", "zzz", Other},
	}
	for _, tc := range cases {
		if got := roleOf(tc.target, "/mnt/dmd", tc.rel); got != tc.want {
			t.Errorf("roleOf(%q, %q) = %v, want %v", tc.target, tc.rel, got, tc.want)
		}
	}
}

func TestReadOnlyFileOpen(t *testing.T) {
	cases := []struct {
		flags uint64
		want  bool
	}{
		{0, true},       // cat
		{0x80000, true}, // O_RDONLY|O_CLOEXEC (python)
		{0x941, false},  // touch: O_WRONLY|O_CREAT|O_NOCTTY|O_NONBLOCK
		{0x800c1, false},
		{syscall.O_RDWR, false},
		{syscall.O_DIRECTORY, false},
		{oPath, false},
		{syscall.O_TRUNC, false},
	}
	for _, tc := range cases {
		if got := readOnlyFileOpen(tc.flags); got != tc.want {
			t.Errorf("readOnlyFileOpen(%#x) = %v, want %v", tc.flags, got, tc.want)
		}
	}
}

// TestReadCallOfBlockedOpen reads the syscall of a real process blocked in
// openat: cat opening a FIFO nobody writes to.
func TestReadCallOfBlockedOpen(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("cat", "fifo")
	cmd.Dir = dir
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })

	// cat is single-threaded: its pid is its tid. Poll until it is
	// asleep in the open (bounded).
	var c Call
	var err error
	poll.Until(t, 10*time.Second, "cat seen in open", func() bool {
		c, err = ReadCall(uint32(cmd.Process.Pid))
		return err == nil && c.Open
	})
	if c.Path != "fifo" || c.Dirfd != atFDCWD || !readOnlyFileOpen(c.Flags) {
		t.Fatalf("decoded %+v, want openat(AT_FDCWD, \"fifo\", O_RDONLY)", c)
	}
	realDir, _ := filepath.EvalSymlinks(dir)
	if got := Classify(c, uint32(cmd.Process.Pid), realDir, "fifo"); got != OpenFile {
		t.Fatalf("Classify = %v, want open-file", got)
	}
	if got := Classify(c, uint32(cmd.Process.Pid), "/elsewhere", "nomatch"); got != Other {
		t.Fatalf("Classify of an unrelated name = %v, want other", got)
	}
	tg, err := Tgid(uint32(cmd.Process.Pid))
	if err != nil || tg != uint32(cmd.Process.Pid) {
		t.Fatalf("Tgid = %d, %v", tg, err)
	}
	// Unblock cat.
	w, err := os.OpenFile(fifo, os.O_WRONLY, 0)
	if err == nil {
		w.Close()
	}
}

func TestReadCallNotOpen(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	var c Call
	poll.Until(t, 10*time.Second, "sleep seen asleep", func() bool {
		var err error
		c, err = ReadCall(uint32(cmd.Process.Pid))
		return err == nil && c.Nr >= 0 && !c.Open
	})
	if got := Classify(c, uint32(cmd.Process.Pid), "/mnt", "x"); got != Other {
		t.Fatalf("Classify(sleep) = %v", got)
	}
}

// TestHoldsPath: a process holds the paths it has descriptors on, and no
// other (not one that merely extends a held path).
func TestHoldsPath(t *testing.T) {
	dir := t.TempDir()
	held := filepath.Join(dir, "held")
	f, err := os.Create(held)
	if err != nil {
		t.Fatal(err)
	}
	pid := uint32(os.Getpid())
	if !HoldsPath(pid, held) {
		t.Fatal("this process does not hold the file it has open")
	}
	if HoldsPath(pid, held+"x") || HoldsPath(pid, dir+"/other") {
		t.Fatal("this process holds a file it never opened")
	}
	os.Remove(held)
	if !HoldsPath(pid, held) {
		t.Fatal("this process does not hold the file it has open once it is unlinked")
	}
	f.Close()
	if HoldsPath(pid, held) {
		t.Fatal("this process still holds a file it closed")
	}
	if HoldsPath(1<<30, held) {
		t.Fatal("a process that does not exist holds a file")
	}
}

// BenchmarkHoldsPath: the check a writer's close makes on its process.
func BenchmarkHoldsPath(b *testing.B) {
	dir := b.TempDir()
	var files []*os.File
	for i := range 8 {
		f, err := os.Create(filepath.Join(dir, strconv.Itoa(i)))
		if err != nil {
			b.Fatal(err)
		}
		files = append(files, f)
	}
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	pid := uint32(os.Getpid())
	missing := filepath.Join(dir, "missing")
	for b.Loop() {
		if HoldsPath(pid, missing) {
			b.Fatal("holds a file it never opened")
		}
	}
}

// TestTgidRemembered: a thread's process is read once and remembered, and
// a remembered process that no longer holds the thread (its id reused) is
// read again.
func TestTgidRemembered(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	tid := uint32(unix.Gettid())
	for range 2 {
		if got, err := Tgid(tid); err != nil || got != uint32(os.Getpid()) {
			t.Fatalf("Tgid(%d) = %d, %v; want %d", tid, got, err, os.Getpid())
		}
	}
	tgids.put(tid, 1) // as if tid had belonged to init's group
	if got, err := Tgid(tid); err != nil || got != uint32(os.Getpid()) {
		t.Fatalf("Tgid(%d) after its id was reused = %d, %v; want %d", tid, got, err, os.Getpid())
	}
}
