package dtl

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/dyadfs/dyadfs/internal/digest"
	"github.com/dyadfs/dyadfs/internal/pagecache"
)

// Sink is where a transport puts a file it receives: a temporary file,
// and the checksum of the bytes written into it, computed as they arrive
// (see digest.Tracker), so that the copy is verified without reading it
// again. Transports write only through it, from any goroutines.
type Sink struct {
	f  *os.File
	mu sync.Mutex
	t  digest.Tracker
}

// NewSink returns a Sink writing into f, an empty file open for writing.
func NewSink(f *os.File) *Sink { return &Sink{f: f} }

// InOrder declares that the transport writes in increasing order of
// offset, and that the gaps between its writes are holes: they are hashed
// as zeros, and no block is read back.
func (s *Sink) InOrder() {
	s.mu.Lock()
	s.t.InOrder = true
	s.mu.Unlock()
}

// WriteAt writes p at off (in pieces the page cache takes fast, see
// pagecache).
func (s *Sink) WriteAt(p []byte, off int64) (int, error) {
	if s == nil || s.f == nil {
		return 0, errNoSink
	}
	n, err := pagecache.WriteAt(s.f, p, off)
	s.mu.Lock()
	s.t.Wrote(p[:n], off)
	s.mu.Unlock()
	return n, err
}

// CopyFrom copies n bytes from r into the file at off and returns how many
// it copied. With a socket as r the kernel moves them into the file
// without passing them through this process (splice); they are hashed
// once they landed, through a read-only mapping of the file's pages, so
// that they are not copied a second time either. It must not run
// concurrently with other writes.
func (s *Sink) CopyFrom(r io.Reader, off, n int64) (int64, error) {
	if s == nil || s.f == nil {
		return 0, errNoSink
	}
	if _, err := s.f.Seek(off, io.SeekStart); err != nil {
		return 0, err
	}
	w, err := io.CopyN(s.f, r, n)
	if w > 0 {
		if herr := s.hashLanded(off, w); herr != nil && err == nil {
			err = herr
		}
	}
	return w, err
}

// hashLanded hashes the n bytes at off, written into the file already.
func (s *Sink) hashLanded(off, n int64) error {
	start := off &^ int64(os.Getpagesize()-1)
	m, err := unix.Mmap(int(s.f.Fd()), start, int(off+n-start), unix.PROT_READ, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		// A filesystem that cannot map: read them back.
		p := make([]byte, n)
		if _, err := s.f.ReadAt(p, off); err != nil {
			return fmt.Errorf("read back what arrived: %w", err)
		}
		s.mu.Lock()
		s.t.Wrote(p, off)
		s.mu.Unlock()
		return nil
	}
	s.mu.Lock()
	s.t.Wrote(m[off-start:], off)
	s.mu.Unlock()
	return unix.Munmap(m)
}

// Truncate sets the file's size.
func (s *Sink) Truncate(size int64) error {
	if s == nil || s.f == nil {
		return errNoSink
	}
	return s.f.Truncate(size)
}

var errNoSink = errors.New("transport: nil destination")

// Valid reports whether the Sink has a file.
func (s *Sink) Valid() bool { return s != nil && s.f != nil }

// Sum returns the checksum of the file received, size bytes long.
func (s *Sink) Sum(size int64) (digest.Sum, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.t.Sum(s.f, size)
}

// Reread is how many bytes Sum read back (blocks written out of order).
func (s *Sink) Reread() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.t.Reread
}
