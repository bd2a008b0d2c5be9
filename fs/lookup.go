package fs

import (
	"context"
	"errors"
	"os"
	"path"
	"sync/atomic"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/dyadfs/dyadfs/fs/caller"
	"github.com/dyadfs/dyadfs/fs/dmd"
)

// intentStats counts how LOOKUPs of missing names were classified.
type intentStats struct {
	openFile, traverse, other, unknown, noWait atomic.Uint64
}

// Lookup implements gofs.NodeLookuper. A name the backing directory has in
// its current version is a cached loopback entry. A name published
// elsewhere is shown with its record's attributes (a directory gets a
// shadow here; a file or link is a remoteNode, whose data comes when it is
// opened). A name published nowhere answers ENOENT at once, unless the
// caller is opening it (or a path through it) read-only and waits: then the
// answer is a placeholder whose OPEN waits, outside any directory lock,
// until the file is published.
func (n *node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if n.reserved(name) {
		return n.fsys.controlDir(ctx), 0
	}
	fsys, d := n.fsys, n.fsys.dmd
	rel := n.childRel(name)
	ch, errno := n.lookupHere(ctx, name, out)
	if errno == 0 {
		if out.Mode&syscall.S_IFMT != syscall.S_IFREG || d.CurrentHere(ctx, rel) {
			fsys.cached(out)
			fsys.copyTimes(rel, &out.Attr)
			return ch, 0
		}
		// A copy of an older version (now removed), or this node's file
		// replaced elsewhere: what the namespace has now is shown.
	} else if errno != syscall.ENOENT {
		return nil, errno
	}
	var call caller.Call
	callErr := errNotRead
	if !d.Solo() {
		// A name known to be published elsewhere needs neither a
		// question nor the caller's syscall (reading it from /proc is
		// most of such a lookup's cost): only a missing name's answer
		// depends on what the caller does.
		rec, ok := d.KnownEntry(rel)
		if !ok {
			call, callErr = caller.ReadCall(callerTid(ctx))
			if callErr == nil && d.CommitComing(rel) && fsys.opensToWait(ctx, call, rel) {
				// This node was told the name's commit is coming: a
				// read-only open that waits takes the record sent
				// ahead (its placeholder's OPEN), and needs no
				// question; anything else asks.
				fsys.intent.openFile.Add(1)
				return fsys.pending(ctx, n.EmbeddedInode(), &pendingFile{fsys: fsys, rel: rel}, readOnlyFile, out), 0
			}
			creating := callErr == nil && call.Open && call.Flags&syscall.O_CREAT != 0
			var err error
			rec, ok, err = d.Entry(ctx, rel, creating)
			if err != nil {
				// Creates must not fail because the namespace cannot
				// be asked: the name is taken for missing.
				fsys.log.Warn("cannot look a name up in the namespace; taken for missing", "path", rel, "err", err)
			}
		}
		if ok {
			if rec.IsDir() {
				if err := d.ShadowDir(ctx, rel, rec); err != nil {
					return nil, fsys.errno("lookup", rel, err)
				}
				if ch, errno := n.lookupHere(ctx, name, out); errno == 0 {
					fsys.cached(out)
					return ch, 0
				}
				return nil, syscall.EIO
			}
			return fsys.remote(ctx, n.EmbeddedInode(), rec, out), 0
		}
	}
	if ch, errno := fsys.lookupMissing(ctx, n.EmbeddedInode(), rel, out, false, call, callErr); ch != nil || errno != 0 {
		return ch, errno
	}
	// The name appeared while we looked (a create in progress): answer
	// with the real file rather than a placeholder that would replace it.
	ch, errno = n.lookupHere(ctx, name, out)
	if errno == 0 {
		fsys.cached(out)
	}
	return ch, errno
}

// errNotRead stands for a caller's syscall not read yet.
var errNotRead = os.ErrInvalid

// lookupMissing decides what a LOOKUP of the missing path rel answers: a
// placeholder or ENOENT. Below a placeholder directory every answer is a
// placeholder; elsewhere, if rel exists by now, it answers (nil, 0) to say
// "look it up again". call is the caller's syscall, if callErr is nil
// (errNotRead: read it here).
func (fsys *FS) lookupMissing(ctx context.Context, parent *gofs.Inode, rel string, out *fuse.EntryOut, belowPlaceholder bool, call caller.Call, callErr error) (*gofs.Inode, syscall.Errno) {
	tid := callerTid(ctx)
	if callErr == errNotRead {
		call, callErr = caller.ReadCall(tid)
	}
	if callErr != nil {
		fsys.intent.unknown.Add(1)
		fsys.log.Debug("cannot tell what the caller of a lookup is doing; answering ENOENT", "path", rel, "tid", tid, "err", callErr)
		return nil, syscall.ENOENT
	}
	intent := caller.Classify(call, tid, fsys.cfg.Mountpoint, rel)
	if intent == caller.OpenFile || intent == caller.Traverse {
		// A directory that appeared meanwhile is looked up again. A
		// file need not be: the placeholder's open looks at it first
		// (see dmd.WaitPath), and a placeholder is never cached.
		if intent == caller.Traverse && !belowPlaceholder {
			var st syscall.Stat_t
			if fsys.back().Lstat(rel, &st) == nil {
				return nil, 0
			}
		}
		if !fsys.waits(tid, rel) && !fsys.dmd.InOrigin(rel) {
			fsys.intent.noWait.Add(1)
			return nil, syscall.ENOENT
		}
	}
	switch intent {
	case caller.OpenFile:
		fsys.intent.openFile.Add(1)
		return fsys.pending(ctx, parent, &pendingFile{fsys: fsys, rel: rel}, readOnlyFile, out), 0
	case caller.Traverse:
		fsys.intent.traverse.Add(1)
		return fsys.pending(ctx, parent, &pendingDir{fsys: fsys, rel: rel}, readOnlyDir, out), 0
	case caller.Other:
		fsys.intent.other.Add(1)
	default:
		fsys.intent.unknown.Add(1)
	}
	return nil, syscall.ENOENT
}

