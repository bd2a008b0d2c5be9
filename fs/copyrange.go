package fs

import (
	"context"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"golang.org/x/sys/unix"
)

// copy_file_range between two files of the mount. The kernel asks the
// daemon first; an answer of EOPNOTSUPP has it copy through reads and
// writes, and ask again at the next call, while ENOSYS has it stop asking
// for good. So it is served whenever both files are open here (between
// their backing files, in the kernel, or through the blocks of a file read
// in ranges), and answered ENOSYS otherwise.

var (
	_ gofs.NodeCopyFileRanger = (*node)(nil)
	_ gofs.NodeCopyFileRanger = (*remoteNode)(nil)
	_ gofs.NodeCopyFileRanger = (*pendingFile)(nil)
)

func (n *node) CopyFileRange(ctx context.Context, fhIn gofs.FileHandle, offIn uint64, out *gofs.Inode, fhOut gofs.FileHandle, offOut uint64, len uint64, flags uint64) (uint32, syscall.Errno) {
	return n.fsys.copyFileRange(ctx, fhIn, offIn, fhOut, offOut, len, flags)
}

func (r *remoteNode) CopyFileRange(ctx context.Context, fhIn gofs.FileHandle, offIn uint64, out *gofs.Inode, fhOut gofs.FileHandle, offOut uint64, len uint64, flags uint64) (uint32, syscall.Errno) {
	return r.fsys.copyFileRange(ctx, fhIn, offIn, fhOut, offOut, len, flags)
}

func (p *pendingFile) CopyFileRange(ctx context.Context, fhIn gofs.FileHandle, offIn uint64, out *gofs.Inode, fhOut gofs.FileHandle, offOut uint64, len uint64, flags uint64) (uint32, syscall.Errno) {
	return p.fsys.copyFileRange(ctx, fhIn, offIn, fhOut, offOut, len, flags)
}

// backingFd is the backing descriptor of a handle that has one.
func backingFd(fh gofs.FileHandle) (int, bool) {
	switch h := fh.(type) {
	case *readHandle:
		return h.LoopbackFile.PassthroughFd()
	case *writeHandle:
		return h.LoopbackFile.PassthroughFd()
	}
	return -1, false
}

// copyChunk bounds what one copy through a file read in ranges moves.
const copyChunk = 1 << 20

func (fsys *FS) copyFileRange(ctx context.Context, fhIn gofs.FileHandle, offIn uint64, fhOut gofs.FileHandle, offOut uint64, n uint64, flags uint64) (uint32, syscall.Errno) {
	if flags != 0 {
		return 0, syscall.EINVAL
	}
	fdOut, ok := backingFd(fhOut)
	if !ok {
		return 0, syscall.ENOSYS
	}
	n = min(n, 1<<30) // the count answered is 32 bits
	if fdIn, ok := backingFd(fhIn); ok {
		in, out := int64(offIn), int64(offOut)
		c, err := unix.CopyFileRange(fdIn, &in, fdOut, &out, int(n), 0)
		if err != nil {
			return 0, gofs.ToErrno(err)
		}
		return uint32(c), 0
	}
	if r, ok := fhIn.(*rangedHandle); ok {
		buf := make([]byte, min(n, copyChunk))
		got, errno := r.Read(ctx, buf, int64(offIn))
		if errno != 0 {
			return 0, errno
		}
		data, st := got.Bytes(buf)
		if !st.Ok() {
			return 0, syscall.EIO
		}
		w, err := unix.Pwrite(fdOut, data, int64(offOut))
		if err != nil {
			return 0, gofs.ToErrno(err)
		}
		return uint32(w), 0
	}
	return 0, syscall.ENOSYS
}
