package fs

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/dyadfs/dyadfs/dtl/dtltest"
	"github.com/dyadfs/dyadfs/dtl/tcp"
	"github.com/dyadfs/dyadfs/fs/dmd"
	"github.com/dyadfs/dyadfs/hfl"
	"github.com/dyadfs/dyadfs/hfl/store/embedded"
)

// faultyStore is a shared store whose reads can be made to fail as an
// unreachable etcd does.
type faultyStore struct {
	hfl.Store
	down atomic.Bool
}

func (s *faultyStore) fail() error {
	if s.down.Load() {
		return hfl.ErrUnavailable
	}
	return nil
}

func (s *faultyStore) Lookup(ctx context.Context, slot hfl.Slot) (hfl.Record, error) {
	if err := s.fail(); err != nil {
		return hfl.Record{}, err
	}
	return s.Store.Lookup(ctx, slot)
}

func (s *faultyStore) Wait(ctx context.Context, slot hfl.Slot, after uint64) (hfl.Record, error) {
	if err := s.fail(); err != nil {
		return hfl.Record{}, err
	}
	return s.Store.Wait(ctx, slot, after)
}

func (s *faultyStore) ListDir(ctx context.Context, dir, after string, limit int) ([]hfl.Record, error) {
	if err := s.fail(); err != nil {
		return nil, err
	}
	return s.Store.ListDir(ctx, dir, after, limit)
}

// sharedMount is a mount of node "n1" that shares a store with node
// "owner", whose files a TCP transport serves from src.
type sharedMount struct {
	mnt, backing string
	loc          *hfl.Locator
	store        *faultyStore
	src          *dtltest.Source
	ownerAddr    string
}

