package dmd

import (
	"os"
	"strconv"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/dyadfs/dyadfs/fs/backing"
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
	m  map[FileID]inherited
}

// inherited is a backing file's inherited number, with the file's birth
// (a file that took a freed inode number is another file).
type inherited struct{ ino, birth uint64 }

func (ids *identities) get(id FileID, birth uint64) (uint64, bool) {
	ids.mu.RLock()
	defer ids.mu.RUnlock()
	in, ok := ids.m[id]
	return in.ino, ok && in.birth == birth
}

func (ids *identities) set(id FileID, in inherited) {
	ids.mu.Lock()
	defer ids.mu.Unlock()
	if ids.m == nil {
		ids.m = make(map[FileID]inherited)
	}
	ids.m[id] = in
}

func (ids *identities) drop(id FileID) {
	ids.mu.Lock()
	defer ids.mu.Unlock()
	delete(ids.m, id)
}

// Ino returns the inode number the mount shows for backing file id, born
// at birth (see backing.LstatGen), with other nodes (see above); on a node
// alone, 0: the backing filesystem's own number is shown.
func (d *DMD) Ino(id FileID, birth uint64) uint64 {
	if d.solo() {
		return 0
	}
	if ino, ok := d.ids.get(id, birth); ok {
		return ino
	}
	return d.bornIno(id, birth)
}

// bornIno is the number of backing file id, born here at birth.
func (d *DMD) bornIno(id FileID, birth uint64) uint64 {
	swap := func(dev uint64) uint64 { return dev<<32 | dev>>32 }
	// The device is mixed in when it is not the backing directory's (a
	// filesystem mounted inside it).
	return hfl.FileIno(d.cfg.Node, swap(id.Dev)^swap(d.back.Dev())^id.Ino, birth)
}

// inoOf is Ino for a backing file whose stat is st.
func (d *DMD) inoOf(rel string, fd int, st *syscall.Stat_t) uint64 {
	if d.solo() {
		return 0
	}
	var birth uint64
	var err error
	var again syscall.Stat_t
	if fd >= 0 {
		birth, err = backing.FstatGen(fd, &again)
	} else {
		birth, err = d.back.LstatGen(rel, &again)
	}
	if err != nil || IDOf(&again) != IDOf(st) {
		return 0
	}
	return d.Ino(IDOf(st), birth)
}

// inherit gives the backing file open as fd the inode number ino of the
// namespace's file it holds a version of (0: none known, it keeps its
// own).
func (d *DMD) inherit(fd int, ino uint64) {
	if d.solo() || ino == 0 {
		return
	}
	var st syscall.Stat_t
	birth, err := backing.FstatGen(fd, &st)
	if err != nil {
		return
	}
	d.keepIno(IDOf(&st), birth, ino, func(v []byte) error { return unix.Fsetxattr(fd, inoXattr, v, 0) })
}

// keepIno records that backing file id, born at birth, inherited ino,
// and keeps it on disk through setx.
func (d *DMD) keepIno(id FileID, birth, ino uint64, setx func([]byte) error) {
	if ino == d.bornIno(id, birth) {
		return // its own already
	}
	d.ids.set(id, inherited{ino: ino, birth: birth})
	if !d.markers || setx == nil {
		return
	}
	if err := setx([]byte(strconv.FormatUint(ino, 10))); err != nil {
		d.log.Debug("cannot keep a file's inode number on disk", "err", err)
	}
}

// inheritFile is inherit for a file open as f.
func (d *DMD) inheritFile(f *os.File, ino uint64) { d.inherit(int(f.Fd()), ino) }

// inheritAt is inherit for backing path rel, not followed if it is a
// symbolic link (which keeps it only while the daemon runs: links take no
// user attributes).
func (d *DMD) inheritAt(rel string, ino uint64) {
	if d.solo() || ino == 0 {
		return
	}
	var st syscall.Stat_t
	birth, err := d.back.LstatGen(rel, &st)
	if err != nil {
		return
	}
	var setx func([]byte) error
	if st.Mode&syscall.S_IFMT != syscall.S_IFLNK {
		setx = func(v []byte) error { return d.back.Setxattr(rel, inoXattr, v, 0) }
	}
	d.keepIno(IDOf(&st), birth, ino, setx)
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
	if birth, err := d.back.LstatGen(rel, &st); err == nil {
		d.ids.set(IDOf(&st), inherited{ino: ino, birth: birth})
	}
}

// gone forgets what backing file id inherited, once its last name went.
func (d *DMD) gone(id FileID) { d.ids.drop(id) }

// Gone is gone for a directory removed through the mount.
func (d *DMD) Gone(id FileID) { d.gone(id) }
