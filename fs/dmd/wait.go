package dmd

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/dyadfs/dyadfs/dtl"
	"github.com/dyadfs/dyadfs/hfl"
)

// owners is the locator's membership as the fetcher asks for it.
type owners struct{ loc *hfl.Locator }

func (o owners) Peer(ctx context.Context, node string) (dtl.Peer, error) {
	m, err := o.loc.Member(ctx, node)
	switch {
	case errors.Is(err, hfl.ErrNotRunning):
		return dtl.Peer{}, fmt.Errorf("%w: %w", dtl.ErrOwnerGone, err)
	case err != nil:
		return dtl.Peer{}, err
	}
	return dtl.Peer{Transport: m.Transport, Addr: m.Addr}, nil
}

// versionOf is what the fetcher needs of a record.
func versionOf(rec hfl.Record) dtl.Version {
	v := dtl.Version{Path: rec.Path, Owner: rec.Owner, Info: dtl.FileInfo{
		Size: rec.Size, Mode: rec.Mode, Uid: rec.Uid, Gid: rec.Gid, MtimeNs: rec.MtimeNs, Generation: rec.Generation}}
	if rec.Inline != nil {
		v.Inline = rec.Inline.Data
	}
	return v
}

// FetchStats counts transfers; nil without a transport.
func (d *DMD) FetchStats() *dtl.FetchStats {
	if d.fetcher == nil {
		return nil
	}
	return d.fetcher.Stats()
}

// completeHere reports whether the regular file rel is complete on this
// node: not being written or created here, not left half-written.
func (d *DMD) completeHere(rel string) (*syscall.Stat_t, bool) {
	var st syscall.Stat_t
	if err := syscall.Lstat(d.BackingPath(rel), &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return nil, false
	}
	d.mu.Lock()
	busy := d.busy[IDOf(&st)] != nil || d.creating[rel] > 0
	d.mu.Unlock()
	return &st, !busy
}

// LocalRecord implements hfl.LocalIndex: it returns the record of rel if the
// file is complete here, and what the namespace has at rel (a copy of an
// older version, or this node's file replaced elsewhere, is not). With
// shared storage, where other nodes write into the same directory unseen,
// a file is complete only once a published record describes it as it is.
func (d *DMD) LocalRecord(ctx context.Context, rel string) (hfl.Record, bool) {
	st, ok := d.completeHere(rel)
	if !ok {
		return hfl.Record{}, false
	}
	if d.cfg.SharedStorage {
		pub, err := d.loc.Published(ctx, rel)
		if err != nil || pub.Size != st.Size || pub.MtimeNs != st.Mtim.Nano() {
			return hfl.Record{}, false
		}
		return pub, true
	}
	if !d.currentHere(ctx, rel, st) {
		return hfl.Record{}, false
	}
	rec := recordOf(rel, d.cfg.Node, st)
	if c, ok := d.copyOf(rel); ok {
		rec.Owner, rec.Generation = c.owner, c.gen
	}
	return rec, true
}

// notRegularHere fails when something other than a regular file is at rel:
// a reader waiting for a file there would wait forever.
func (d *DMD) notRegularHere(rel string) error {
	var st syscall.Stat_t
	if syscall.Lstat(d.BackingPath(rel), &st) != nil || st.Mode&syscall.S_IFMT == syscall.S_IFREG {
		return nil
	}
	if st.Mode&syscall.S_IFMT == syscall.S_IFDIR {
		return fmt.Errorf("%s is a directory: %w", rel, ErrNotRegular)
	}
	return fmt.Errorf("%s is not a regular file: %w", rel, ErrNotRegular)
}

// existsHere reports whether something is at rel in the backing store,
// complete or not.
func (d *DMD) existsHere(rel string) bool {
	var st syscall.Stat_t
	return syscall.Lstat(d.BackingPath(rel), &st) == nil
}

