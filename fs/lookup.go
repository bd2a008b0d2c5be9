package fs

import (
	"context"
	"os"
	"path"
	"sync/atomic"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/dyadfs/dyadfs/fs/caller"
)

// intentStats counts how LOOKUPs of missing names were classified.
type intentStats struct {
	openFile, traverse, other, unknown atomic.Uint64
}

// Lookup implements gofs.NodeLookuper. An existing name is a cached loopback
// entry. A missing name answers ENOENT at once, unless the caller is opening
// it (or a path through it) read-only: then the answer is a placeholder whose
// OPEN waits, outside any directory lock, until the file is published.
func (n *node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if n.reserved(name) {
		return n.fsys.controlDir(ctx), 0
	}
	ch, errno := n.LoopbackNode.Lookup(ctx, name, out)
	if errno == 0 {
		n.fsys.cached(out)
		return ch, 0
	}
	if errno != syscall.ENOENT {
		return nil, errno
	}
	if ch, errno := n.fsys.lookupMissing(ctx, n.EmbeddedInode(), n.childRel(name), out, false); ch != nil || errno != 0 {
		return ch, errno
	}
	// The name appeared while we looked (a create in progress): answer
	// with the real file rather than a placeholder that would replace it.
	ch, errno = n.LoopbackNode.Lookup(ctx, name, out)
	if errno == 0 {
		n.fsys.cached(out)
	}
	return ch, errno
}

// lookupMissing decides what a LOOKUP of the missing path rel answers: a
// placeholder or ENOENT. Below a placeholder directory every answer is a
// placeholder; elsewhere, if rel exists by now, it answers (nil, 0) to say
// "look it up again".
func (fsys *FS) lookupMissing(ctx context.Context, parent *gofs.Inode, rel string, out *fuse.EntryOut, belowPlaceholder bool) (*gofs.Inode, syscall.Errno) {
	tid := callerTid(ctx)
	call, err := caller.ReadCall(tid)
	if err != nil {
		fsys.intent.unknown.Add(1)
		fsys.log.Debug("cannot tell what the caller of a lookup is doing; answering ENOENT", "path", rel, "tid", tid, "err", err)
		return nil, syscall.ENOENT
	}
	intent := caller.Classify(call, tid, fsys.cfg.Mountpoint, rel)
	if !belowPlaceholder && (intent == caller.OpenFile || intent == caller.Traverse) {
		var st syscall.Stat_t
		if syscall.Lstat(fsys.dmd.BackingPath(rel), &st) == nil {
			return nil, 0
		}
	}
	switch intent {
	case caller.OpenFile:
		fsys.intent.openFile.Add(1)
		return fsys.pending(ctx, parent, &pendingFile{fsys: fsys, rel: rel}, syscall.S_IFREG|0o444, out), 0
	case caller.Traverse:
		fsys.intent.traverse.Add(1)
		return fsys.pending(ctx, parent, &pendingDir{fsys: fsys, rel: rel}, syscall.S_IFDIR|0o555, out), 0
	case caller.Other:
		fsys.intent.other.Add(1)
	default:
		fsys.intent.unknown.Add(1)
	}
	return nil, syscall.ENOENT
}

// pending makes a placeholder inode. Its entry and attributes are never
// cached, so that every other process looking at the name sees what is
// really there.
func (fsys *FS) pending(ctx context.Context, parent *gofs.Inode, ops gofs.InodeEmbedder, mode uint32, out *fuse.EntryOut) *gofs.Inode {
	out.Mode = mode
	out.Nlink = 1
	out.Owner = fuse.Owner{Uid: uint32(os.Getuid()), Gid: uint32(os.Getgid())}
	out.SetEntryTimeout(zero)
	out.SetAttrTimeout(zero)
	return parent.NewInode(ctx, ops, gofs.StableAttr{Mode: mode & syscall.S_IFMT})
}

// pendingDir stands for a directory that does not exist yet, on the path of
// a read-only open. Everything below it is pending too.
type pendingDir struct {
	gofs.Inode
	fsys *FS
	rel  string
}

// Lookup implements gofs.NodeLookuper. Below a placeholder directory
// everything is a placeholder, even what exists by now: the opener's OPEN
// waits for the file to be complete and then opens it by its path.
func (p *pendingDir) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return p.fsys.lookupMissing(ctx, p.EmbeddedInode(), path.Join(p.rel, name), out, true)
}

// Getattr implements gofs.NodeGetattrer.
func (p *pendingDir) Getattr(ctx context.Context, f gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode = syscall.S_IFDIR | 0o555
	out.Nlink = 2
	out.SetTimeout(zero)
	return 0
}

// pendingFile stands for a file that a reader is opening but that is not
// complete here yet. Its OPEN waits for the file and then opens the backing
// file: the reader's descriptor reads the complete file.
type pendingFile struct {
	gofs.Inode
	fsys *FS
	rel  string
}

// Getattr implements gofs.NodeGetattrer: through an open handle it is the
// real file's attributes.
func (p *pendingFile) Getattr(ctx context.Context, f gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.SetTimeout(zero)
	if fga, ok := f.(gofs.FileGetattrer); ok {
		errno := fga.Getattr(ctx, out)
		out.Ino = p.StableAttr().Ino
		return errno
	}
	out.Mode = syscall.S_IFREG | 0o444
	out.Nlink = 1
	return 0
}

// Open implements gofs.NodeOpener.
func (p *pendingFile) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	if flags&syscall.O_ACCMODE != syscall.O_RDONLY {
		return nil, 0, syscall.ENOENT
	}
	if _, err := p.fsys.dmd.WaitPath(ctx, p.rel); err != nil {
		return nil, 0, p.fsys.errno("open", p.rel, err)
	}
	f, err := p.fsys.dmd.OpenBeneath(p.rel, int(flags&^(syscall.O_APPEND|fuse.FMODE_EXEC)))
	if err != nil {
		return nil, 0, p.fsys.errno("open", p.rel, err)
	}
	if errno := p.fsys.mayRead(ctx, p.rel, f); errno != 0 {
		f.Close()
		return nil, 0, errno
	}
	return p.fsys.newReadHandle(gofs.NewLoopbackFileFromOS(f)), 0, 0
}
