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

// InOrigin reports whether the origin has rel as a regular file or a
// directory: a missing name a read-only open may take from there, whoever
// opens it.
func (d *DMD) InOrigin(rel string) bool {
	if d.origin == nil {
		return false
	}
	var st syscall.Stat_t
	if d.origin.dir.Lstat(rel, &st) != nil {
		return false
	}
	t := st.Mode & syscall.S_IFMT
	return t == syscall.S_IFREG || t == syscall.S_IFDIR
}

// OriginPublishes reports whether a file read from the origin is brought
// here and published (see BringFromOrigin).
func (d *DMD) OriginPublishes() bool { return d.cfg.OriginPublish }

// OriginFile opens, for a read-only open of rel (a name missing here),
// the origin's file at rel, if the origin has it as a regular file and no
// node published rel. Nil means the open waits as usual: nothing in the
// origin, or something published (it is fetched), or a store that cannot
// say (a published version must not be missed). The caller checks the
// opener's permissions against the origin's modes (Config.Origin).
func (d *DMD) OriginFile(ctx context.Context, rel string) (*os.File, error) {
	if d.origin == nil || d.existsHere(rel) {
		return nil, nil
	}
	var st syscall.Stat_t
	if d.origin.dir.Lstat(rel, &st) != nil || st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return nil, nil
	}
	// O_NONBLOCK: whatever took the name since the look, opening it must
	// not block (a FIFO).
	fd, err := d.origin.dir.OpenFile(rel, unix.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s in the origin: %w", rel, err)
	}
	f := os.NewFile(uintptr(fd), filepath.Join(d.origin.dir.Path(), rel))
	if err := syscall.Fstat(fd, &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		f.Close()
		return nil, nil
	}
	if _, published, err := d.Entry(ctx, rel, false); err != nil || published {
		if err != nil {
			d.log.Debug("cannot tell whether a path in the origin is published; waiting", "path", rel, "err", err)
		}
		f.Close()
		return nil, nil
	}
	d.stats.originReads.Add(1)
	return f, nil
}

// BringFromOrigin copies the origin's file f, opened by OriginFile for
// rel, here through a temporary file renamed into place (never over
// anything), and publishes it as this node's own, before it returns: a
// node that opens rel next fetches it from here, not from the origin. It
// closes f.
func (d *DMD) BringFromOrigin(ctx context.Context, rel string, f *os.File) error {
	defer f.Close()
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		return fmt.Errorf("copy %s from the origin: %w", rel, err)
	}
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
	unix.UtimesNanoAt(tfd, "", ts, unix.AT_EMPTY_PATH) // futimens
	// On disk before it has a name: after a crash, a file here is whole
	// (the scan publishes what it finds).
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("copy %s from the origin: %w", rel, err)
	}
	dir, base := path.Split(rel)
	dir = strings.TrimSuffix(dir, "/")
	if err := d.originParents(ctx, dir); err != nil {
		return fmt.Errorf("copy %s from the origin: %w", rel, err)
	}
	dirfd, err := d.dirBeneath(dir, st.Uid, st.Gid)
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
	if _, published, err := d.Entry(ctx, rel, false); err == nil && published {
		// Another node published rel meanwhile (its own file, or what
		// it read from the origin): that one stands, and the copy here
		// is set aside as any file replaced elsewhere.
		return nil
	}
	// A store that refuses only costs the others a read of the origin
	// (the publish is retried).
	if err := d.publishFile(ctx, rel, &here); err != nil {
		d.log.Warn("file read from the origin could not be published; other nodes read the origin", "path", rel, "err", err)
	}
	return nil
}

// originParents makes the directories on the way to dir that are
// missing here: as the namespace has them (published by a node), or else
// as the origin has them, with its modes and owners, and published as
// this node's, so that every node shows them and checks the origin's
// permissions on the way to the files brought from it.
func (d *DMD) originParents(ctx context.Context, dir string) error {
	if dir == "" {
		return nil
	}
	p := ""
	for _, name := range strings.Split(dir, "/") {
		p = path.Join(p, name)
		if d.existsHere(p) {
			continue
		}
		if rec, ok, err := d.Entry(ctx, p, false); err == nil && ok && rec.IsDir() {
			if err := d.ShadowDir(ctx, p, rec); err != nil {
				return err
			}
			continue
		}
		var st syscall.Stat_t
		if err := d.origin.dir.Lstat(p, &st); err != nil {
			return err
		}
		if st.Mode&syscall.S_IFMT != syscall.S_IFDIR {
			return fmt.Errorf("%s in the origin: %w", p, syscall.ENOTDIR)
		}
		if err := d.back.Mkdir(p, st.Mode&0o7777); err != nil && !errors.Is(err, syscall.EEXIST) {
			return err
		}
		if fd, err := d.back.OpenFile(p, unix.O_RDONLY|unix.O_DIRECTORY, 0); err == nil {
			unix.Fchmod(fd, st.Mode&0o7777) // the daemon's umask does not apply
			if os.Geteuid() == 0 {
				unix.Fchown(fd, int(st.Uid), int(st.Gid))
			}
			unix.Close(fd)
		}
		d.Made(ctx, p)
	}
	return nil
}
