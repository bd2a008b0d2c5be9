package test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	fusefs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// TestNetworkBackingWarns: a backing directory on a filesystem other
// machines share gets a warning on the terminal and in the log, unless
// --shared-storage says every node mounts it. This kernel mounts no NFS
// or Lustre (those are told by statfs magic), so the shared filesystem
// here is a FUSE one that says it is sshfs (its mount type, fuse.sshfs, is
// how dyadfs tells FUSE network filesystems apart).
func TestNetworkBackingWarns(t *testing.T) {
	requireEnv(t)
	root := t.TempDir()
	real, share := filepath.Join(root, "real"), filepath.Join(root, "share")
	for _, d := range []string{real, share} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	lb, err := fusefs.NewLoopbackRoot(real)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := fusefs.Mount(share, lb, &fusefs.Options{MountOptions: fuse.MountOptions{Name: "sshfs", FsName: "user@fileserver:/scratch"}})
	if err != nil {
		t.Skipf("cannot mount a FUSE filesystem to share: %v", err)
	}
	t.Cleanup(func() { srv.Unmount() })
	backing := filepath.Join(share, "backing")
	os.Mkdir(backing, 0o755)

	for _, c := range []struct {
		name   string
		flags  []string
		warned bool
	}{
		{"node-local", nil, true},
		{"shared storage", []string{"--shared-storage"}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			mnt := filepath.Join(root, "mnt-"+strings.ReplaceAll(c.name, " ", "-"))
			os.Mkdir(mnt, 0o755)
			logFile := filepath.Join(root, c.name+".log")
			args := append([]string{"mount", "--backing", backing, "--log-file", logFile}, c.flags...)
			out, err := dyadfs(t, append(args, mnt)...)
			if err != nil {
				t.Fatalf("dyadfs mount: %v\n%s", err, out)
			}
			m := &mount{t: t, mnt: mnt, backing: backing, logFile: logFile}
			m.pid = m.status().PID
			defer m.cleanup()
			defer m.unmount()
			warned := strings.Contains(out, "warning: backing directory "+backing+" is on sshfs, which other machines share: pass --shared-storage")
			if warned != c.warned {
				t.Fatalf("dyadfs mount said, warned %v, want %v:\n%s", warned, c.warned, out)
			}
			logged := strings.Contains(readFile(logFile), "filesystem=sshfs")
			if logged != c.warned {
				t.Fatalf("the log warns %v, want %v:\n%s", logged, c.warned, readFile(logFile))
			}
			// The shell changes into the mount itself: a child whose
			// working directory is set before exec does the chdir
			// while this process, which serves the backing's
			// filesystem, is frozen in its fork (the forking thread
			// keeps its P and a stop of the world waits for it); the
			// daemon, asking that filesystem, would never be answered.
			mustSh(t, "", "cd '"+mnt+"' && echo hi > f && cat f >/dev/null")
		})
	}
}

func readFile(name string) string {
	b, _ := os.ReadFile(name)
	return string(b)
}
