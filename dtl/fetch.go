package dtl

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
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
	Log     *slog.Logger
}

// ErrStale is returned when the owner no longer serves the version located:
// it removed the file or is rewriting it, and a newer publish will follow.
var ErrStale = errors.New("the owner no longer has this version")

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

	stats FetchStats
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
		go f.run(call, rec)
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
	}
	f.mu.Lock()
	delete(f.inflight, rec.Path)
	f.mu.Unlock()
	close(call.done)
}

// transfer fetches with retries until it succeeds, fails for good, has
// failed for longer than the timeout, or ctx ends.
func (f *Fetcher) transfer(ctx context.Context, rec Version) error {
	pause := 20 * time.Millisecond
	var failingSince time.Time
	var last error
	for attempt := 0; ; attempt++ {
		m, err := f.owner(ctx, rec.Owner, attempt > 0)
		if errors.Is(err, ErrOwnerGone) {
			if last != nil {
				return fmt.Errorf("%w (last attempt: %w)", err, last)
			}
			return err
		}
		if err == nil && m.Transport != "" && m.Transport != f.cfg.TransportName {
			return fmt.Errorf("owner %s uses the %s transport, this node %s", rec.Owner, m.Transport, f.cfg.TransportName)
		}
		if err == nil {
			err = f.once(ctx, m.Addr, rec)
			if err == nil {
				return nil
			}
			var re *RemoteError
			switch {
			case errors.Is(err, errPresent):
				return err
			case errors.Is(err, ErrNotFound), errors.Is(err, ErrNotPublished), errors.Is(err, ErrBusy):
				return fmt.Errorf("%w: %w", ErrStale, err)
			case errors.As(err, &re), errors.Is(err, ErrProtocol):
				return err // refused for good (outside, unauthorized) or broken peer
			case errors.Is(err, net.ErrClosed) && ctx.Err() == nil && f.ctx.Err() != nil:
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
		f.log.Info("transfer failed; retrying", "path", rec.Path, "owner", rec.Owner, "attempt", attempt+1, "err", err)
		select {
		case <-time.After(pause):
		case <-ctx.Done():
			return fmt.Errorf("fetch %s from %s gave up after %d attempts: %w", rec.Path, rec.Owner, attempt+1, last)
		}
		pause = min(2*pause, time.Second)
	}
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
	err := f.install(rec, func(tmp *os.File) (FileInfo, error) {
		_, err := tmp.Write(rec.Inline)
		return rec.Info, err
	})
	switch {
	case err == nil:
		f.stats.FromNotices.Add(1)
		return nil
	case errors.Is(err, errPresent):
		return err
	}
	f.log.Debug("copy from a notice's bytes failed; fetching", "path", rec.Path, "err", err)
	return fmt.Errorf("%w: %w", errNoBytes, err)
}

// once runs one transfer into a temporary file and, if it is complete,
// installs it.
func (f *Fetcher) once(ctx context.Context, addr string, rec Version) error {
	err := f.install(rec, func(tmp *os.File) (FileInfo, error) {
		return f.cfg.Transport.Fetch(ctx, addr, Request{Path: rec.Path, Generation: rec.Info.Generation, Owner: rec.Owner}, tmp)
	})
	if err == nil {
		f.stats.Transfers.Add(1)
	}
	return err
}

// install has fill write rec's file into a temporary file and describe it,
// verifies it, gives it the owner's attributes and installs it. It fails
// with errPresent if something got there first.
func (f *Fetcher) install(rec Version, fill func(tmp *os.File) (FileInfo, error)) (err error) {
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
	info, err := fill(tmp)
	if err != nil {
		return err
	}
	if err := verify(tmp, info); err != nil {
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
	if err := os.Chtimes(tmp.Name(), time.Time{}, time.Unix(0, info.MtimeNs)); err != nil {
		return err
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
// the pool moves that off the path of a waiting open.
type tempPool struct {
	dir    string
	ready  chan *os.File
	refill chan struct{}
	done   chan struct{}
	wg     sync.WaitGroup
}

func newTempPool(dir string, size int) *tempPool {
	p := &tempPool{dir: dir, ready: make(chan *os.File, size), refill: make(chan struct{}, 1), done: make(chan struct{})}
	p.wg.Add(1)
	go p.fill()
	p.refill <- struct{}{}
	return p
}

// take returns an empty temporary file, from the pool if it has one.
func (p *tempPool) take() (*os.File, error) {
	select {
	case f := <-p.ready:
		return f, nil
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
			select {
			case p.ready <- f:
			case <-p.done:
				f.Close()
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
		case f := <-p.ready:
			f.Close()
			os.Remove(f.Name())
		default:
			return nil
		}
	}
}
