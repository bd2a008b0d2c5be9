package dmd

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"sync"
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
	v := dtl.Version{Path: rec.Path, Owner: rec.Owner, Alloc: rec.Alloc, Ino: rec.InodeNumber(), Info: dtl.FileInfo{
		Size: rec.Size, Mode: rec.Mode, Uid: rec.Uid, Gid: rec.Gid, MtimeNs: rec.MtimeNs, Generation: rec.Generation, Checksum: rec.Sum}}
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
	if err := d.back.Lstat(rel, &st); err != nil {
		return nil, false
	}
	return &st, d.completeAs(rel, &st)
}

// completeAs is completeHere for a file whose lstat is st.
func (d *DMD) completeAs(rel string, st *syscall.Stat_t) bool {
	if st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return false
	}
	d.mu.Lock()
	busy := d.busy[IDOf(st)] != nil || d.creating[rel] > 0
	d.mu.Unlock()
	return !busy
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
	return d.localRecordAs(ctx, rel, st)
}

// localRecordAs is LocalRecord for a complete file whose lstat is st.
func (d *DMD) localRecordAs(ctx context.Context, rel string, st *syscall.Stat_t) (hfl.Record, bool) {
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

// existsHere reports whether something is at rel in the backing store,
// complete or not.
func (d *DMD) existsHere(rel string) bool {
	var st syscall.Stat_t
	return d.back.Lstat(rel, &st) == nil
}

// here is what one look at a path in the backing store found.
type here struct {
	present  bool // something is there
	complete bool // ...a regular file, complete and current here
}

// lookHere looks at rel in the backing store, with one lstat. It fails
// when something other than a regular file is there: a reader waiting for
// a file there would wait forever.
func (d *DMD) lookHere(ctx context.Context, rel string) (here, error) {
	var st syscall.Stat_t
	if d.back.Lstat(rel, &st) != nil {
		return here{}, nil
	}
	switch st.Mode & syscall.S_IFMT {
	case syscall.S_IFREG:
	case syscall.S_IFDIR:
		return here{}, fmt.Errorf("%s is a directory: %w", rel, ErrNotRegular)
	default:
		return here{}, fmt.Errorf("%s is not a regular file: %w", rel, ErrNotRegular)
	}
	if !d.completeAs(rel, &st) {
		return here{present: true}, nil
	}
	_, current := d.localRecordAs(ctx, rel, &st)
	return here{present: true, complete: current}, nil
}

// WaitPath blocks until the file rel is complete in the backing store and
// is the namespace's current version, and returns its backing path. A file
// published by another node is fetched. The wait, of thread tid (0: not a
// request), is listed while it lasts; it ends with ErrWaitTimeout,
// ErrShutdown, or ctx's error.
//
// One path for every waiting open: one registration with the locator
// (whatever ends the wait: a notice, the store, a change here), one look
// at the backing store per change, one fetch; the caller's goroutine is
// the only one that waits.
func (d *DMD) WaitPath(ctx context.Context, rel string, tid uint32) (string, error) {
	// Watch before looking, so that a change between the look and the
	// wait is not missed.
	w := d.loc.Watch(rel)
	defer w.Close()
	h, err := d.lookHere(ctx, rel)
	if err != nil || h.complete {
		return d.pathIf(rel, h.complete), err
	}
	ctx, waitFor, end := d.openWaits(ctx, rel, tid, "publish")
	defer end()
	ctx = context.WithValue(ctx, waitForKey{}, waitFor)

	// A record that arrived with a notice: sent ahead of its publish, or
	// carrying the file's bytes.
	var arrived hfl.Record
	committedOnly := false
	relooked := false
	for looked := true; ; looked = false {
		if !looked {
			w.Rearm()
		}
		// A record that arrived is fetched without another look: its
		// install never replaces what may have appeared meanwhile. One
		// of this node's own publishes is looked for here: the file
		// it describes is complete here now.
		if !looked && (arrived.Path == "" || arrived.Owner == d.cfg.Node) {
			if h, err = d.lookHere(ctx, rel); err != nil || h.complete {
				return d.pathIf(rel, h.complete), err
			}
		}
		var p string
		var after uint64
		if arrived.Path == "" {
			p, after, arrived, err = d.locateOnce(ctx, w, h, !committedOnly)
		}
		if err == nil && p == "" && arrived.Path != "" {
			p, after, err = d.fetchLocated(ctx, rel, arrived, h)
			// A record sent ahead that could not be fetched (the
			// owner is rewriting the file, say) is not taken again:
			// wait for what the store commits.
			committedOnly = committedOnly || arrived.Provisional
			arrived = hfl.Record{}
		}
		if err != nil || p != "" {
			return p, err
		}
		if after > 0 && !relooked && endsIfMissing(ctx) {
			// The version found is not to be had (its owner no
			// longer has it, say): one that does not wait for
			// missing files looks once more, in case the path is
			// gone, before it waits for the next version.
			relooked = true
			continue
		}
		var recheck time.Duration
		if d.cfg.SharedStorage && after > 0 {
			// Published, but this node's view of the shared directory
			// does not show it yet (attribute caches): look again soon.
			recheck = sharedRecheck
		} else if endsIfMissing(ctx) {
			// A removal tells a wait nothing it waits for (a newer
			// version): one that ends if the path goes looks again
			// now and then.
			recheck = missingRecheck
		}
		if arrived, err = d.waitChange(ctx, w, after, recheck, !committedOnly); err != nil {
			return "", err
		}
	}
}

func (d *DMD) pathIf(rel string, ok bool) string {
	if ok {
		return d.BackingPath(rel)
	}
	return ""
}

// sharedRecheck is how often a published file that shared storage does not
// show yet is looked at again.
const sharedRecheck = 100 * time.Millisecond

// missingRecheck is how often a wait that ends if its path goes (see
// EndsIfMissing) looks again.
const missingRecheck = time.Second

// storeRetry is how long a wait that the store failed waits before it
// looks again.
const storeRetry = 500 * time.Millisecond

// waitForKey carries, in a wait's context, the function that says what the
// wait is waiting for now.
type waitForKey struct{}

// endsIfMissingKey marks the context of a wait (see EndsIfMissing).
type endsIfMissingKey struct{}

// EndsIfMissing returns ctx for the wait of an open of a name its caller
// saw: if noWait says the caller does not wait for missing files
// (DYADFS_WAIT=0, a producer), the wait ends with fs.ErrNotExist once the
// namespace has nothing at the path (removed since the caller looked),
// instead of waiting for a publish the caller never asked to wait for. A
// file that is there but being rewritten is still waited for. noWait is
// asked only then, at most once.
func EndsIfMissing(ctx context.Context, noWait func() bool) context.Context {
	var once sync.Once
	var ends bool
	return context.WithValue(ctx, endsIfMissingKey{}, func() bool {
		once.Do(func() { ends = noWait() })
		return ends
	})
}

// endsIfMissing reports whether ctx's wait ends when its path is missing.
func endsIfMissing(ctx context.Context) bool {
	f, ok := ctx.Value(endsIfMissingKey{}).(func() bool)
	return ok && f()
}

// clearForFetch reports whether a fetched file may be installed at rel:
// nothing is there, or only what the namespace replaced (a copy of an
// older version, this node's file replaced elsewhere), which is removed.
// Something being written here or of another kind is left alone.
func (d *DMD) clearForFetch(ctx context.Context, rel string) bool {
	var st syscall.Stat_t
	if d.back.Lstat(rel, &st) != nil {
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
	d.removeBeneath(rel, false, &st)
	return !d.existsHere(rel)
}

// locateOnce looks for w's path through the locator, past this node's
// backing store (h is what it has). It returns the backing path when the
// file is complete here (fetching it if it is complete elsewhere), or the
// generation to wait past. With takeAhead, the locator may find a record
// sent ahead of its publish: that is returned as arrived, for the caller
// to fetch.
func (d *DMD) locateOnce(ctx context.Context, w *hfl.Watch, h here, takeAhead bool) (path string, after uint64, arrived hfl.Record, err error) {
	rel := w.Path()
	rec, _, err := d.loc.LocateWaiting(ctx, w, takeAhead)
	switch {
	case errors.Is(err, hfl.ErrNotFound):
		// A file being made here (h.present) is waited for by
		// everyone: its writer publishes it at close.
		if !h.present && endsIfMissing(ctx) {
			return "", 0, hfl.Record{}, fmt.Errorf("%s is published nowhere: %w", rel, fs.ErrNotExist)
		}
		return "", 0, hfl.Record{}, nil
	case err != nil:
		if ctx.Err() != nil {
			return "", 0, hfl.Record{}, d.waitErr(ctx)
		}
		// The store is unreachable (restarting, say): keep waiting; the
		// wait reconnects and sees what is published meanwhile.
		d.log.Warn("metadata store unavailable while locating; waiting", "path", rel, "err", err)
		return "", 0, hfl.Record{}, nil
	case rec.Provisional:
		return "", 0, rec, nil
	}
	path, after, err = d.fetchLocated(ctx, rel, rec, h)
	return path, after, hfl.Record{}, err
}

// fetchLocated fetches rel as rec, found by the locator (or sent ahead of
// its publish), describes it; h is what the backing store had when the
// wait last looked. It returns the backing path when the file is complete
// here, or the generation to wait past.
func (d *DMD) fetchLocated(ctx context.Context, rel string, rec hfl.Record, h here) (path string, after uint64, err error) {
	if rec.Writing || rec.Owner == d.cfg.Node || d.cfg.SharedStorage || (h.present && !d.clearForFetch(ctx, rel)) {
		// Being rewritten (here or elsewhere), published from this
		// backing store but not complete here, or being written here:
		// wait for the writer or a newer publish rather than fetch over
		// it.
		return "", rec.Generation, nil
	}
	if d.fetcher == nil {
		return "", 0, fmt.Errorf("%s published by node %s: %w", rel, rec.Owner, ErrNoTransport)
	}
	switch _, err := d.openRanged(ctx, rel, rec); {
	case err == nil:
		d.loc.Hold(ctx, rel, false) // it must hear of changes
		return d.BackingPath(rel), 0, nil
	case errors.Is(err, dtl.ErrStale):
		// The owner no longer has that version: wait for the next.
		d.loc.Forget(rel)
		return "", rec.Generation, nil
	case errors.Is(err, ErrNoRoom):
		return "", 0, err
	case !errors.Is(err, errNoRanges):
		if ctx.Err() != nil {
			return "", 0, d.waitErr(ctx)
		}
		d.stats.fetchErrors.Add(1)
		return "", 0, fmt.Errorf("%w: %s from %s: %w", ErrFetch, rel, rec.Owner, err)
	}
	done, err := d.makeRoom(ctx, rel, rec.Size)
	if err != nil {
		return "", 0, err
	}
	defer done()
	d.loc.Hold(ctx, rel, false) // the copy must hear of changes
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
		d.loc.Changed(rel)
		if c, ok := d.copyOf(rel); ok && c.owner == rec.Owner && c.gen >= rec.Generation {
			// Installed: complete here, at the version located
			// or newer.
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

// waitChange blocks until w's path changes here, a record of it newer
// than after reaches this node, recheck (if not zero) passes, or the wait
// ends.
//
// It returns the record that arrived, if one did: the caller fetches it
// without asking the locator again.
func (d *DMD) waitChange(ctx context.Context, w *hfl.Watch, after uint64, recheck time.Duration, takeAhead bool) (hfl.Record, error) {
	wctx := ctx
	if recheck > 0 {
		var cancel context.CancelFunc
		wctx, cancel = context.WithTimeout(ctx, recheck)
		defer cancel()
	}
	rec, err := d.loc.Await(wctx, w, after, takeAhead)
	switch {
	case err == nil:
		d.log.Debug("record arrived", "path", w.Path(), "provisional", rec.Provisional)
		return rec, nil
	case errors.Is(err, hfl.ErrChangedHere):
		return hfl.Record{}, nil
	case ctx.Err() != nil:
		return hfl.Record{}, d.waitErr(ctx)
	case wctx.Err() != nil:
		return hfl.Record{}, nil // time to look again
	case errors.Is(err, hfl.ErrClosed):
		return hfl.Record{}, ErrShutdown
	case errors.Is(err, hfl.ErrUnavailable):
		// The store is unreachable (restarting, say): the wait goes
		// on, and looks again in a moment.
		d.log.Debug("metadata store unavailable while waiting; waiting on", "path", w.Path(), "err", err)
		t := time.NewTimer(storeRetry)
		defer t.Stop()
		select {
		case <-t.C:
			return hfl.Record{}, nil
		case <-ctx.Done():
			return hfl.Record{}, d.waitErr(ctx)
		}
	}
	return hfl.Record{}, fmt.Errorf("wait for %s: %w", w.Path(), err)
}
