package fs

import (
	"context"
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/dyadfs/dyadfs/fs/dmd"
	"github.com/dyadfs/dyadfs/internal/poll"
)

// TestOpenOfNameRenamedOverReadsCurrent: the kernel looked x up, then a
// rename replaced x before its OPEN came. The OPEN of the inode that lost
// its name reads what x is now, as an open a moment later would. (It used
// to answer ESTALE, and the kernel retries such an open only once: a
// reader of a name renamed over twice in a row saw "Stale file handle".)
// A GETATTR of it answers ESTALE, not ENOENT: stat retries the lookup.
func TestOpenOfNameRenamedOverReadsCurrent(t *testing.T) {
	m := mount(t, nil)
	if m.fs.dmd.Solo() {
		t.Fatal("the test mount is alone; this is about a namespace shared with other nodes")
	}
	looked := m.lookedUp(t, "x", "old")
	if err := os.WriteFile(m.path("x.tmp"), []byte("new"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(m.path("x.tmp"), m.path("x")); err != nil {
		t.Fatal(err)
	}
	if _, named := m.fs.pathOf(looked); named {
		t.Fatal("the inode looked up kept its name after the rename")
	}
	ctx := fuse.NewContext(context.Background(), &fuse.Caller{Pid: uint32(os.Getpid())})
	// A stat of it has the kernel look the name up again (a stat a
	// moment later finds the new file) rather than say x is missing.
	var attr fuse.AttrOut
	if errno := looked.Operations().(gofs.NodeGetattrer).Getattr(ctx, nil, &attr); errno != syscall.ESTALE {
		t.Errorf("getattr of the inode renamed over: %v, want ESTALE", errno)
	}
	for _, op := range []struct {
		flags uint32
		want  syscall.Errno
	}{{syscall.O_RDONLY, 0}, {syscall.O_WRONLY, syscall.ESTALE}} {
		fh, _, errno := looked.Operations().(gofs.NodeOpener).Open(ctx, op.flags)
		if errno != op.want {
			t.Fatalf("open(%#o) of the inode renamed over: %v, want %v", op.flags, errno, op.want)
		}
		if errno != 0 {
			continue
		}
		buf := make([]byte, 16)
		res, errno := fh.(gofs.FileReader).Read(ctx, buf, 0)
		if errno != 0 {
			t.Fatalf("read: %v", errno)
		}
		got, _ := res.Bytes(buf)
		if string(got) != "new" {
			t.Errorf("read %q through the inode renamed over, want the current %q", got, "new")
		}
		fh.(gofs.FileReleaser).Release(ctx)
	}
}

// TestOpenOfNameRemovedMeanwhileWaitsOnlyForWaiters: the kernel looked x
// up, then x was removed before its OPEN came. A caller that does not
// wait for missing files (here: x matches the mount's never-wait names)
// gets ENOENT at once, as an open a moment later would.
func TestOpenOfNameRemovedMeanwhileWaitsOnlyForWaiters(t *testing.T) {
	m := mount(t, func(_ *dmd.Config, c *Config) { c.NeverWait = append(c.NeverWait, "x") })
	looked := m.lookedUp(t, "x", "old")
	if err := os.Remove(m.path("x")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ctx = fuse.NewContext(ctx, &fuse.Caller{Pid: uint32(os.Getpid())})
	if _, _, errno := looked.Operations().(gofs.NodeOpener).Open(ctx, syscall.O_RDONLY); errno != syscall.ENOENT {
		t.Fatalf("open of the inode whose name was removed: %v, want ENOENT", errno)
	}
}

// lookedUp writes name with content through the mount, has the kernel
// look it up, and returns the inode it looked up. The kernel holds on to
// the inode until the test ends (an O_PATH descriptor, which sends no
// OPEN), as it does between the LOOKUP and the OPEN of an open().
func (m *mounted) lookedUp(t *testing.T, name, content string) *gofs.Inode {
	t.Helper()
	if err := os.WriteFile(m.path(name), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(m.path(name), unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	looked := m.fs.root.EmbeddedInode().GetChild(name)
	if looked == nil {
		t.Fatalf("the kernel did not look %s up", name)
	}
	return looked
}

// TestLostNamesGoWithTheirInodes: an inode that lost its name keeps the
// name it had (an OPEN of it reads what the name is now) only while the
// kernel may still open it: once the kernel forgets it, the name goes, so
// that renames and removals leave nothing behind. Inodes that keep their
// names keep no name of their own.
func TestLostNamesGoWithTheirInodes(t *testing.T) {
	m := mount(t, nil)
	const n = 20
	var held []int
	defer func() {
		for _, fd := range held {
			unix.Close(fd)
		}
	}()
	for i := range n {
		name := fmt.Sprint("f", i)
		if err := os.WriteFile(m.path(name), []byte("old"), 0o644); err != nil {
			t.Fatal(err)
		}
		fd, err := unix.Open(m.path(name), unix.O_PATH|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, fd)
	}
	if got := m.fs.lost.len(); got != 0 {
		t.Fatalf("%d names kept apart for inodes that have theirs", got)
	}
	for i := range n {
		name := fmt.Sprint("f", i)
		if i%2 == 0 {
			if err := os.WriteFile(m.path(name+".tmp"), []byte("new"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(m.path(name+".tmp"), m.path(name)); err != nil {
				t.Fatal(err)
			}
		} else if err := os.Remove(m.path(name)); err != nil {
			t.Fatal(err)
		}
	}
	if got := m.fs.lost.len(); got != n {
		t.Fatalf("%d lost names kept after %d inodes the kernel holds lost theirs", got, n)
	}
	for _, fd := range held {
		unix.Close(fd)
	}
	held = nil
	// The kernel forgets an inode whose last name went as soon as nothing
	// holds it.
	poll.Until(t, 10*time.Second, "the kernel to forget the inodes that lost their names", func() bool {
		return m.fs.lost.len() == 0
	})
	// Looking names up again, and listing them, keeps nothing apart: an
	// inode another takes the place of keeps its path in go-fuse's tree.
	for i := range n {
		if err := os.WriteFile(m.path(fmt.Sprint("g", i)), []byte("g"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		if _, err := os.ReadDir(m.path("")); err != nil {
			t.Fatal(err)
		}
		for i := range n {
			os.Stat(m.path(fmt.Sprint("g", i)))
		}
	}
	if got := m.fs.lost.len(); got != 0 {
		t.Fatalf("%d names kept apart after listing and looking up files that keep theirs", got)
	}
}
