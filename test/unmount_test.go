package test

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dyadfs/dyadfs/fs"
)

// TestUnmountEndsWaits: fusermount3 -u fails while a consumer waits for a
// file (the waiting open keeps the mount busy); dyadfs unmount ends the
// wait (the reader gets ENOTCONN) and unmounts. With a file held open it
// refuses and says why; --lazy detaches then. A mount whose daemon died
// is named so by status and mount, and cleared by unmount.
func TestUnmountEndsWaits(t *testing.T) {
	m := newMount(t)
	waiting, _ := startCmd(t, m.mnt, nil, "cat", "not-yet")
	m.waitStatus("cat waits", func(st fs.Status) bool { return len(st.Waiters) == 1 })
	if out, err := exec.Command("fusermount3", "-u", m.mnt).CombinedOutput(); err == nil || !strings.Contains(string(out), "busy") {
		t.Fatalf("fusermount3 -u while an open waits: %v %s; the test expects it busy", err, out)
	}
	out, err := dyadfs(t, "unmount", m.mnt)
	if err != nil || !strings.Contains(out, "unmounted") {
		t.Fatalf("dyadfs unmount: %v %s", err, out)
	}
	select {
	case r := <-waiting:
		if r.err == nil || !strings.Contains(r.stderr, "Transport endpoint is not connected") {
			t.Fatalf("the waiting cat: %v, want ENOTCONN", r)
		}
	case <-time.After(bound):
		t.Fatal("the waiting cat did not end")
	}
	if isMounted(m.mnt) {
		t.Fatal("still mounted")
	}

	// A file held open: refused, with what to do; --lazy detaches.
	m = newMount(t)
	mustSh(t, m.mnt, "echo x > held")
	_, stdin := startCmd(t, m.mnt, nil, "sh", "-c", "exec 3<held; cat >/dev/null")
	m.waitStatus("a file held open", func(st fs.Status) bool { return st.Descriptors.Handles >= 1 })
	out, err = dyadfs(t, "unmount", m.mnt)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 6 || !strings.Contains(out, "files are open") || !strings.Contains(out, "--lazy") || !isMounted(m.mnt) {
		t.Fatalf("dyadfs unmount with a file open: %v %q, want exit 6, the files named, and the mount kept", err, out)
	}
	if out, err := dyadfs(t, "unmount", "--lazy", m.mnt); err != nil || isMounted(m.mnt) {
		t.Fatalf("dyadfs unmount --lazy: %v %s", err, out)
	}
	stdin.Close()

	// A daemon that died: status and mount say so; unmount clears it.
	m = newMount(t)
	pid := m.status().PID
	syscall.Kill(pid, syscall.SIGKILL)
	if !waitExit(pid, bound) {
		t.Fatal("the daemon killed did not exit")
	}
	m.pid = 0
	out, err = dyadfs(t, "status", m.mnt)
	if err == nil || !strings.Contains(out, "not running") || !strings.Contains(out, "dyadfs unmount") {
		t.Fatalf("status of a mount whose daemon died: %v %q", err, out)
	}
	out, err = dyadfs(t, "mount", "--backing", m.backing, m.mnt)
	if err == nil || !strings.Contains(out, "not running") {
		t.Fatalf("mount over a mount whose daemon died: %v %q", err, out)
	}
	if out, err := dyadfs(t, "unmount", m.mnt); err != nil || isMounted(m.mnt) {
		t.Fatalf("dyadfs unmount of a dead mount: %v %s", err, out)
	}
	os.Remove(m.logFile)
}

// TestMount8Form: mount(8) mounts dyadfs as it mounts sshfs, through
// mount.fuse3, with the mount flags given as options and FUSE options
// beside them; the options of fstab and mount(8) themselves are dropped.
// (The test names its own binary, mount -t fuse "BINARY#dyadfs"; an
// installed dyadfs is mount -t fuse.dyadfs dyadfs MOUNTPOINT.)
func TestMount8Form(t *testing.T) {
	requireEnv(t)
	_, mnt, backing := mountDirs(t)
	logFile := filepath.Join(t.TempDir(), "log")
	out, err := exec.Command("mount", "-t", "fuse", dyadfsBin+"#dyadfs", mnt,
		"-o", "backing="+backing+",wait_timeout=7m,log-file="+logFile+",allow_other,nosuid,_netdev,x-systemd.automount").CombinedOutput()
	if err != nil {
		t.Fatalf("mount -t fuse ...#dyadfs: %v %s", err, out)
	}
	defer exec.Command("fusermount3", "-u", "-z", mnt).Run()
	st, err := dyadfs(t, "status", "--json", mnt)
	if err != nil || !strings.Contains(st, `"wait_timeout_seconds": 420`) || !strings.Contains(st, `"backing": "`+backing+`"`) {
		t.Fatalf("status of the mount(8) mount: %v\n%s", err, st)
	}
	info, _ := os.ReadFile("/proc/self/mountinfo")
	var line string
	for _, l := range strings.Split(string(info), "\n") {
		if strings.Contains(l, " "+mnt+" ") {
			line = l
		}
	}
	if !strings.Contains(line, "nosuid") || !strings.Contains(line, "allow_other") || !strings.Contains(line, "fuse.dyadfs") {
		t.Fatalf("the mount's options: %q, want nosuid and allow_other on a fuse.dyadfs mount", line)
	}
	mustSh(t, mnt, "echo x > f && cat f")
	if out, err := dyadfs(t, "unmount", mnt); err != nil || isMounted(mnt) {
		t.Fatalf("dyadfs unmount: %v %s", err, out)
	}
}

// TestSystemdReady: a daemon in the foreground under a Type=notify unit
// tells systemd it is ready once mounted (READY=1 on NOTIFY_SOCKET).
func TestSystemdReady(t *testing.T) {
	requireEnv(t)
	_, mnt, backing := mountDirs(t)
	sock := filepath.Join(t.TempDir(), "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	done, _ := startCmd(t, "", []string{"NOTIFY_SOCKET=" + sock}, dyadfsBin, "mount", "--foreground", "--backing", backing, mnt)
	defer exec.Command("fusermount3", "-u", "-z", mnt).Run()
	conn.SetReadDeadline(time.Now().Add(bound))
	buf := make([]byte, 512)
	n, err := conn.Read(buf)
	if err != nil || !strings.Contains(string(buf[:n]), "READY=1") {
		t.Fatalf("systemd was told %q (%v), want READY=1", buf[:n], err)
	}
	if !isMounted(mnt) {
		t.Fatal("READY=1 came before the mount")
	}
	if out, err := dyadfs(t, "unmount", mnt); err != nil {
		t.Fatalf("dyadfs unmount: %v %s", err, out)
	}
	select {
	case <-done:
	case <-time.After(bound):
		t.Fatal("the foreground daemon did not exit after its unmount")
	}
}
