package fs

import (
	"context"
	"path"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/dyadfs/dyadfs/fs/dmd"
)

// node is a file or directory that exists in the backing store: a loopback
// (see loopback.go) whose operations that create, open, release, rename
// or remove files keep the managed directory informed.
type node struct {
	gofs.Inode
	fsys *FS
	// id is the backing inode this node stands for; go-fuse makes a new
	// node when a name comes to mean another inode.
	id dmd.FileID
	fileInode
	// The name it was last known by, once it has none, is kept apart
	// (lostNames): 160 bytes a node, not 176.
}

// fileInode is what the inode of a file, here (node) or elsewhere
// (remoteNode), keeps across its opens.
type fileInode struct {
	// opens counts the opens and creates that gave the kernel a handle
	// of it, or may: once one has, the kernel passes its opens through to
	// that handle's backing file while any is open (see retarget).
	opens atomic.Int32
}

// beginOpen counts an open (or a create) of the inode, before anything
// else it does.
func (f *fileInode) beginOpen() { f.opens.Add(1) }

// soleOpen reports whether no open or create of the inode but the
// caller's ever began: only then may the caller's open be given another
// file than the inode's (see retarget). It is asked when that is
// decided, not when the open began: an open that began later may have
// returned its handle meanwhile, and go-fuse ties the inode to the file
// of the first handle returned, not of the first open begun.
func (f *fileInode) soleOpen() bool { return f.opens.Load() == 1 }

// lostNames are the last names of the file inodes (here or remote) whose
// name went while the kernel still knows them, until it forgets them
// (OnForget). A rename or an unlink can take an inode's name between the
// kernel's LOOKUP and the OPEN that follows it; a reader's open then
// starts again from the name the inode was last known by, as an open a
// moment later would, instead of failing (the kernel retries an ESTALE
// open only once, and the name can be taken again meanwhile). Until then
// go-fuse's tree has its name: few are kept here at a time, where every
// inode keeping its own would cost every file 32 bytes.
type lostNames struct {
	mu    sync.Mutex
	names map[*gofs.Inode]string
}

func (l *lostNames) set(n *gofs.Inode, rel string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.names == nil {
		l.names = make(map[*gofs.Inode]string)
	}
	l.names[n] = rel
}

func (l *lostNames) get(n *gofs.Inode) (string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	rel, ok := l.names[n]
	return rel, ok
}

func (l *lostNames) drop(n *gofs.Inode) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.names, n)
}

// len returns how many lost names are kept (for tests).
func (l *lostNames) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.names)
}

// OnForget implements gofs.NodeOnForgetter: the kernel can no longer open
// the node, so its lost name goes.
func (n *node) OnForget() { n.fsys.lost.drop(n.EmbeddedInode()) }

// OnForget implements gofs.NodeOnForgetter, as node's.
func (r *remoteNode) OnForget() { r.fsys.lost.drop(r.EmbeddedInode()) }

// nameGoes records that ino, known as rel, is about to lose that name:
// unlinked or renamed over. (An inode that another takes the place of at
// a lookup or a create keeps its path: go-fuse leaves it its parent.)
func (fsys *FS) nameGoes(ino *gofs.Inode, rel string) {
	if ino == nil || ino.IsDir() {
		return // a directory is not opened by a name it lost
	}
	switch ino.Operations().(type) {
	case *node, *remoteNode:
		fsys.lost.set(ino, rel)
		// The kernel may have forgotten it meanwhile (OnForget came
		// first): then nothing would drop the name.
		if ino.Forgotten() {
			fsys.lost.drop(ino)
		}
	}
}

// Every interface a node implements beyond the embedded loopback's is
// checked here, once, and so are those of the nodes that stand for what
// is not here (remote, pending) and of the control tree's.
var (
	_ gofs.NodeLookuper       = (*node)(nil)
	_ gofs.NodeGetattrer      = (*node)(nil)
	_ gofs.NodeSetattrer      = (*node)(nil)
	_ gofs.NodeOpener         = (*node)(nil)
	_ gofs.NodeCreater        = (*node)(nil)
	_ gofs.NodeTmpfiler       = (*node)(nil)
	_ gofs.NodeFlusher        = (*node)(nil)
	_ gofs.NodeMkdirer        = (*node)(nil)
	_ gofs.NodeMknoder        = (*node)(nil)
	_ gofs.NodeSymlinker      = (*node)(nil)
	_ gofs.NodeLinker         = (*node)(nil)
	_ gofs.NodeUnlinker       = (*node)(nil)
	_ gofs.NodeRenamer        = (*node)(nil)
	_ gofs.NodeOpendirHandler = (*node)(nil)
	_ gofs.NodeGetxattrer     = (*node)(nil)
	_ gofs.NodeSetxattrer     = (*node)(nil)
	_ gofs.NodeRemovexattrer  = (*node)(nil)
	_ gofs.NodeListxattrer    = (*node)(nil)
	_ gofs.NodeReadlinker     = (*node)(nil)
	_ gofs.NodeStatfser       = (*node)(nil)
	_ gofs.NodeOnForgetter    = (*node)(nil)
	_ gofs.NodeOnForgetter    = (*remoteNode)(nil)

	_ gofs.NodeGetattrer  = (*remoteNode)(nil)
	_ gofs.NodeSetattrer  = (*remoteNode)(nil)
	_ gofs.NodeOpener     = (*remoteNode)(nil)
	_ gofs.NodeReadlinker = (*remoteNode)(nil)
	_ gofs.NodeGetxattrer = (*remoteNode)(nil)

	_ gofs.NodeLookuper  = (*pendingDir)(nil)
	_ gofs.NodeGetattrer = (*pendingDir)(nil)
	_ gofs.NodeGetattrer = (*pendingFile)(nil)
	_ gofs.NodeOpener    = (*pendingFile)(nil)

	_ gofs.NodeOpener    = (*jsonFile)(nil)
	_ gofs.NodeGetattrer = (*jsonFile)(nil)
	_ gofs.NodeLookuper  = (*locateDir)(nil)
	_ gofs.NodeGetattrer = (*controlDirNode)(nil)
)

