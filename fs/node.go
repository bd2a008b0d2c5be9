package fs

import (
	"context"
	"path"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/dyadfs/dyadfs/fs/dmd"
)

// node is a file or directory that exists in the backing store. It is a
// go-fuse loopback node; the operations that create, open, release, rename
// or remove files are overridden to keep the managed directory informed.
type node struct {
	gofs.LoopbackNode
	fsys *FS
	// id is the backing inode this node stands for; go-fuse makes a new
	// node when a name comes to mean another inode.
	id dmd.FileID
}

// Every interface a node implements beyond the embedded loopback's is
// checked here, once.
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

	_ gofs.NodeLookuper  = (*pendingDir)(nil)
	_ gofs.NodeGetattrer = (*pendingDir)(nil)
	_ gofs.NodeGetattrer = (*pendingFile)(nil)
	_ gofs.NodeOpener    = (*pendingFile)(nil)

	_ gofs.NodeOpener    = (*jsonFile)(nil)
	_ gofs.NodeGetattrer = (*jsonFile)(nil)
	_ gofs.NodeLookuper  = (*locateDir)(nil)
	_ gofs.NodeGetattrer = (*controlDirNode)(nil)
)

// rel returns the node's path relative to the mount ("" for the root).
func (n *node) rel() string { return n.Path(nil) }

func (n *node) isRoot() bool { return n.EmbeddedInode() == n.fsys.root.EmbeddedInode() }

func (n *node) childRel(name string) string { return path.Join(n.rel(), name) }

// cached marks an entry of an existing file as cacheable by the kernel.
func (fsys *FS) cached(out *fuse.EntryOut) {
	out.SetEntryTimeout(fsys.cfg.CacheTTL)
	out.SetAttrTimeout(fsys.cfg.CacheTTL)
}

// Getattr implements gofs.NodeGetattrer.
func (n *node) Getattr(ctx context.Context, f gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	errno := n.LoopbackNode.Getattr(ctx, f, out)
	if errno == 0 {
		out.SetTimeout(n.fsys.cfg.CacheTTL)
	}
	return errno
}

// Setattr implements gofs.NodeSetattrer. A chmod, truncate or utimes of a
// complete file republishes it.
func (n *node) Setattr(ctx context.Context, f gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	errno := n.LoopbackNode.Setattr(ctx, f, in, out)
	if errno != 0 {
		return errno
	}
	out.SetTimeout(n.fsys.cfg.CacheTTL)
	if out.Mode&syscall.S_IFMT == syscall.S_IFREG {
		n.fsys.dmd.Changed(ctx, n.rel())
	}
	return 0
}

// zero is an explicit zero timeout for entries that must not be cached.
const zero = time.Duration(0)
