package dmd

import (
	"errors"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// markerXattr is set on a backing file while it is open for writing and
// removed when its last writer publishes it. A file that still carries it
// when dyadfs starts was being written when the previous daemon died: it is
// not published, and readers wait until it is written again.
const markerXattr = "user.dyadfs.incomplete"

// replicaXattr marks a file fetched from its owner ("node@generation"): a
// restarted daemon does not publish it as its own, and a writer that
// changes it here becomes its owner.
const replicaXattr = "user.dyadfs.replica"

// IsInternalXattr reports whether name is one of dyadfs's own attributes,
// which the mount neither shows nor lets users change.
func IsInternalXattr(name string) bool { return name == markerXattr || name == replicaXattr }

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
