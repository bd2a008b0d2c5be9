package hfl

import (
	"context"
	"errors"
	"sync"
)

// ErrChangedHere ends an Await when the managed directory of this node
// changed the path (see Changed): the caller looks at it again.
var ErrChangedHere = errors.New("changed on this node")

// Waits is the one registry of waits for paths. Whatever may end a wait
// fires the path's entry: a notice (holder.go), a change in this node's
// managed directory (Changed). A wait on the global store runs in the
// waiting goroutine itself, under a context the entry cancels, so that a
// waiting open parks one goroutine however it ends.
type Waits struct {
	mu     sync.Mutex
	byPath map[string]*pathWait
}

// pathWait wakes every wait for one path at the path's next change; a
// change arms a new one for the waits that go on.
type pathWait struct {
	ch    chan struct{} // closed at the change
	users int
	// What the change was, once ch is closed: a record a notice told
	// (told), or a change on this node (here).
	rec  Record
	told bool
	here bool
	// cancels end the store calls made under this entry.
	cancels []context.CancelFunc
}

func newWaits() *Waits { return &Waits{byPath: make(map[string]*pathWait)} }

// Watch is one wait's registration for a path. Take it before looking at
// the path, so that a change between the look and the wait ends the wait.
type Watch struct {
	ws   *Waits
	path string
	w    *pathWait
}

// Watch registers a wait for path; Close ends it.
func (l *Locator) Watch(path string) *Watch {
	w := &Watch{ws: l.waits, path: path}
	w.w = l.waits.take(path)
	return w
}

// Close ends the registration.
func (w *Watch) Close() { w.ws.drop(w.path, w.w) }

// Changed wakes the waits for path: the managed directory changed it on
// this node (a file completed, removed, installed).
func (l *Locator) Changed(path string) { l.waits.Fire(path, nil, true) }

// Fired reports whether the path changed since the watch was (re)armed.
func (w *Watch) Fired() bool {
	select {
	case <-w.w.ch:
		return true
	default:
		return false
	}
}

// Path is the watched path.
func (w *Watch) Path() string { return w.path }

// Done is closed at the path's next change.
func (w *Watch) Done() <-chan struct{} { return w.w.ch }

// Told returns, once fired, the record a notice told of the path (ok
// false: the change was not told with a record).
func (w *Watch) Told() (rec Record, ok bool) { return w.w.rec, w.w.told }

// ChangedHere reports, once fired, whether the change was made on this
// node (see Locator.Changed).
func (w *Watch) ChangedHere() bool { return w.w.here }

// Rearm moves the watch to the path's next change: call it after a
// change ended a wait, before looking at the path again.
func (w *Watch) Rearm() {
	old := w.w
	w.w = w.ws.take(w.path)
	w.ws.drop(w.path, old)
}

// CancelOnChange returns a context derived from ctx that ends at the
// path's next change (or when stop is called).
func (w *Watch) CancelOnChange(ctx context.Context) (context.Context, context.CancelFunc) {
	cctx, cancel := context.WithCancel(ctx)
	ws, pw := w.ws, w.w
	ws.mu.Lock()
	select {
	case <-pw.ch:
		cancel()
	default:
		pw.cancels = append(pw.cancels, cancel)
	}
	ws.mu.Unlock()
	return cctx, cancel
}

func (ws *Waits) take(p string) *pathWait {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	w, ok := ws.byPath[p]
	if !ok {
		w = &pathWait{ch: make(chan struct{})}
		ws.byPath[p] = w
	}
	w.users++
	return w
}

func (ws *Waits) drop(p string, w *pathWait) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if w.users--; w.users == 0 && ws.byPath[p] == w {
		delete(ws.byPath, p)
	}
}

// Fire ends the waits for p: told rec (not nil), or a change here.
func (ws *Waits) Fire(p string, rec *Record, here bool) {
	ws.mu.Lock()
	w, ok := ws.byPath[p]
	if ok {
		delete(ws.byPath, p)
		if rec != nil {
			w.rec, w.told = *rec, true
		}
		w.here = here
		close(w.ch)
	}
	ws.mu.Unlock()
	if ok {
		for _, cancel := range w.cancels {
			cancel()
		}
	}
}

// Paths returns the paths that have waits now.
func (ws *Waits) Paths() map[string]struct{} {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	out := make(map[string]struct{}, len(ws.byPath))
	for p := range ws.byPath {
		out[p] = struct{}{}
	}
	return out
}

// WaitingPaths is how many paths have waits.
func (l *Locator) WaitingPaths() int { return l.waits.len() }

func (ws *Waits) len() int {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	return len(ws.byPath)
}

// Wait blocks until the job has a record of path newer than generation
// after, and returns it (changes on this node do not end it).
func (l *Locator) Wait(ctx context.Context, path string, after uint64) (Record, error) {
	return l.waitRecord(ctx, path, after, false)
}

// WaitAhead is Wait, but it may also return a provisional record: one sent
// by its owner ahead of the store's commit, whose file the owner serves.
func (l *Locator) WaitAhead(ctx context.Context, path string, after uint64) (Record, error) {
	return l.waitRecord(ctx, path, after, true)
}

func (l *Locator) waitRecord(ctx context.Context, path string, after uint64, ahead bool) (Record, error) {
	w := l.Watch(path)
	defer w.Close()
	for {
		rec, err := l.Await(ctx, w, after, ahead)
		if !errors.Is(err, ErrChangedHere) {
			return rec, err
		}
		w.Rearm()
	}
}
