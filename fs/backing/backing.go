// Package backing is the node-local backing directory of a managed
// directory, addressed beneath one open descriptor: every operation
// resolves the path of its parent directory with openat2(RESOLVE_BENEATH,
// RESOLVE_NO_SYMLINKS) and acts on the last name relative to that
// directory. So the limits on path length are the mount's (a path below
// the mount is never joined to the backing directory's own path), and no
// symbolic link, or directory swapped for one, in the backing directory
// can make an operation act outside it. The parents last used stay open
// (see dirCache) until a directory is renamed or removed.
//
// Paths are clean, slash-separated and relative to the backing directory
// ("" for the directory itself); callers (fs, fs/dmd) check that before.
package backing

import (
	"fmt"
	"path"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Dir is a backing directory.
type Dir struct {
	fd   int    // O_PATH descriptor of the directory
	path string // its absolute path, for messages and for the kernel's use
	dev  uint64 // its device
	dirs dirCache
}

// Open opens the backing directory at the absolute path p.
func Open(p string) (*Dir, error) {
	fd, err := unix.Open(p, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open backing directory %s: %w", p, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("stat backing directory %s: %w", p, err)
	}
	return &Dir{fd: fd, path: p, dev: st.Dev}, nil
}

// Close releases the directory's descriptor.
func (d *Dir) Close() error {
	d.dirs.closeAll()
	return unix.Close(d.fd)
}

// Fd is the directory's O_PATH descriptor; it stays open until Close.
func (d *Dir) Fd() int { return d.fd }

// Path is the directory's absolute path.
func (d *Dir) Path() string { return d.path }

// Dev is the device of the backing directory.
func (d *Dir) Dev() uint64 { return d.dev }

// Join is rel's absolute path, for messages (never for system calls: it
// may be longer than a path can be).
func (d *Dir) Join(rel string) string { return path.Join(d.path, rel) }

// maxResolve bounds the path handed to one openat2: Linux refuses longer
// ones (PATH_MAX with its NUL). A longer directory path is resolved a
// piece at a time.
const maxResolve = unix.PathMax - 1

// beneath is how every directory on the way is resolved.
var beneath = unix.OpenHow{
	Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
	Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
}

// OpenDirPath opens directory rel (O_PATH) beneath the backing directory;
// the caller closes it. A symbolic link or a ".." on the way fails it
// (ELOOP, EXDEV).
func (d *Dir) OpenDirPath(rel string) (int, error) {
	if rel == "" {
		return unix.Openat2(d.fd, ".", &beneath)
	}
	at, opened := d.fd, false
	for rel != "" {
		piece := rel
		if len(piece) > maxResolve {
			// Cut at the last slash that keeps the piece short
			// enough; a single name is never longer than 255.
			cut := strings.LastIndexByte(piece[:maxResolve], '/')
			if cut <= 0 {
				return -1, unix.ENAMETOOLONG
			}
			piece = piece[:cut]
		}
		fd, err := unix.Openat2(at, piece, &beneath)
		if opened {
			unix.Close(at)
		}
		if err != nil {
			return -1, err
		}
		at, opened = fd, true
		rel = strings.TrimPrefix(rel[len(piece):], "/")
	}
	return at, nil
}

// Parent opens the directory that holds rel (O_PATH) and returns it with
// rel's last name; the caller closes it. rel must not be "".
func (d *Dir) Parent(rel string) (int, string, error) {
	if rel == "" {
		return -1, "", fmt.Errorf("the backing directory has no parent here: %w", unix.EINVAL)
	}
	dir, name := path.Split(rel)
	fd, err := d.OpenDirPath(strings.TrimSuffix(dir, "/"))
	return fd, name, err
}

// at runs op on rel's parent directory and last name.
func (d *Dir) at(rel string, op func(dirfd int, name string) error) error {
	if rel == "" {
		return fmt.Errorf("the backing directory has no parent here: %w", unix.EINVAL)
	}
	dir, name := path.Split(rel)
	dirfd, release, err := d.parent(strings.TrimSuffix(dir, "/"))
	if err != nil {
		return err
	}
	defer release()
	return op(dirfd, name)
}

// Lstat stats rel without following a symbolic link at its end.
func (d *Dir) Lstat(rel string, st *syscall.Stat_t) error {
	if rel == "" {
		return syscall.Fstat(d.fd, st)
	}
	return d.at(rel, func(dirfd int, name string) error {
		return fstatat(dirfd, name, st, unix.AT_SYMLINK_NOFOLLOW)
	})
}

// Exists reports whether something is at rel.
func (d *Dir) Exists(rel string) bool {
	var st syscall.Stat_t
	return d.Lstat(rel, &st) == nil
}

func fstatat(dirfd int, name string, st *syscall.Stat_t, flags int) error {
	var ust unix.Stat_t
	if err := unix.Fstatat(dirfd, name, &ust, flags); err != nil {
		return err
	}
	*st = toSyscall(&ust)
	return nil
}

// toSyscall converts the two packages' identical stat structures.
func toSyscall(u *unix.Stat_t) syscall.Stat_t {
	return syscall.Stat_t{
		Dev: u.Dev, Ino: u.Ino, Nlink: u.Nlink, Mode: u.Mode, Uid: u.Uid, Gid: u.Gid,
		Rdev: u.Rdev, Size: u.Size, Blksize: u.Blksize, Blocks: u.Blocks,
		Atim: syscall.Timespec(u.Atim), Mtim: syscall.Timespec(u.Mtim), Ctim: syscall.Timespec(u.Ctim),
	}
}

// OpenFile opens rel with flags and, when it creates it, mode (the
// caller's umask already applied: the daemon's own is 0). A symbolic link
// at rel's end is not followed: ELOOP, or with O_PATH the link itself.
func (d *Dir) OpenFile(rel string, flags int, mode uint32) (int, error) {
	if rel == "" {
		return unix.Openat(d.fd, ".", flags|unix.O_CLOEXEC, 0)
	}
	var fd int
	err := d.at(rel, func(dirfd int, name string) (err error) {
		fd, err = Openat(dirfd, name, flags|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode)
		return err
	})
	return fd, err
}

// Openat is openat(2), except that a write-only open is made read-write:
// the daemon reads what a writer wrote (its checksum, a small file's bytes
// for its notices) through the writer's own descriptor instead of opening
// the file again. The kernel still refuses reads through the caller's
// write-only descriptor. A file the daemon may not read is opened as
// asked.
func Openat(dirfd int, name string, flags int, mode uint32) (int, error) {
	if flags&unix.O_ACCMODE == unix.O_WRONLY {
		fd, err := unix.Openat(dirfd, name, flags&^unix.O_ACCMODE|unix.O_RDWR, mode)
		if err != unix.EACCES && err != unix.EPERM {
			return fd, err
		}
	}
	return unix.Openat(dirfd, name, flags, mode)
}

// Mkdir makes directory rel with mode.
func (d *Dir) Mkdir(rel string, mode uint32) error {
	return d.at(rel, func(dirfd int, name string) error { return unix.Mkdirat(dirfd, name, mode) })
}

// Mknod makes the node rel.
func (d *Dir) Mknod(rel string, mode uint32, dev int) error {
	return d.at(rel, func(dirfd int, name string) error { return unix.Mknodat(dirfd, name, mode, dev) })
}

// Symlink makes rel a symbolic link to target.
func (d *Dir) Symlink(target, rel string) error {
	return d.at(rel, func(dirfd int, name string) error { return unix.Symlinkat(target, dirfd, name) })
}

// Readlink returns the target of the symbolic link rel.
func (d *Dir) Readlink(rel string) (string, error) {
	var target string
	err := d.at(rel, func(dirfd int, name string) error {
		for size := 256; ; size *= 2 {
			buf := make([]byte, size)
			n, err := unix.Readlinkat(dirfd, name, buf)
			if err != nil {
				return err
			}
			if n < size {
				target = string(buf[:n])
				return nil
			}
		}
	})
	return target, err
}

// Link gives the file at oldRel the name newRel too.
func (d *Dir) Link(oldRel, newRel string) error {
	return d.at(oldRel, func(olddir int, oldName string) error {
		return d.at(newRel, func(newdir int, newName string) error {
			return unix.Linkat(olddir, oldName, newdir, newName, 0)
		})
	})
}

// Unlink removes the name rel of a file.
func (d *Dir) Unlink(rel string) error {
	return d.at(rel, func(dirfd int, name string) error { return unix.Unlinkat(dirfd, name, 0) })
}

// Rmdir removes the empty directory rel.
func (d *Dir) Rmdir(rel string) error {
	defer d.DirsChange()()
	return d.at(rel, func(dirfd int, name string) error { return unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR) })
}

