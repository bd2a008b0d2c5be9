package fs

import (
	"context"
	"path"
	"strings"
	"sync/atomic"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/dyadfs/dyadfs/hfl"
	"github.com/dyadfs/dyadfs/internal/workers"
)

// remoteNode is a file or a symbolic link that the namespace has and this
// node does not (in its current version): published on another node. Its
// attributes are its record's; opening it brings it here (or, to write
// with O_TRUNC, makes a new one); what this node then has is shown through
// the loopback at the next lookup.
type remoteNode struct {
	gofs.Inode
	fsys      *FS
	gen       uint64 // the version it stands for
	fileInode        // its last name, once it has none, is in lostNames
}

// remote makes the node of rel, published elsewhere as rec. It shows the
// file's inode number (hfl.Record.InodeNumber), the same on every node
// and once the file is here. Each version is a node of its own, told
// apart by its generation (top bit set, apart from the backing files'):
// the kernel ties an inode to the backing file its first open passes
// through to, so a newer version must not come to an inode a process
// still reads an older one through.
func (fsys *FS) remote(ctx context.Context, parent *gofs.Inode, rec hfl.Record, out *fuse.EntryOut) *gofs.Inode {
	ino := rec.InodeNumber()
	attrFromRecord(rec, ino, &out.Attr)
	fsys.cached(out)
	r := &remoteNode{fsys: fsys, gen: rec.Generation}
	return parent.NewInode(ctx, r, gofs.StableAttr{Mode: rec.Mode & syscall.S_IFMT, Ino: ino, Gen: rec.Generation | 1<<63})
}

// attrFromRecord fills out with rec's attributes. The change time shown is
// the modification time: it is what this node's copy will show too, so
// that a program comparing the two (tar does) sees one version.
func attrFromRecord(rec hfl.Record, ino uint64, out *fuse.Attr) {
	out.Ino = ino
	out.Mode = rec.Mode
	out.Size = uint64(rec.Size)
	if rec.IsSymlink() {
		out.Size = uint64(len(rec.Target))
	}
	out.Blocks = (out.Size + 511) / 512
	if rec.Alloc > 0 {
		// A sparse file: the space its data takes on its owner, as du
		// and cp --sparse=auto there would see it.
		out.Blocks = uint64(rec.Alloc) / 512 // 1: none
	}
	out.Blksize = 4096
	out.Nlink = 1
	out.Owner = fuse.Owner{Uid: rec.Uid, Gid: rec.Gid}
	sec, nsec := uint64(rec.MtimeNs/1e9), uint32(rec.MtimeNs%1e9)
	out.Mtime, out.Mtimensec = sec, nsec
	out.Ctime, out.Ctimensec = sec, nsec
	out.Atime, out.Atimensec = sec, nsec
}

// rel returns the node's path now, or, with named false, the last path it
// had if it has no name any more (see lostNames; "" if none was kept).
// Never the root's: a node whose name went has no path of its own.
func (r *remoteNode) rel() (rel string, named bool) {
	if rel, named = r.fsys.pathOf(r.EmbeddedInode()); named {
		return rel, true
	}
	rel, _ = r.fsys.lost.get(r.EmbeddedInode())
	return rel, false
}

// Getattr implements gofs.NodeGetattrer: what this node has of it now, if
// that is current (fetched, or being written here), else the record.
func (r *remoteNode) Getattr(ctx context.Context, f gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	fsys := r.fsys
	ino := r.StableAttr().Ino
	if fga, ok := f.(gofs.FileGetattrer); ok {
		errno := fga.Getattr(ctx, out)
		out.Ino = ino
		return errno
	}
	rel, named := r.rel()
	if !named {
		return syscall.ESTALE // the kernel looks the name up again
	}
	var st syscall.Stat_t
	if fsys.back().Lstat(rel, &st) == nil && fsys.dmd.CurrentHere(ctx, rel) {
		out.FromStat(&st)
		out.Ino = ino
		fsys.copyTimes(rel, &out.Attr)
		out.SetTimeout(fsys.cacheTTL())
		return 0
	}
	rec, ok, err := fsys.dmd.Entry(ctx, rel, false)
	if err != nil {
		return fsys.errno("getattr", rel, err)
	}
	if !ok {
		return syscall.ENOENT
	}
	attrFromRecord(rec, ino, &out.Attr)
	out.SetTimeout(fsys.cacheTTL())
	return 0
}

