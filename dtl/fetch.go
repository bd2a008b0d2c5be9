package dtl

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dyadfs/dyadfs/internal/workers"
	"github.com/dyadfs/dyadfs/metrics"
)

// Version names one published version of a file: what a consumer fetches.
type Version struct {
	// Path is clean and relative to the managed directory.
	Path string
	// Owner is the node whose daemon serves the file.
	Owner string
	// Info is what the publish said of the file, with its generation in
	// the global store.
	Info FileInfo
	// Inline is the file's content when the notice of its publish carried
	// it (a small file), or nil.
	Inline []byte
	// Alloc is, for a sparse file, the space its data takes (less than
	// Info.Size); 0 for a file without holes.
	Alloc int64
	// Ino is the file's inode number in the namespace, which its copy
	// keeps (see hfl.Record.Ino).
	Ino uint64
}

// Peer is where a node's daemon listens, and with which transport.
type Peer struct {
	Transport string
	Addr      string
}

// Owners tells where a node's daemon listens, and whether it runs at all.
type Owners interface {
	// Peer returns node's address, or an error wrapping ErrOwnerGone
	// when its daemon is not running.
	Peer(ctx context.Context, node string) (Peer, error)
}

// Destination is where fetched files go: the consumer's managed directory.
type Destination interface {
	// Install moves tmp, a complete and verified copy of v's file, to
	// v.Path. v.Info is what the owner sent: the version asked for or a
	// newer one. It never replaces anything: if something is
	// there already it fails with an error matching fs.ErrExist.
	Install(tmp *os.File, v Version) error
}

// FetcherConfig configures a Fetcher.
type FetcherConfig struct {
	Transport Transport
	// TransportName is the backend's name; an owner registered with
	// another transport cannot be fetched from.
	TransportName string
	Owners        Owners
	Dest          Destination
	// TempDir receives files while they arrive. It must be on the same
	// filesystem as the destination, so that installing them is a rename.
	TempDir string
	// Timeout bounds how long a transfer is retried after it first
	// failed. (A transfer that makes progress is not bounded: the
	// transport fails one that stalls.)
	Timeout time.Duration
	// Node is this node's id, for the log.
	Node string
	Log  *slog.Logger
}

// ErrStale is returned when the owner no longer serves the version located:
// it removed the file or is rewriting it, and a newer publish will follow.
var ErrStale = errors.New("the owner no longer has this version")

// ErrCorrupt means that the bytes received do not match the checksum the
// owner computed when it published the file: they changed on its disk, in
// its memory or on the way. Nothing is installed; the readers get EIO.
var ErrCorrupt = errors.New("content does not match its published checksum")

// ErrOwnerGone means the file's owner is not running: no transfer can
// succeed until it returns.
var ErrOwnerGone = errors.New("owner node is not running")

// errPresent: a file was at the path before the fetched one could be
// installed (another transfer's, a local writer's). Fetch succeeds then:
// the caller looks at what is there.
var errPresent = errors.New("a file is at the path already")

// Fetcher brings published files from their owners into this node's
// backing store: one transfer per path however many opens wait for it, into
// a temporary file that is verified and then installed, so that a failed or
// interrupted transfer leaves nothing visible. A transfer runs on its own,
// not in any one waiter's stead: each waiter stops waiting when its open is
// interrupted or times out, and the file still arrives for the next open.
// Transfers that fail for reasons that may pass (connection refused, reset,
// stalled) are retried while the owner is registered, within the timeout; a
// dead owner fails at once.
type Fetcher struct {
	cfg    FetcherConfig
	log    *slog.Logger
	ctx    context.Context // ends at Close
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	inflight map[string]*fetchCall
	// owners caches registrations: one store round trip less per
	// transfer. A failed transfer always asks the store again.
	owners map[string]cachedOwner
	temps  *tempPool

	stats  FetchStats
	ranges RangeStats
}

