package dtl

import (
	"errors"
	"os"
	"sync"

	"github.com/dyadfs/dyadfs/internal/digest"
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

// WriteAt writes p at off.
func (s *Sink) WriteAt(p []byte, off int64) (int, error) {
	if s == nil || s.f == nil {
		return 0, errNoSink
	}
	n, err := s.f.WriteAt(p, off)
	s.mu.Lock()
	s.t.Wrote(p[:n], off)
	s.mu.Unlock()
	return n, err
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
