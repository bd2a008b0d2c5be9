package dtltest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dyadfs/dyadfs/dtl"
	"github.com/dyadfs/dyadfs/internal/digest"
)

// State is what a Source says about a path, whatever the directory holds.
type State int

const (
	// Published: served if the directory holds a regular file there
	// (the default).
	Published State = iota
	// NotPublished: refused with dtl.ErrNotPublished.
	NotPublished
	// Busy: refused with dtl.ErrBusy.
	Busy
	// Outside: refused with dtl.ErrOutside.
	Outside
	// Rewritten: opened and sent, but Unchanged then says a writer
	// changed it meanwhile (dtl.ErrBusy).
	Rewritten
	// Unreadable: refused with dtl.ErrUnreadable (permission denied), as
	// a file the owner cannot open.
	Unreadable
)

// Source is a dtl.Source backed by a directory, for tests: every regular
// file under the directory is published, with generation 1, unless Set or
// SetGeneration say otherwise. Paths are resolved beneath the directory
// (a symbolic link that leads out of it is refused with dtl.ErrOutside).
// Stream makes a path serve whatever the test writes into a pipe, so that
// a test can hold a transfer in the middle for as long as it likes.
type Source struct {
	root  string
	calls atomic.Int64

	mu      sync.Mutex
	states  map[string]State
	gens    map[string]uint64
	streams map[string]*stream
	fails   map[string]int64
	sums    map[string]digest.Sum
}

var _ dtl.Source = (*Source)(nil)

type stream struct {
	size    int64
	writers chan *os.File
}

// NewSource returns a Source serving the files under root.
func NewSource(root string) *Source {
	return &Source{
		root:    root,
		states:  make(map[string]State),
		gens:    make(map[string]uint64),
		streams: make(map[string]*stream),
		fails:   make(map[string]int64),
		sums:    make(map[string]digest.Sum),
	}
}

// Publish describes p with the checksum of what its file holds now, as
// a producer records at publish: changing the file afterwards makes the
// Source send bytes that do not match it. Without Publish a file is
// described with the checksum of what it holds when it is opened.
func (s *Source) Publish(p string) error {
	f, err := os.Open(filepath.Join(s.root, filepath.FromSlash(p)))
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	sum, err := digest.File(f, st.Size())
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sums[p] = sum
	return nil
}

// checksum is what p is described with, its file open as f.
func (s *Source) checksum(p string, f *os.File, size int64) (digest.Sum, error) {
	s.mu.Lock()
	sum, ok := s.sums[p]
	s.mu.Unlock()
	if ok {
		return sum, nil
	}
	return digest.File(f, size)
}

// ReadFails makes p a file described as size bytes whose reads fail (with
// EISDIR: it is a directory), as a file on a failing disk does.
func (s *Source) ReadFails(p string, size int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fails[p] = size
}

// Root is the directory the Source serves.
func (s *Source) Root() string { return s.root }

// Calls counts the calls of OpenPublished, whatever their outcome.
func (s *Source) Calls() int64 { return s.calls.Load() }

// Set gives path a state.
func (s *Source) Set(p string, st State) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.states[p] = st
}

// SetGeneration sets the generation path is described with.
func (s *Source) SetGeneration(p string, gen uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gens[p] = gen
}

// generation is the generation p is described with.
func (s *Source) generation(p string) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if gen, ok := s.gens[p]; ok {
		return gen
	}
	return 1
}

// WriteFile creates the file p (and its directories) under the root with
// data.
func (s *Source) WriteFile(p string, data []byte) error {
	full := filepath.Join(s.root, filepath.FromSlash(p))
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		return err
	}
	return os.WriteFile(full, data, 0o644)
}

// Stream makes every later open of p return the read end of a new pipe,
// described as a size-byte regular file; the write end of each pipe goes
// out on the returned channel when the open happens, so receiving from it
// also tells that a transfer of p has begun. The transport gets exactly what
// the test writes; the test closes the write end when done.
func (s *Source) Stream(p string, size int64) <-chan *os.File {
	st := &stream{size: size, writers: make(chan *os.File, 16)}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.streams[p] = st
	return st.writers
}

