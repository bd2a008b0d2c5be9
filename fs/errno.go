package fs

import (
	"context"
	"errors"
	"io/fs"
	"syscall"

	"github.com/dyadfs/dyadfs/dtl"
	"github.com/dyadfs/dyadfs/fs/dmd"
	"github.com/dyadfs/dyadfs/hfl"
)

// errno maps an error from the managed directory to the errno a FUSE caller
// sees. Expected outcomes map silently; anything else is EIO with one log
// line naming the cause.
func (fsys *FS) errno(op, rel string, err error) syscall.Errno {
	if err == nil {
		return 0
	}
	var errno syscall.Errno
	switch {
	case errors.Is(err, dmd.ErrPublish):
		// The writer's close: the store refused the file or did not
		// answer. It stays here, and its publish is retried.
		fsys.log.Warn(op+": not published", "path", rel, "err", err)
		switch {
		case errors.Is(err, hfl.ErrNoSpace):
			return syscall.ENOSPC
		case errors.Is(err, hfl.ErrDenied):
			return syscall.EACCES
		}
		return syscall.EIO
	case errors.Is(err, dmd.ErrFetch):
		// A failed transfer is EIO, even when a timeout ended it,
		// unless this node's storage refused the file: then the
		// program can tell the user so (ENOSPC, EDQUOT, EROFS,
		// EACCES), and what to free or fix.
		fsys.log.Warn(op+" failed", "path", rel, "err", err)
		return dtl.ReaderErrno(err)
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		// This node's backing store is full: the program can tell
		// the user so, and what to free.
		fsys.log.Warn(op+" failed", "path", rel, "err", err)
		errors.As(err, &errno)
		return errno
	case errors.Is(err, dmd.ErrWaitTimeout), errors.Is(err, context.DeadlineExceeded):
		return syscall.ETIMEDOUT
	case errors.Is(err, dmd.ErrShutdown):
		return syscall.ENOTCONN
	case errors.Is(err, context.Canceled):
		return syscall.EINTR
	case errors.Is(err, dmd.ErrNotRegular):
		// A directory (or another non-file) took the name.
		return syscall.EISDIR
	case errors.Is(err, hfl.ErrNotFound), errors.Is(err, fs.ErrNotExist):
		return syscall.ENOENT
	case errors.As(err, &errno):
		return errno
	}
	fsys.log.Error(op+" failed", "path", rel, "err", err)
	return syscall.EIO
}

// stale answers ESTALE to an open whose inode is not the name's current
// file any more: the kernel looks the name up again and retries once.
func (fsys *FS) stale(why, rel string) syscall.Errno {
	fsys.log.Debug("open of an inode the name no longer names; the kernel looks it up again", "path", rel, "why", why)
	return syscall.ESTALE
}
