package dtl

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/dyadfs/dyadfs/hfl"
)

// Owners tells where a node's daemon listens, and whether it runs at all.
type Owners interface {
	// Member returns node's registration, or an error wrapping
	// hfl.ErrNotRunning when its daemon is gone.
	Member(ctx context.Context, node string) (hfl.Member, error)
}

// FetcherConfig configures a Fetcher.
type FetcherConfig struct {
	Transport Transport
	Owners    Owners
	// TempDir receives files while they arrive. It must be on the same
	// filesystem as the destinations, so that renaming into place is
	// atomic.
	TempDir string
	// Timeout bounds one fetch, retries included.
	Timeout time.Duration
	// Prepare is called on a complete, verified file before it is renamed
	// into place (dyadfs marks it as a replica).
	Prepare func(f *os.File, rec hfl.Record) error
	Log     *slog.Logger
}

// ErrStale is returned when the owner no longer serves the version located:
// it removed the file or is rewriting it, and a newer publish will follow.
// The managed directory defines the same condition; the caller maps it.
var ErrStale = errors.New("the owner no longer has this version")

// ErrOwnerGone means the file's owner is not running: no transfer can
// succeed until it returns.
var ErrOwnerGone = errors.New("owner node is not running")

// Fetcher brings published files from their owners into this node's
// backing store: one transfer per path however many opens wait for it, into
// a temporary file that is verified and renamed into place, so that a
// failed or interrupted transfer leaves nothing visible. Transfers that fail
// for reasons that may pass (connection refused, reset, stalled) are retried
// while the owner is registered, within the timeout; a dead owner fails at
// once.
type Fetcher struct {
	cfg FetcherConfig
	log *slog.Logger

	mu       sync.Mutex
	inflight map[string]*fetchCall
	// owners caches registrations: one store round trip less per
	// transfer. A failed transfer always asks the store again.
	owners map[string]cachedOwner
	temps  *tempPool

	stats FetchStats
}

type cachedOwner struct {
	m  hfl.Member
	at time.Time
}

// ownerCacheTTL bounds how long a registration is used without asking the
// store again.
const ownerCacheTTL = 30 * time.Second

// FetchStats counts transfers.
type FetchStats struct {
	Transfers atomic.Uint64 // completed transfers
	Bytes     atomic.Uint64 // bytes of completed transfers (apparent size)
	Joined    atomic.Uint64 // fetches that waited for another's transfer
	Retries   atomic.Uint64
	Failures  atomic.Uint64
}

type fetchCall struct {
	done chan struct{}
	err  error
}

