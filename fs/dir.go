package fs

import (
	"bytes"
	"context"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/dyadfs/dyadfs/fs/dmd"
)

// reserved reports whether name in this directory is dyadfs's control
// directory, which users cannot create, replace or remove.
func (n *node) reserved(name string) bool { return n.isRoot() && name == dmd.InternalDir }

// Mkdir implements gofs.NodeMkdirer. The directory is published, so that
// every node shows it.
func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return n.makePublished(ctx, name, out, func() (*gofs.Inode, syscall.Errno) {
		return n.mkdirHere(ctx, name, mode, out)
	})
}

// Mknod implements gofs.NodeMknoder.
func (n *node) Mknod(ctx context.Context, name string, mode, rdev uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if n.reserved(name) {
		return nil, syscall.EEXIST
	}
	ch, errno := n.mknodHere(ctx, name, mode, rdev, out)
	if errno == 0 {
		n.fsys.cached(out)
		if mode&syscall.S_IFMT == syscall.S_IFREG {
			n.fsys.dmd.Changed(ctx, n.childRel(name))
		} else {
			n.fsys.dmd.Made(ctx, n.childRel(name))
		}
	}
	return ch, errno
}

// Symlink implements gofs.NodeSymlinker. The link is published, so that
// every node shows it; readers follow it to the files it names.
func (n *node) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return n.makePublished(ctx, name, out, func() (*gofs.Inode, syscall.Errno) {
		return n.symlinkHere(ctx, target, name, out)
	})
}

// makePublished makes the directory or link name with mk, unless name is
// reserved, and publishes it, so that every node shows it.
func (n *node) makePublished(ctx context.Context, name string, out *fuse.EntryOut, mk func() (*gofs.Inode, syscall.Errno)) (*gofs.Inode, syscall.Errno) {
	if n.reserved(name) {
		return nil, syscall.EEXIST
	}
	ch, errno := mk()
	if errno == 0 {
		n.fsys.cached(out)
		rel := n.childRel(name)
		// A reader waiting for a file of that name gives up.
		n.fsys.dmd.Changed(ctx, rel)
		n.fsys.dmd.Made(ctx, rel)
	}
	return ch, errno
}

// Link implements gofs.NodeLinker: the new name of a complete file is
// published. Hard links are this node's: only a file this node owns gets
// a second name. Another node's file (not here, or a copy here) fails
// with EXDEV, as across filesystems: a link here would be a second file
// with the first one's inode number, or would make the file this node's,
// a new version of it everywhere. Programs copy instead (git clone, cp
// -l's users); other nodes see two files.
func (n *node) Link(ctx context.Context, target gofs.InodeEmbedder, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if n.reserved(name) {
		return nil, syscall.EEXIST
	}
	fsys, d := n.fsys, n.fsys.dmd
	rel := n.childRel(name)
	t, ok := target.(*node)
	if !ok {
		return nil, syscall.EXDEV
	}
	trel := t.rel()
	if !d.Solo() && (d.IsCopy(trel) || !d.CurrentHere(ctx, trel)) {
		return nil, syscall.EXDEV
	}
	ch, errno := n.linkHere(ctx, trel, name, out)
	if errno == 0 {
		fsys.cached(out)
		d.Changed(ctx, rel)
	}
	return ch, errno
}

// Unlink implements gofs.NodeUnlinker: an unlinked file is removed from the
// namespace, and every node that had it is told before the call returns.
// A file published elsewhere is unlinked there too.
func (n *node) Unlink(ctx context.Context, name string) (errno syscall.Errno) {
	if n.reserved(name) {
		return syscall.EPERM
	}
	d := n.fsys.dmd
	rel := n.childRel(name)
	defer func() {
		if errno == 0 {
			n.fsys.nameGoes(n.GetChild(name), rel)
		}
	}()
	var st syscall.Stat_t
	statErr := n.fsys.back().Lstat(rel, &st)
	if statErr != nil && !d.Solo() {
		return n.fsys.errno("unlink", rel, d.RemoveName(ctx, rel))
	}
	errno = gofs.ToErrno(n.fsys.back().Unlink(rel))
	if errno == 0 && statErr == nil && (st.Mode&syscall.S_IFMT == syscall.S_IFREG || !d.Solo()) {
		d.Removed(ctx, rel, dmd.IDOf(&st), st.Nlink <= 1)
	}
	return errno
}