// WaitPath blocks until the file rel is complete in the backing store and
// is the namespace's current version, and returns its backing path. A file
// published by another node is fetched. The wait, of thread tid (0: not a
// request), is listed while it lasts; it ends with ErrWaitTimeout,
// ErrShutdown, or ctx's error.
func (d *DMD) WaitPath(ctx context.Context, rel string, tid uint32) (string, error) {
	if _, ok := d.LocalRecord(ctx, rel); ok {
		return d.BackingPath(rel), nil
	}
	ctx, cancel := d.waitContext(ctx)
	defer cancel()
	start := time.Now()
	d.stats.opensWaited.Add(1)
	defer func() { d.stats.waited(time.Since(start)) }()
	done, waitFor := d.startWait(rel, tid, "publish")
	defer done()
	ctx = context.WithValue(ctx, waitForKey{}, waitFor)

	// A record that arrived with a notice: sent ahead of its publish, or
	// carrying the file's bytes.
	var arrived hfl.Record
	committedOnly := false
	for {
		// Watch before looking, so that a change between the look and
		// the wait is not missed.
		w := d.watchPath(rel)
		var p string
		var after uint64
		var err error
		if arrived.Path == "" {
			p, after, arrived, err = d.locateOnce(ctx, rel, !committedOnly)
		}
		if err == nil && p == "" && arrived.Path != "" {
			p, after, err = d.fetchLocated(ctx, rel, arrived)
			// A record sent ahead that could not be fetched (the
			// owner is rewriting the file, say) is not taken again:
			// wait for what the store commits.
			committedOnly = committedOnly || arrived.Provisional
			arrived = hfl.Record{}
		}
		if err != nil || p != "" {
			d.unwatch(rel, w)
			return p, err
		}
		var recheck time.Duration
		if d.cfg.SharedStorage && after > 0 {
			// Published, but this node's view of the shared directory
			// does not show it yet (attribute caches): look again soon.
			recheck = sharedRecheck
		}
		arrived, err = d.waitChange(ctx, rel, w, after, recheck, !committedOnly)
		d.unwatch(rel, w)
		if err != nil {
			return "", err
		}
	}
}

// sharedRecheck is how often a published file that shared storage does not
// show yet is looked at again.
const sharedRecheck = 100 * time.Millisecond

// waitForKey carries, in a wait's context, the function that says what the
// wait is waiting for now.
type waitForKey struct{}

// clearForFetch reports whether a fetched file may be installed at rel:
// nothing is there, or only what the namespace replaced (a copy of an
// older version, this node's file replaced elsewhere), which is removed.
// Something being written here or of another kind is left alone.
func (d *DMD) clearForFetch(ctx context.Context, rel string) bool {
	var st syscall.Stat_t
	if syscall.Lstat(d.BackingPath(rel), &st) != nil {
		return true
	}
	if d.solo() || st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return false
	}
	d.mu.Lock()
	busy := d.busy[IDOf(&st)] != nil || d.creating[rel] > 0
	d.mu.Unlock()
	if busy || d.currentHere(ctx, rel, &st) {
		return false
	}
	d.removeBeneath(rel, false)
	return !d.existsHere(rel)
}

// locateOnce looks for rel through the locator. It returns the backing path
// when the file is complete here (fetching it if it is complete elsewhere),
// or the generation to wait past. With takeAhead, the locator may find a
// record sent ahead of its publish: that is returned as arrived, for the
// caller to fetch.
func (d *DMD) locateOnce(ctx context.Context, rel string, takeAhead bool) (path string, after uint64, arrived hfl.Record, err error) {
	if err := d.notRegularHere(rel); err != nil {
		return "", 0, hfl.Record{}, err
	}
	rec, level, err := d.loc.LocateWaiting(ctx, rel, takeAhead)
	switch {
	case errors.Is(err, hfl.ErrNotFound):
		return "", 0, hfl.Record{}, nil
	case err != nil:
		if ctx.Err() != nil {
			return "", 0, hfl.Record{}, d.waitErr(ctx)
		}
		// The store is unreachable (restarting, say): keep waiting; the
		// wait reconnects and sees what is published meanwhile.
		d.log.Warn("metadata store unavailable while locating; waiting", "path", rel, "err", err)
		return "", 0, hfl.Record{}, nil
	case level == hfl.LevelLocal:
		return d.BackingPath(rel), 0, hfl.Record{}, nil
	case rec.Provisional:
		return "", 0, rec, nil
	}
	path, after, err = d.fetchLocated(ctx, rel, rec)
	return path, after, hfl.Record{}, err
}

