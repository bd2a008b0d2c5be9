package dmd

import (
	"errors"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// markerXattr is how releases before the being-written marks (see
// writingMarks) marked a file being written: a file found with it after an
// unclean stop is held as a marked one is, and it is removed when the
// file is written again.
const markerXattr = "user.dyadfs.incomplete"

// replicaXattr marks a file fetched from its owner ("node@generation"): a
// restarted daemon does not publish it as its own, and a writer that
// changes it here becomes its owner.
const replicaXattr = "user.dyadfs.replica"

// publishedXattr marks this node's own file or directory once its record
// is in the store ("storeid@generation"): a restarted daemon that finds the
// mark but no record (or another node's) knows the path was removed or
// replaced elsewhere meanwhile, and does not bring it back; a mark of
// another store (the embedded store of an earlier run) means nothing.
const publishedXattr = "user.dyadfs.published"

// IsInternalXattr reports whether name is one of dyadfs's own attributes,
// which the mount neither shows nor lets users change.
func IsInternalXattr(name string) bool {
	return name == markerXattr || name == replicaXattr || name == publishedXattr || name == inoXattr
}

// markPublished notes on rel that it was published at generation gen:
// through fd, the file published, if it is open (fd >= 0; one system call
// instead of a walk to rel and three).
func (d *DMD) markPublished(rel string, gen uint64, fd int) {
	if !d.markers || d.solo() || d.storeID == "" {
		return
	}
	v := d.storeID + "@" + strconv.FormatUint(gen, 10)
	var err error
	if fd >= 0 {
		err = unix.Fsetxattr(fd, publishedXattr, []byte(v), 0)
	} else {
		err = d.back.Setxattr(rel, publishedXattr, []byte(v), 0)
	}
	if err != nil && !errors.Is(err, unix.ENOENT) {
		d.log.Debug("cannot mark a file as published", "path", rel, "err", err)
	}
}

// publishedMark returns the store and generation rel's mark names.
func (d *DMD) publishedMark(rel string) (store string, gen uint64, ok bool) {
	return d.splitMark(rel, publishedXattr)
}

// replicaMark returns the owner and generation a copy's mark names.
func (d *DMD) replicaMark(rel string) (owner string, gen uint64, ok bool) {
	return d.splitMark(rel, replicaXattr)
}

func (d *DMD) splitMark(rel, attr string) (string, uint64, bool) {
	buf := make([]byte, 512)
	n, err := d.back.Getxattr(rel, attr, buf)
	if err != nil {
		return "", 0, false
	}
	v := string(buf[:n])
	i := strings.LastIndexByte(v, '@')
	if i < 0 {
		return v, 0, true
	}
	gen, _ := strconv.ParseUint(v[i+1:], 10, 64)
	return v[:i], gen, true
}

// MarkReplica marks f, fetched from rec's owner, as a replica. It is the
// fetcher's last step before the file is renamed into place.
func (d *DMD) MarkReplica(f *os.File, owner string, generation uint64) error {
	if !d.markers {
		return nil
	}
	v := owner + "@" + strconv.FormatUint(generation, 10)
	return unix.Fsetxattr(int(f.Fd()), replicaXattr, []byte(v), 0)
}

func isReplica(path string) bool {
	_, err := unix.Lgetxattr(path, replicaXattr, nil)
	return err == nil
}

func clearReplica(fd int) {
	unix.Fremovexattr(fd, replicaXattr)
}

func probeMarkers(dir string) bool {
	f, err := os.CreateTemp(dir, "probe-*")
	if err != nil {
		return false
	}
	defer os.Remove(f.Name())
	defer f.Close()
	return unix.Fsetxattr(int(f.Fd()), markerXattr, []byte{1}, 0) == nil
}

func clearMarker(fd int) error {
	err := unix.Fremovexattr(fd, markerXattr)
	if errors.Is(err, unix.ENODATA) {
		return nil
	}
	return err
}

func (d *DMD) hasMarker(rel string) bool {
	_, err := d.back.Getxattr(rel, markerXattr, nil)
	return err == nil
}
