package fs

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/dyadfs/dyadfs/fs/caller"
	"github.com/dyadfs/dyadfs/fs/dmd"
)

// writeFlags make an open a writer. O_TRUNC reaches OPEN because dyadfs
// asks the kernel for atomic O_TRUNC (open(O_RDONLY|O_TRUNC) truncates too).
const writeFlags = syscall.O_WRONLY | syscall.O_RDWR | syscall.O_TRUNC

func callerTid(ctx context.Context) uint32 {
	if c, ok := fuse.FromContext(ctx); ok {
		return c.Pid
	}
	return 0
}

// Open implements gofs.NodeOpener. A read-only open waits while the file is
// being written on this node (or was left half-written), unless the caller's
// own process is the writer. A write open registers a writer before the
// backing file is opened, so that readers never see a truncated file.
func (n *node) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	tid := callerTid(ctx)
	if flags&writeFlags == 0 {
		if err := n.fsys.dmd.WaitComplete(ctx, n.id, tid); err != nil {
			return nil, 0, n.fsys.errno("open", n.rel(), err)
		}
		if n.fsys.dmd.Config().SharedStorage {
			// Another node may be writing this file into the shared
			// directory: it is complete once a record describes it.
			if _, err := n.fsys.dmd.WaitPath(ctx, n.rel()); err != nil {
				return nil, 0, n.fsys.errno("open", n.rel(), err)
			}
		}
		fh, fuseFlags, errno := n.LoopbackNode.Open(ctx, flags)
		if errno != 0 {
			return nil, 0, errno
		}
		return n.fsys.newReadHandle(fh), fuseFlags, 0
	}
	w := n.fsys.dmd.BeginWrite(n.id, tid, n.rel(), false)
	fh, fuseFlags, errno := n.LoopbackNode.Open(ctx, flags)
	if errno != 0 {
		w.Abort()
		return nil, 0, errno
	}
	return n.fsys.newWriteHandle(fh, w, n), fuseFlags, 0
}

// Create implements gofs.NodeCreater: the new file is registered as being
// written before any reader can look it up.
func (n *node) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	if n.reserved(name) {
		return nil, nil, 0, syscall.EEXIST
	}
	rel := n.childRel(name)
	n.fsys.dmd.BeginCreate(rel)
	defer n.fsys.dmd.EndCreate(rel)
	ch, fh, fuseFlags, errno := n.LoopbackNode.Create(ctx, name, flags, mode, out)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	n.fsys.cached(out)
	child := ch.Operations().(*node)
	w := n.fsys.dmd.BeginWrite(child.id, callerTid(ctx), rel, true)
	return ch, n.fsys.newWriteHandle(fh, w, child), fuseFlags, 0
}

// Tmpfile implements gofs.NodeTmpfiler. O_TMPFILE files could not be linked
// into the tree (go-fuse has no path for them), so say so at open and let
// programs fall back to a named temporary file.
func (n *node) Tmpfile(ctx context.Context, flags, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	return nil, nil, 0, syscall.EOPNOTSUPP
}

// Flush implements gofs.NodeFlusher. Writes reach the backing file
// synchronously (or directly, with passthrough), so there is nothing to do
// at close. ENOSYS tells the kernel to stop sending FLUSH, one request less
// per close.
func (n *node) Flush(ctx context.Context, f gofs.FileHandle) syscall.Errno {
	return syscall.ENOSYS
}

// writeHandle wraps a loopback file handle opened for writing: its release
// ends the writer, which publishes the file when it is the last one.
type writeHandle struct {
	*gofs.LoopbackFile
	fsys *FS
	w    *dmd.Writer
	n    *node
	fd   int
}

var _ gofs.FileReleaser = (*writeHandle)(nil)

func (fsys *FS) newWriteHandle(fh gofs.FileHandle, w *dmd.Writer, n *node) gofs.FileHandle {
	lf := fh.(*gofs.LoopbackFile)
	// The loopback file owns the descriptor until its Release; it exposes
	// the number only through PassthroughFd.
	fd, _ := lf.PassthroughFd()
	w.Opened(fd)
	return &writeHandle{LoopbackFile: lf, fsys: fsys, w: w, n: n, fd: fd}
}

// Release implements gofs.FileReleaser. End logs what goes wrong.
func (h *writeHandle) Release(ctx context.Context) syscall.Errno {
	h.w.End(context.WithoutCancel(ctx), h.fd, h.n.rel())
	return h.LoopbackFile.Release(ctx)
}

// readHandle is a loopback file handle opened for reading. It only counts
// its release: a file that is only read is never republished.
type readHandle struct {
	*gofs.LoopbackFile
	fsys *FS
}

var _ gofs.FileReleaser = (*readHandle)(nil)

func (fsys *FS) newReadHandle(fh gofs.FileHandle) gofs.FileHandle {
	return &readHandle{LoopbackFile: fh.(*gofs.LoopbackFile), fsys: fsys}
}

// Release implements gofs.FileReleaser.
func (h *readHandle) Release(ctx context.Context) syscall.Errno {
	errno := h.LoopbackFile.Release(ctx)
	h.fsys.readReleases.Add(1)
	return errno
}

// mayRead checks that the caller may read the file at rel, opened as f: a
// pending file's placeholder, and the placeholder directories above it, are
// open to all (their real modes are unknown until they exist), so the
// kernel's permission checks did not see the real modes. This one does:
// search permission on every directory on the way, read permission on the
// file.
func (fsys *FS) mayRead(ctx context.Context, rel string, f *os.File) syscall.Errno {
	c, ok := fuse.FromContext(ctx)
	if !ok || c.Uid == 0 {
		return 0
	}
	var groups []uint32
	var haveGroups bool
	allowed := func(st *syscall.Stat_t, bit uint32) bool {
		switch {
		case st.Uid == c.Uid:
			return st.Mode&(bit<<6) != 0
		case st.Gid == c.Gid:
			return st.Mode&(bit<<3) != 0
		}
		if !haveGroups {
			groups, _ = caller.Groups(c.Pid)
			haveGroups = true
		}
		if slices.Contains(groups, st.Gid) {
			return st.Mode&(bit<<3) != 0
		}
		return st.Mode&bit != 0
	}
	dir := fsys.dmd.Config().Backing
	parts := strings.Split(rel, "/")
	for _, p := range parts[:len(parts)-1] {
		var st syscall.Stat_t
		if err := syscall.Stat(dir, &st); err != nil || !allowed(&st, 0o1) {
			return syscall.EACCES
		}
		dir = filepath.Join(dir, p)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(dir, &st); err != nil || !allowed(&st, 0o1) {
		return syscall.EACCES
	}
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil || !allowed(&st, 0o4) {
		return syscall.EACCES
	}
	return 0
}
