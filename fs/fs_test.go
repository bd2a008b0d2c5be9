package fs

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dyadfs/dyadfs/internal/poll"

	"github.com/dyadfs/dyadfs/hfl/store/embedded"

	"github.com/dyadfs/dyadfs/fs/dmd"
	"github.com/dyadfs/dyadfs/hfl"
)

// mounted is a dyadfs mounted in the test process.
type mounted struct {
	fs      *FS
	mnt     string
	backing string
	store   *embedded.Store
}

func needFuse(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting needs root (the tests run as root in CI)")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("/dev/fuse is missing")
	}
	if _, err := exec.LookPath("fusermount3"); err != nil {
		t.Skip("fusermount3 is missing: run scripts/setup.sh")
	}
}

func mount(t *testing.T, mod func(*dmd.Config, *Config)) *mounted {
	t.Helper()
	needFuse(t)
	mnt, backing := t.TempDir(), t.TempDir()
	mnt, _ = filepath.EvalSymlinks(mnt)
	dcfg := dmd.DefaultConfig()
	dcfg.Backing, dcfg.Node = backing, "n1"
	fcfg := DefaultConfig()
	fcfg.Mountpoint = mnt
	if mod != nil {
		mod(&dcfg, &fcfg)
	}
	store := embedded.New()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	kernel := NewKernelNotifier()
	d, err := dmd.New(dcfg, dmd.Parts{Store: store, Locator: hfl.DefaultLocatorConfig(), Notifier: kernel, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Scan(context.Background()); err != nil {
		t.Fatal(err)
	}
	fsys, err := Mount(fcfg, d, kernel, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := fsys.Unmount(); err != nil {
			t.Errorf("unmount: %v", err)
		}
		fsys.Wait()
		store.Close()
	})
	return &mounted{fs: fsys, mnt: mnt, backing: backing, store: store}
}

func (m *mounted) path(rel string) string { return filepath.Join(m.mnt, rel) }

func TestWriteReadThroughMount(t *testing.T) {
	m := mount(t, nil)
	if err := os.MkdirAll(m.path("run1"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(m.path("run1/a.dat"), []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(m.path("run1/a.dat"))
	if err != nil || string(got) != "hello" {
		t.Fatalf("read back %q, %v", got, err)
	}
	onDisk, err := os.ReadFile(filepath.Join(m.backing, "run1/a.dat"))
	if err != nil || string(onDisk) != "hello" {
		t.Fatalf("backing store holds %q, %v", onDisk, err)
	}
}

func TestCatWaitsForPublish(t *testing.T) {
	m := mount(t, nil)
	cat := exec.Command("cat", m.path("run2/a/b.dat"))
	var out strings.Builder
	cat.Stdout = &out
	if err := cat.Start(); err != nil {
		t.Fatal(err)
	}
	// The producer writes once cat is waiting (the status file says so).
	waitFor(t, func() bool { return m.fs.dmd.Stats().Waiting > 0 })
	if _, err := os.Stat(m.path("run2/a/b.dat")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("stat of the waited path: %v, want ENOENT", err)
	}
	os.MkdirAll(m.path("run2/a"), 0o755)
	if err := os.WriteFile(m.path("run2/a/b.dat"), []byte("payload"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := cat.Wait(); err != nil {
		t.Fatalf("cat: %v", err)
	}
	if out.String() != "payload" {
		t.Fatalf("cat read %q", out.String())
	}
}

// waitFor polls cond, bounded; it is only for observing another process's
// progress that has no event to wait on.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	poll.Until(t, 20*time.Second, "condition", cond)
}

var _ = syscall.ENOENT

func TestOrphanPath(t *testing.T) {
	for rel, want := range map[string]bool{
		".go-fuse.123/deleted":           true,
		".go-fuse.7/deleted/a/b":         true,
		".go-fuse.x/deleted":             false,
		".go-fuse.12":                    false,
		"dir/.go-fuse.12/deleted":        false,
		".go-fuse.12/deletedness":        false,
		"a/b":                            false,
		"":                               false,
		".go-fuse.9999999999999/deleted": true,
	} {
		if got := orphanPath(rel); got != want {
			t.Errorf("orphanPath(%q) = %v, want %v", rel, got, want)
		}
	}
}