// FetchStats counts transfers.
type FetchStats struct {
	Transfers atomic.Uint64 // completed transfers
	Bytes     atomic.Uint64 // bytes of the files copied here (apparent size)
	Joined    atomic.Uint64 // fetches that waited for another's transfer
	Retries   atomic.Uint64
	Failures  atomic.Uint64
	// FromNotices counts copies made from the bytes a small file's
	// notice carried, without a transfer.
	FromNotices atomic.Uint64
	// Verified counts copies whose content matched the owner's checksum;
	// Corrupt those that did not (not installed); Unverified those
	// installed without one (published by a daemon that computed none).
	Verified, Corrupt, Unverified atomic.Uint64
	// Reread counts the bytes read back to check a copy (blocks that
	// arrived out of order).
	Reread atomic.Uint64

	mu sync.Mutex
	// permanent counts the transfers that failed for good (ErrPermanent),
	// by the errno their readers saw.
	permanent map[syscall.Errno]uint64
}

func (s *FetchStats) countPermanent(errno syscall.Errno) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.permanent == nil {
		s.permanent = make(map[syscall.Errno]uint64)
	}
	s.permanent[errno]++
}

// Permanent returns how many transfers failed for good, by the name of the
// errno their readers saw ("ENOSPC", "EIO", ...).
func (s *FetchStats) Permanent() map[string]uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]uint64, len(s.permanent))
	for e, n := range s.permanent {
		out[unix.ErrnoName(e)] = n
	}
	return out
}

type fetchCall struct {
	done chan struct{}
	err  error
}

type cachedOwner struct {
	p  Peer
	at time.Time
}

// ownerCacheTTL bounds how long a registration is used without asking the
// store again.
const ownerCacheTTL = 30 * time.Second

