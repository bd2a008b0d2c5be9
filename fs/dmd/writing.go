package dmd

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// A file being written is marked by an empty file named after its inode
// number in .dyadfs/writing-NODE: made when its first writer opens it,
// removed when its last writer finishes it. A mark left when the daemon
// starts names a file that was being written when the previous daemon
// died: it is not published, and readers wait until it is written again.
//
// The mark is beside the file, not on it. It used to be an extended
// attribute (markerXattr), but setting or removing one changes the file's
// ctime, and the last writer's release comes after its close() returned:
// a program that stat'ed the file after close saw its ctime move later
// (pjdfstest's truncate/00.t did). Files do not need user attributes for
// it either.

// openWritingMarks makes and opens this node's directory of marks.
func (d *DMD) openWritingMarks() error {
	dir := filepath.Join(d.internalPath(), "writing-"+d.cfg.Node)
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", dir, err)
	}
	d.writingFd = fd
	return nil
}

func markName(id FileID) string { return strconv.FormatUint(id.Ino, 16) }

// markWriting marks file id as being written.
func (d *DMD) markWriting(id FileID) error {
	err := unix.Mknodat(d.writingFd, markName(id), unix.S_IFREG|0o600, 0)
	if errors.Is(err, unix.EEXIST) {
		return nil // left by a file that had its inode number before
	}
	return err
}

// unmarkWriting removes file id's mark.
func (d *DMD) unmarkWriting(id FileID) {
	err := unix.Unlinkat(d.writingFd, markName(id), 0)
	if err != nil && !errors.Is(err, unix.ENOENT) {
		d.log.Warn("cannot clear the being-written mark", "ino", id.Ino, "err", err)
	}
}

// leftWriting returns the inode numbers marked as being written when the
// daemon starts, by the name of each mark.
func (d *DMD) leftWriting() map[uint64]string {
	fd, err := unix.Openat(d.writingFd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		d.log.Warn("cannot read the being-written marks", "err", err)
		return nil
	}
	f := os.NewFile(uintptr(fd), "writing")
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		d.log.Warn("cannot read the being-written marks", "err", err)
	}
	left := make(map[uint64]string, len(names))
	for _, name := range names {
		if ino, err := strconv.ParseUint(name, 16, 64); err == nil {
			left[ino] = name
		}
	}
	return left
}

// dropWritingMarks removes the marks in left that matched no file.
func (d *DMD) dropWritingMarks(left map[uint64]string, matched map[uint64]bool) {
	for ino, name := range left {
		if !matched[ino] {
			unix.Unlinkat(d.writingFd, name, 0)
		}
	}
}
