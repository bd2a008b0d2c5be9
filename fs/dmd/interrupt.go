package dmd

import (
	"context"
	"errors"
	"reflect"
	"sync"

	"github.com/dyadfs/dyadfs/internal/workers"
)

// A FUSE request's context (go-fuse's fuse.Context) is not one of the
// standard library's, so every context derived from it parks a goroutine
// that waits for the request's interruption. A waiting open derives
// several (its timeout, the locator's registration), so waitContext
// detaches a wait from its request instead (see detach), and a few
// goroutines watch the interruptions of all waits: one per
// waitsPerWatcher of them.

// waitsPerWatcher is how many waits one watcher goroutine looks after.
const waitsPerWatcher = 64

// interruptWatch is one wait's interruption: done, the request's channel,
// and what to call when it closes.
type interruptWatch struct {
	done   <-chan struct{}
	err    func() error // the request's Err
	cancel context.CancelFunc
}

// interrupts is the set of watchers.
type interrupts struct {
	mu       sync.Mutex
	watchers []*interruptWatcher
}

// interruptWatcher is one goroutine's share of the waits. It runs while it
// has any.
type interruptWatcher struct {
	changed chan struct{} // its share changed: select again
	waits   map[*interruptWatch]struct{}
}

var requestInterrupts interrupts

// detach returns a context with ctx's values and deadline that is
// canceled when ctx is, or when the returned function is called, without
// parking a goroutine of its own.
func detach(ctx context.Context) (context.Context, context.CancelFunc) {
	base := context.WithoutCancel(ctx)
	var dctx context.Context
	var cancel context.CancelFunc
	if deadline, ok := ctx.Deadline(); ok {
		dctx, cancel = context.WithDeadline(base, deadline)
	} else {
		dctx, cancel = context.WithCancel(base)
	}
	if ctx.Done() == nil {
		return dctx, cancel
	}
	stop := requestInterrupts.watch(ctx.Done(), ctx.Err, cancel)
	return dctx, func() {
		stop()
		cancel()
	}
}

// watch calls cancel when done closes, until stop is called.
func (in *interrupts) watch(done <-chan struct{}, err func() error, cancel context.CancelFunc) (stop func()) {
	iw := &interruptWatch{done: done, err: err, cancel: cancel}
	in.mu.Lock()
	var w *interruptWatcher
	for _, cand := range in.watchers {
		if len(cand.waits) < waitsPerWatcher {
			w = cand
			break
		}
	}
	if w == nil {
		w = &interruptWatcher{changed: make(chan struct{}, 1), waits: make(map[*interruptWatch]struct{})}
		in.watchers = append(in.watchers, w)
		workers.Go(func() { in.run(w) })
	}
	w.waits[iw] = struct{}{}
	in.mu.Unlock()
	w.poke()
	return func() {
		in.mu.Lock()
		_, ok := w.waits[iw]
		delete(w.waits, iw)
		in.mu.Unlock()
		if ok {
			w.poke()
		}
	}
}

func (w *interruptWatcher) poke() {
	select {
	case w.changed <- struct{}{}:
	default:
	}
}

// run selects on the interruptions of w's waits until it has none left.
func (in *interrupts) run(w *interruptWatcher) {
	var cases []reflect.SelectCase
	var waits []*interruptWatch
	for {
		in.mu.Lock()
		if len(w.waits) == 0 {
			for i, cand := range in.watchers {
				if cand == w {
					in.watchers = append(in.watchers[:i], in.watchers[i+1:]...)
					break
				}
			}
			in.mu.Unlock()
			return
		}
		cases = append(cases[:0], reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(w.changed)})
		waits = waits[:0]
		for iw := range w.waits {
			cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(iw.done)})
			waits = append(waits, iw)
		}
		in.mu.Unlock()
		chosen, _, _ := reflect.Select(cases)
		if chosen == 0 {
			continue
		}
		iw := waits[chosen-1]
		in.mu.Lock()
		delete(w.waits, iw)
		in.mu.Unlock()
		// A request that reached its deadline is left to the detached
		// context's own timer (the same deadline, so it fires now):
		// the wait then ends with DeadlineExceeded, not Canceled.
		if !errors.Is(iw.err(), context.DeadlineExceeded) {
			iw.cancel()
		}
	}
}