func mountShared(t *testing.T, backing string, ownerSecret []byte) *sharedMount {
	t.Helper()
	needFuse(t)
	secret := make([]byte, 32)
	rand.Read(secret)
	if ownerSecret == nil {
		ownerSecret = secret
	}
	owner := dtltest.Loopback(t, "owner", ownerSecret, tcp.New)
	src := dtltest.Serving(t, owner)

	mnt, _ := filepath.EvalSymlinks(t.TempDir())
	if backing == "" {
		backing = t.TempDir()
	}
	dcfg := dmd.DefaultConfig()
	dcfg.Backing, dcfg.Node, dcfg.WaitTimeout = backing, "n1", 500*time.Millisecond
	store := &faultyStore{Store: embedded.New()}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	kernel := NewKernelNotifier()
	consumer := dtltest.Loopback(t, "n1", secret, tcp.New)
	d, err := dmd.New(dcfg, dmd.Parts{Store: store, Locator: hfl.DefaultLocatorConfig(), Transport: consumer,
		TransportName: "tcp", FetchTimeout: 300 * time.Millisecond, Notifier: kernel, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	fcfg := DefaultConfig()
	fcfg.Mountpoint = mnt
	fsys, err := Mount(fcfg, d, kernel, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		fsys.Unmount()
		fsys.Wait()
		d.Close()
		store.Store.Close()
	})
	return &sharedMount{mnt: mnt, backing: backing, loc: d.Locator(), store: store, src: src, ownerAddr: owner.Addr()}
}

// publish makes rel a file of node owner, served with data, and registers
// owner at addr ("" for nowhere).
func (m *sharedMount) publish(t *testing.T, rel string, data []byte, addr string) {
	t.Helper()
	ctx := context.Background()
	if err := m.src.WriteFile(rel, data); err != nil {
		t.Fatal(err)
	}
	rec, err := m.loc.Publish(ctx, hfl.Record{Path: rel, Owner: "owner", Size: int64(len(data)), Mode: syscall.S_IFREG | 0o644, MtimeNs: 1}, hfl.PublishOptions{})
	if err != nil {
		t.Fatal(err)
	}
	m.src.SetGeneration(rel, rec.Generation)
	if addr != "" {
		if err := m.loc.Register(ctx, hfl.Member{Node: "owner", Transport: "tcp", Addr: addr}, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
}

// smallTmpfs mounts a 1 MiB tmpfs, a backing store that fills up.
func smallTmpfs(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
		t.Skipf("cannot mount a small tmpfs: %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(dir, syscall.MNT_DETACH) })
	return dir
}

// remountReadOnly makes the filesystem at dir read-only, as an
// administrator would (retrying while a file is being created there).
func remountReadOnly(t *testing.T, dir string) {
	t.Helper()
	var err error
	for range 100 {
		if err = syscall.Mount("", dir, "", syscall.MS_REMOUNT|syscall.MS_RDONLY, ""); !errors.Is(err, syscall.EBUSY) {
			break
		}
		time.Sleep(10 * time.Millisecond) // a temporary file is being made: let it be
	}
	if err != nil {
		t.Fatalf("remount %s read-only: %v", dir, err)
	}
}

// TestErrnoOfEachFault drives failures of the store, the transport and
// the backing store up to the errno a program's open sees, through the
// whole daemon: its FUSE layer, managed directory, locator and fetcher.
func TestErrnoOfEachFault(t *testing.T) {
	needFuse(t)
	// published mounts with "f" published by its owner, which is running
	// and says st of it.
	published := func(t *testing.T, st dtltest.State) *sharedMount {
		m := mountShared(t, "", nil)
		m.publish(t, "f", []byte("data"), m.ownerAddr)
		m.src.Set("f", st)
		return m
	}
	for _, tc := range []struct {
		name string
		// set up makes "f" fail to open; it returns what to expect.
		setup func(t *testing.T) (*sharedMount, syscall.Errno)
	}{
		{"transfer works", func(t *testing.T) (*sharedMount, syscall.Errno) {
			return published(t, dtltest.Published), 0
		}},
		{"owner not running", func(t *testing.T) (*sharedMount, syscall.Errno) {
			m := mountShared(t, "", nil)
			m.publish(t, "f", []byte("data"), "")
			return m, syscall.EIO
		}},
		{"owner unreachable", func(t *testing.T) (*sharedMount, syscall.Errno) {
			m := mountShared(t, "", nil)
			m.publish(t, "f", []byte("data"), "127.0.0.1:1")
			return m, syscall.EIO
		}},
		{"owner of another job", func(t *testing.T) (*sharedMount, syscall.Errno) {
			other := make([]byte, 32)
			rand.Read(other)
			m := mountShared(t, "", other)
			m.publish(t, "f", []byte("data"), m.ownerAddr)
			return m, syscall.EIO
		}},
		{"owner no longer has it", func(t *testing.T) (*sharedMount, syscall.Errno) {
			// A newer version is awaited, for as long as waits last.
			return published(t, dtltest.NotPublished), syscall.ETIMEDOUT
		}},
		{"backing store full", func(t *testing.T) (*sharedMount, syscall.Errno) {
			m := mountShared(t, smallTmpfs(t), nil)
			m.publish(t, "f", bytes.Repeat([]byte("x"), 2<<20), m.ownerAddr)
			return m, syscall.ENOSPC
		}},
		{"backing store read-only", func(t *testing.T) (*sharedMount, syscall.Errno) {
			dir := smallTmpfs(t)
			m := mountShared(t, dir, nil)
			m.publish(t, "f", []byte("data"), m.ownerAddr)
			remountReadOnly(t, dir)
			return m, syscall.EROFS
		}},
		{"owner cannot read it", func(t *testing.T) (*sharedMount, syscall.Errno) {
			return published(t, dtltest.Unreadable), syscall.EIO
		}},
		{"store unreachable", func(t *testing.T) (*sharedMount, syscall.Errno) {
			m := mountShared(t, "", nil)
			rec := hfl.Record{Path: "f", Owner: "owner", Size: 4, Mode: syscall.S_IFREG | 0o644}
			if _, err := m.store.Store.Publish(context.Background(), m.loc.Slot("f"), rec); err != nil {
				t.Fatal(err)
			}
			m.store.down.Store(true)
			// Taken for missing, and waited for until the store is
			// back or the wait times out.
			return m, syscall.ETIMEDOUT
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, want := tc.setup(t)
			f, err := os.Open(filepath.Join(m.mnt, "f"))
			if err == nil {
				f.Close()
			}
			var got syscall.Errno
			if err != nil && !errors.As(err, &got) {
				t.Fatalf("open: %v, not an errno", err)
			}
			if got != want {
				t.Fatalf("open: %v (errno %d), want errno %d (%v)", err, got, want, want)
			}
		})
	}
}

// TestErrnoOfAClose: a writer's close that could not publish its file
// fails with the errno that says why: the store is full, denies the
// write, or did not answer.
func TestErrnoOfAClose(t *testing.T) {
	fsys := &FS{log: slog.New(slog.DiscardHandler)}
	for _, c := range []struct {
		cause error
		want  syscall.Errno
	}{
		{hfl.ErrNoSpace, syscall.ENOSPC},
		{hfl.ErrDenied, syscall.EACCES},
		{hfl.ErrTooLarge, syscall.EIO},
		{hfl.ErrUnavailable, syscall.EIO},
		{context.DeadlineExceeded, syscall.EIO},
	} {
		err := fmt.Errorf("%w: f: publish f: etcd: %w", dmd.ErrPublish, c.cause)
		if got := fsys.errno("close", "f", err); got != c.want {
			t.Errorf("close that failed with %v: %v, want %v", c.cause, got, c.want)
		}
	}
}
