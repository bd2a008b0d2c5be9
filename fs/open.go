package fs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/dyadfs/dyadfs/fs/caller"
	"github.com/dyadfs/dyadfs/fs/dmd"
	"github.com/dyadfs/dyadfs/hfl"
	"github.com/dyadfs/dyadfs/internal/pagecache"
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
// backing file is opened, so that readers never see a truncated file. A
// file that is not the namespace's current version any more (replaced
// elsewhere since the kernel looked it up) is opened as the current one.
func (n *node) Open(ctx context.Context, flags uint32) (fh gofs.FileHandle, fuseFlags uint32, errno syscall.Errno) {
	n.beginOpen()
	fsys, d := n.fsys, n.fsys.dmd
	if errno := fsys.fds.admit(ctx); errno != 0 {
		return nil, 0, errno
	}
	tid := callerTid(ctx)
	rel, hasName := fsys.pathOf(n.EmbeddedInode())
	if !hasName {
		// Its name went (renamed over, removed) between the kernel's
		// look up and this open. A reader starts again from the name,
		// as an open a moment later would (see lostNames). A writer:
		// alone, ENOENT, as a loopback filesystem answers; with other
		// nodes, ESTALE has the kernel look the name up again.
		if last, ok := fsys.lost.get(n.EmbeddedInode()); ok && flags&writeFlags == 0 {
			return fsys.reopen(ctx, last, flags)
		}
		if d.Solo() {
			return nil, 0, syscall.ENOENT
		}
		return nil, 0, fsys.stale("name gone", rel)
	}
	id, regular, here := n.id, true, true
	if !d.Solo() {
		id, regular, here = n.backingID()
	}
	if !d.Solo() && (!here || id != n.id) {
		// Removed or replaced here since the kernel looked it up (a
		// copy dropped or renewed).
		if here && flags&writeFlags == 0 {
			// Replaced by a newer copy: a reader reads the current
			// version; the kernel refreshes the inode's attributes.
			n.NotifyContent(-1, 0)
			defer fsys.forget(rel)
			return fsys.reopen(ctx, rel, flags)
		}
		// Gone here, or opened to write: a writer writes what the
		// namespace has now (see writeCurrent).
		if flags&writeFlags != 0 {
			return fsys.writeCurrent(ctx, rel, flags, &n.fileInode, "backing replaced")
		}
		return nil, 0, fsys.stale("reader: backing gone", rel)
	}
	if regular && !d.CurrentHere(ctx, rel) {
		defer fsys.forget(rel)
		if flags&writeFlags == 0 {
			return fsys.reopen(ctx, rel, flags)
		}
		// A writer writes the current version, which is another file
		// than this inode's (see writeCurrent).
		return fsys.writeCurrent(ctx, rel, flags, &n.fileInode, "not current")
	}
	if flags&writeFlags == 0 {
		if err := d.WaitComplete(ctx, id, rel, tid); err != nil {
			return nil, 0, fsys.errno("open", rel, err)
		}
		if d.Config().SharedStorage {
			// Another node may be writing this file into the shared
			// directory: it is complete once a record describes it.
			if _, err := d.WaitPath(ctx, rel, tid); err != nil {
				return nil, 0, fsys.errno("open", rel, err)
			}
		}
		fh, errno := n.openHere(flags)
		if errno == syscall.ENOENT {
			// Renamed over (or, with other nodes, a copy dropped)
			// just now: the name's current version.
			return fsys.reopen(ctx, rel, flags)
		}
		if errno != 0 {
			return nil, 0, errno
		}
		return fsys.newReadHandle(fh, rel), fuse.FOPEN_NOFLUSH, 0
	}
	// The version this write replaces, if it is published: its writer's
	// close tells every node holding a copy (see writeHandle.Flush).
	prev, published := d.PublishedAs(ctx, rel)
	w := d.BeginWrite(id, tid, rel, false)
	var lf *gofs.LoopbackFile
	if d.Solo() {
		lf, errno = n.openHere(flags) // no copy from elsewhere replaces it
	} else if lf, errno = n.openHere(flags &^ truncLater(flags)); errno == 0 {
		if errno = openedAs(lf, id, flags); errno != 0 {
			lf.Release(ctx)
		}
	}
	if errno != 0 {
		w.Abort()
		if (errno == syscall.ENOENT || errno == syscall.ESTALE) && !d.Solo() {
			return fsys.writeCurrent(ctx, rel, flags, &n.fileInode, "backing gone or replaced")
		}
		return nil, 0, errno
	}
	h := fsys.newWriteHandle(lf, w, n.knownRel)
	if published {
		h.claim(prev)
	} else if !d.CloseWaits() {
		fuseFlags |= fuse.FOPEN_NOFLUSH
	}
	return h, fuseFlags, 0
}

