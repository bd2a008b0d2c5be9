package dmd

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/dyadfs/dyadfs/dtl"
	"github.com/dyadfs/dyadfs/hfl"
)

var _ dtl.Destination = (*DMD)(nil)

// Install implements dtl.Destination: it marks tmp, a file fetched from
// v's owner, as a replica and renames it to v.Path. The path is resolved
// beneath the backing directory without following symbolic links (a user
// could have put one where a directory was expected, to make the daemon
// write elsewhere); missing directories are made, owned like the file. It
// never replaces anything.
func (d *DMD) Install(tmp *os.File, v dtl.Version) error {
	return d.installFrom(d.tempFd, tmp, v)
}

// installFrom is Install for tmp, a file of directory fromFd.
func (d *DMD) installFrom(fromFd int, tmp *os.File, v dtl.Version) error {
	rel, err := hfl.CleanPath(v.Path)
	if err != nil || rel == InternalDir || strings.HasPrefix(rel, InternalDir+"/") {
		return fmt.Errorf("install %q: %w", v.Path, hfl.ErrBadPath)
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(int(tmp.Fd()), &st); err != nil {
		return err
	}
	if err := d.MarkReplica(tmp, v.Owner, v.Info.Generation); err != nil {
		return fmt.Errorf("mark %s as a copy: %w", rel, err)
	}
	ino := v.Ino
	if rec, exists, ok := d.loc.Told(rel); ok && exists && rec.Generation == v.Info.Generation && v.Info.Generation != 0 {
		// The owner sent a newer version than the one located (it
		// serves its current one): that version's number.
		ino = rec.InodeNumber()
	}
	d.inheritFile(tmp, ino)
	dir, base := path.Split(rel)
	dirfd, err := d.dirBeneath(strings.TrimSuffix(dir, "/"), st.Uid, st.Gid)
	if err != nil {
		return fmt.Errorf("install %s: %w", rel, err)
	}
	defer unix.Close(dirfd)
	// Noted as a copy before it is there: a writer that opens it at once
	// makes it this node's own (its release drops the note), and a note
	// coming after would make that file a stale copy to remove. Under
	// namesMu: no stale copy is removed meanwhile.
	d.namesMu.Lock()
	defer d.namesMu.Unlock()
	fail := func(err error) error { return &os.LinkError{Op: "install", Old: tmp.Name(), New: rel, Err: err} }
	var there unix.Stat_t
	if err := unix.Fstatat(dirfd, base, &there, unix.AT_SYMLINK_NOFOLLOW); err == nil {
		return fail(unix.EEXIST)
	}
	c := copyInfo{owner: v.Owner, gen: v.Info.Generation}
	d.noteCopy(rel, c, &st)
	if err := unix.Renameat2(fromFd, filepath.Base(tmp.Name()), dirfd, base, unix.RENAME_NOREPLACE); err != nil {
		d.copies.forgetIf(rel, c) // something else got there first
		return fail(err)
	}
	if fromFd == d.tempFd {
		// Fetched whole (prefetch, say): the later opens read this.
		d.dropRanged(rel)
	}
	return nil
}

// dirBeneath opens directory rel of the backing directory (O_PATH), making
// the components that are missing, owned by uid:gid. A component that is a
// symbolic link, or not a directory, is an error.
func (d *DMD) dirBeneath(rel string, uid, gid uint32) (int, error) {
	how := &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	}
	if fd, err := d.back.OpenDirPath(rel); err == nil {
		return fd, nil
	} else if !errors.Is(err, unix.ENOENT) {
		return -1, fmt.Errorf("directory %s: %w", rel, err)
	}
	cur := -1 // -1: the backing directory itself
	at := func() int {
		if cur < 0 {
			return d.back.Fd()
		}
		return cur
	}
	made := ""
	for _, name := range strings.Split(rel, "/") {
		made = path.Join(made, name)
		err := unix.Mkdirat(at(), name, 0o755)
		if err == nil {
			unix.Fchownat(at(), name, int(uid), int(gid), unix.AT_SYMLINK_NOFOLLOW)
			d.shadowMade(at(), name, made)
		} else if !errors.Is(err, unix.EEXIST) {
			d.closeIf(cur)
			return -1, fmt.Errorf("make directory %s in %s: %w", name, rel, err)
		}
		next, err := unix.Openat2(at(), name, how)
		d.closeIf(cur)
		if err != nil {
			return -1, fmt.Errorf("directory %s in %s: %w", name, rel, err)
		}
		cur = next
	}
	return cur, nil
}

// shadowMade marks directory name, just made in dirfd at rel for a file
// of another node, as the shadow of that node's directory: not this node's
// to publish.
func (d *DMD) shadowMade(dirfd int, name, rel string) {
	if d.solo() {
		return
	}
	d.noteCopy(rel, copyInfo{dir: true}, nil)
	if !d.markers {
		return
	}
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	unix.Fsetxattr(fd, replicaXattr, []byte("@0"), 0)
}

func (d *DMD) closeIf(fd int) {
	if fd >= 0 {
		unix.Close(fd)
	}
}
