package dmd

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// A file being written is marked in .dyadfs/writing-NODE, a file of
// slots, each an inode number: a slot is taken when the file's first
// writer opens it and freed when its last writer finishes it, one pwrite
// each. A mark left when the daemon starts names a file that was being
// written when the previous daemon died: it is not published, and readers
// wait until it is written again.
//
// The mark is beside the file, not on it. It used to be an extended
// attribute (markerXattr), but setting or removing one changes the file's
// ctime, and the last writer's release comes after its close() returned:
// a program that stat'ed the file after close saw its ctime move later
// (pjdfstest's truncate/00.t did). Files do not need user attributes for
// it either. (A shared mapping of the slots would save the system calls,
// but a store into it kills the daemon with SIGBUS when the backing
// filesystem is full.)
type writingMarks struct {
	mu   sync.Mutex
	path string
	// fd is open while slots are taken, and for marksIdle after: a
	// read-only remount of the backing filesystem is refused while a
	// file on it is open for writing.
	fd     int
	taken  int
	idle   *time.Timer
	closed bool
	free   []int // freed slots, taken first, lowest last
	next   int   // the lowest slot never taken
	warned bool  // said once that a mark could not be written
}

// markSlots bounds the files marked at once: as many as a process can
// hold open by default (nr_open).
const markSlots = 1 << 20

// marksIdle is how long the marks stay open once none is taken.
const marksIdle = time.Second

// openWritingMarks returns this node's marks, kept in dir.
func openWritingMarks(dir, node string) *writingMarks {
	return &writingMarks{path: filepath.Join(dir, "writing-"+node), fd: -1, next: 1}
}

func (m *writingMarks) openLocked() error {
	if m.fd >= 0 {
		return nil
	}
	fd, err := unix.Open(m.path, unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	m.fd = fd
	return nil
}

// set writes ino into slot.
func (m *writingMarks) set(slot int, ino uint64) error {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], ino)
	_, err := unix.Pwrite(m.fd, b[:], int64(slot)*8)
	return err
}

// take marks inode ino, and returns its slot (0: not marked).
func (m *writingMarks) take(ino uint64) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return 0, nil
	}
	if err := m.openLocked(); err != nil {
		return 0, err
	}
	var slot int
	switch {
	case len(m.free) > 0:
		slot = m.free[len(m.free)-1]
		m.free = m.free[:len(m.free)-1]
	case m.next <= markSlots:
		slot = m.next
		m.next++
	default:
		return 0, fmt.Errorf("more than %d files written at once", markSlots)
	}
	if err := m.set(slot, ino); err != nil {
		m.free = append(m.free, slot)
		return 0, err
	}
	m.taken++
	return slot, nil
}

// drop frees slot.
func (m *writingMarks) drop(slot int) error {
	if slot <= 0 {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed || m.fd < 0 {
		return nil
	}
	m.free = append(m.free, slot)
	err := m.set(slot, 0)
	if m.taken--; m.taken == 0 {
		if m.idle == nil {
			m.idle = time.AfterFunc(marksIdle, m.closeIdle)
		} else {
			m.idle.Reset(marksIdle)
		}
	}
	return err
}

func (m *writingMarks) closeIdle() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.taken == 0 && m.fd >= 0 {
		unix.Close(m.fd)
		m.fd = -1
	}
}

// left returns the slots marked when the daemon starts, by inode number,
// and keeps them from being taken until keep settles them.
func (m *writingMarks) left() map[uint64][]int {
	out := make(map[uint64][]int)
	b, err := os.ReadFile(m.path)
	if err != nil {
		return out
	}
	for slot := 1; slot <= markSlots && slot*8+8 <= len(b); slot++ {
		if ino := binary.LittleEndian.Uint64(b[slot*8:]); ino != 0 {
			out[ino] = append(out[ino], slot)
			m.next = max(m.next, slot+1)
		}
	}
	return out
}

// keep settles the marks found at start: the slots in held stay taken,
// every other one is freed, and the file shrinks to the slots taken.
func (m *writingMarks) keep(held map[int]bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	top := 0
	for slot := range held {
		top = max(top, slot)
	}
	m.free, m.next, m.taken = m.free[:0], top+1, len(held)
	if m.closed || m.openLocked() != nil {
		return
	}
	for slot := top - 1; slot >= 1; slot-- {
		if !held[slot] {
			m.free = append(m.free, slot)
			m.set(slot, 0)
		}
	}
	unix.Ftruncate(m.fd, int64(top+1)*8) // the slots past top, cleared
	if m.taken == 0 {
		unix.Close(m.fd)
		m.fd = -1
	}
}

func (m *writingMarks) close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	if m.idle != nil {
		m.idle.Stop()
	}
	if m.fd >= 0 {
		unix.Close(m.fd)
		m.fd = -1
	}
}

// markWritingLocked marks file id as being written by ws. d.mu must be
// held (it orders marks with the writers' states).
func (d *DMD) markWritingLocked(id FileID, ws *writeState) {
	if ws.mark != 0 {
		return
	}
	var err error
	if ws.mark, err = d.marks.take(id.Ino); err != nil && !d.marks.warned {
		d.marks.warned = true
		d.log.Warn("cannot mark a file as being written: if dyadfs dies while it is, it may be published half-written", "err", err)
	}
}

// unmarkWritingLocked frees ws's mark. d.mu must be held.
func (d *DMD) unmarkWritingLocked(ws *writeState) {
	if err := d.marks.drop(ws.mark); err != nil {
		d.log.Warn("cannot clear a being-written mark", "err", err)
	}
	ws.mark = 0
}