// openedAs finishes the open of f by path for a writer of the inode of
// backing file id, with other nodes: it checks that f is that file (a
// newer copy can replace it here between the open's checks and the open
// itself, and the kernel would send a writer's bytes to the file the
// inode's other handles have, with passthrough, while the newer copy is
// published: ESTALE then); then it truncates f if the open left that to
// it (see truncLater).
func openedAs(f *gofs.LoopbackFile, id dmd.FileID, flags uint32) syscall.Errno {
	fd, _ := f.PassthroughFd()
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return gofs.ToErrno(err)
	}
	if dmd.IDOf(&st) != id {
		return syscall.ESTALE
	}
	if truncLater(flags) != 0 {
		return gofs.ToErrno(syscall.Ftruncate(fd, 0))
	}
	return 0
}

// truncLater is O_TRUNC if an open with flags truncates after its checks
// (see openedAs): one that can write. An O_RDONLY|O_TRUNC open, which
// truncates too, leaves it to open(2).
func truncLater(flags uint32) uint32 {
	if flags&syscall.O_ACCMODE != syscall.O_RDONLY {
		return flags & syscall.O_TRUNC
	}
	return 0
}

// writeCurrent opens for writing the current version of rel, for an open
// through an inode of another version (why says how it differs). While any
// handle of an inode is open, the kernel sends every write through it to
// the backing file its first open gave (with passthrough): the writer's
// bytes would land in the version set aside, and the new file be
// published empty. So only an inode that retarget allows is given the
// current version; otherwise ESTALE has the kernel look the name up again
// (it retries once) and open the current version through an inode of its
// own, as it does for a name removed meanwhile (and creates it if asked).
func (fsys *FS) writeCurrent(ctx context.Context, rel string, flags uint32, f *fileInode, why string) (gofs.FileHandle, uint32, syscall.Errno) {
	if !retarget(f, flags) {
		return nil, 0, fsys.stale(why, rel)
	}
	fh, fuseFlags, errno := fsys.openForWrite(ctx, rel, flags)
	if errno == syscall.ENOENT {
		return nil, 0, fsys.stale(why+", then removed", rel)
	}
	return fh, fuseFlags, errno
}

// reopen opens for reading what rel is now, for an open of an inode that
// rel no longer names (see lostNames). A name removed meanwhile is waited
// for only by a caller that waits for missing files (see waits). If rel is
// not a regular file any more (a directory, or a symbolic link, which the
// kernel follows itself), the daemon cannot open it in the kernel's
// stead: with other nodes, ESTALE has the kernel look the name up again;
// alone, ENOENT, as a loopback filesystem answers.
func (fsys *FS) reopen(ctx context.Context, rel string, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	if !fsys.nameExists(ctx, rel) && !fsys.waits(callerTid(ctx), rel) {
		return nil, 0, syscall.ENOENT
	}
	fh, fuseFlags, errno := fsys.openWhenHere(ctx, rel, flags)
	if errno == syscall.EISDIR {
		if fsys.dmd.Solo() {
			return nil, 0, syscall.ENOENT
		}
		return nil, 0, syscall.ESTALE
	}
	return fh, fuseFlags, errno
}

// nameExists reports whether rel names something here or in the namespace.
func (fsys *FS) nameExists(ctx context.Context, rel string) bool {
	var st syscall.Stat_t
	if fsys.back().Lstat(rel, &st) == nil {
		return true
	}
	_, ok, err := fsys.dmd.Entry(ctx, rel, false)
	return ok || err != nil // a namespace that cannot answer: as before, wait
}

// backingID returns the backing inode the node's path names now, whether
// it is a regular file, and whether there is one. (The kernel may keep a
// node for a name whose file was replaced here: a copy of a newer
// version.)
func (n *node) backingID() (id dmd.FileID, regular, here bool) {
	var st syscall.Stat_t
	if err := n.fsys.back().Lstat(n.rel(), &st); err != nil {
		return n.id, false, false
	}
	return dmd.IDOf(&st), st.Mode&syscall.S_IFMT == syscall.S_IFREG, true
}

