package dmd

import (
	"os"
	"strconv"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/dyadfs/dyadfs/hfl"
)

// Inode numbers across nodes. Every node shows a file under one inode
// number, whether the file is here or not, fetched once or again: git,
// rsync, tar and find compare them. A file born here (a new name made on
// this node) is numbered from this node and its backing inode
// (hfl.FileIno); its records carry the number (Record.Ino). A backing
// file that holds another node's file (a copy), or a version of it written
// here in place (an append, an edit, a truncating open), keeps that
// file's number: it is inherited, kept here by backing inode and on disk
// in an extended attribute, so that it survives a restart.

// inoXattr holds the inherited inode number of a backing file.
const inoXattr = "user.dyadfs.ino"

// identities maps backing files to the inode numbers they inherited.
type identities struct {
	mu sync.RWMutex
	m  map[FileID]uint64
}

func (ids *identities) get(id FileID) (uint64, bool) {
	ids.mu.RLock()
	defer ids.mu.RUnlock()
	ino, ok := ids.m[id]
	return ino, ok
}

func (ids *identities) set(id FileID, ino uint64) {
	ids.mu.Lock()
	defer ids.mu.Unlock()
	if ids.m == nil {
		ids.m = make(map[FileID]uint64)
	}
	ids.m[id] = ino
}

func (ids *identities) drop(id FileID) {
	ids.mu.Lock()
	defer ids.mu.Unlock()
	delete(ids.m, id)
}

// Ino returns the inode number the mount shows for backing file id, with
// other nodes (see above); on a node alone, 0: the backing filesystem's
// own number is shown.
func (d *DMD) Ino(id FileID) uint64 {
	if d.solo() {
		return 0
	}
	if ino, ok := d.ids.get(id); ok {
		return ino
	}
	return hfl.FileIno(d.cfg.Node, d.localIno(id))
}

// localIno is backing file id's number here: its inode number, with its
// device's mixed in when it is not the backing directory's (a filesystem
// mounted inside it).
func (d *DMD) localIno(id FileID) uint64 {
	swap := func(dev uint64) uint64 { return dev<<32 | dev>>32 }
	return swap(id.Dev) ^ swap(d.back.Dev()) ^ id.Ino
}

// inherit gives the backing file open as fd the inode number ino of the
// namespace's file it holds a version of (0: none known, it keeps its
// own).
func (d *DMD) inherit(fd int, ino uint64) {
	if d.solo() || ino == 0 {
		return
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return
	}
	id := IDOf(&st)
	if ino == hfl.FileIno(d.cfg.Node, d.localIno(id)) {
		return // its own already
	}
	d.ids.set(id, ino)
	if d.markers {
		if err := unix.Fsetxattr(fd, inoXattr, []byte(strconv.FormatUint(ino, 10)), 0); err != nil {
			d.log.Debug("cannot keep a file's inode number on disk", "err", err)
		}
	}
}

// inheritFile is inherit for a file open as f.
func (d *DMD) inheritFile(f *os.File, ino uint64) { d.inherit(int(f.Fd()), ino) }

// inheritAt is inherit for backing path rel (not followed if a link).
func (d *DMD) inheritAt(rel string, ino uint64) {
	if d.solo() || ino == 0 {
		return
	}
	fd, err := d.back.OpenFile(rel, unix.O_PATH|unix.O_NOFOLLOW, 0)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return
	}
	id := IDOf(&st)
	if ino == hfl.FileIno(d.cfg.Node, d.localIno(id)) {
		return
	}
	d.ids.set(id, ino)
	if d.markers && st.Mode&syscall.S_IFMT != syscall.S_IFLNK {
		// Not through the O_PATH descriptor: the kernel refuses it.
		if err := d.back.Setxattr(rel, inoXattr, []byte(strconv.FormatUint(ino, 10)), 0); err != nil {
			d.log.Debug("cannot keep a file's inode number on disk", "path", rel, "err", err)
		}
	}
}

// loadIno takes the inode number the backing file at rel inherited, kept
// on disk, at start.
func (d *DMD) loadIno(rel string) {
	if d.solo() || !d.markers {
		return
	}
	buf := make([]byte, 32)
	n, err := d.back.Getxattr(rel, inoXattr, buf)
	if err != nil {
		return
	}
	ino, err := strconv.ParseUint(string(buf[:n]), 10, 64)
	if err != nil || ino == 0 {
		return
	}
	var st syscall.Stat_t
	if d.back.Lstat(rel, &st) == nil {
		d.ids.set(IDOf(&st), ino)
	}
}

// gone forgets what backing file id inherited, once its last name went.
func (d *DMD) gone(id FileID) { d.ids.drop(id) }
