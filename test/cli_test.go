package test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// badMount runs `dyadfs mount` expecting it to fail with code and a
// one-line message containing want, and checks that nothing was mounted.
func badMount(t *testing.T, env []string, code int, want string, args ...string) {
	t.Helper()
	mnt := args[len(args)-1]
	wasMounted := isMounted(mnt)
	cmd := exec.Command(dyadfsBin, append([]string{"mount"}, args...)...)
	// The default log file goes to $TMPDIR: keep it in the test's directory.
	cmd.Env = append(append(os.Environ(), "TMPDIR="+t.TempDir()), env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != code {
		t.Fatalf("dyadfs mount %v: %v, want exit code %d; stderr %q", args, err, code, stderr.String())
	}
	msg := stderr.String()
	if strings.Count(msg, "\n") != 1 || !strings.HasPrefix(msg, "dyadfs: ") || !strings.Contains(msg, want) {
		t.Fatalf("dyadfs mount %v printed %q, want one line with %q", args, msg, want)
	}
	if !wasMounted && isMounted(mnt) {
		exec.Command("fusermount3", "-u", "-z", mnt).Run()
		t.Fatalf("%s left mounted after a failed mount", mnt)
	}
}

// TestBadInput (point 7): every mistake gets a one-line message, a named
// exit code and no mount.
func TestBadInput(t *testing.T) {
	requireEnv(t)
	dir, mnt, backing := mountDirs(t)
	file := filepath.Join(dir, "file")
	os.WriteFile(file, nil, 0o644)
	inner := filepath.Join(mnt, "inner")
	os.Mkdir(inner, 0o755)
	shortSecret := filepath.Join(dir, "short-secret")
	os.WriteFile(shortSecret, []byte("short\n"), 0o600)
	mntInBacking := filepath.Join(backing, "mnt")
	os.Mkdir(mntInBacking, 0o755)

	const (
		usage, backingErr, mountpointErr, noFuse, mountFailed, storeErr = 2, 3, 4, 5, 6, 7
	)
	cases := []struct {
		name string
		env  []string
		code int
		want string
		args []string
	}{
		{"unknown flag", nil, usage, "unknown flag", []string{"--bogus", "--backing", backing, mnt}},
		{"bad duration", nil, usage, "wait-timeout", []string{"--wait-timeout", "soon", "--backing", backing, mnt}},
		{"negative timeout", nil, usage, "must not be negative", []string{"--wait-timeout", "-1s", "--backing", backing, mnt}},
		{"bad key depth", nil, usage, "depth", []string{"--key-depth", "0", "--backing", backing, mnt}},
		{"bad store", nil, usage, "unknown scheme", []string{"--store", "bogus://x", "--backing", backing, mnt}},
		{"bad env", []string{"DYAD_KEY_BINS=lots"}, usage, "DYAD_KEY_BINS", []string{"--backing", backing, mnt}},
		{"no mountpoint", nil, usage, "MOUNTPOINT", []string{"--backing", backing}},
		{"missing backing", nil, backingErr, "does not exist", []string{"--backing", filepath.Join(dir, "nope"), mnt}},
		{"backing is a file", nil, backingErr, "not a directory", []string{"--backing", file, mnt}},
		{"backing inside mountpoint", nil, backingErr, "inside the mountpoint", []string{"--backing", inner, mnt}},
		{"mountpoint inside backing", nil, backingErr, "inside the backing", []string{"--backing", backing, mntInBacking}},
		{"missing mountpoint", nil, mountpointErr, "does not exist", []string{"--backing", backing, filepath.Join(dir, "nomnt")}},
		{"mountpoint is a file", nil, mountpointErr, "not a directory", []string{"--backing", backing, file}},
		// fusermount3's own message; found where Debian puts it when
		// PATH lacks it (mount(8) runs helpers with an empty PATH).
		{"kernel refuses the mount", nil, mountFailed, "fusermount3: unknown option 'no_such_fuse_option'", []string{"-o", "no_such_fuse_option", "--backing", backing, mnt}},
		{"fusermount3 outside PATH", []string{"PATH=" + dir}, mountFailed, "fusermount3: unknown option 'no_such_fuse_option'", []string{"-o", "no_such_fuse_option", "--backing", backing, mnt}},
		{"store unreachable", nil, storeErr, "127.0.0.1:1", []string{"--store", "etcd://127.0.0.1:1", "--backing", backing, mnt}},
		{"secret in clear in etcd", []string{"DYADFS_INSECURE_STORE_SECRET=0"}, usage, "the job secret would be kept in clear in etcd", []string{"--store", "etcd://127.0.0.1:1", "--backing", backing, mnt}},
		{"etcd certificate without TLS", nil, usage, "write the store as https://", []string{"--store", "etcd://127.0.0.1:1", "--etcd-cacert", file, "--backing", backing, mnt}},
		{"etcd user without password file", nil, usage, "go together", []string{"--store", "etcd://127.0.0.1:1", "--etcd-user", "job", "--backing", backing, mnt}},
		{"bad transport", nil, usage, "not available in this build", []string{"--dtl", "margo", "--backing", backing, mnt}},
		{"bad metrics port", nil, usage, "port from 0 to 65535", []string{"--metrics", "127.0.0.1:99999", "--backing", backing, mnt}},
		{"short secret", nil, usage, "at least 16 bytes", []string{"--secret-file", shortSecret, "--backing", backing, mnt}},
		{"readable secret", nil, usage, "chmod 600", []string{"--secret-file", file, "--backing", backing, mnt}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { badMount(t, tc.env, tc.code, tc.want, tc.args...) })
	}

	t.Run("read-only backing", func(t *testing.T) {
		ro := filepath.Join(dir, "ro")
		os.Mkdir(ro, 0o755)
		if out, err := runOut("mount", "-t", "tmpfs", "-o", "ro", "none", ro); err != nil {
			t.Skipf("cannot make a read-only tmpfs: %v %s", err, out)
		}
		defer runOut("umount", ro)
		badMount(t, nil, backingErr, "not writable", "--backing", ro, mnt)
	})

	t.Run("already mounted", func(t *testing.T) {
		m := newMount(t)
		badMount(t, nil, mountpointErr, "already mounted", "--backing", t.TempDir(), m.mnt)
		if !isMounted(m.mnt) {
			t.Fatal("the failed second mount unmounted the first")
		}
	})

	t.Run("backing in use", func(t *testing.T) {
		m := newMount(t)
		_, mnt2, _ := mountDirs(t)
		badMount(t, nil, backingErr, fmt.Sprintf("in use by the dyadfs daemon (pid %d) mounted at %s", m.pid, m.mnt), "--backing", m.backing, mnt2)
	})

	t.Run("no /dev/fuse", func(t *testing.T) {
		// In a private mount namespace, an empty /dev hides /dev/fuse.
		cmd := exec.Command("unshare", "-m", "--propagation", "private", "sh", "-c",
			`mount -t tmpfs none /dev && exec "$0" mount --backing "$1" "$2"`, dyadfsBin, backing, mnt)
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != noFuse || !strings.Contains(string(out), "/dev/fuse is missing") {
			t.Fatalf("without /dev/fuse: %v %q, want exit %d and a message about /dev/fuse", err, out, noFuse)
		}
	})
}

// TestMountArgumentsAfterDashDash: "--" before the mountpoint works, in the
// command and in the daemon it starts.
func TestMountArgumentsAfterDashDash(t *testing.T) {
	requireEnv(t)
	dir, mnt, backing := mountDirs(t)
	if out, err := dyadfs(t, "mount", "--backing", backing, "--log-file", filepath.Join(dir, "log"), "--", mnt); err != nil {
		t.Fatalf("dyadfs mount ... -- MNT: %v %s", err, out)
	}
	m := &mount{t: t, mnt: mnt, backing: backing, logFile: filepath.Join(dir, "log")}
	m.pid = m.status().PID
	t.Cleanup(m.cleanup)
	m.unmount()
}

// TestKeyCommand: dyadfs key prints DYAD's key of each path.
func TestKeyCommand(t *testing.T) {
	requireEnv(t)
	out, err := dyadfs(t, "key", "--key-depth", "3", "--key-bins", "1024", "a.txt", "run1/step7.dat")
	if err != nil {
		t.Fatalf("dyadfs key: %v %s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || lines[0] != "7f.70.5d.a.txt" || !strings.HasSuffix(lines[1], ".run1/step7.dat") {
		t.Fatalf("dyadfs key printed %q", out)
	}
	if _, err := dyadfs(t, "key", "../escape"); err == nil {
		t.Fatal("dyadfs key accepted a path leaving the managed directory")
	}
}

func TestOtherCommands(t *testing.T) {
	requireEnv(t)
	if out, err := dyadfs(t, "version"); err != nil || !strings.HasPrefix(out, "dyadfs ") {
		t.Fatalf("version: %v %q", err, out)
	}
	for _, args := range [][]string{{"help"}, {"help", "mount"}, {"help", "status"}, {"help", "wait"}, {"help", "prefetch"}, {"mount", "--help"}} {
		if out, err := dyadfs(t, args...); err != nil || !strings.Contains(out, "Usage") {
			t.Fatalf("%v: %v %q", args, err, out)
		}
	}
	cmd := exec.Command(dyadfsBin, "status", t.TempDir())
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 8 || !strings.Contains(string(out), "not a dyadfs mount") {
		t.Fatalf("status of a plain directory: %v %q", err, out)
	}
	for _, args := range [][]string{{"prefetch"}, {"prefetch", "--jobs", "0", "x"}, {"prefetch", "--timeout", "-1s", "x"}} {
		out, err := exec.Command(dyadfsBin, args...).CombinedOutput()
		if !errors.As(err, &ee) || ee.ExitCode() != 2 || strings.Count(string(out), "\n") != 1 {
			t.Fatalf("%v: %v %q, want exit 2 and one line", args, err, out)
		}
	}
	cmd = exec.Command(dyadfsBin, "frobnicate")
	if err := cmd.Run(); !errors.As(err, &ee) || ee.ExitCode() != 2 {
		t.Fatalf("unknown command: %v, want exit 2", err)
	}
}

// TestMountWithoutBacking: the design card's command as written: with no
// --backing, dyadfs stores the files in node-local scratch of its own,
// /var/tmp/dyadfs/NAMESPACE, made 0700, and the status names it;
// DYADFS_BACKING chooses another.
func TestMountWithoutBacking(t *testing.T) {
	requireEnv(t)
	ns := "nobacking-" + strconv.Itoa(os.Getpid())
	want := filepath.Join("/var/tmp/dyadfs", ns)
	t.Cleanup(func() { os.RemoveAll(want) })
	root := t.TempDir()
	mnt := filepath.Join(root, "mnt")
	os.Mkdir(mnt, 0o755)
	logFile := filepath.Join(root, "log")
	if out, err := dyadfs(t, "mount", "--namespace", ns, "--log-file", logFile, mnt); err != nil {
		t.Fatalf("dyadfs mount MOUNTPOINT: %v %s", err, out)
	}
	m := &mount{t: t, mnt: mnt, backing: want, logFile: logFile}
	m.pid = m.status().PID
	t.Cleanup(m.cleanup)
	if st := m.status(); st.Backing != want {
		t.Fatalf("status names backing %q, want %q", st.Backing, want)
	}
	if info, err := os.Stat(want); err != nil || info.Mode().Perm() != 0o700 {
		t.Fatalf("default backing directory: %v %v, want mode 0700", info, err)
	}
	mustSh(t, mnt, "echo hi > f")
	if b, err := os.ReadFile(filepath.Join(want, "f")); err != nil || string(b) != "hi\n" {
		t.Fatalf("the file in the default backing directory: %q %v", b, err)
	}
	if !strings.Contains(m.readLog(), "backing="+want) {
		t.Errorf("the log does not name the backing directory:\n%s", m.readLog())
	}
	m.unmount()

	// DYADFS_BACKING names the directory instead.
	root2, mnt2, backing2 := mountDirs(t)
	if out, err := dyadfsEnv(t, []string{"DYADFS_BACKING=" + backing2}, "mount", "--log-file", filepath.Join(root2, "log"), mnt2); err != nil {
		t.Fatalf("dyadfs mount with DYADFS_BACKING: %v %s", err, out)
	}
	m2 := &mount{t: t, mnt: mnt2, backing: backing2, logFile: filepath.Join(root2, "log")}
	m2.pid = m2.status().PID
	t.Cleanup(m2.cleanup)
	if st := m2.status(); st.Backing != backing2 {
		t.Fatalf("with DYADFS_BACKING: backing %q, want %q", st.Backing, backing2)
	}
}