// Readlink implements gofs.NodeReadlinker.
func (r *remoteNode) Readlink(ctx context.Context) ([]byte, syscall.Errno) {
	rel, named := r.rel()
	if !named {
		return nil, syscall.ESTALE
	}
	rec, ok, err := r.fsys.dmd.Entry(ctx, rel, false)
	if err != nil {
		return nil, r.fsys.errno("readlink", rel, err)
	}
	if !ok || !rec.IsSymlink() {
		return nil, syscall.EINVAL
	}
	return []byte(rec.Target), 0
}

// Getxattr implements gofs.NodeGetxattrer: a file of another node shows no
// extended attributes.
func (r *remoteNode) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	return 0, syscall.ENODATA
}

// Open implements gofs.NodeOpener. To read, it waits until the current
// version is here (fetched); to write, see dmd.OpenForWrite.
func (r *remoteNode) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	r.beginOpen()
	fsys := r.fsys
	rel, named := r.rel()
	if !named && rel == "" {
		// Its name went by a way that kept no record of it: the kernel
		// looks the name up again.
		return nil, 0, fsys.stale("name gone", rel)
	}
	defer fsys.forget(rel) // what is here from now on is shown as such
	if !named {
		// Its name went since the kernel looked it up (renamed over or
		// removed here): the version it stood for is gone. A reader
		// starts again from the name, as an open a moment later would;
		// a writer has the kernel look the name up again.
		if flags&writeFlags != 0 {
			return nil, 0, fsys.stale("name gone", rel)
		}
		return fsys.reopen(ctx, rel, flags)
	}
	rec, ok, err := fsys.dmd.Entry(ctx, rel, false)
	if err == nil && ok && rec.Generation != r.gen && !fsys.dmd.Mine(rel) {
		if flags&writeFlags != 0 && !retarget(&r.fileInode, flags) {
			// Another version since the kernel looked it up: it looks
			// up again (the kernel retries an open that gets ESTALE
			// once); see retarget.
			return nil, 0, fsys.stale("newer version elsewhere", rel)
		}
		// A reader reads the newest version (close-to-open allows a
		// newer one); the kernel refreshes the inode's attributes. An
		// ESTALE here would fail a reader of a file rewritten twice
		// while it opened it.
		r.NotifyContent(-1, 0)
	}
	if flags&writeFlags == 0 {
		if err == nil && !ok && !fsys.waits(callerTid(ctx), rel) {
			return nil, 0, syscall.ENOENT // removed since the kernel looked it up
		}
		return fsys.openWhenHere(ctx, rel, flags)
	}
	return fsys.openForWrite(ctx, rel, flags)
}

// openForWrite opens rel, whose current version is not here, for writing.
func (fsys *FS) openForWrite(ctx context.Context, rel string, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	w, f, prev, err := fsys.dmd.OpenForWrite(ctx, rel, int(flags&^fuse.FMODE_EXEC), callerTid(ctx))
	if err != nil {
		return nil, 0, fsys.errno("open", rel, err)
	}
	h := fsys.newWriteHandle(gofs.NewLoopbackFileFromOS(f), w, func() string { return rel })
	h.claim(prev)
	return h, 0, 0
}

// Setattr implements gofs.NodeSetattrer: the file becomes this node's (its
// current version brought here, unless it is truncated to nothing), is
// changed here and published.
func (r *remoteNode) Setattr(ctx context.Context, f gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if fsa, ok := f.(gofs.FileSetattrer); ok {
		return fsa.Setattr(ctx, in, out)
	}
	rel, named := r.rel()
	if !named {
		return syscall.ESTALE
	}
	if errno := r.setattrAt(ctx, rel, in, out); errno != 0 {
		return errno
	}
	out.Ino = r.StableAttr().Ino
	return 0
}

