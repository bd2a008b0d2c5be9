// Package wire holds what the binary transports (dtl/tcp, dtl/ucx) do the
// same way on either side of their different wires: the counters they
// report, the checks an owner makes before it sends a file, how it finds
// a file's data and how it reports a file it cannot read. Only those
// packages import it.
package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/dyadfs/dyadfs/dtl"
)

// MaxPath is Linux's PATH_MAX: no longer path names a file.
const MaxPath = 4096

// Stats counts what a transport did. All counters only grow.
type Stats struct {
	Dials     int64 // connections (UCX: endpoints) a client opened and authenticated
	Reused    int64 // fetches and messages that went out on an open connection
	Retried   int64 // fetches and messages retried because an open connection had gone stale
	Accepts   int64 // connections a server accepted
	Served    int64 // files a server sent completely
	Refused   int64 // requests, messages and peers a server refused
	BytesSent int64 // data bytes a server sent
	BytesRecv int64 // data bytes a client received
	Messages  int64 // messages a client sent and had a reply to
	Answered  int64 // messages a server's handler answered
}

// Counters are a transport's live Stats, counted from many goroutines.
type Counters struct {
	Dials, Reused, Retried, Accepts, Served, Refused, BytesSent, BytesRecv atomic.Int64
	Messages, Answered                                                     atomic.Int64
}

// Load returns the counters' values now.
func (c *Counters) Load() Stats {
	return Stats{
		Dials: c.Dials.Load(), Reused: c.Reused.Load(), Retried: c.Retried.Load(),
		Accepts: c.Accepts.Load(), Served: c.Served.Load(), Refused: c.Refused.Load(),
		BytesSent: c.BytesSent.Load(), BytesRecv: c.BytesRecv.Load(),
		Messages: c.Messages.Load(), Answered: c.Answered.Load(),
	}
}

// CheckFetch refuses a fetch that no owner could answer, before anything
// goes out; name is the transport's, for the error.
func CheckFetch(name string, req dtl.Request, dst *dtl.Sink) error {
	if !dst.Valid() {
		return errors.New(name + " transport: nil destination file")
	}
	if len(req.Path) > MaxPath {
		return fmt.Errorf("%s transport: path of %d bytes is longer than any file name (%d): %w", name, len(req.Path), MaxPath, dtl.ErrNotFound)
	}
	return nil
}

// CheckPath refuses, before the Source sees it, any path that is not a
// clean relative path inside the managed directory. The Source confines
// paths itself; this is the second lock on the door.
func CheckPath(p string) error {
	switch {
	case p == "" || p == ".":
		return fmt.Errorf("empty path: %w", dtl.ErrOutside)
	case strings.IndexByte(p, 0) >= 0:
		return fmt.Errorf("path %q contains a NUL byte: %w", p, dtl.ErrOutside)
	case strings.HasPrefix(p, "/"):
		return fmt.Errorf("path %q is absolute: %w", p, dtl.ErrOutside)
	}
	for elem := range strings.SplitSeq(p, "/") {
		if elem == "" || elem == "." || elem == ".." {
			return fmt.Errorf("path %q is not clean: %w", p, dtl.ErrOutside)
		}
	}
	return nil
}

// InfoLen is the size of a file's description as AppendInfo writes it.
const InfoLen = 52

// AppendInfo appends fi's description, big endian: size, mode, uid, gid,
// mtime, generation, checksum.
func AppendInfo(b []byte, fi dtl.FileInfo) []byte {
	b = binary.BigEndian.AppendUint64(b, uint64(fi.Size))
	b = binary.BigEndian.AppendUint32(b, fi.Mode)
	b = binary.BigEndian.AppendUint32(b, fi.Uid)
	b = binary.BigEndian.AppendUint32(b, fi.Gid)
	b = binary.BigEndian.AppendUint64(b, uint64(fi.MtimeNs))
	b = binary.BigEndian.AppendUint64(b, fi.Generation)
	return append(b, fi.Checksum[:]...)
}

// CheckFile checks that what the Source opened is what it describes, and
// tells whether it is a regular file (read at offsets and scanned for
// holes). Anything else is read sequentially from where it stands, which
// only tests do.
func CheckFile(f *os.File, info dtl.FileInfo) (regular bool, err error) {
	if info.Size < 0 {
		return false, fmt.Errorf("source described a negative size %d", info.Size)
	}
	st, err := f.Stat()
	if err != nil {
		return false, err
	}
	if !st.Mode().IsRegular() {
		return false, nil
	}
	if st.Size() != info.Size {
		return false, fmt.Errorf("%s is %d bytes, its description says %d: it changed since it was published", f.Name(), st.Size(), info.Size)
	}
	return true, nil
}

