package dmd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/dyadfs/dyadfs/fs/backing"
)

// The origin: a directory of a parallel file system (Lustre, GPFS) that
// holds what no node of the job published, such as a training dataset
// (DYAD's DYAD_PATH_ORIGIN). A read-only open of a path that no node
// published and that this node does not have reads the origin's file
// instead of waiting. With OriginPublish the first node to read it brings
// it here and publishes it, so that the others fetch it from that node
// rather than from the parallel file system (cache-aside). The origin is
// only ever opened to read.

// originDir is the origin, opened once; nil without one.
type originDir struct {
	dir *backing.Dir
}

func openOrigin(dir string) (*originDir, error) {
	if dir == "" {
		return nil, nil
	}
	st, err := os.Stat(dir)
	if err != nil {
		return nil, fmt.Errorf("origin %s: %w", dir, err)
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("origin %s: not a directory", dir)
	}
	b, err := backing.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("origin %s: %w", dir, err)
	}
	return &originDir{dir: b}, nil
}

func (o *originDir) close() {
	if o != nil {
		o.dir.Close()
	}
}

// InOrigin reports whether rel is under the origin: a missing name a
// read-only open may then take from there, whoever opens it.
func (d *DMD) InOrigin(rel string) bool {
	if d.origin == nil {
		return false
	}
	var st syscall.Stat_t
	return d.origin.dir.Lstat(rel, &st) == nil
}

// FromOrigin serves a read-only open of rel, a name missing here, from the
// origin: if no node published rel and the origin has it as a regular
// file, it returns that file opened read-only. With OriginPublish it
// brings the file here first and publishes it, and returns (nil, true):
// the caller opens the copy here as any file of this node. (nil, false)
// says the origin has nothing for rel: the open waits as usual.
func (d *DMD) FromOrigin(ctx context.Context, rel string) (*os.File, bool, error) {
	if d.origin == nil || d.existsHere(rel) {
		return nil, false, nil
	}
	if _, published, err := d.Entry(ctx, rel, false); err != nil || published {
		return nil, false, err // published: fetched from its node
	}
	fd, err := d.origin.dir.OpenFile(rel, unix.O_RDONLY, 0)
	if err != nil {
		return nil, false, nil
	}
	f := os.NewFile(uintptr(fd), filepath.Join(d.origin.dir.Path(), rel))
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		f.Close()
		return nil, false, nil
	}
	d.stats.originReads.Add(1)
	if !d.cfg.OriginPublish {
		return f, false, nil
	}
	defer f.Close()
	if err := d.bringFromOrigin(ctx, rel, f, &st); err != nil {
		return nil, false, err
	}
	return nil, true, nil
}

// bringFromOrigin copies the origin's file f (attributes st) to rel here,
// through a temporary file renamed into place (never over anything), and
// publishes it as this node's own.
func (d *DMD) bringFromOrigin(ctx context.Context, rel string, f *os.File, st *syscall.Stat_t) error {
	tmp, err := os.CreateTemp(d.TempDir(), "origin-")
	if err != nil {
		return fmt.Errorf("copy %s from the origin: %w", rel, err)
	}
	done := false
	defer func() {
		if !done {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if _, err := tmp.ReadFrom(f); err != nil { // copy_file_range where it can
		return fmt.Errorf("copy %s from the origin: %w", rel, err)
	}
	tfd := int(tmp.Fd())
	unix.Fchmod(tfd, st.Mode&0o7777)
	if os.Geteuid() == 0 {
		unix.Fchown(tfd, int(st.Uid), int(st.Gid))
	}
	ts := []unix.Timespec{unix.NsecToTimespec(st.Atim.Nano()), unix.NsecToTimespec(st.Mtim.Nano())}
	unix.UtimesNanoAt(tfd, "", ts, 0)
	if d.cfg.FsyncOnPublish {
		tmp.Sync()
	}
	dir, base := path.Split(rel)
	dirfd, err := d.dirBeneath(strings.TrimSuffix(dir, "/"), st.Uid, st.Gid)
	if err != nil {
		return fmt.Errorf("copy %s from the origin: %w", rel, err)
	}
	defer unix.Close(dirfd)
	d.namesMu.Lock()
	err = unix.Renameat2(d.tempFd, filepath.Base(tmp.Name()), dirfd, base, unix.RENAME_NOREPLACE)
	d.namesMu.Unlock()
	if errors.Is(err, unix.EEXIST) {
		return nil // another open of this node brought it meanwhile
	}
	if err != nil {
		return fmt.Errorf("copy %s from the origin: %w", rel, err)
	}
	done = true
	tmp.Close()
	var here syscall.Stat_t
	if err := d.back.Lstat(rel, &here); err != nil {
		return fmt.Errorf("copy %s from the origin: %w", rel, err)
	}
	d.stats.originPublished.Add(1)
	if d.solo() {
		return nil
	}
	// Published before the open returns: a node that opens it next
	// fetches it from here, not from the origin. A store that refuses
	// only costs the others a read of the origin (the publish is retried).
	if err := d.publishFile(ctx, rel, &here); err != nil {
		d.log.Warn("file read from the origin could not be published; other nodes read the origin", "path", rel, "err", err)
	}
	return nil
}