// setattrAt changes the attributes of rel, whose current version is not
// here: see Setattr.
func (r *remoteNode) setattrAt(ctx context.Context, rel string, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	fsys := r.fsys
	flags := uint32(syscall.O_RDWR)
	if sz, ok := in.GetSize(); ok && sz == 0 {
		flags |= syscall.O_TRUNC
	}
	fh, _, errno := fsys.openForWrite(ctx, rel, flags)
	if errno != 0 {
		return errno
	}
	h := fh.(*writeHandle)
	defer fsys.forget(rel)
	defer h.Release(ctx)
	if errno := h.Setattr(ctx, in, out); errno != 0 {
		return errno
	}
	return h.Flush(ctx) // claims it: the copies elsewhere go
}

// forget tells the kernel, aside, to look rel up again: the loopback shows
// what is here now.
func (fsys *FS) forget(rel string) {
	workers.Go(func() { fsys.forgetNow(rel) })
}

// forgetNow drops the kernel's entry of rel, if it has one: go-fuse knows
// every entry the kernel looked up; placeholders are never cached.
func (fsys *FS) forgetNow(rel string) {
	dir, name := path.Split(rel)
	parent := fsys.inodeOf(dir)
	if parent == nil {
		return
	}
	ch := parent.GetChild(name)
	if ch == nil {
		return
	}
	switch ch.Operations().(type) {
	case *pendingFile, *pendingDir:
		return
	}
	parent.NotifyEntry(name)
}

// inodeOf returns the inode of directory rel, if the kernel knows it.
func (fsys *FS) inodeOf(rel string) *gofs.Inode {
	if fsys.root == nil || fsys.server == nil {
		return nil
	}
	ino := fsys.root.EmbeddedInode()
	for _, c := range strings.Split(rel, "/") {
		if c == "" {
			continue
		}
		if ino = ino.GetChild(c); ino == nil {
			return nil
		}
	}
	return ino
}

// KernelNotifier is the managed directory's dmd.Notifier: it passes
// changes on to the kernel of the mount it is given (see Mount). It is
// made before the managed directory, which is made before the mount;
// until the mount exists the kernel has cached nothing to forget.
type KernelNotifier struct{ fsys atomic.Pointer[FS] }

// NewKernelNotifier returns a notifier for the mount to come.
func NewKernelNotifier() *KernelNotifier { return &KernelNotifier{} }

// EntryChanged makes the kernel forget the entry of rel.
func (k *KernelNotifier) EntryChanged(rel string) {
	if fsys := k.fsys.Load(); fsys != nil {
		fsys.forgetNow(rel)
	}
}

// ChildrenUnpromised makes the kernel look up again the entries of
// directory rel that are shown from the namespace.
func (k *KernelNotifier) ChildrenUnpromised(rel string) {
	fsys := k.fsys.Load()
	if fsys == nil {
		return
	}
	dir := fsys.inodeOf(rel)
	if dir == nil {
		return
	}
	for name, ch := range dir.Children() {
		_, remote := ch.Operations().(*remoteNode)
		if remote || fsys.dmd.IsCopy(path.Join(rel, name)) {
			dir.NotifyEntry(name)
		}
	}
}

// copyTimes shows a copy of another node's file with its change time equal
// to its modification time, as the record shows it while the file is not
// here: one version, one set of times on every node.
func (fsys *FS) copyTimes(rel string, a *fuse.Attr) {
	if a.Mode&syscall.S_IFMT == syscall.S_IFREG && fsys.dmd.IsCopy(rel) {
		a.Ctime, a.Ctimensec = a.Mtime, a.Mtimensec
	}
}

// retarget reports whether an open for writing with flags may open the
// current version of a file through f, the inode of another version: only
// a truncating open, which needs nothing of that version and whose size
// the kernel sets to 0, and only the inode's sole open (see
// fileInode.soleOpen), to which the kernel ties no backing file yet (it
// passes every open of an inode through to the backing file of the handle
// that gave it one, while any handle of it is open, a create's too;
// go-fuse keeps that file until the last handle's release). Otherwise
// ESTALE has the kernel look the name up again, which may race with the
// next change again.
func retarget(f *fileInode, flags uint32) bool {
	return flags&syscall.O_TRUNC != 0 && f.soleOpen()
}