// Rmdir implements gofs.NodeRmdirer. A directory that holds files published
// elsewhere is not empty.
func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno {
	if n.reserved(name) {
		return syscall.EPERM
	}
	d := n.fsys.dmd
	rel := n.childRel(name)
	if !d.Solo() {
		empty, err := d.DirEmptyElsewhere(ctx, rel)
		if err != nil {
			return n.fsys.errno("rmdir", rel, err)
		}
		if !empty {
			return syscall.ENOTEMPTY
		}
	}
	var st syscall.Stat_t
	var statErr error = syscall.ENOENT
	if !d.Solo() {
		statErr = n.fsys.back().Lstat(rel, &st) // its inherited number goes with it
	}
	errno := gofs.ToErrno(n.fsys.back().Rmdir(rel))
	if errno == 0 {
		if statErr == nil {
			d.Gone(dmd.IDOf(&st))
		}
		d.RemovedDir(ctx, rel)
	}
	return errno
}

// Rename implements gofs.NodeRenamer: records follow renamed files, and a
// rename onto a name someone waits for (the write-then-rename pattern)
// completes the wait. A file published elsewhere is brought here first; a
// directory moves only if everything in it is here (else EXDEV: mv copies
// it). Every node is told before the call returns.
func (n *node) Rename(ctx context.Context, name string, newParent gofs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	np, ok := newParent.(*node)
	if !ok {
		return syscall.EXDEV
	}
	if n.reserved(name) || np.reserved(newName) {
		return syscall.EPERM
	}
	fsys, d := n.fsys, n.fsys.dmd
	oldRel, newRel := n.childRel(name), np.childRel(newName)
	if !d.Solo() {
		if err := d.Materialize(ctx, oldRel, callerTid(ctx)); err != nil {
			return fsys.errno("rename", oldRel, err)
		}
		if flags&unix.RENAME_EXCHANGE != 0 {
			if err := d.Materialize(ctx, newRel, callerTid(ctx)); err != nil {
				return fsys.errno("rename", newRel, err)
			}
		} else if fsys.isDir(newRel) {
			if empty, err := d.DirEmptyElsewhere(ctx, newRel); err != nil {
				return fsys.errno("rename", newRel, err)
			} else if !empty {
				return syscall.ENOTEMPTY
			}
		}
		defer fsys.forget(oldRel)
		defer fsys.forget(newRel)
	}
	var target syscall.Stat_t
	targetErr := fsys.back().Lstat(newRel, &target)
	errno := gofs.ToErrno(d.RenameBeneath(oldRel, newRel, uint(flags)))
	if errno != 0 {
		return errno
	}
	// go-fuse moves the kernel's entries after this returns; what the
	// rename replaced loses its name.
	moved, over := n.GetChild(name), np.GetChild(newName)
	if flags&unix.RENAME_EXCHANGE != 0 {
		d.Republish(ctx, oldRel)
		d.Republish(ctx, newRel)
		return 0
	}
	if over != moved {
		fsys.nameGoes(over, newRel)
	}
	if targetErr == nil && target.Mode&syscall.S_IFMT == syscall.S_IFREG {
		// The file the rename replaced may have been half-written.
		d.Replaced(dmd.IDOf(&target), target.Nlink <= 1)
	}
	d.Renamed(ctx, oldRel, newRel)
	return 0
}

