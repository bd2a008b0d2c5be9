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

	stats FetchStats
}

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
	return &Fetcher{cfg: cfg, log: log, inflight: make(map[string]*fetchCall)}, nil
}

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
		m, err := f.cfg.Owners.Member(ctx, rec.Owner)
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

// once runs one transfer into a temporary file and, if it is complete,
// renames it to dst.
func (f *Fetcher) once(ctx context.Context, addr string, rec hfl.Record, dst string) error {
	tmp, err := os.CreateTemp(f.cfg.TempDir, "fetch-*")
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
