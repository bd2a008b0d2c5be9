//go:build flux

package flux

/*
#cgo pkg-config: flux-core
#include <flux/core.h>
#include <stdint.h>
#include <stdlib.h>

// Callbacks into Go (callbacks.go). A cgo.Handle travels as the void*
// argument, cast from and to uintptr_t on the C side only.
extern void goFluxWake(uintptr_t h);
extern void goFluxFuture(flux_future_t *f, uintptr_t h);
extern void goFluxRequest(flux_msg_t *msg, uintptr_t h);
extern void goFluxEvent(flux_msg_t *msg, uintptr_t h);

static void dyadfs_wake_cb(flux_reactor_t *r, flux_watcher_t *w, int revents, void *arg) {
	goFluxWake((uintptr_t)arg);
}

flux_watcher_t *dyadfs_wake_watcher(flux_reactor_t *r, int fd, uintptr_t h) {
	return flux_fd_watcher_create(r, fd, FLUX_POLLIN, dyadfs_wake_cb, (void *)h);
}

static void dyadfs_future_cb(flux_future_t *f, void *arg) {
	goFluxFuture(f, (uintptr_t)arg);
}

int dyadfs_future_then(flux_future_t *f, uintptr_t h) {
	return flux_future_then(f, -1.0, dyadfs_future_cb, (void *)h);
}

static void dyadfs_request_cb(flux_t *h, flux_msg_handler_t *mh, const flux_msg_t *msg, void *arg) {
	goFluxRequest((flux_msg_t *)msg, (uintptr_t)arg);
}

flux_msg_handler_t *dyadfs_request_handler(flux_t *h, const char *glob, uintptr_t arg) {
	struct flux_match m = FLUX_MATCH_REQUEST;
	m.topic_glob = (char *)glob;
	return flux_msg_handler_create(h, m, dyadfs_request_cb, (void *)arg);
}
static void dyadfs_event_cb(flux_t *h, flux_msg_handler_t *mh, const flux_msg_t *msg, void *arg) {
	goFluxEvent((flux_msg_t *)msg, (uintptr_t)arg);
}

flux_msg_handler_t *dyadfs_event_handler(flux_t *h, const char *glob, uintptr_t arg) {
	struct flux_match m = FLUX_MATCH_EVENT;
	m.topic_glob = (char *)glob;
	return flux_msg_handler_create(h, m, dyadfs_event_cb, (void *)arg);
}
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"runtime/cgo"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Built tells whether this binary was built with Flux (the flux build tag).
const Built = true

// NodeAny addresses an RPC to whichever broker routes it (FLUX_NODEID_ANY).
const NodeAny = ^uint32(0)

// Handle is a connection to a Flux broker. Its methods may be called from
// any goroutine; they run on the handle's reactor thread.
type Handle struct {
	rank, size uint32

	calls chan func()
	wakeW int           // write end of the pipe that wakes the reactor
	done  chan struct{} // closed when the reactor thread has let go of the handle

	mu      sync.Mutex
	closing bool
	closed  atomic.Bool
	// failed says that the reactor stopped on an error of the
	// connection, not by Close.
	failed atomic.Bool

	// Owned by the reactor thread.
	h       *C.flux_t
	r       *C.flux_reactor_t
	wakeR   int
	pending map[*pendingFuture]struct{}
	self    cgo.Handle
	// handlers are the message handlers made from the handle (services,
	// event subscriptions), released before the handle is closed.
	handlers map[releaser]struct{}
}

// releaser frees what a message handler holds, on the reactor thread.
type releaser interface{ release() }

// msgHandler is the C side of a message handler (a service's or a
// subscription's), owned by the reactor thread: the handler, its topic
// glob and the cgo.Handle by which its callbacks find the Go side.
type msgHandler struct {
	mh   *C.flux_msg_handler_t
	glob *C.char
	self cgo.Handle
}

// free destroys and forgets whichever of them was made.
func (m *msgHandler) free() {
	if m.mh != nil {
		C.flux_msg_handler_destroy(m.mh)
		m.mh = nil
	}
	if m.glob != nil {
		C.free(unsafe.Pointer(m.glob))
		m.glob = nil
	}
	if m.self != 0 {
		m.self.Delete()
		m.self = 0
	}
}

// Open connects to the broker at uri ("": FLUX_URI from the environment,
// as every process of a Flux job has it) and starts the reactor thread.
func Open(uri string) (*Handle, error) {
	h := &Handle{calls: make(chan func(), 1024), done: make(chan struct{}), pending: make(map[*pendingFuture]struct{}),
		handlers: make(map[releaser]struct{})}
	started := make(chan error, 1)
	go h.loop(uri, started)
	if err := <-started; err != nil {
		return nil, err
	}
	return h, nil
}

// loop is the reactor thread: it owns the flux_t and everything made from
// it, and runs every call the other goroutines send.
func (h *Handle) loop(uri string, started chan<- error) {
	// A Flux handle and its reactor belong to one thread. The thread is
	// never unlocked: it ends with the goroutine.
	runtime.LockOSThread()
	defer close(h.done)
	var curi *C.char
	if uri != "" {
		curi = C.CString(uri)
		defer C.free(unsafe.Pointer(curi))
	}
	fh, err := C.flux_open(curi, 0)
	if fh == nil {
		started <- &Error{Op: "open " + uriOrDefault(uri), Errno: errnoOf(err)}
		return
	}
	defer C.flux_close(fh)
	h.h = fh
	var rank, size C.uint32_t
	if rc, err := C.flux_get_rank(fh, &rank); rc < 0 {
		started <- &Error{Op: "get rank", Errno: errnoOf(err)}
		return
	}
	if rc, err := C.flux_get_size(fh, &size); rc < 0 {
		started <- &Error{Op: "get size", Errno: errnoOf(err)}
		return
	}
	h.rank, h.size = uint32(rank), uint32(size)
	h.r = C.flux_get_reactor(fh)
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_NONBLOCK|unix.O_CLOEXEC); err != nil {
		started <- fmt.Errorf("flux: wake pipe: %w", err)
		return
	}
	h.wakeR, h.wakeW = p[0], p[1]
	defer unix.Close(h.wakeR)
	h.self = cgo.NewHandle(h)
	defer h.self.Delete()
	w := C.dyadfs_wake_watcher(h.r, C.int(h.wakeR), C.uintptr_t(h.self))
	if w == nil {
		unix.Close(h.wakeW)
		started <- errors.New("flux: cannot watch the wake pipe")
		return
	}
	defer C.flux_watcher_destroy(w)
	C.flux_watcher_start(w)
	started <- nil
	if rc := C.flux_reactor_run(h.r, 0); rc < 0 {
		// The connection failed (the broker died, say): every call
		// from now on fails with ErrClosed.
		h.failed.Store(true)
	}
	// Stopped by Close: what is still pending fails.
	for p := range h.pending {
		p.fail(ErrClosed)
		C.flux_future_destroy(p.f)
		p.self.Delete()
	}
	h.pending = nil
	for r := range h.handlers {
		r.release()
	}
}

func uriOrDefault(uri string) string {
	if uri == "" {
		return "$FLUX_URI"
	}
	return uri
}

// errnoOf is the errno of a failed C call.
func errnoOf(err error) syscall.Errno {
	var e syscall.Errno
	if errors.As(err, &e) {
		return e
	}
	return syscall.EIO
}

// Rank is the rank of the broker the handle is connected to: the node's
// id in the instance.
func (h *Handle) Rank() uint32 { return h.rank }

// Size is the number of brokers of the instance.
func (h *Handle) Size() uint32 { return h.size }

// Close stops the reactor thread and closes the handle; calls in progress
// fail with ErrClosed, and the handle's services go away with it.
func (h *Handle) Close() error {
	h.mu.Lock()
	if h.closing {
		h.mu.Unlock()
		<-h.done
		return nil
	}
	h.closing = true
	h.mu.Unlock()
	h.post(func() { C.flux_reactor_stop(h.r) })
	<-h.done
	h.closed.Store(true)
	unix.Close(h.wakeW)
	return nil
}

// post runs fn on the reactor thread, later; it reports false if the
// handle is closed.
func (h *Handle) post(fn func()) bool {
	select {
	case <-h.done:
		return false
	default:
	}
	select {
	case h.calls <- fn:
	case <-h.done:
		return false
	}
	// After the send: a reactor that drained the channel before it
	// arrived wakes again for it.
	unix.Write(h.wakeW, []byte{1})
	return true
}

// do runs fn on the reactor thread and waits until it ran.
func (h *Handle) do(fn func()) error {
	ran := make(chan struct{})
	if !h.post(func() { fn(); close(ran) }) {
		return ErrClosed
	}
	select {
	case <-ran:
		return nil
	case <-h.done:
		select {
		case <-ran:
			return nil
		default:
			return ErrClosed
		}
	}
}

// wake runs on the reactor thread when the pipe is readable: it runs the
// calls that are waiting.
func (h *Handle) wake() {
	var buf [256]byte
	for {
		if n, _ := unix.Read(h.wakeR, buf[:]); n < len(buf) {
			break
		}
	}
	for {
		select {
		case fn := <-h.calls:
			fn()
		default:
			return
		}
	}
}

// pendingFuture is a Flux future the reactor thread waits on. ready runs
// on the reactor thread each time the future is fulfilled (once per
// response of a stream) and says whether more are to come; fail runs
// instead when the handle closes first.
type pendingFuture struct {
	h     *Handle
	f     *C.flux_future_t
	self  cgo.Handle
	ready func(f *C.flux_future_t) (more bool)
	fail  func(err error)
}

// confirm waits, on the reactor thread (the caller), for f: a request
// started as what, whose answer is only success or failure. On failure it
// calls undo and reports the error to done; on success, ok, then done.
func (h *Handle) confirm(f *C.flux_future_t, what string, ok, undo func(), done func(struct{}, error)) {
	err := h.then(f, func(f *C.flux_future_t) bool {
		if err := futureErr(what, f); err != nil {
			undo()
			done(struct{}{}, err)
			return false
		}
		ok()
		done(struct{}{}, nil)
		return false
	}, func(err error) { done(struct{}{}, err) })
	if err != nil {
		undo()
		done(struct{}{}, err)
	}
}

// then waits for f on the reactor thread (which must be the caller).
func (h *Handle) then(f *C.flux_future_t, ready func(*C.flux_future_t) bool, fail func(error)) error {
	_, err := h.thenP(f, ready, fail)
	return err
}

// thenP is then, returning the pending future (see abandon).
func (h *Handle) thenP(f *C.flux_future_t, ready func(*C.flux_future_t) bool, fail func(error)) (*pendingFuture, error) {
	p := &pendingFuture{h: h, f: f, ready: ready, fail: fail}
	p.self = cgo.NewHandle(p)
	if rc, err := C.dyadfs_future_then(f, C.uintptr_t(p.self)); rc < 0 {
		p.self.Delete()
		C.flux_future_destroy(f)
		return nil, &Error{Op: "future then", Errno: errnoOf(err)}
	}
	h.pending[p] = struct{}{}
	return p, nil
}

// abandon destroys p if it is still pending (its responses are dropped),
// from any goroutine.
func (h *Handle) abandon(p *pendingFuture) {
	h.post(func() {
		if _, ok := h.pending[p]; ok {
			delete(h.pending, p)
			C.flux_future_destroy(p.f)
			p.self.Delete()
		}
	})
}

// whilePending runs fn with p's future on the reactor thread, if p is
// still pending.
func (h *Handle) whilePending(p *pendingFuture, fn func(f *C.flux_future_t)) {
	h.post(func() {
		if _, ok := h.pending[p]; ok {
			fn(p.f)
		}
	})
}

// futureReady is goFluxFuture's work for p.
func (h *Handle) futureReady(p *pendingFuture) {
	if p.ready(p.f) {
		C.flux_future_reset(p.f)
		return
	}
	delete(h.pending, p)
	C.flux_future_destroy(p.f)
	p.self.Delete()
}

// futureErr is the error f was fulfilled with, or nil.
func futureErr(op string, f *C.flux_future_t) error {
	if rc, err := C.flux_future_get(f, nil); rc < 0 {
		e := &Error{Op: op, Errno: errnoOf(err)}
		if C.flux_future_has_error(f) {
			e.Msg = C.GoString(C.flux_future_error_string(f))
		}
		return e
	}
	return nil
}

type result[T any] struct {
	v   T
	err error
}

// call runs start on the reactor thread; start (or a future it waits on)
// calls done once with the outcome, which call returns. ctx's end
// abandons the wait (the outcome is dropped when it comes).
func call[T any](ctx context.Context, h *Handle, start func(done func(T, error))) (T, error) {
	ch := make(chan result[T], 1)
	var zero T
	done := func(v T, err error) {
		select {
		case ch <- result[T]{v, err}:
		default: // called twice: the first outcome stands
		}
	}
	if err := h.do(func() { start(done) }); err != nil {
		return zero, err
	}
	select {
	case r := <-ch:
		return r.v, r.err
	case <-ctx.Done():
		return zero, ctx.Err()
	case <-h.done:
		select {
		case r := <-ch:
			return r.v, r.err
		default:
			return zero, ErrClosed
		}
	}
}
