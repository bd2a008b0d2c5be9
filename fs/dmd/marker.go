package dmd

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
)

// markerXattr is set on a backing file while it is open for writing and
// removed when its last writer publishes it. A file that still carries it
// when dyadfs starts was being written when the previous daemon died: it is
// not published, and readers wait until it is written again.
const markerXattr = "user.dyadfs.incomplete"

// IsInternalXattr reports whether name is dyadfs's own attribute, which the
// mount neither shows nor lets users change.
func IsInternalXattr(name string) bool { return name == markerXattr }

func probeMarkers(dir string) bool {
	f, err := os.CreateTemp(dir, "probe-*")
	if err != nil {
		return false
	}
	defer os.Remove(f.Name())
	defer f.Close()
	return unix.Fsetxattr(int(f.Fd()), markerXattr, []byte{1}, 0) == nil
}

func setMarker(fd int) error {
	return unix.Fsetxattr(fd, markerXattr, []byte{1}, 0)
}

func clearMarker(fd int) error {
	err := unix.Fremovexattr(fd, markerXattr)
	if errors.Is(err, unix.ENODATA) {
		return nil
	}
	return err
}

func hasMarker(path string) bool {
	_, err := unix.Lgetxattr(path, markerXattr, nil)
	return err == nil
}

// lstatPath is syscall.Lstat with the path joined under dir.
func lstatPath(dir, rel string, st *syscall.Stat_t) error {
	return syscall.Lstat(filepath.Join(dir, rel), st)
}