// opensToWait reports whether call, the syscall of the LOOKUP's caller, is
// a read-only open of the file rel that waits for it (see lookupMissing).
func (fsys *FS) opensToWait(ctx context.Context, call caller.Call, rel string) bool {
	tid := callerTid(ctx)
	return caller.Classify(call, tid, fsys.cfg.Mountpoint, rel) == caller.OpenFile && fsys.waits(tid, rel)
}

// waits reports whether the process of thread tid, opening rel (missing)
// read-only, waits for it: never for a name in Config.NeverWait, else what
// its environment says (see caller.RoleOf), else the mount's default.
func (fsys *FS) waits(tid uint32, rel string) bool {
	base := path.Base(rel)
	for _, pat := range fsys.cfg.NeverWait {
		if ok, _ := path.Match(pat, base); ok {
			return false
		}
	}
	switch caller.RoleOf(tid, path.Join(fsys.cfg.Mountpoint, rel)) {
	case caller.RoleWait:
		return true
	case caller.RoleNoWait:
		return false
	}
	return fsys.cfg.WaitMissing
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
	return p.fsys.lookupMissing(ctx, p.EmbeddedInode(), path.Join(p.rel, name), out, true, caller.Call{}, errNotRead)
}

// Getattr implements gofs.NodeGetattrer.
func (p *pendingDir) Getattr(ctx context.Context, f gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	return readOnlyAttr(out, readOnlyDir)
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
	if fga, ok := f.(gofs.FileGetattrer); ok {
		out.SetTimeout(zero)
		errno := fga.Getattr(ctx, out)
		out.Ino = p.StableAttr().Ino
		return errno
	}
	return readOnlyAttr(out, readOnlyFile)
}

// Open implements gofs.NodeOpener.
func (p *pendingFile) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	if flags&syscall.O_ACCMODE != syscall.O_RDONLY || flags&syscall.O_TRUNC != 0 {
		// A file that is not there is neither written nor truncated
		// through a reader's placeholder (an open of /proc/<pid>/fd/N
		// reaches it without a look up).
		return nil, 0, syscall.ENOENT
	}
	fsys, d := p.fsys, p.fsys.dmd
	for attempt := 0; ; attempt++ {
		f, err := d.OriginFile(ctx, p.rel)
		if err != nil {
			return nil, 0, fsys.errno("open", p.rel, err)
		}
		if f != nil {
			// Published nowhere: read from the origin, as the
			// origin's modes allow the caller.
			if errno := fsys.mayReadUnder(ctx, d.Config().Origin, p.rel, f); errno != 0 {
				f.Close()
				return nil, 0, errno
			}
			if !d.OriginPublishes() {
				return fsys.newReadHandle(gofs.NewLoopbackFileFromOS(f), p.rel), fuse.FOPEN_NOFLUSH, 0
			}
			// Brought here and published: the open below finds it.
			if err := d.BringFromOrigin(ctx, p.rel, f); err != nil {
				return nil, 0, fsys.errno("open", p.rel, err)
			}
		}
		fh, fuseFlags, errno := fsys.openWhenHere(ctx, p.rel, flags)
		if errno != syscall.ENOENT || attempt > 0 || !d.InOrigin(p.rel) {
			return fh, fuseFlags, errno
		}
		// A caller that does not wait found the publish it was to
		// read withdrawn meanwhile: the origin's file, once more.
	}
}

// openWhenHere waits until rel is complete here in its current version
// (fetching it if it is published elsewhere) and opens it for reading.
func (fsys *FS) openWhenHere(ctx context.Context, rel string, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	var f *os.File
	tid := callerTid(ctx)
	// A caller that does not wait opens a name it saw: if that is gone
	// meanwhile, the open fails as it would on a disk.
	ctx = dmd.EndsIfMissing(ctx, func() bool { return !fsys.waits(tid, rel) })
	for attempt := 0; ; attempt++ {
		_, ranged, err := fsys.dmd.WaitOpen(ctx, rel, tid, func() bool { return !caller.WholeFiles(tid) })
		if err != nil {
			return nil, 0, fsys.errno("open", rel, err)
		}
		if ranged != nil {
			return fsys.openRanged(ctx, rel, ranged)
		}
		f, err = fsys.dmd.OpenBeneath(rel, int(flags&^(syscall.O_APPEND|fuse.FMODE_EXEC)))
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.ENOENT) || attempt >= 3 {
			return nil, 0, fsys.errno("open", rel, err)
		}
		// Dropped between the wait and the open (a newer version was
		// told meanwhile): wait for that one.
	}
	if errno := fsys.mayRead(ctx, rel, f); errno != 0 {
		f.Close()
		return nil, 0, errno
	}
	return fsys.newReadHandle(gofs.NewLoopbackFileFromOS(f), rel), fuse.FOPEN_NOFLUSH, 0
}