// Rename moves oldRel to newRel, with renameat2's flags.
func (d *Dir) Rename(oldRel, newRel string, flags uint) error {
	defer d.DirsChange()()
	return d.at(oldRel, func(olddir int, oldName string) error {
		return d.at(newRel, func(newdir int, newName string) error {
			return unix.Renameat2(olddir, oldName, newdir, newName, flags)
		})
	})
}

// Lchown sets rel's owner and group (-1: unchanged), without following a
// symbolic link at its end.
func (d *Dir) Lchown(rel string, uid, gid int) error {
	if rel == "" {
		return unix.Fchownat(d.fd, "", uid, gid, unix.AT_EMPTY_PATH)
	}
	return d.at(rel, func(dirfd int, name string) error {
		return unix.Fchownat(dirfd, name, uid, gid, unix.AT_SYMLINK_NOFOLLOW)
	})
}

// Utimes sets rel's access and modification times (UTIME_OMIT leaves
// one), without following a symbolic link at its end.
func (d *Dir) Utimes(rel string, ts []unix.Timespec) error {
	if rel == "" {
		return d.withPath(rel, func(p string) error { return unix.UtimesNano(p, ts) })
	}
	return d.at(rel, func(dirfd int, name string) error {
		return unix.UtimesNanoAt(dirfd, name, ts, unix.AT_SYMLINK_NOFOLLOW)
	})
}