// OpendirHandle implements gofs.NodeOpendirHandler. With other nodes, the
// listing is the backing directory's entries and the namespace's (what is
// published elsewhere), each name once; the root's listing hides the
// control directory.
func (n *node) OpendirHandle(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	if !n.fsys.dmd.Solo() {
		return n.fsys.openListing(ctx, n.rel(), n.isRoot())
	}
	fh, errno := n.opendirHere()
	if errno != 0 || !n.isRoot() {
		return fh, 0, errno
	}
	return &rootDir{fh}, 0, 0
}

// rootDir is the root's directory stream without the control directory.
type rootDir struct{ gofs.FileHandle }

var (
	_ gofs.FileReaddirenter = (*rootDir)(nil)
	_ gofs.FileSeekdirer    = (*rootDir)(nil)
	_ gofs.FileReleasedirer = (*rootDir)(nil)
	_ gofs.FileFsyncdirer   = (*rootDir)(nil)
)

func (d *rootDir) Readdirent(ctx context.Context) (*fuse.DirEntry, syscall.Errno) {
	for {
		de, errno := d.FileHandle.(gofs.FileReaddirenter).Readdirent(ctx)
		if errno != 0 || de == nil || de.Name != dmd.InternalDir {
			return de, errno
		}
	}
}

func (d *rootDir) Seekdir(ctx context.Context, off uint64) syscall.Errno {
	if s, ok := d.FileHandle.(gofs.FileSeekdirer); ok {
		return s.Seekdir(ctx, off)
	}
	return syscall.ENOTSUP
}

func (d *rootDir) Releasedir(ctx context.Context, flags uint32) {
	if r, ok := d.FileHandle.(gofs.FileReleasedirer); ok {
		r.Releasedir(ctx, flags)
	}
}

func (d *rootDir) Fsyncdir(ctx context.Context, flags uint32) syscall.Errno {
	if s, ok := d.FileHandle.(gofs.FileFsyncdirer); ok {
		return s.Fsyncdir(ctx, flags)
	}
	return 0
}

// Getxattr implements gofs.NodeGetxattrer without dyadfs's own attribute.
func (n *node) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	if dmd.IsInternalXattr(attr) {
		return 0, syscall.ENODATA
	}
	sz, err := n.fsys.back().Getxattr(n.rel(), attr, dest)
	return uint32(sz), gofs.ToErrno(err)
}

// Setxattr implements gofs.NodeSetxattrer; dyadfs's own attribute is not
// for users.
func (n *node) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	if dmd.IsInternalXattr(attr) {
		return syscall.EPERM
	}
	return gofs.ToErrno(n.fsys.back().Setxattr(n.rel(), attr, data, int(flags)))
}

// Removexattr implements gofs.NodeRemovexattrer.
func (n *node) Removexattr(ctx context.Context, attr string) syscall.Errno {
	if dmd.IsInternalXattr(attr) {
		return syscall.EPERM
	}
	return gofs.ToErrno(n.fsys.back().Removexattr(n.rel(), attr))
}

// Listxattr implements gofs.NodeListxattrer without dyadfs's own attribute.
func (n *node) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	buf := make([]byte, 64<<10)
	sz, err := n.fsys.back().Listxattr(n.rel(), buf)
	if err != nil {
		return 0, gofs.ToErrno(err)
	}
	var out []byte
	for _, name := range bytes.Split(buf[:sz], []byte{0}) {
		if len(name) == 0 || dmd.IsInternalXattr(string(name)) {
			continue
		}
		out = append(append(out, name...), 0)
	}
	if len(dest) == 0 {
		return uint32(len(out)), 0
	}
	if len(out) > len(dest) {
		return uint32(len(out)), syscall.ERANGE
	}
	return uint32(copy(dest, out)), 0
}

// isDir reports whether rel is a directory in the backing directory.
func (fsys *FS) isDir(rel string) bool {
	var st syscall.Stat_t
	return fsys.back().Lstat(rel, &st) == nil && st.Mode&syscall.S_IFMT == syscall.S_IFDIR
}