// NewFetcher returns a Fetcher.
func NewFetcher(cfg FetcherConfig) (*Fetcher, error) {
	if cfg.Transport == nil || cfg.Owners == nil || cfg.TempDir == "" || cfg.Timeout <= 0 {
		return nil, errors.New("fetcher: transport, owners, temp dir and a positive timeout are required")
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Fetcher{cfg: cfg, log: log, inflight: make(map[string]*fetchCall), owners: make(map[string]cachedOwner),
		temps: newTempPool(cfg.TempDir, 16)}, nil
}

// Close removes the files kept ready for transfers. Fetches must be over.
func (f *Fetcher) Close() error { return f.temps.close() }

// Stats returns the counters.
func (f *Fetcher) Stats() *FetchStats { return &f.stats }

// Fetch makes rec.Path complete at dst. Concurrent calls for the same path
// share one transfer; each returns when it ends or its own ctx does.
func (f *Fetcher) Fetch(ctx context.Context, rec hfl.Record, dst string) error {
	f.mu.Lock()
	call, joined := f.inflight[rec.Path]
	if !joined {
		call = &fetchCall{done: make(chan struct{})}
		f.inflight[rec.Path] = call
	}
	f.mu.Unlock()

	if joined {
		f.stats.Joined.Add(1)
		select {
		case <-call.done:
			return call.err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	// The transfer serves every waiter, so it does not end with the
	// first one's interruption; it has its own deadline.
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), f.cfg.Timeout)
	call.err = f.transfer(tctx, rec, dst)
	cancel()
	f.mu.Lock()
	delete(f.inflight, rec.Path)
	f.mu.Unlock()
	close(call.done)
	if call.err != nil {
		f.stats.Failures.Add(1)
	}
	return call.err
}

// transfer fetches with retries until it succeeds, fails for good, or ctx
// ends.
func (f *Fetcher) transfer(ctx context.Context, rec hfl.Record, dst string) error {
	pause := 20 * time.Millisecond
	var last error
	for attempt := 0; ; attempt++ {
		m, err := f.owner(ctx, rec.Owner, attempt > 0)
		if errors.Is(err, hfl.ErrNotRunning) {
			if last != nil {
				return fmt.Errorf("%w (%v; last attempt: %v)", ErrOwnerGone, err, last)
			}
			return fmt.Errorf("%w: %v", ErrOwnerGone, err)
		}
		if err == nil {
			err = f.once(ctx, m.Addr, rec, dst)
			if err == nil {
				return nil
			}
			var re *RemoteError
			switch {
			case errors.Is(err, ErrNotFound), errors.Is(err, ErrNotPublished), errors.Is(err, ErrBusy):
				return fmt.Errorf("%w: %v", ErrStale, err)
			case errors.As(err, &re), errors.Is(err, ErrProtocol):
				return err // refused for good (outside, unauthorized) or broken peer
			}
		}
		last = err
		if ctx.Err() != nil {
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
func (f *Fetcher) owner(ctx context.Context, node string, fresh bool) (hfl.Member, error) {
	f.mu.Lock()
	c, ok := f.owners[node]
	f.mu.Unlock()
	if ok && !fresh && time.Since(c.at) < ownerCacheTTL {
		return c.m, nil
	}
	m, err := f.cfg.Owners.Member(ctx, node)
	f.mu.Lock()
	if err == nil {
		f.owners[node] = cachedOwner{m: m, at: time.Now()}
	} else {
		delete(f.owners, node)
	}
	f.mu.Unlock()
	return m, err
}

// once runs one transfer into a temporary file and, if it is complete,
// renames it to dst.
func (f *Fetcher) once(ctx context.Context, addr string, rec hfl.Record, dst string) error {
	tmp, err := f.temps.take()
	if err != nil {
		return fmt.Errorf("temporary file: %w", err)
	}
	committed := false
	defer func() {
		if !committed {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	info, err := f.cfg.Transport.Fetch(ctx, addr, Request{Path: rec.Path, Generation: rec.Generation}, tmp)
	if err != nil {
		return err
	}
	if err := verify(tmp, info); err != nil {
		return err
	}
	// Owner first: chown clears set-id bits, chmod sets them again.
	if os.Geteuid() == 0 {
		if err := tmp.Chown(int(info.Uid), int(info.Gid)); err != nil {
			return err
		}
	}
	if err := syscall.Fchmod(int(tmp.Fd()), info.Mode&0o7777); err != nil {
		return err
	}
	mtime := time.Unix(0, info.MtimeNs)
	if err := os.Chtimes(tmp.Name(), time.Time{}, mtime); err != nil {
		return err
	}
	published := rec
	published.Size, published.Mode, published.MtimeNs, published.Generation = info.Size, info.Mode, info.MtimeNs, info.Generation
	if f.cfg.Prepare != nil {
		if err := f.cfg.Prepare(tmp, published); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return err
	}
	committed = true
	f.stats.Transfers.Add(1)
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
// the filesystem an inode allocation, which on a busy ext4 (one that freed
// many inodes in the last minute) can take a millisecond: the pool moves
// that off the path of a waiting open.
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
	case p.refill <- struct{}{}:
	default:
	}
	select {
	case f := <-p.ready:
		return f, nil
	default:
		return os.CreateTemp(p.dir, "fetch-*")
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