// withPath runs op on the name /proc/self/fd/N of rel opened O_PATH
// without following a link at its end: what only takes a path name
// (chmod, truncate, xattrs) reaches the very file so, and nothing else.
func (d *Dir) withPath(rel string, op func(p string) error) error {
	fd, err := d.OpenFile(rel, unix.O_PATH, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return op(fmt.Sprintf("/proc/self/fd/%d", fd))
}

// Chmod sets rel's mode. A symbolic link's mode cannot be set (Linux has
// none): EOPNOTSUPP.
func (d *Dir) Chmod(rel string, mode uint32) error {
	fd, err := d.OpenFile(rel, unix.O_PATH, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		return unix.EOPNOTSUPP
	}
	return unix.Chmod(fmt.Sprintf("/proc/self/fd/%d", fd), mode)
}

// Truncate sets the size of the regular file rel.
func (d *Dir) Truncate(rel string, size int64) error {
	return d.withPath(rel, func(p string) error { return unix.Truncate(p, size) })
}

// Getxattr reads rel's extended attribute attr into dest.
func (d *Dir) Getxattr(rel, attr string, dest []byte) (int, error) {
	var n int
	err := d.withPath(rel, func(p string) (err error) {
		n, err = unix.Getxattr(p, attr, dest)
		return err
	})
	return n, err
}

// Setxattr sets rel's extended attribute attr.
func (d *Dir) Setxattr(rel, attr string, data []byte, flags int) error {
	return d.withPath(rel, func(p string) error { return unix.Setxattr(p, attr, data, flags) })
}

// Removexattr removes rel's extended attribute attr.
func (d *Dir) Removexattr(rel, attr string) error {
	return d.withPath(rel, func(p string) error { return unix.Removexattr(p, attr) })
}

// Listxattr lists rel's extended attributes into dest.
func (d *Dir) Listxattr(rel string, dest []byte) (int, error) {
	var n int
	err := d.withPath(rel, func(p string) (err error) {
		n, err = unix.Listxattr(p, dest)
		return err
	})
	return n, err
}

// Statfs describes the filesystem of the backing directory.
func (d *Dir) Statfs(st *unix.Statfs_t) error { return unix.Fstatfs(d.fd, st) }

// LstatGen is Lstat, with a generation number for the inode: its birth
// time, which tells a new file from an old one that had the same inode
// number (1 where the filesystem does not say).
func (d *Dir) LstatGen(rel string, st *syscall.Stat_t) (uint64, error) {
	var x unix.Statx_t
	var err error
	if rel == "" {
		err = unix.Statx(d.fd, "", unix.AT_EMPTY_PATH, unix.STATX_BASIC_STATS|unix.STATX_BTIME, &x)
	} else {
		err = d.at(rel, func(dirfd int, name string) error {
			return unix.Statx(dirfd, name, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_BASIC_STATS|unix.STATX_BTIME, &x)
		})
	}
	if err != nil {
		return 0, err
	}
	*st = fromStatx(&x)
	return genOf(&x), nil
}

// FstatGen is LstatGen for an open descriptor.
func FstatGen(fd int, st *syscall.Stat_t) (uint64, error) {
	var x unix.Statx_t
	if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH, unix.STATX_BASIC_STATS|unix.STATX_BTIME, &x); err != nil {
		return 0, err
	}
	*st = fromStatx(&x)
	return genOf(&x), nil
}