// Create implements gofs.NodeCreater: the new file is registered as being
// written before any reader can look it up. The name was published
// nowhere (its lookup said so), so its close needs to tell nobody, unless
// the close reports the publish (see writeHandle.Flush).
func (n *node) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	if n.reserved(name) {
		return nil, nil, 0, syscall.EEXIST
	}
	if errno := n.fsys.fds.admit(ctx); errno != 0 {
		return nil, nil, 0, errno
	}
	rel := n.childRel(name)
	n.fsys.dmd.BeginCreate(rel)
	defer n.fsys.dmd.EndCreate(rel)
	ch, fh, made, errno := n.createHere(ctx, name, flags, mode, out)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	var fuseFlags uint32
	n.fsys.cached(out)
	child := ch.Operations().(*node)
	child.beginOpen() // the kernel ties the inode to the created file
	w := n.fsys.dmd.BeginWrite(child.id, callerTid(ctx), rel, true)
	if made {
		w.Made()
	}
	if !n.fsys.dmd.CloseWaits() {
		fuseFlags |= fuse.FOPEN_NOFLUSH
	}
	return ch, n.fsys.newWriteHandle(fh, w, child.knownRel), fuseFlags, 0
}

// Tmpfile implements gofs.NodeTmpfiler. O_TMPFILE files could not be linked
// into the tree (go-fuse has no path for them), so say so at open and let
// programs fall back to a named temporary file.
func (n *node) Tmpfile(ctx context.Context, flags, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	return nil, nil, 0, syscall.EOPNOTSUPP
}

// Flush implements gofs.NodeFlusher. Writes reach the backing file
// synchronously (or directly, with passthrough), so a close has nothing to
// write; the kernel sends FLUSH only for the write handles of published
// files, whose close tells the job of the rewrite, and, when a writer's
// close reports its publish (dmd.Config.CloseWait), for every write handle
// (the others are opened with FOPEN_NOFLUSH).
func (n *node) Flush(ctx context.Context, f gofs.FileHandle) syscall.Errno {
	if h, ok := f.(*writeHandle); ok {
		return h.Flush(ctx)
	}
	return 0
}

// writeHandle wraps a loopback file handle opened for writing: its release
// ends the writer, which publishes the file when it is the last one.
type writeHandle struct {
	*gofs.LoopbackFile
	fsys *FS
	w    *dmd.Writer
	rel  func() string // the file's path now
	fd   int
	// claims says that the file was published when opened (as prev): once
	// the writer changed it, a close tells the job (see Flush).
	claims  bool
	prev    hfl.Record
	claimed atomic.Bool
}

var (
	_ gofs.FileReleaser = (*writeHandle)(nil)
	_ gofs.FileFlusher  = (*writeHandle)(nil)
	_ gofs.FileWriter   = (*writeHandle)(nil)
)

func (fsys *FS) newWriteHandle(fh gofs.FileHandle, w *dmd.Writer, rel func() string) *writeHandle {
	lf := fh.(*gofs.LoopbackFile)
	// The loopback file owns the descriptor until its Release; it exposes
	// the number only through PassthroughFd.
	fd, _ := lf.PassthroughFd()
	w.Opened(fd)
	fsys.fds.opened()
	return &writeHandle{LoopbackFile: lf, fsys: fsys, w: w, rel: rel, fd: fd}
}

// Write implements gofs.FileWriter. Writes reach the daemon only without
// passthrough, up to MaxWrite (1 MiB) at once; they go into the backing
// file in pieces the page cache takes fast (see pagecache). As pwrite, it
// reports the bytes written if there are any, and the error otherwise.
func (h *writeHandle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	n, err := pagecache.WriteAt(loopbackWriterAt{ctx, h.LoopbackFile}, data, off)
	var errno syscall.Errno
	switch {
	case n > 0 || err == nil:
		return uint32(n), 0
	case errors.As(err, &errno):
		return 0, errno
	}
	return 0, syscall.EIO
}

// loopbackWriterAt writes through a loopback file handle, which keeps its
// own locking.
type loopbackWriterAt struct {
	ctx context.Context
	f   *gofs.LoopbackFile
}

func (w loopbackWriterAt) WriteAt(p []byte, off int64) (int, error) {
	n, errno := w.f.Write(w.ctx, p, off)
	if errno != 0 {
		return 0, errno // n is pwrite's -1 then
	}
	return int(n), nil
}

// claim says the file was published as prev when this handle opened it.
func (h *writeHandle) claim(prev hfl.Record) {
	h.claims, h.prev = true, prev
}