// SourceError is a failure to read the file being sent (not to send it):
// the owner tells the consumer in place of the end, after Pad bytes that
// complete the chunk under way (where its wire needs them).
type SourceError struct {
	Err error
	Pad int64
}

func (e *SourceError) Error() string { return e.Err.Error() }
func (e *SourceError) Unwrap() error { return e.Err }

// Code is what the consumer is told: a file that ended early changed
// (busy: a new version will be published); one that could not be read is
// unreadable.
func (e *SourceError) Code() uint16 {
	if errors.Is(e.Err, io.ErrUnexpectedEOF) {
		return dtl.CodeBusy
	}
	return dtl.CodeUnreadable
}

// ReadFailed describes a failure to read f at off, with pad bytes of the
// chunk under way still to send.
func ReadFailed(f *os.File, off int64, err error, pad int64) *SourceError {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return &SourceError{Err: fmt.Errorf("%s ended at %d, before its described size: %w", f.Name(), off, io.ErrUnexpectedEOF), Pad: pad}
	}
	return &SourceError{Err: fmt.Errorf("%w: read %s at %d: %w", dtl.ErrUnreadable, f.Name(), off, err), Pad: pad}
}

// SeekFailed describes a failure to seek in f, with pad bytes of the chunk
// under way still to send.
func SeekFailed(f *os.File, err error, pad int64) *SourceError {
	return &SourceError{Err: fmt.Errorf("%w: seek %s: %w", dtl.ErrUnreadable, f.Name(), err), Pad: pad}
}

// DataExtents calls emit for each extent of data in f's first size bytes,
// in order, skipping holes (SEEK_DATA, SEEK_HOLE). Where the filesystem
// cannot tell, the whole file is one extent. A failed seek's error is what
// seekErr makes of it (each transport reports it its own way).
func DataExtents(f *os.File, size int64, emit func(off, n int64) error, seekErr func(error) error) error {
	return DataExtentsIn(f, 0, size, emit, seekErr)
}

// DataExtentsIn is DataExtents for the bytes [lo, hi) of f: a range of a
// file read in ranges.
func DataExtentsIn(f *os.File, lo, hi int64, emit func(off, n int64) error, seekErr func(error) error) error {
	off := lo
	for off < hi {
		data, err := f.Seek(off, unix.SEEK_DATA)
		switch {
		case errors.Is(err, unix.ENXIO):
			return nil // only a hole from off to the end
		case err != nil && off == lo:
			return emit(lo, hi-lo) // no SEEK_DATA here
		case err != nil:
			return seekErr(err)
		case data >= hi:
			return nil
		}
		hole, err := f.Seek(data, unix.SEEK_HOLE)
		if err != nil {
			return seekErr(err)
		}
		if hole <= data || hole > hi {
			hole = hi
		}
		if err := emit(data, hole-data); err != nil {
			return err
		}
		off = hole
	}
	return nil
}

// Sending holds the file an owner is sending, so that an abort from
// another goroutine can close it whatever its read is blocked in (a pipe).
type Sending struct {
	mu      sync.Mutex
	file    *os.File
	aborted bool
	err     error // why it was aborted
}

// Set records f as the file being sent. It reports false, having closed
// f, if the transfer is aborted.
func (s *Sending) Set(f *os.File) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.aborted {
		f.Close()
		return false
	}
	s.file = f
	return true
}

// Clear closes the file being sent, if any, and forgets it.
func (s *Sending) Clear() {
	s.mu.Lock()
	f := s.file
	s.file = nil
	s.mu.Unlock()
	if f != nil {
		f.Close()
	}
}

// Abort marks the transfer aborted for err, calls then (if not nil) and
// closes the file being sent: then comes first so that a read the close
// cuts short finds the transfer's context ended. It does nothing if the
// transfer was aborted already.
func (s *Sending) Abort(err error, then func()) {
	s.mu.Lock()
	if s.aborted {
		s.mu.Unlock()
		return
	}
	s.aborted, s.err = true, err
	f := s.file
	s.mu.Unlock()
	if then != nil {
		then()
	}
	if f != nil {
		f.Close()
	}
}

// Aborted reports whether the transfer was aborted, and why.
func (s *Sending) Aborted() (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.aborted, s.err
}
