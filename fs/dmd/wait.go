package dmd

import (
	"context"
	"errors"
	"fmt"
	"syscall"

	"github.com/dyadfs/dyadfs/hfl"
)

// Fetcher brings a file published by another node into this node's backing
// store. The data transport layer implements it.
type Fetcher interface {
	// Fetch makes rec.Path complete in the backing store at dst, or fails
	// leaving nothing at dst.
	Fetch(ctx context.Context, rec hfl.Record, dst string) error
}

// SetFetcher installs the fetcher; without one, files published elsewhere
// cannot be read here (ErrNoTransport).
func (d *DMD) SetFetcher(f Fetcher) { d.fetcher = f }

// LocalRecord implements hfl.LocalIndex: it returns the record of rel if the
// file is complete in the backing store (not being written, not being
// created, not left half-written).
func (d *DMD) LocalRecord(rel string) (hfl.Record, bool) {
	var st syscall.Stat_t
	if err := syscall.Stat(d.BackingPath(rel), &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return hfl.Record{}, false
	}
	d.mu.Lock()
	busy := d.busy[IDOf(&st)] != nil || d.creating[rel] > 0
	d.mu.Unlock()
	if busy {
		return hfl.Record{}, false
	}
	return recordOf(rel, d.cfg.Node, &st), true
}

// WaitPath blocks until the file rel is complete in the backing store and
// returns its backing path. A file published by another node is fetched.
// The wait ends with ErrWaitTimeout, ErrShutdown, or ctx's error.
func (d *DMD) WaitPath(ctx context.Context, rel string) (string, error) {
	if rec, ok := d.LocalRecord(rel); ok {
		return d.BackingPath(rec.Path), nil
	}
	ctx, cancel := d.waitContext(ctx)
	defer cancel()
	start := now()
	d.stats.opensWaited.Add(1)
	defer func() { d.stats.waited(since(start)) }()

	for {
		// Watch before looking, so that a change between the look and
		// the wait is not missed.
		w := d.watchPath(rel)
		p, after, err := d.locateOnce(ctx, rel)
		if err != nil || p != "" {
			d.unwatch(rel, w)
			return p, err
		}
		err = d.waitChange(ctx, rel, w, after)
		d.unwatch(rel, w)
		if err != nil {
			return "", err
		}
	}
}

// locateOnce looks for rel through the locator. It returns the backing path
// when the file is complete here (fetching it if it is complete elsewhere),
// or the generation to wait past.
func (d *DMD) locateOnce(ctx context.Context, rel string) (path string, after uint64, err error) {
	rec, level, err := d.loc.Locate(ctx, rel)
	switch {
	case errors.Is(err, hfl.ErrNotFound):
		return "", 0, nil
	case err != nil:
		if ctx.Err() != nil {
			return "", 0, d.waitErr(ctx)
		}
		return "", 0, fmt.Errorf("locate %s: %w", rel, err)
	case level == hfl.LevelLocal:
		return d.BackingPath(rel), 0, nil
	}
	if rec.Owner == d.cfg.Node || d.cfg.SharedStorage {
		// Published from this backing store but not complete here
		// (being rewritten, or removed): wait for a newer publish.
		return "", rec.Generation, nil
	}
	if d.fetcher == nil {
		return "", 0, fmt.Errorf("%s published by node %s: %w", rel, rec.Owner, ErrNoTransport)
	}
	d.stats.fetches.Add(1)
	if err := d.fetcher.Fetch(ctx, rec, d.BackingPath(rel)); err != nil {
		d.stats.fetchErrors.Add(1)
		if ctx.Err() != nil {
			return "", 0, d.waitErr(ctx)
		}
		return "", 0, fmt.Errorf("fetch %s from %s: %w", rel, rec.Owner, err)
	}
	d.notify(rel)
	return "", 0, nil // look again: the file is here now
}

// waitChange blocks until a local change of rel (w fires), a publish of rel
// newer than after reaches the global store, or the wait ends.
func (d *DMD) waitChange(ctx context.Context, rel string, w *pathWatch, after uint64) error {
	gctx, stop := context.WithCancel(ctx)
	defer stop()
	global := make(chan error, 1)
	go func() {
		_, err := d.loc.Wait(gctx, rel, after)
		global <- err
	}()
	select {
	case <-w.ch:
		return nil
	case err := <-global:
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return d.waitErr(ctx)
		}
		if errors.Is(err, hfl.ErrClosed) {
			return ErrShutdown
		}
		return fmt.Errorf("wait for %s: %w", rel, err)
	case <-ctx.Done():
		return d.waitErr(ctx)
	case <-d.shutdown:
		return ErrShutdown
	}
}
