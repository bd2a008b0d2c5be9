package fs

import (
	"context"
	"sync"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/dyadfs/dyadfs/fs/dmd"
)

// rangedHandle reads a large file of another node in ranges (see
// dmd.RangedFile): each read fetches the blocks it touches that are not
// here yet. It is opened for direct I/O: the kernel passes each read on as
// the program made it, without reading ahead past it into blocks nobody
// asked for (the handle reads ahead itself, when reads go in order).
// Mappings still work (the kernel maps direct-I/O files since Linux 6.6).
// There is no passthrough until the file is whole and opened again.
type rangedHandle struct {
	fsys *FS
	rel  string
	f    *dmd.RangedFile

	mu  sync.Mutex
	cur dmd.ReadCursor
}

var (
	_ gofs.FileReader    = (*rangedHandle)(nil)
	_ gofs.FileGetattrer = (*rangedHandle)(nil)
	_ gofs.FileReleaser  = (*rangedHandle)(nil)
	_ gofs.FileFlusher   = (*rangedHandle)(nil)
	_ gofs.FileFsyncer   = (*rangedHandle)(nil)
)

// openRanged returns the handle of f, opened in ranges for a reader of
// rel, once the caller may read it.
func (fsys *FS) openRanged(ctx context.Context, rel string, f *dmd.RangedFile) (gofs.FileHandle, uint32, syscall.Errno) {
	if errno := fsys.mayRead(ctx, rel, f.Data()); errno != 0 {
		f.Release()
		return nil, 0, errno
	}
	f.Opened()
	fsys.fds.opened()
	return &rangedHandle{fsys: fsys, rel: rel, f: f}, fuse.FOPEN_NOFLUSH | fuse.FOPEN_DIRECT_IO, 0
}

// Read implements gofs.FileReader.
func (h *rangedHandle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	h.mu.Lock()
	cur := h.cur
	h.mu.Unlock()
	n, err := h.f.ReadAt(ctx, dest, off, callerTid(ctx), &cur)
	h.mu.Lock()
	h.cur = cur
	h.mu.Unlock()
	if err != nil {
		return nil, h.fsys.errno("read", h.rel, err)
	}
	return fuse.ReadResultData(dest[:n]), 0
}

// Getattr implements gofs.FileGetattrer: the record's attributes.
func (h *rangedHandle) Getattr(ctx context.Context, out *fuse.AttrOut) syscall.Errno {
	rec := h.f.Record()
	attrFromRecord(rec, rec.InodeNumber(), &out.Attr)
	out.SetTimeout(h.fsys.cacheTTL())
	return 0
}

// Release implements gofs.FileReleaser.
func (h *rangedHandle) Release(ctx context.Context) syscall.Errno {
	h.f.Release()
	h.fsys.fds.released()
	h.fsys.readReleases.Add(1)
	return 0
}

// Flush implements gofs.FileFlusher: nothing was written.
func (h *rangedHandle) Flush(ctx context.Context) syscall.Errno { return 0 }

// Fsync implements gofs.FileFsyncer: nothing was written.
func (h *rangedHandle) Fsync(ctx context.Context, flags uint32) syscall.Errno { return 0 }