// NewFetcher returns a Fetcher.
func NewFetcher(cfg FetcherConfig) (*Fetcher, error) {
	if cfg.Transport == nil || cfg.Owners == nil || cfg.Dest == nil || cfg.TempDir == "" || cfg.Timeout <= 0 {
		return nil, errors.New("fetcher: transport, owners, destination, temp dir and a positive timeout are required")
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Fetcher{cfg: cfg, log: log, ctx: ctx, cancel: cancel,
		inflight: make(map[string]*fetchCall), owners: make(map[string]cachedOwner),
		temps: newTempPool(cfg.TempDir, 16)}, nil
}

// Stats returns the counters.
func (f *Fetcher) Stats() *FetchStats { return &f.stats }

// Close ends the transfers in progress and removes the files kept ready.
func (f *Fetcher) Close() error {
	f.cancel()
	f.wg.Wait()
	return f.temps.close()
}

// Fetch makes rec.Path complete at its place in the destination. Concurrent
// calls for the same path share one transfer; each returns when it ends or
// its own ctx does.
func (f *Fetcher) Fetch(ctx context.Context, rec Version) error {
	f.mu.Lock()
	call, joined := f.inflight[rec.Path]
	if !joined {
		call = &fetchCall{done: make(chan struct{})}
		f.inflight[rec.Path] = call
		f.wg.Add(1)
		workers.Go(func() { f.run(call, rec) })
	}
	f.mu.Unlock()
	if joined {
		f.stats.Joined.Add(1)
	}
	select {
	case <-call.done:
		return call.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// run is one transfer, for everyone waiting for rec.Path.
func (f *Fetcher) run(call *fetchCall, rec Version) {
	defer f.wg.Done()
	start := time.Now()
	call.err = errNoBytes
	if rec.Inline != nil {
		call.err = f.fromNotice(rec)
	}
	if errors.Is(call.err, errNoBytes) {
		call.err = f.transfer(f.ctx, rec)
	}
	if errors.Is(call.err, errPresent) {
		call.err = nil
	}
	if call.err != nil {
		f.stats.Failures.Add(1)
	} else {
		metrics.FetchBytes.Observe(float64(rec.Info.Size))
	}
	metrics.FetchDuration.WithLabelValues(metrics.Outcome(call.err)).Observe(time.Since(start).Seconds())
	f.mu.Lock()
	delete(f.inflight, rec.Path)
	f.mu.Unlock()
	close(call.done)
}

// transfer fetches with retries until it succeeds, fails for good, has
// failed for longer than the timeout, or ctx ends. Retries back off
// exponentially, with jitter, so that a dead or overloaded owner is not
// hammered.
func (f *Fetcher) transfer(ctx context.Context, rec Version) error {
	var b backoff
	var failingSince time.Time
	var last error
	mismatched := false
	for attempt := 0; ; attempt++ {
		m, err := f.owner(ctx, rec.Owner, attempt > 0)
		if errors.Is(err, ErrOwnerGone) {
			if last != nil {
				return fmt.Errorf("%w (last attempt: %w)", err, last)
			}
			return err
		}
		if err == nil && m.Transport != "" && m.Transport != f.cfg.TransportName {
			return f.failed(rec, fmt.Errorf("owner %s uses the %s transport, this node %s", rec.Owner, m.Transport, f.cfg.TransportName))
		}
		if err == nil {
			err = f.once(ctx, m.Addr, rec)
			switch classify(err) {
			case done:
				return err
			case stale:
				return fmt.Errorf("%w: %w", ErrStale, err)
			case final:
				if errors.Is(err, ErrCorrupt) && !mismatched {
					// The owner's file may have changed under the
					// transfer (rewritten in place), or the bytes on
					// the way: the next transfer brings the version
					// the owner has now, or is refused if it is not
					// published yet. Damage that stays fails it.
					mismatched = true
					f.log.Warn("copy does not match its published checksum; fetching it again", "path", rec.Path,
						"owner", rec.Owner, "node", f.cfg.Node, "err", err)
					continue
				}
				if errors.Is(err, ErrCorrupt) {
					f.corrupt(rec, "transfer", err)
				}
				return f.failed(rec, err)
			}
			if errors.Is(err, net.ErrClosed) && ctx.Err() == nil && f.ctx.Err() != nil {
				return err // shutting down
			}
		}
		last = err
		if failingSince.IsZero() {
			failingSince = time.Now()
		}
		if ctx.Err() != nil || time.Since(failingSince) > f.cfg.Timeout {
			return fmt.Errorf("fetch %s from %s gave up after %d attempts: %w", rec.Path, rec.Owner, attempt+1, last)
		}
		f.stats.Retries.Add(1)
		// The last pause ends at the timeout, for one last attempt.
		pause := min(b.next(), time.Until(failingSince.Add(f.cfg.Timeout))+time.Millisecond)
		f.log.Info("transfer failed; retrying", "path", rec.Path, "owner", rec.Owner, "attempt", attempt+1, "in", pause, "err", err)
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("fetch %s from %s gave up after %d attempts: %w", rec.Path, rec.Owner, attempt+1, last)
		}
	}
}

// outcome is what a failed attempt means for the next one.
type outcome int

const (
	// retry: it may pass (the owner unreachable or restarting, a
	// connection reset, a stall, a failure on the owner's side).
	retry outcome = iota
	// done: not a failure of the transfer (success, or a file got there
	// first).
	done
	// stale: the owner no longer serves that version (removed, being
	// rewritten): the caller waits for the next publish.
	stale
	// final: no retry can fix it (see ErrPermanent).
	final
)

// classify says what err, from one attempt, means.
func classify(err error) outcome {
	var re *RemoteError
	switch {
	case err == nil, errors.Is(err, errPresent):
		return done
	case errors.Is(err, ErrNotFound), errors.Is(err, ErrNotPublished), errors.Is(err, ErrBusy):
		return stale
	case errors.Is(err, ErrUnavailable):
		return retry
	case errors.As(err, &re), errors.Is(err, ErrProtocol), errors.Is(err, ErrCorrupt):
		// Refused for good (unreadable, outside, unauthorized), a
		// broken peer, or bytes that are not what was published (the
		// owner's copy changed under it: the next attempt would bring
		// the same; the next open tries again).
		return final
	}
	if _, ok := StorageErrno(err); ok {
		return final
	}
	return retry
}

// ErrPermanent marks a transfer that failed for a reason no retry can fix:
// this node's storage refused the file (full, over quota, read-only, not
// writable), the owner cannot read it, or the owner refused or broke the
// protocol. Every open waiting for the transfer ends at once.
var ErrPermanent = errors.New("transfer cannot succeed")

// storageErrnos are the failures of this node's storage that no retry
// fixes, as a reader sees them.
var storageErrnos = map[syscall.Errno]syscall.Errno{
	syscall.ENOSPC: syscall.ENOSPC,
	syscall.EDQUOT: syscall.EDQUOT,
	syscall.EROFS:  syscall.EROFS,
	syscall.EACCES: syscall.EACCES,
	syscall.EPERM:  syscall.EACCES,
	syscall.EFBIG:  syscall.EFBIG,
}

// StorageErrno returns the errno a reader sees when err says this node's
// storage cannot take a file (ENOSPC, EDQUOT, EROFS, EACCES, EFBIG). The
// transports report their own network failures as ErrUnavailable or as
// errors of the connection, never as these.
func StorageErrno(err error) (syscall.Errno, bool) {
	var errno syscall.Errno
	if !errors.As(err, &errno) || errors.Is(err, ErrUnavailable) {
		return 0, false
	}
	e, ok := storageErrnos[errno]
	return e, ok
}

// ReaderErrno is the errno a reader sees for a transfer that failed for
// good: the storage's own, or EIO.
func ReaderErrno(err error) syscall.Errno {
	if e, ok := StorageErrno(err); ok {
		return e
	}
	return syscall.EIO
}

// failed marks err as permanent, counts it by the errno a reader sees and
// says so in one log line, with what the file needs and what this node has.
func (f *Fetcher) failed(rec Version, err error) error {
	errno := ReaderErrno(err)
	f.stats.countPermanent(errno)
	free := int64(-1)
	var st unix.Statfs_t
	if unix.Statfs(f.cfg.TempDir, &st) == nil {
		free = int64(st.Bavail) * st.Bsize
	}
	f.log.Warn("transfer cannot succeed; the opens waiting for it fail", "path", rec.Path, "owner", rec.Owner,
		"size", rec.Info.Size, "free_bytes", free, "errno", unix.ErrnoName(errno), "err", err)
	return fmt.Errorf("%w: %w", ErrPermanent, err)
}

// backoff spaces retries: exponential from backoffMin to backoffMax, each
// pause drawn between half and all of its step (jitter), so that the
// consumers of one dead owner do not retry in step.
type backoff struct{ step time.Duration }

const (
	backoffMin = 50 * time.Millisecond
	backoffMax = 2 * time.Second
)

func (b *backoff) next() time.Duration {
	if b.step == 0 {
		b.step = backoffMin
	} else {
		b.step = min(2*b.step, backoffMax)
	}
	return b.step/2 + rand.N(b.step/2+1)
}

// owner returns node's registration, from the cache unless fresh.
func (f *Fetcher) owner(ctx context.Context, node string, fresh bool) (Peer, error) {
	f.mu.Lock()
	c, ok := f.owners[node]
	f.mu.Unlock()
	if ok && !fresh && time.Since(c.at) < ownerCacheTTL {
		return c.p, nil
	}
	m, err := f.cfg.Owners.Peer(ctx, node)
	f.mu.Lock()
	if err == nil {
		f.owners[node] = cachedOwner{p: m, at: time.Now()}
	} else {
		delete(f.owners, node)
	}
	f.mu.Unlock()
	return m, err
}

// errNoBytes: the bytes a notice carried cannot make the file.
var errNoBytes = errors.New("no usable bytes from the notice")

// fromNotice installs rec's file from the bytes its notice carried. It
// fails with errNoBytes if it could not; a transfer brings the file then.
func (f *Fetcher) fromNotice(rec Version) error {
	if int64(len(rec.Inline)) != rec.Info.Size {
		return errNoBytes
	}
	err := f.install(rec, func(dst *Sink) (FileInfo, error) {
		_, err := dst.WriteAt(rec.Inline, 0)
		return rec.Info, err
	})
	switch {
	case err == nil:
		f.stats.FromNotices.Add(1)
		return nil
	case errors.Is(err, errPresent):
		return err
	case errors.Is(err, ErrCorrupt):
		// The notice's bytes were damaged on the way; the owner's
		// file may be good: a transfer, verified too, tells.
		f.corrupt(rec, "notice", err)
		return fmt.Errorf("%w: %w", errNoBytes, err)
	}
	if _, ok := StorageErrno(err); ok {
		return f.failed(rec, err) // a transfer would fail the same way
	}
	f.log.Debug("copy from a notice's bytes failed; fetching", "path", rec.Path, "err", err)
	return fmt.Errorf("%w: %w", errNoBytes, err)
}

// once runs one transfer into a temporary file and, if it is complete,
// installs it.
func (f *Fetcher) once(ctx context.Context, addr string, rec Version) error {
	err := f.install(rec, func(dst *Sink) (FileInfo, error) {
		return f.cfg.Transport.Fetch(ctx, addr, Request{Path: rec.Path, Generation: rec.Info.Generation, Owner: rec.Owner}, dst)
	})
	if err == nil {
		f.stats.Transfers.Add(1)
	}
	return err
}

// corrupt counts and logs a copy that did not match its checksum.
func (f *Fetcher) corrupt(rec Version, how string, err error) {
	f.stats.Corrupt.Add(1)
	f.log.Error("copy does not match its published checksum; not installed", "path", rec.Path,
		"owner", rec.Owner, "node", f.cfg.Node, "via", how, "err", err)
}

// install has fill write rec's file into a temporary file and describe it,
// verifies it, gives it the owner's attributes and installs it. It fails
// with errPresent if something got there first, ErrCorrupt if its content
// is not what the owner published.
func (f *Fetcher) install(rec Version, fill func(dst *Sink) (FileInfo, error)) (err error) {
	tmp, err := f.temps.take()
	if err != nil {
		return fmt.Errorf("temporary file: %w", err)
	}
	defer f.temps.replenish()
	installed := false
	defer func() {
		if !installed {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if err := reserve(tmp, rec); err != nil {
		return err
	}
	sink := NewSink(tmp)
	info, err := fill(sink)
	if err != nil {
		return err
	}
	if err := verify(tmp, info); err != nil {
		return err
	}
	if err := f.check(sink, info); err != nil {
		return err
	}
	// Owner first: chown clears set-id bits. A copy keeps none: a node
	// does not run set-id programs for another.
	if os.Geteuid() == 0 {
		if err := tmp.Chown(int(info.Uid), int(info.Gid)); err != nil {
			return err
		}
	}
	if err := syscall.Fchmod(int(tmp.Fd()), info.Mode&0o1777); err != nil {
		return err
	}
	// futimens: by the descriptor, no path to resolve. The access time
	// stays what the copy's was.
	ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, unix.NsecToTimespec(info.MtimeNs)}
	if err := unix.UtimesNanoAt(int(tmp.Fd()), "", ts, unix.AT_EMPTY_PATH); err != nil {
		return fmt.Errorf("set the modification time of %s: %w", tmp.Name(), err)
	}
	got := rec
	got.Info, got.Inline = info, nil
	err = f.cfg.Dest.Install(tmp, got)
	switch {
	case errors.Is(err, fs.ErrExist):
		// Something got there first (another transfer, a local
		// producer): the waiters look at what is there.
		return fmt.Errorf("install %s: %w", rec.Path, errPresent)
	case err != nil:
		return err
	}
	installed = true
	tmp.Close()
	f.stats.Bytes.Add(uint64(info.Size))
	return nil
}

// reserveMin is the smallest file whose space is reserved before it is
// fetched: a smaller one that does not fit fails as soon as it is written.
const reserveMin = 1 << 20

// reserve makes sure that rec's file fits in tmp's filesystem before any
// byte of it moves, so that a transfer cannot fail half way for space: a
// file without holes gets its blocks allocated (fallocate, keeping the
// size at 0 so that the transfer writes as into an empty file); for a
// sparse file, whose holes stay holes, the free space is checked against
// what its data takes. It fails with ENOSPC or EDQUOT.
func reserve(tmp *os.File, rec Version) error {
	fd := int(tmp.Fd())
	if rec.Alloc > 0 {
		var st unix.Statfs_t
		if err := unix.Fstatfs(fd, &st); err == nil && int64(st.Bavail)*st.Bsize < rec.Alloc {
			return fmt.Errorf("the %d bytes of data of %s do not fit in %d free bytes: %w", rec.Alloc, rec.Path, int64(st.Bavail)*st.Bsize, syscall.ENOSPC)
		}
		return nil
	}
	if rec.Info.Size < reserveMin {
		return nil
	}
	err := unix.Fallocate(fd, unix.FALLOC_FL_KEEP_SIZE, 0, rec.Info.Size)
	switch {
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return fmt.Errorf("reserve %d bytes for %s: %w", rec.Info.Size, rec.Path, err)
	case err != nil:
		return nil // the filesystem cannot reserve: the writes will tell
	}
	return nil
}

// check compares the checksum of what arrived with the owner's.
func (f *Fetcher) check(sink *Sink, info FileInfo) error {
	if info.Checksum.IsZero() {
		f.stats.Unverified.Add(1)
		return nil
	}
	got, err := sink.Sum(info.Size)
	f.stats.Reread.Add(uint64(sink.Reread()))
	if err != nil {
		return err
	}
	if got != info.Checksum {
		return fmt.Errorf("%w: the copy's is %v, the owner published %v", ErrCorrupt, got, info.Checksum)
	}
	f.stats.Verified.Add(1)
	return nil
}

// verify checks that the received file is what the owner described.
func verify(tmp *os.File, info FileInfo) error {
	var st syscall.Stat_t
	if err := syscall.Fstat(int(tmp.Fd()), &st); err != nil {
		return err
	}
	if st.Size != info.Size {
		return fmt.Errorf("received %d bytes of a %d-byte file: %w", st.Size, info.Size, ErrProtocol)
	}
	return nil
}

// tempPool keeps a few empty temporary files ready. Creating a file costs
// the filesystem an inode allocation, which on an ext4 without a journal
// that freed many inodes in the last half minute can take a millisecond:
// the pool moves that off the path of a waiting open. It keeps their names,
// not open descriptors, so that it never holds the backing filesystem open
// for writing (an administrator can still remount it read-only).
type tempPool struct {
	dir    string
	ready  chan string
	refill chan struct{}
	done   chan struct{}
	wg     sync.WaitGroup
}

func newTempPool(dir string, size int) *tempPool {
	p := &tempPool{dir: dir, ready: make(chan string, size), refill: make(chan struct{}, 1), done: make(chan struct{})}
	p.wg.Add(1)
	go p.fill()
	p.refill <- struct{}{}
	return p
}

// take returns an empty temporary file, from the pool if it has one.
func (p *tempPool) take() (*os.File, error) {
	select {
	case name := <-p.ready:
		f, err := os.OpenFile(name, os.O_RDWR|os.O_TRUNC, 0)
		if err != nil {
			os.Remove(name)
		}
		return f, err
	default:
		return os.CreateTemp(p.dir, "fetch-*")
	}
}

// replenish asks for the pool to be filled again. It is called when a
// transfer has ended, not when it takes its file: creating files in the
// temporary directory while the transfer renames out of it would make the
// rename wait for the directory (a millisecond, on a slow inode
// allocation).
func (p *tempPool) replenish() {
	select {
	case p.refill <- struct{}{}:
	default:
	}
}

func (p *tempPool) fill() {
	defer p.wg.Done()
	for {
		select {
		case <-p.done:
			return
		case <-p.refill:
		}
		for len(p.ready) < cap(p.ready) {
			f, err := os.CreateTemp(p.dir, "fetch-*")
			if err != nil {
				break // a transfer will create its own, and say why
			}
			f.Close()
			select {
			case p.ready <- f.Name():
			case <-p.done:
				os.Remove(f.Name())
				return
			}
		}
	}
}

func (p *tempPool) close() error {
	close(p.done)
	p.wg.Wait()
	for {
		select {
		case name := <-p.ready:
			os.Remove(name)
		default:
			return nil
		}
	}
}