// Flush implements gofs.FileFlusher: the close of a handle that changed a
// published file tells the job, before close returns, that this node
// rewrites it: every copy elsewhere is dropped, and an open that starts
// afterwards anywhere reads the new version (close-to-open). The publish
// of the new version follows at the last writer's release.
//
// When a writer's close reports its publish, the close that is the
// writer's last publishes the file and returns the store's verdict (see
// dmd.Writer.Close): a program's close() fails with ENOSPC when the store
// is full, EACCES when it denies the write, EIO when it does not answer.
func (h *writeHandle) Flush(ctx context.Context) syscall.Errno {
	// What a close starts, it finishes: an interruption of the FLUSH (a
	// signal to the closing thread, such as the Go runtime's preemption
	// signal) must not leave the job half told. A killed process stops
	// waiting; the publish goes on. Both calls are bounded on their own.
	tid := callerTid(ctx)
	ctx = context.WithoutCancel(ctx)
	rel := h.rel()
	if rel == "" {
		return 0 // its last name went: nothing to tell
	}
	if h.claims && !h.claimed.Load() && h.w.Changed(h.fd) {
		h.claimed.Store(true)
		if err := h.w.Claim(ctx, rel, h.prev, tid); err != nil {
			// The new version is published at release (or at this
			// close, which reports how that went), or retried.
			h.fsys.log.Warn("cannot tell the job of a rewrite before close returned", "path", rel, "err", err)
		}
	}
	if !h.fsys.dmd.CloseWaits() {
		return 0
	}
	full := filepath.Join(h.fsys.cfg.Mountpoint, rel)
	held := func(pid uint32) bool { return caller.HoldsPath(pid, full) }
	return h.fsys.errno("close", rel, h.w.Close(ctx, h.fd, rel, tid, held))
}

// Release implements gofs.FileReleaser. End logs what goes wrong.
func (h *writeHandle) Release(ctx context.Context) syscall.Errno {
	h.w.End(context.WithoutCancel(ctx), h.fd, h.rel())
	errno := h.LoopbackFile.Release(ctx)
	h.fsys.fds.released()
	return errno
}

// readHandle is a loopback file handle opened for reading. It only counts
// its release: a file that is only read is never republished.
type readHandle struct {
	*gofs.LoopbackFile
	fsys *FS
	rel  string
	// pin is the file the handle keeps from eviction, if pinned.
	pin    dmd.FileID
	pinned bool
}

var (
	_ gofs.FileReleaser  = (*readHandle)(nil)
	_ gofs.FileGetattrer = (*readHandle)(nil)
)

// newReadHandle wraps fh, opened to read rel. With a cache capacity, the
// open pins the file it opened: a copy is not evicted while open (or
// mapped: the kernel releases a mapped file at munmap).
func (fsys *FS) newReadHandle(fh gofs.FileHandle, rel string) gofs.FileHandle {
	fsys.fds.opened()
	h := &readHandle{LoopbackFile: fh.(*gofs.LoopbackFile), fsys: fsys, rel: rel}
	if fsys.dmd.CopiesBounded() {
		var st syscall.Stat_t
		if fd, ok := h.LoopbackFile.PassthroughFd(); ok && syscall.Fstat(fd, &st) == nil {
			h.pin, h.pinned = dmd.IDOf(&st), true
			fsys.dmd.CopyOpened(h.pin, rel)
		}
	}
	return h
}

// Getattr implements gofs.FileGetattrer: a copy shows its record's times.
func (h *readHandle) Getattr(ctx context.Context, out *fuse.AttrOut) syscall.Errno {
	errno := h.LoopbackFile.Getattr(ctx, out)
	if errno == 0 {
		h.fsys.copyTimes(h.rel, &out.Attr)
	}
	return errno
}

// Release implements gofs.FileReleaser.
func (h *readHandle) Release(ctx context.Context) syscall.Errno {
	errno := h.LoopbackFile.Release(ctx)
	if h.pinned {
		h.fsys.dmd.CopyClosed(h.pin)
	}
	h.fsys.fds.released()
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
	return fsys.mayReadUnder(ctx, fsys.dmd.Config().Backing, rel, f)
}

// mayReadUnder is mayRead for a file at rel under dir (the backing
// directory, or the origin).
func (fsys *FS) mayReadUnder(ctx context.Context, dir, rel string, f *os.File) syscall.Errno {
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