// rel returns the node's path relative to the mount ("" for the root). A
// node whose last name went (an orphan, still open) has a path that names
// nothing (".go-fuse.N/deleted"), so that what is asked of it by path
// fails with ENOENT instead of acting on the root.
func (n *node) rel() string { return n.Path(n.fsys.root.EmbeddedInode()) }

// pathOf returns the path of ino relative to the mount, and whether it has
// one: an inode whose last name went (an orphan) has none.
func (fsys *FS) pathOf(ino *gofs.Inode) (string, bool) {
	rel := ino.Path(fsys.root.EmbeddedInode())
	return rel, !orphanPath(rel)
}

// orphanPath reports whether rel is go-fuse's path of an orphan: it
// starts with ".go-fuse.<number>/deleted" where the path could not be
// followed up to the root.
func orphanPath(rel string) bool {
	first, rest, _ := strings.Cut(rel, "/")
	num, ok := strings.CutPrefix(first, ".go-fuse.")
	if !ok || num == "" || strings.Trim(num, "0123456789") != "" {
		return false
	}
	return rest == "deleted" || strings.HasPrefix(rest, "deleted/")
}

// knownRel is rel, or "" for an orphan: what a handle tells the managed
// directory its file is called now.
func (n *node) knownRel() string {
	rel, named := n.fsys.pathOf(n.EmbeddedInode())
	if !named {
		return ""
	}
	return rel
}

func (n *node) isRoot() bool { return n.EmbeddedInode() == n.fsys.root.EmbeddedInode() }

func (n *node) childRel(name string) string { return path.Join(n.rel(), name) }

// cached marks an entry of an existing file as cacheable by the kernel.
func (fsys *FS) cached(out *fuse.EntryOut) {
	out.SetEntryTimeout(fsys.cacheTTL())
	out.SetAttrTimeout(fsys.cacheTTL())
}

// sharedCacheTTL bounds how long the kernel caches what it is shown when
// other nodes share the namespace: not longer than a home's promise to
// tell this node of changes lasts (see hfl's notices), so that what the
// kernel shows is asked about again before it can go stale unseen.
const sharedCacheTTL = 50 * time.Second

// cacheTTL is how long the kernel may cache entries and attributes.
func (fsys *FS) cacheTTL() time.Duration {
	if !fsys.dmd.Solo() {
		return min(fsys.cfg.CacheTTL, sharedCacheTTL)
	}
	return fsys.cfg.CacheTTL
}

// Getattr implements gofs.NodeGetattrer.
func (n *node) Getattr(ctx context.Context, f gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	errno := n.getattrHere(ctx, f, out)
	if errno == syscall.ENOENT && f == nil {
		// Its name went since the kernel looked it up: renamed over
		// (the node has no name now), or replaced by another node's
		// version (the file here was removed). ESTALE has the kernel
		// look the name up again, as a stat a moment later would;
		// ENOENT would tell a program that stats a name that always
		// exists that it is missing.
		return syscall.ESTALE
	}
	if errno == 0 {
		out.Ino = n.StableAttr().Ino // the number shown (see stable), not the backing one
		out.SetTimeout(n.fsys.cacheTTL())
		n.fsys.copyTimes(n.rel(), &out.Attr)
	}
	return errno
}

// Setattr implements gofs.NodeSetattrer. A chmod, truncate or utimes of a
// complete file republishes it; a copy of another node's file becomes this
// node's, and a file replaced elsewhere since it was looked up is changed
// in its current version.
func (n *node) Setattr(ctx context.Context, f gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	d := n.fsys.dmd
	rel := n.rel()
	if f == nil && !d.Solo() {
		if _, regular, _ := n.backingID(); regular && !d.CurrentHere(ctx, rel) {
			r := &remoteNode{fsys: n.fsys}
			return r.setattrAt(ctx, rel, in, out)
		}
		d.Adopt(rel)
	}
	errno := n.setattrHere(ctx, f, in, out)
	if errno != 0 {
		return errno
	}
	out.Ino = n.StableAttr().Ino
	out.SetTimeout(n.fsys.cacheTTL())
	if out.Mode&syscall.S_IFMT == syscall.S_IFREG {
		d.Changed(ctx, rel)
	} else {
		d.Made(ctx, rel)
	}
	return 0
}

// zero is an explicit zero timeout for entries that must not be cached.
const zero = time.Duration(0)
