package fs

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
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
	if path, ok := FusermountPath(); ok {
		out, err := exec.Command(path, "-u", "-z", mountpoint).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%s -u -z %s: %w: %s", filepath.Base(path), mountpoint, err, bytes.TrimSpace(out))
		}
		return nil
	}
	return syscall.Unmount(mountpoint, syscall.MNT_DETACH)
}

// captureStderr runs fn with this process's standard error going into a
// pipe, and returns what was written there (also passed on to the
// standard error, once it is back): the only way to hear what a helper
// that inherits it (fusermount3) says.
func captureStderr(fn func()) []byte {
	r, w, err := os.Pipe()
	if err != nil {
		fn()
		return nil
	}
	saved, err := unix.Dup(2)
	if err != nil {
		r.Close()
		w.Close()
		fn()
		return nil
	}
	var buf bytes.Buffer
	done := make(chan struct{})
	go func() {
		io.Copy(&buf, r)
		close(done)
	}()
	unix.Dup2(int(w.Fd()), 2)
	fn()
	unix.Dup2(saved, 2)
	unix.Close(saved)
	w.Close()
	<-done
	r.Close()
	os.Stderr.Write(buf.Bytes())
	return buf.Bytes()
}

// FusermountSaid is the last line fusermount wrote, from its name on.
func FusermountSaid(out []byte) string {
	var last string
	for _, line := range strings.Split(string(out), "\n") {
		// "/usr/bin/fusermount3: unknown option 'x'"
		for _, name := range []string{"fusermount3: ", "fusermount: "} {
			if i := strings.Index(line, name); i >= 0 {
				last = strings.TrimSpace(line[i:])
				break
			}
		}
	}
	return last
}

// FusermountPath finds fusermount3 (or fusermount) on PATH or where
// Debian installs it: mount(8) runs helpers with an empty PATH.
func FusermountPath() (string, bool) {
	for _, prog := range []string{"fusermount3", "fusermount"} {
		if p, err := exec.LookPath(prog); err == nil {
			return p, true
		}
		for _, dir := range []string{"/usr/bin", "/bin", "/usr/local/bin"} {
			p := filepath.Join(dir, prog)
			if st, err := os.Stat(p); err == nil && st.Mode()&0o111 != 0 {
				return p, true
			}
		}
	}
	return "", false
}
