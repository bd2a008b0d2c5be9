package fs

import (
	"context"
	"os"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/dyadfs/dyadfs/fs/backing"
	"github.com/dyadfs/dyadfs/fs/dmd"
)

// The loopback: what a node does in the backing directory. It is go-fuse's
// loopback, but every operation is addressed beneath the backing
// directory's descriptor (package backing), never by the backing
// directory's path joined to the node's: paths as long as the mount takes
// work, and no symbolic link in the backing directory leads an operation
// out of it. Creations take exactly the mode the kernel passes (the
// caller's umask applied; the daemon's own is 0) and are owned by the
// caller, their group inherited from a set-group-ID directory.

func (fsys *FS) back() *backing.Dir { return fsys.dmd.Backing() }

// stable is the identity of a backing inode for the kernel. On a node
// alone: its inode number mixed with its device's, as go-fuse's loopback
// makes it (the backing directory's own device mixed out, so that a
// backing directory on one filesystem shows that filesystem's inode
// numbers), and its generation (birth). With other nodes, the inode number
// of the namespace's file it holds (see dmd.Ino), which every version of
// that file shows; the generation then tells the backing files apart (the
// kernel ties each of its inodes to one backing file), with the top bit
// clear: remote nodes have it set (see remote).
func (fsys *FS) stable(st *syscall.Stat_t, gen uint64) gofs.StableAttr {
	if ino := fsys.dmd.Ino(dmd.IDOf(st), gen); ino != 0 {
		return gofs.StableAttr{Mode: st.Mode, Ino: ino, Gen: (gen ^ st.Ino*0x9e3779b97f4a7c15) &^ (1 << 63)}
	}
	swap := func(dev uint64) uint64 { return dev<<32 | dev>>32 }
	return gofs.StableAttr{Mode: st.Mode, Gen: gen, Ino: swap(st.Dev) ^ swap(fsys.back().Dev()) ^ st.Ino}
}

// newChild makes the inode of the backing file st, found as rel, under n.
func (n *node) newChild(ctx context.Context, rel string, st *syscall.Stat_t, gen uint64) *gofs.Inode {
	return n.NewInode(ctx, &node{fsys: n.fsys, id: dmd.IDOf(st)}, n.fsys.stable(st, gen))
}

// entry looks rel up in the backing directory and makes its inode under n.
func (n *node) entry(ctx context.Context, rel string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	var st syscall.Stat_t
	gen, err := n.fsys.back().LstatGen(rel, &st)
	if err != nil {
		return nil, gofs.ToErrno(err)
	}
	out.Attr.FromStat(&st)
	return n.newChild(ctx, rel, &st, gen), 0
}

// lookupHere is LOOKUP in the backing directory.
func (n *node) lookupHere(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return n.entry(ctx, n.childRel(name), out)
}

// giveToCaller makes rel, just created by the daemon (root), the caller's:
// its owner, and its group unless the directory it is in is set-group-ID
// (then the group the filesystem gave it, the directory's, stays). The
// set-ID bits asked for, which chown clears, are set again.
func (n *node) giveToCaller(ctx context.Context, rel string, mode uint32) {
	if os.Geteuid() != 0 {
		return
	}
	c, ok := fuse.FromContext(ctx)
	if !ok {
		return
	}
	if int(c.Uid) == os.Geteuid() && int(c.Gid) == os.Getegid() {
		// Made by the daemon as the caller is: the kernel gave it the
		// caller's owner, a setgid directory's group, and its mode.
		return
	}
	back := n.fsys.back()
	gid := int(c.Gid)
	var dir syscall.Stat_t
	if back.Lstat(n.rel(), &dir) == nil && dir.Mode&syscall.S_ISGID != 0 {
		gid = -1
	}
	if back.Lchown(rel, int(c.Uid), gid) != nil {
		return
	}
	if mode&(syscall.S_ISUID|syscall.S_ISGID) != 0 && mode&syscall.S_IFMT != syscall.S_IFLNK {
		back.Chmod(rel, mode&07777)
	}
}

// made finishes a creation: the caller's ownership, then the new inode.
func (n *node) made(ctx context.Context, rel string, mode uint32, out *fuse.EntryOut, undo func() error) (*gofs.Inode, syscall.Errno) {
	n.giveToCaller(ctx, rel, mode)
	ch, errno := n.entry(ctx, rel, out)
	if errno != 0 {
		undo()
	}
	return ch, errno
}

func (n *node) mknodHere(ctx context.Context, name string, mode, rdev uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	rel := n.childRel(name)
	if err := n.fsys.back().Mknod(rel, mode, int(rdev)); err != nil {
		return nil, gofs.ToErrno(err)
	}
	return n.made(ctx, rel, mode, out, func() error { return n.fsys.back().Unlink(rel) })
}

func (n *node) mkdirHere(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	rel := n.childRel(name)
	if err := n.fsys.back().Mkdir(rel, mode); err != nil {
		return nil, gofs.ToErrno(err)
	}
	return n.made(ctx, rel, mode|syscall.S_IFDIR, out, func() error { return n.fsys.back().Rmdir(rel) })
}

func (n *node) symlinkHere(ctx context.Context, target, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	rel := n.childRel(name)
	if err := n.fsys.back().Symlink(target, rel); err != nil {
		return nil, gofs.ToErrno(err)
	}
	return n.made(ctx, rel, syscall.S_IFLNK, out, func() error { return n.fsys.back().Unlink(rel) })
}

// linkHere gives the backing file at targetRel the name name in n.
func (n *node) linkHere(ctx context.Context, targetRel, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	rel := n.childRel(name)
	if err := n.fsys.back().Link(targetRel, rel); err != nil {
		return nil, gofs.ToErrno(err)
	}
	return n.entry(ctx, rel, out)
}