func genOf(x *unix.Statx_t) uint64 {
	if x.Mask&unix.STATX_BTIME == 0 || (x.Btime.Sec == 0 && x.Btime.Nsec == 0) {
		return 1
	}
	return uint64(x.Btime.Sec)*1e9 + uint64(x.Btime.Nsec)
}

func fromStatx(x *unix.Statx_t) syscall.Stat_t {
	return syscall.Stat_t{
		Dev:     unix.Mkdev(x.Dev_major, x.Dev_minor),
		Ino:     x.Ino,
		Nlink:   uint64(x.Nlink),
		Mode:    uint32(x.Mode),
		Uid:     x.Uid,
		Gid:     x.Gid,
		Rdev:    unix.Mkdev(x.Rdev_major, x.Rdev_minor),
		Size:    int64(x.Size),
		Blksize: int64(x.Blksize),
		Blocks:  int64(x.Blocks),
		Atim:    syscall.Timespec{Sec: x.Atime.Sec, Nsec: int64(x.Atime.Nsec)},
		Mtim:    syscall.Timespec{Sec: x.Mtime.Sec, Nsec: int64(x.Mtime.Nsec)},
		Ctim:    syscall.Timespec{Sec: x.Ctime.Sec, Nsec: int64(x.Ctime.Nsec)},
	}
}

// ReadDir lists directory rel: its entries' names and types (DT_*), in
// the order the filesystem gives them, "." and ".." left out.
func (d *Dir) ReadDir(rel string) ([]DirEntry, error) {
	fd, err := d.OpenFile(rel, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	var out []DirEntry
	buf := make([]byte, 32<<10)
	for {
		n, err := unix.Getdents(fd, buf)
		if err != nil {
			return nil, err
		}
		if n == 0 {
			return out, nil
		}
		for off := 0; off < n; {
			// struct linux_dirent64: ino u64, off s64, reclen u16, type u8, name.
			reclen := int(buf[off+16]) | int(buf[off+17])<<8
			typ := buf[off+18]
			name := buf[off+19 : off+reclen]
			if i := indexByte(name, 0); i >= 0 {
				name = name[:i]
			}
			if s := string(name); s != "." && s != ".." {
				if typ == unix.DT_UNKNOWN {
					// The filesystem does not say: ask the inode.
					var st unix.Stat_t
					if unix.Fstatat(fd, s, &st, unix.AT_SYMLINK_NOFOLLOW) == nil {
						typ = uint8(st.Mode & unix.S_IFMT >> 12)
					}
				}
				out = append(out, DirEntry{Name: s, Type: typ})
			}
			off += reclen
		}
	}
}

func indexByte(b []byte, c byte) int {
	for i, x := range b {
		if x == c {
			return i
		}
	}
	return -1
}

// DirEntry is an entry of a directory: its name and type (unix.DT_*).
type DirEntry struct {
	Name string
	Type uint8
}

// IsDir reports whether the entry is a directory.
func (e DirEntry) IsDir() bool { return e.Type == unix.DT_DIR }

// Walk calls fn for every entry below directory rel (not rel itself), a
// directory before what it holds, with the entry's path relative to the
// backing directory. An error from fn ends the walk; SkipDir from fn on a
// directory skips what it holds. A directory that cannot be read is
// passed over, and the walk returns the first such error at its end.
func (d *Dir) Walk(rel string, fn func(rel string, e DirEntry) error) error {
	var unread error
	err := d.walk(rel, fn, &unread)
	if err != nil {
		return err
	}
	return unread
}

func (d *Dir) walk(rel string, fn func(rel string, e DirEntry) error, unread *error) error {
	entries, err := d.ReadDir(rel)
	if err != nil {
		if *unread == nil {
			*unread = fmt.Errorf("read directory %s: %w", d.Join(rel), err)
		}
		return nil
	}
	for _, e := range entries {
		p := path.Join(rel, e.Name)
		if err := fn(p, e); err != nil {
			if err == SkipDir {
				continue
			}
			return err
		}
		if e.IsDir() {
			if err := d.walk(p, fn, unread); err != nil {
				return err
			}
		}
	}
	return nil
}

// SkipDir, returned by Walk's fn for a directory, skips what it holds.
var SkipDir = fmt.Errorf("skip this directory")
