package fs

import (
	"context"
	"path"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/dyadfs/dyadfs/fs/dmd"
	"github.com/dyadfs/dyadfs/hfl"
)

// listing is a directory's entries as every node shows them: the backing
// directory's (this node's own files, copies, and those being written)
// and the namespace's (published anywhere), each name once. It is read when
// the directory is opened, the namespace's part page by page.
type listing struct {
	entries []fuse.DirEntry
	pos     int
}

var (
	_ gofs.FileReaddirenter = (*listing)(nil)
	_ gofs.FileSeekdirer    = (*listing)(nil)
	_ gofs.FileReleasedirer = (*listing)(nil)
)

// openListing reads the listing of directory rel.
func (fsys *FS) openListing(ctx context.Context, rel string, root bool) (gofs.FileHandle, uint32, syscall.Errno) {
	ds, errno := fsys.dirStream(rel)
	if errno != 0 {
		return nil, 0, errno
	}
	l := &listing{}
	here := make(map[string]struct{})
	for ds.HasNext() {
		de, errno := ds.Next()
		if errno != 0 {
			ds.Close()
			return nil, 0, errno
		}
		if root && de.Name == dmd.InternalDir {
			continue
		}
		here[de.Name] = struct{}{}
		de.Ino = fsys.direntIno(rel, de)
		l.entries = append(l.entries, de)
	}
	ds.Close()
	after := ""
	for {
		recs, err := fsys.dmd.List(ctx, rel, after, hfl.DefaultListLimit)
		if err != nil {
			return nil, 0, fsys.errno("readdir", rel, err)
		}
		for _, rec := range recs {
			name := rec.Name()
			if _, ok := here[name]; ok {
				continue
			}
			l.entries = append(l.entries, fuse.DirEntry{Name: name, Mode: rec.Mode & syscall.S_IFMT, Ino: rec.InodeNumber()})
		}
		if len(recs) < hfl.DefaultListLimit {
			break
		}
		after = recs[len(recs)-1].Name()
	}
	return l, 0, 0
}

// direntIno is the inode number the listing of directory rel shows for
// its backing entry de: the number its stat shows (see dmd.Ino), which
// takes one more look at the entry.
func (fsys *FS) direntIno(rel string, de fuse.DirEntry) uint64 {
	p := path.Join(rel, de.Name)
	switch {
	case (de.Name == "." || de.Name == "..") && rel == "":
		return de.Ino // the root's, and outside the mount
	case de.Name == ".":
		p = rel
	case de.Name == "..":
		p = path.Dir(rel)
		if p == "." {
			p = ""
		}
	}
	var st syscall.Stat_t
	birth, err := fsys.back().LstatGen(p, &st)
	if err != nil {
		return de.Ino
	}
	if ino := fsys.dmd.Ino(dmd.IDOf(&st), birth); ino != 0 {
		return ino
	}
	return de.Ino
}

// Readdirent implements gofs.FileReaddirenter.
func (l *listing) Readdirent(ctx context.Context) (*fuse.DirEntry, syscall.Errno) {
	if l.pos >= len(l.entries) {
		return nil, 0
	}
	de := l.entries[l.pos]
	l.pos++
	de.Off = uint64(l.pos)
	return &de, 0
}

// Seekdir implements gofs.FileSeekdirer: offsets are positions in the
// listing read at open.
func (l *listing) Seekdir(ctx context.Context, off uint64) syscall.Errno {
	l.pos = int(min(off, uint64(len(l.entries))))
	return 0
}

// Releasedir implements gofs.FileReleasedirer.
func (l *listing) Releasedir(ctx context.Context, flags uint32) {}