// createHere is CREATE in the backing directory.
func (n *node) createHere(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (ch *gofs.Inode, fh *gofs.LoopbackFile, made bool, errno syscall.Errno) {
	rel := n.childRel(name)
	open := int(flags &^ syscall.O_APPEND)
	// Exclusive first: only a file this call made is given to the
	// caller. One that another process made meanwhile is opened as it is
	// (unless the caller asked for O_EXCL itself: EEXIST).
	fd, err := n.fsys.back().OpenFile(rel, open|os.O_CREATE|os.O_EXCL, mode&07777)
	made = err == nil
	if errorsIsExist(err) && flags&syscall.O_EXCL == 0 {
		fd, err = n.fsys.back().OpenFile(rel, open&^os.O_CREATE, 0)
	}
	if err != nil {
		return nil, nil, false, gofs.ToErrno(err)
	}
	if made {
		n.giveToCaller(ctx, rel, mode)
	}
	var st syscall.Stat_t
	gen, err := backing.FstatGen(fd, &st)
	if err != nil {
		unix.Close(fd)
		return nil, nil, false, gofs.ToErrno(err)
	}
	out.FromStat(&st)
	return n.newChild(ctx, rel, &st, gen), gofs.NewLoopbackFile(fd).(*gofs.LoopbackFile), made, 0
}

func errorsIsExist(err error) bool { return err == unix.EEXIST }

// openHere is OPEN of the node's backing file.
func (n *node) openHere(flags uint32) (*gofs.LoopbackFile, syscall.Errno) {
	fd, err := n.fsys.back().OpenFile(n.rel(), int(flags&^(syscall.O_APPEND|fuse.FMODE_EXEC)), 0)
	if err != nil {
		return nil, gofs.ToErrno(err)
	}

	return gofs.NewLoopbackFile(fd).(*gofs.LoopbackFile), 0
}

// opendirHere lists the node's backing directory.
func (n *node) opendirHere() (gofs.FileHandle, syscall.Errno) {
	ds, errno := n.fsys.dirStream(n.rel())
	return ds, errno
}

// dirStream is a stream of the entries of backing directory rel.
func (fsys *FS) dirStream(rel string) (gofs.DirStream, syscall.Errno) {
	fd, err := fsys.back().OpenFile(rel, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, gofs.ToErrno(err)
	}
	ds, errno := gofs.NewLoopbackDirStreamFd(fd)
	if errno != 0 {
		unix.Close(fd)
		return nil, errno
	}
	return ds, 0
}

// Readlink implements gofs.NodeReadlinker.
func (n *node) Readlink(ctx context.Context) ([]byte, syscall.Errno) {
	target, err := n.fsys.back().Readlink(n.rel())
	if err != nil {
		return nil, gofs.ToErrno(err)
	}
	return []byte(target), 0
}

// Statfs implements gofs.NodeStatfser: the backing filesystem's figures.
func (n *node) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	var st unix.Statfs_t
	if err := n.fsys.back().Statfs(&st); err != nil {
		return gofs.ToErrno(err)
	}
	s := syscall.Statfs_t{Type: st.Type, Bsize: st.Bsize, Blocks: st.Blocks, Bfree: st.Bfree, Bavail: st.Bavail,
		Files: st.Files, Ffree: st.Ffree, Namelen: st.Namelen, Frsize: st.Frsize, Flags: st.Flags}
	out.FromStatfsT(&s)
	return 0
}

// getattrHere is GETATTR of the node's backing file: through the handle if
// there is one.
func (n *node) getattrHere(ctx context.Context, f gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	if fga, ok := f.(gofs.FileGetattrer); ok && f != nil {
		return fga.Getattr(ctx, out)
	}
	var st syscall.Stat_t
	if err := n.fsys.back().Lstat(n.rel(), &st); err != nil {
		return gofs.ToErrno(err)
	}
	out.FromStat(&st)
	return 0
}

// setattrHere is SETATTR of the node's backing file: through the handle if
// there is one.
func (n *node) setattrHere(ctx context.Context, f gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if fsa, ok := f.(gofs.FileSetattrer); ok && f != nil {
		if errno := fsa.Setattr(ctx, in, out); errno != 0 {
			return errno
		}
		return n.getattrHere(ctx, f, out)
	}
	back, rel := n.fsys.back(), n.rel()
	if m, ok := in.GetMode(); ok {
		if err := back.Chmod(rel, m); err != nil {
			return gofs.ToErrno(err)
		}
	}
	uid, uok := in.GetUID()
	gid, gok := in.GetGID()
	if uok || gok {
		suid, sgid := -1, -1
		if uok {
			suid = int(uid)
		}
		if gok {
			sgid = int(gid)
		}
		if err := back.Lchown(rel, suid, sgid); err != nil {
			return gofs.ToErrno(err)
		}
	}
	// Truncate before the times, so that an explicit mtime stays.
	if sz, ok := in.GetSize(); ok {
		if err := back.Truncate(rel, int64(sz)); err != nil {
			return gofs.ToErrno(err)
		}
	}
	mtime, mok := in.GetMTime()
	atime, aok := in.GetATime()
	if mok || aok {
		ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, {Nsec: unix.UTIME_OMIT}}
		var err error
		if aok {
			if ts[0], err = unix.TimeToTimespec(atime); err != nil {
				return gofs.ToErrno(err)
			}
		}
		if mok {
			if ts[1], err = unix.TimeToTimespec(mtime); err != nil {
				return gofs.ToErrno(err)
			}
		}
		if err := back.Utimes(rel, ts); err != nil {
			return gofs.ToErrno(err)
		}
	}
	return n.getattrHere(ctx, nil, out)
}
