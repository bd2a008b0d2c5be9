package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/dyadfs/dyadfs/fs/dmd"
)

// backingEnv names a backing directory when --backing is not given.
const backingEnv = "DYADFS_BACKING"

// defaultBacking is node-local scratch for namespace: /var/tmp/dyadfs/NS
// for root, /var/tmp/dyadfs-UID/NS for other users (a directory of root's
// is not theirs to create in).
func defaultBacking(namespace string) string {
	base := "/var/tmp/dyadfs"
	if uid := os.Getuid(); uid != 0 {
		base += "-" + strconv.Itoa(uid)
	}
	return filepath.Join(base, namespace)
}

// makeDefaultBacking creates the default backing directory, readable by
// its owner only (the files in it keep their own modes).
func makeDefaultBacking(dir string) error {
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	return nil
}

// networkFS names the filesystem under dir if it is one that other
// machines share, by statfs magic or, for those statfs cannot tell apart
// (FUSE ones, sshfs say), by the type its mount has, or "".
func networkFS(dir string) string {
	var st unix.Statfs_t
	if unix.Statfs(dir, &st) != nil {
		return ""
	}
	switch uint32(st.Type) {
	case unix.NFS_SUPER_MAGIC:
		return "NFS"
	case 0x0bd00bd0:
		return "Lustre"
	case 0x47504653:
		return "GPFS"
	case unix.CIFS_SUPER_MAGIC, unix.SMB2_SUPER_MAGIC, unix.SMB_SUPER_MAGIC:
		return "SMB/CIFS"
	case unix.CEPH_SUPER_MAGIC:
		return "CephFS"
	case 0x19830326:
		return "BeeGFS"
	case unix.AFS_SUPER_MAGIC, 0x6b414653:
		return "AFS"
	}
	return networkMountTypes[mountType(dir)]
}

// networkMountTypes are the mount types (as /proc/self/mountinfo shows
// them) of filesystems other machines share.
var networkMountTypes = map[string]string{
	"nfs": "NFS", "nfs4": "NFS", "lustre": "Lustre", "gpfs": "GPFS",
	"cifs": "SMB/CIFS", "smb3": "SMB/CIFS", "ceph": "CephFS", "beegfs": "BeeGFS",
	"afs": "AFS", "9p": "9P",
	"fuse.sshfs": "sshfs", "fuse.glusterfs": "GlusterFS", "fuse.ceph-fuse": "CephFS",
	"fuse.s3fs": "s3fs", "fuse.rclone": "rclone", "fuse.gcsfuse": "gcsfuse",
	"fuse.juicefs": "JuiceFS", "fuse.lustre": "Lustre",
}

// mountType is the type of the mount dir is on ("ext4", "fuse.sshfs"),
// found by its device number in /proc/self/mountinfo, or "".
func mountType(dir string) string {
	var st unix.Stat_t
	if unix.Stat(dir, &st) != nil {
		return ""
	}
	info, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return ""
	}
	dev := fmt.Sprintf("%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev))
	for _, line := range strings.Split(string(info), "\n") {
		// id parent major:minor root mountpoint options [optional...] - type source super-options
		f := strings.Fields(line)
		if len(f) < 3 || f[2] != dev {
			continue
		}
		for i, w := range f {
			if w == "-" && i+1 < len(f) {
				return f[i+1]
			}
		}
	}
	return ""
}

// backingLock is the lock a daemon holds on its backing directory: one
// daemon per node and backing directory (with shared storage, each node's
// daemon locks a file of its own there, since all of them use it).
//
// The lock's file is held open read-only: a file open for writing would keep
// the backing filesystem from being remounted read-only (an operator's way to
// stop writes to a failing disk).
type backingLock struct{ f *os.File }

func lockName(node string, shared bool) string {
	if shared {
		return "daemon-" + node + ".lock"
	}
	return "daemon.lock"
}

// lockBacking takes the lock, or says which daemon holds it.
func lockBacking(dir, node string, shared bool) (*backingLock, error) {
	internal := filepath.Join(dir, dmd.InternalDir)
	if err := os.MkdirAll(internal, 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(internal, lockName(node, shared)), os.O_RDONLY|os.O_CREATE|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		holder, _ := os.ReadFile(f.Name())
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			who := strings.TrimSpace(string(holder))
			if who == "" {
				who = "another dyadfs daemon"
			}
			return nil, fmt.Errorf("backing directory %s is in use by %s: pass another --backing", dir, who)
		}
		return nil, err
	}
	return &backingLock{f: f}, nil
}

// say records who holds the lock, for the next daemon's message.
func (l *backingLock) say(who string) {
	os.WriteFile(l.f.Name(), []byte(who+"\n"), 0o644)
}

func (l *backingLock) release() {
	if l != nil {
		l.f.Close()
	}
}
