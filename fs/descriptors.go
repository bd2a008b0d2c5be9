package fs

import (
	"context"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/dyadfs/dyadfs/fs/caller"
)

// Every open file handle holds a descriptor of its backing file until the
// kernel releases it, and the kernel releases handles after close returns,
// in the background: many writers that each close and create again can
// run ahead of the releases (each one publishes), and the daemon would run
// out of descriptors, failing creates with EMFILE. fdGuard bounds the
// handles instead: when they reach the cap, an open waits until a release
// frees one (backpressure), so a create never fails for the daemon's own
// descriptors. The cap leaves room below the limit for everything else the
// daemon opens (sockets, fetches, directories).
type fdGuard struct {
	log   *slog.Logger
	limit int64 // RLIMIT_NOFILE, raised to the hard limit
	kept  int64 // /proc files kept open at most

	cap       atomic.Int64 // open handles at most
	refreshed atomic.Int64 // when cap was set, in Unix ns

	handles atomic.Int64
	waiting atomic.Int32
	held    atomic.Uint64 // opens that had to wait

	mu    sync.Mutex
	freed chan struct{} // closed when a handle is released while opens wait
}

// stuckAfter is how long an open waits for a release before it fails with
// EMFILE: the handles are then held open by programs, not by releases that
// lag behind, and only the limit can help.
const stuckAfter = 10 * time.Second

// raiseFileLimit raises the soft descriptor limit to the hard one (the Go
// runtime does too, but says nothing) and returns it.
func raiseFileLimit(log *slog.Logger) int64 {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 1024
	}
	if rl.Cur < rl.Max {
		raised := rl
		raised.Cur = rl.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &raised); err == nil {
			rl = raised
		} else {
			log.Warn("cannot raise the descriptor limit", "soft", rl.Cur, "hard", rl.Max, "err", err)
		}
	}
	return int64(min(rl.Cur, 1<<31))
}

// openDescriptors counts the daemon's open descriptors.
func openDescriptors() int {
	f, err := os.Open("/proc/self/fd")
	if err != nil {
		return -1
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return -1
	}
	return len(names) - 1 // the directory being read
}

// newFdGuard sizes the guard from the limit: the /proc files kept to
// tell callers apart get an eighth of it (at most
// caller.DefaultKeptFiles), and handles what is left (see refresh).
func newFdGuard(log *slog.Logger) *fdGuard {
	limit := raiseFileLimit(log)
	kept := min(limit/8, caller.DefaultKeptFiles)
	caller.SetKeptFiles(int(kept))
	g := &fdGuard{log: log, limit: limit, kept: kept}
	g.refresh()
	log.Debug("descriptors", "limit", limit, "proc files kept", kept, "handles at most", g.cap.Load())
	return g
}

// refresh sets the cap of handles from what else the daemon holds now
// (sockets to the store and to every peer, logs, and the /proc files it
// may keep, open or not yet), keeping a reserve for descriptors that come
// and go (a lookup's directory, a fetch, a new peer): 16 and an eighth of
// the limit. At least 4.
func (g *fdGuard) refresh() {
	g.refreshed.Store(time.Now().UnixNano())
	open := int64(openDescriptors())
	if open < 0 {
		return
	}
	keptOpen, keptMost := caller.KeptFiles()
	others := max(open-g.handles.Load()-int64(keptOpen), 0) + int64(keptMost)
	g.cap.Store(max(g.limit-others-16-g.limit/8, 4))
}

// The daemon's descriptors are counted again at most every refreshEvery,
// or every refreshNear once the handles are past half their cap.
const (
	refreshEvery = time.Second
	refreshNear  = 50 * time.Millisecond
)

// refreshAfter refreshes the cap if it was set longer than every ago; of
// opens that find it so at once, one counts.
func (g *fdGuard) refreshAfter(every time.Duration) {
	then := g.refreshed.Load()
	if time.Now().UnixNano()-then > int64(every) && g.refreshed.CompareAndSwap(then, time.Now().UnixNano()) {
		g.refresh()
	}
}

// admit waits, if the handles are at the cap, until one is released. It
// fails with EINTR when the open is interrupted, and with EMFILE when no
// handle is released for stuckAfter.
func (g *fdGuard) admit(ctx context.Context) syscall.Errno {
	if g.handles.Load() >= g.cap.Load()/2 {
		g.refreshAfter(refreshNear)
	} else {
		g.refreshAfter(refreshEvery)
	}
	if g.handles.Load() < g.cap.Load() {
		return 0
	}
	g.held.Add(1)
	g.waiting.Add(1)
	defer g.waiting.Add(-1)
	timer := time.NewTimer(stuckAfter)
	defer timer.Stop()
	for {
		g.refreshAfter(refreshNear)
		g.mu.Lock()
		if g.handles.Load() < g.cap.Load() {
			g.mu.Unlock()
			return 0
		}
		if g.freed == nil {
			g.freed = make(chan struct{})
		}
		freed := g.freed
		g.mu.Unlock()
		select {
		case <-freed:
			timer.Reset(stuckAfter)
		case <-ctx.Done():
			return syscall.EINTR
		case <-timer.C:
			g.log.Warn("open refused: the daemon's file handles are all held open; raise its descriptor limit (ulimit -n, LimitNOFILE)",
				"handles", g.handles.Load(), "limit", g.limit)
			return syscall.EMFILE
		}
	}
}

// opened counts a handle.
func (g *fdGuard) opened() { g.handles.Add(1) }

// released uncounts a handle and wakes the opens that wait.
func (g *fdGuard) released() {
	g.handles.Add(-1)
	if g.waiting.Load() == 0 {
		return
	}
	g.mu.Lock()
	if g.freed != nil {
		close(g.freed)
		g.freed = nil
	}
	g.mu.Unlock()
}

// Descriptors is the status's view of the daemon's descriptors.
type Descriptors struct {
	Open  int   `json:"open" metric:"-"`
	Limit int64 `json:"limit" metric:"-"`
	// Handles are the open file handles, each holding a backing
	// descriptor; opens wait while they are at HandlesMax.
	Handles    int64 `json:"handles"`
	HandlesMax int64 `json:"handles_max" metric:"-"`
	// OpensHeld counts opens that waited for a release; OpensWaiting are
	// those waiting now.
	OpensHeld    uint64 `json:"opens_held"`
	OpensWaiting int32  `json:"opens_waiting"`
}

func (g *fdGuard) status() Descriptors {
	return Descriptors{Open: openDescriptors(), Limit: g.limit, Handles: g.handles.Load(), HandlesMax: g.cap.Load(),
		OpensHeld: g.held.Load(), OpensWaiting: g.waiting.Load()}
}