// Unchanged implements dtl.Source.
func (s *Source) Unchanged(f *os.File, info dtl.FileInfo) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	rel, err := filepath.Rel(s.root, f.Name())
	if err == nil && s.states[filepath.ToSlash(rel)] == Rewritten {
		return fmt.Errorf("%s was rewritten while it was sent: %w", rel, dtl.ErrBusy)
	}
	return nil
}

// OpenPublished implements dtl.Source.
func (s *Source) OpenPublished(ctx context.Context, req dtl.Request) (*os.File, dtl.FileInfo, error) {
	p := req.Path
	s.calls.Add(1)
	if err := ctx.Err(); err != nil {
		return nil, dtl.FileInfo{}, err
	}
	if p == "" || path.Clean(p) != p || !filepath.IsLocal(p) {
		return nil, dtl.FileInfo{}, fmt.Errorf("%q: %w", p, dtl.ErrOutside)
	}
	gen := s.generation(p)
	s.mu.Lock()
	state := s.states[p]
	st := s.streams[p]
	failSize, fails := s.fails[p]
	s.mu.Unlock()
	if fails {
		f, err := os.Open(s.root)
		if err != nil {
			return nil, dtl.FileInfo{}, err
		}
		return f, dtl.FileInfo{Size: failSize, Mode: syscall.S_IFREG | 0o644, MtimeNs: 1, Generation: gen}, nil
	}

	switch state {
	case NotPublished:
		return nil, dtl.FileInfo{}, fmt.Errorf("%s: %w", p, dtl.ErrNotPublished)
	case Busy:
		return nil, dtl.FileInfo{}, fmt.Errorf("%s: %w", p, dtl.ErrBusy)
	case Outside:
		return nil, dtl.FileInfo{}, fmt.Errorf("%s: %w", p, dtl.ErrOutside)
	case Unreadable:
		return nil, dtl.FileInfo{}, fmt.Errorf("%w: open %s: %w", dtl.ErrUnreadable, p, syscall.EACCES)
	}
	if st != nil {
		return s.openStream(ctx, st, gen)
	}

	fd, err := s.openBeneath(p)
	switch {
	case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ENOTDIR):
		return nil, dtl.FileInfo{}, fmt.Errorf("%s: %w", p, dtl.ErrNotFound)
	case errors.Is(err, unix.EXDEV), errors.Is(err, unix.ELOOP):
		return nil, dtl.FileInfo{}, fmt.Errorf("%s leads outside %s: %w", p, s.root, dtl.ErrOutside)
	case err != nil:
		return nil, dtl.FileInfo{}, fmt.Errorf("open %s: %w", p, err)
	}
	var sst unix.Stat_t
	if err := unix.Fstat(fd, &sst); err != nil {
		unix.Close(fd)
		return nil, dtl.FileInfo{}, err
	}
	if sst.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return nil, dtl.FileInfo{}, fmt.Errorf("%s is not a regular file: %w", p, dtl.ErrNotFound)
	}
	if err := unix.SetNonblock(fd, false); err != nil {
		unix.Close(fd)
		return nil, dtl.FileInfo{}, err
	}
	f := os.NewFile(uintptr(fd), filepath.Join(s.root, p))
	sum, err := s.checksum(p, f, sst.Size)
	if err != nil {
		f.Close()
		return nil, dtl.FileInfo{}, err
	}
	return f, dtl.FileInfo{Size: sst.Size, Mode: sst.Mode, Uid: sst.Uid, Gid: sst.Gid, MtimeNs: sst.Mtim.Nano(), Generation: gen, Checksum: sum}, nil
}

func (s *Source) openBeneath(p string) (int, error) {
	root, err := unix.Open(s.root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	defer unix.Close(root)
	return unix.Openat2(root, p, &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_CLOEXEC | unix.O_NOCTTY | unix.O_NONBLOCK,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS,
	})
}

func (s *Source) openStream(ctx context.Context, st *stream, gen uint64) (*os.File, dtl.FileInfo, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, dtl.FileInfo{}, err
	}
	select {
	case st.writers <- w:
	case <-ctx.Done():
		r.Close()
		w.Close()
		return nil, dtl.FileInfo{}, ctx.Err()
	}
	info := dtl.FileInfo{Size: st.size, Mode: syscall.S_IFREG | 0o644, MtimeNs: time.Now().UnixNano(), Generation: gen}
	return r, info, nil
}