// fetchLocated fetches rel as rec, found by the locator (or sent ahead of
// its publish), describes it. It returns the backing path when the file is
// complete here, or the generation to wait past.
func (d *DMD) fetchLocated(ctx context.Context, rel string, rec hfl.Record) (path string, after uint64, err error) {
	if rec.Writing || rec.Owner == d.cfg.Node || d.cfg.SharedStorage || !d.clearForFetch(ctx, rel) {
		// Being rewritten (here or elsewhere), published from this
		// backing store but not complete here, or being written here:
		// wait for the writer or a newer publish rather than fetch over
		// it.
		return "", rec.Generation, nil
	}
	if d.fetcher == nil {
		return "", 0, fmt.Errorf("%s published by node %s: %w", rel, rec.Owner, ErrNoTransport)
	}
	d.loc.Hold(ctx, rel) // the copy must hear of changes
	d.stats.fetches.Add(1)
	start := time.Now()
	if f, ok := ctx.Value(waitForKey{}).(func(string)); ok {
		f("fetch")
		defer f("publish")
	}
	err = d.fetcher.Fetch(ctx, versionOf(rec))
	switch {
	case err == nil:
		d.log.Debug("fetched", "path", rel, "owner", rec.Owner, "took", time.Since(start))
		d.notify(rel)
		if _, ok := d.LocalRecord(ctx, rel); ok {
			return d.BackingPath(rel), 0, nil
		}
		return "", 0, nil // something else got there first: look again
	case errors.Is(err, dtl.ErrStale):
		// The owner removed or is rewriting that version: wait for the
		// next publish.
		d.loc.Forget(rel)
		return "", rec.Generation, nil
	case ctx.Err() != nil:
		return "", 0, d.waitErr(ctx)
	}
	d.stats.fetchErrors.Add(1)
	return "", 0, fmt.Errorf("%w: %s from %s: %w", ErrFetch, rel, rec.Owner, err)
}

// waitChange blocks until a local change of rel (w fires), a publish of rel
// newer than after reaches the global store, or the wait ends.
//
// It returns the record that arrived if it was sent ahead of its publish
// (provisional) or carries the file's bytes: the caller fetches it without
// asking the locator again.
func (d *DMD) waitChange(ctx context.Context, rel string, w *pathWatch, after uint64, recheck time.Duration, takeAhead bool) (hfl.Record, error) {
	gctx, stop := context.WithCancel(ctx)
	defer stop()
	var again <-chan time.Time
	if recheck > 0 {
		t := time.NewTimer(recheck)
		defer t.Stop()
		again = t.C
	}
	type arrival struct {
		rec hfl.Record
		err error
	}
	global := make(chan arrival, 1)
	go func() {
		wait := d.loc.Wait
		if takeAhead {
			wait = d.loc.WaitAhead
		}
		rec, err := wait(gctx, rel, after)
		global <- arrival{rec, err}
	}()
	select {
	case <-w.ch:
		return hfl.Record{}, nil
	case <-again:
		return hfl.Record{}, nil
	case a := <-global:
		if a.err == nil {
			d.log.Debug("record arrived", "path", rel, "provisional", a.rec.Provisional)
			if a.rec.Provisional || a.rec.Inline != nil {
				return a.rec, nil
			}
			return hfl.Record{}, nil
		}
		if ctx.Err() != nil {
			return hfl.Record{}, d.waitErr(ctx)
		}
		if errors.Is(a.err, hfl.ErrClosed) {
			return hfl.Record{}, ErrShutdown
		}
		return hfl.Record{}, fmt.Errorf("wait for %s: %w", rel, a.err)
	case <-ctx.Done():
		return hfl.Record{}, d.waitErr(ctx)
	case <-d.shutdown:
		return hfl.Record{}, ErrShutdown
	}
}
