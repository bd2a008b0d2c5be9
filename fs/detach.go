package fs

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"

	"golang.org/x/sys/unix"
)

// watchDetach ends every wait once the mount disappears from this mount
// namespace while the kernel still holds the connection open: that is a lazy
// unmount (fusermount3 -u -z, umount -l). The waiting opens are what keep
// the connection alive, so ending them lets the kernel finish the unmount
// and the daemon exit.
func (fsys *FS) watchDetach() {
	var st syscall.Stat_t
	if err := syscall.Stat(fsys.cfg.Mountpoint, &st); err != nil {
		fsys.log.Warn("cannot watch for lazy unmount", "err", err)
		return
	}
	devID := fmt.Sprintf("%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev))
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		fsys.log.Warn("cannot watch for lazy unmount", "err", err)
		return
	}
	defer f.Close()
	for {
		data, err := readFrom0(f)
		if err != nil {
			return
		}
		if !mountinfoHasDev(data, devID) {
			fsys.log.Info("mount detached; ending all waits", "mountpoint", fsys.cfg.Mountpoint)
			fsys.dmd.Shutdown()
			return
		}
		// The mount table signals POLLPRI|POLLERR on every change. The
		// signal has been seen to go missing for a lazy unmount (Linux
		// 6.18), so the table is read again every second as well.
		fds := []unix.PollFd{{Fd: int32(f.Fd()), Events: unix.POLLPRI | unix.POLLERR}}
		if _, err := unix.Poll(fds, 1000); err != nil && err != unix.EINTR {
			fsys.log.Warn("cannot watch for lazy unmount", "err", err)
			return
		}
	}
}

func readFrom0(f *os.File) ([]byte, error) {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	return io.ReadAll(f)
}

// mountinfoHasDev reports whether a mount of device devID ("major:minor",
// the third field of /proc/self/mountinfo) is listed.
func mountinfoHasDev(data []byte, devID string) bool {
	for _, line := range bytes.Split(data, []byte{'\n'}) {
		f := bytes.Fields(line)
		if len(f) > 2 && string(f[2]) == devID {
			return true
		}
	}
	return false
}

// lazyUnmount detaches the mount at once; the kernel finishes the unmount
// when the last open file on it is closed.
func lazyUnmount(mountpoint string) error {
	for _, prog := range []string{"fusermount3", "fusermount"} {
		if path, err := exec.LookPath(prog); err == nil {
			out, err := exec.Command(path, "-u", "-z", mountpoint).CombinedOutput()
			if err != nil {
				return fmt.Errorf("%s -u -z %s: %w: %s", prog, mountpoint, err, bytes.TrimSpace(out))
			}
			return nil
		}
	}
	return syscall.Unmount(mountpoint, syscall.MNT_DETACH)
}
