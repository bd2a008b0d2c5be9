package dmd

import (
	"context"
	"sort"
	"sync"
	"time"

	"github.com/dyadfs/dyadfs/fs/caller"
)

// Every open that waits is listed, so that a hang can be seen (dyadfs
// status lists them) and its cause found; one that lasts longer than
// Config.WaitLogAfter is logged, with the same details.

// Waiter is an open that waits, as the status shows it.
type Waiter struct {
	Path    string `json:"path"`
	Pid     uint32 `json:"pid"`
	Command string `json:"command"`
	// For says what it waits for: "publish" (the path is published nowhere
	// yet, or is being rewritten elsewhere), "writer" (a writer on this
	// node has the file open), "fetch" (the file is on its way here);
	// "rewrite told" is a close telling the nodes that hold the file of
	// its rewrite.
	For     string  `json:"for"`
	Seconds float64 `json:"waited_seconds"`
}

type waiters struct {
	mu   sync.Mutex
	next uint64
	m    map[uint64]*waiting
}

type waiting struct {
	w     Waiter
	tid   uint32 // whose process and command are read when shown
	named bool
	since time.Time
	timer *time.Timer
}

// shown returns the waiter as shown, its process named (read once, when
// first shown: most waits end before anyone looks). ws.mu must be held.
func (w *waiting) shown() Waiter {
	if !w.named && w.tid != 0 {
		w.w.Pid = processOf(w.tid)
		w.w.Command = caller.Comm(w.tid)
		w.named = true
	}
	info := w.w
	info.Seconds = time.Since(w.since).Seconds()
	return info
}

// startWait lists a wait for rel by thread tid (0: not a request) and
// returns the function that ends it, and the one that says what it waits
// for now.
func (d *DMD) startWait(rel string, tid uint32, what string) (done func(), now func(string)) {
	ws := &d.waiters
	w := &waiting{w: Waiter{Path: rel, For: what}, tid: tid, since: time.Now()}
	ws.mu.Lock()
	if ws.m == nil {
		ws.m = make(map[uint64]*waiting)
	}
	ws.next++
	id := ws.next
	ws.m[id] = w
	ws.mu.Unlock()
	after := d.cfg.WaitLogAfter
	if after <= 0 {
		after = 10 * time.Second
	}
	w.timer = time.AfterFunc(after, func() {
		ws.mu.Lock()
		info := w.shown()
		ws.mu.Unlock()
		d.log.Warn("an open has been waiting long", "path", info.Path, "pid", info.Pid, "command", info.Command,
			"for", info.For, "waited", time.Since(w.since).Round(time.Second))
	})
	done = func() {
		w.timer.Stop()
		ws.mu.Lock()
		delete(ws.m, id)
		ws.mu.Unlock()
	}
	now = func(what string) {
		ws.mu.Lock()
		w.w.For = what
		ws.mu.Unlock()
	}
	return done, now
}

// Waiters lists the opens that wait now, longest first.
func (d *DMD) Waiters() []Waiter {
	ws := &d.waiters
	ws.mu.Lock()
	out := make([]Waiter, 0, len(ws.m))
	for _, w := range ws.m {
		out = append(out, w.shown())
	}
	ws.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Seconds > out[j].Seconds })
	return out
}

// openWaits begins the wait of an open of rel by thread tid for what: it
// is bounded as every wait is (see waitContext), counted, and listed in
// the status until end is called. now changes what it waits for.
func (d *DMD) openWaits(ctx context.Context, rel string, tid uint32, what string) (wctx context.Context, now func(string), end func()) {
	ctx, cancel := d.waitContext(ctx)
	start := time.Now()
	d.stats.opensWaited.Add(1)
	done, now := d.startWait(rel, tid, what)
	return ctx, now, func() {
		done()
		d.stats.waited(time.Since(start))
		cancel()
	}
}
