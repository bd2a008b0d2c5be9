//go:build ucx

package ucx

/*
#cgo pkg-config: ucx
#cgo LDFLAGS: -lucp -lucs
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"runtime/cgo"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/dyadfs/dyadfs/dtl"
)

// worker owns every UCX object of a Transport and is the only goroutine
// that calls libucp. Other goroutines hand it commands (submit, do) over
// a channel; it answers them through each operation's own state
// (clientOp, serveOp). Fields below "owned by the worker's goroutine" are
// touched by nothing else.
//
// The goroutine is not locked to an OS thread, unlike what STYLE.md asks
// of cgo event loops, and the worker is UCS_THREAD_MODE_SERIALIZED: one
// caller at a time, from any thread. Locked, every hand-over between the
// worker and another goroutine (a Fetch's request, a chunk or reply for
// it, a file to serve, its answer) was a switch of OS threads, because a
// locked goroutine runs on its thread only: four such hops and two wire
// wakeups made a 4 KiB fetch take 290 µs (p50, loopback, BenchmarkFetch4KiB)
// and a 64-byte message round trip 175 µs on the development machine.
// Unlocked, the goroutine the worker readies runs on the same thread as
// soon as the worker parks, and the worker runs on the thread of the
// goroutine that sent it a command: 105 µs and 43 µs.
type worker struct {
	t   *Transport
	log *slog.Logger

	cmds chan func(*worker)
	// kick wakes the worker with nothing to run (a receive buffer came
	// back); ucxReady is the waker's word that UCX has events; watch
	// asks the waker to wait for them. Each holds one signal at most.
	kick, ucxReady, watch chan struct{}
	wakerDone             chan struct{}
	// wakerStop is set before cleanup closes the epoll set under the
	// waker, whose wait then ends with an error that is no failure.
	wakerStop atomic.Bool
	done      chan struct{}

	// The pools' rings are shared (pool); their memory is the worker's.
	sendPool, recvPool *pool
	// npending mirrors len(pending): a goroutine that frees a receive
	// buffer wakes the worker only if a descriptor waits for one.
	npending atomic.Int32
	// For Stats.
	nEndpoints, nInFlight atomic.Int64

	// Owned by the worker's goroutine.
	uctx      C.ucp_context_h
	uw        C.ucp_worker_h
	self      cgo.Handle // the AM handler's and the listener's argument
	efd, epfd int
	// epoll is epfd (an epoll set holding UCX's event fd) in Go's
	// netpoller, where the waker goroutine waits on it (a blocking
	// epoll_wait would hold a P until sysmon takes it back).
	epoll     *os.File
	epollConn syscall.RawConn
	// watching: the waker waits for UCX's events and will say so on
	// ucxReady.
	watching bool
	timer    *time.Timer // the next tick, while the worker sleeps
	listener C.ucp_listener_h
	src      dtl.Source
	eps      map[C.ucp_ep_h]*endpoint
	peers    map[string]*endpoint // client endpoints by the address dialled
	// handshaking counts accepted endpoints that have not authenticated.
	handshaking int
	// pending are rendezvous chunks waiting for a receive buffer, oldest
	// first.
	pending []pendingData
	// later is the work callbacks queued for the loop.
	later []func()
	// inflight counts requests whose callback is still due.
	inflight  int
	closing   bool // Close began: nothing new starts
	exiting   bool // Close's last step: leave once every request completed
	exitSince time.Time
	nextTick  time.Time
}

// request is one UCX request (a send, a receive, an endpoint close): its
// own completion, never reused (invariant I1). Its cgo.Handle is deleted
// when it completes.
type request struct {
	w  *worker
	op string // the call that started it, for errors
	// cmem is C memory the operation reads (a message's header and
	// payload), freed when it completes; nil if it has none.
	cmem unsafe.Pointer
	// length is what a receive completing in place received.
	length int64
	done   func(err error, n int64)
}

// pendingData is a rendezvous chunk whose descriptor UCX keeps for us until
// a receive buffer is free.
type pendingData struct {
	desc unsafe.Pointer
	ep   *endpoint
	op   *clientOp
	off  int64
	n    int64
	size int64
}

const (
	// tick is how often the worker looks for idle endpoints and expired
	// handshakes while it has endpoints (with none, it sleeps until
	// something happens).
	tick = 250 * time.Millisecond
	// exitWait bounds how long Close waits for UCX to complete requests
	// of endpoints it closed.
	exitWait = 10 * time.Second
)

func startWorker(t *Transport) (*worker, error) {
	w := &worker{
		t:         t,
		log:       t.log,
		cmds:      make(chan func(*worker), 4096),
		kick:      make(chan struct{}, 1),
		ucxReady:  make(chan struct{}, 1),
		watch:     make(chan struct{}, 1),
		wakerDone: make(chan struct{}),
		done:      make(chan struct{}),
		eps:       make(map[C.ucp_ep_h]*endpoint),
		peers:     make(map[string]*endpoint),
		efd:       -1,
		epfd:      -1,
	}
	ready := make(chan error, 1)
	go w.run(ready)
	if err := <-ready; err != nil {
		<-w.done
		return nil, err
	}
	return w, nil
}

// run is the worker's goroutine.
func (w *worker) run(ready chan<- error) {
	defer close(w.done)
	if err := w.init(); err != nil {
		w.cleanup()
		ready <- err
		return
	}
	ready <- nil
	w.loop()
	w.cleanup()
}

func (w *worker) init() error {
	var cfg *C.ucp_config_t
	if st := C.ucp_config_read(nil, nil, &cfg); st != C.UCS_OK {
		return statusErr("ucp_config_read", st)
	}
	defer C.ucp_config_release(cfg)
	for _, d := range ucxDefaults {
		if d.set() {
			continue
		}
		if err := configModify(cfg, d.name, d.value); err != nil {
			w.log.Debug("cannot change a UCX default", "option", d.name, "err", err)
		}
	}
	for k, v := range w.t.tun.ucx {
		if err := configModify(cfg, k, v); err != nil {
			return err
		}
	}
	if st := C.shim_init(cfg, &w.uctx); st != C.UCS_OK {
		return statusErr("ucp_init", st)
	}
	w.self = cgo.NewHandle(w)
	var maxHeader C.size_t
	var mode C.int
	if st := C.shim_worker_create(w.uctx, C.uintptr_t(w.self), &w.uw, &maxHeader, &mode); st != C.UCS_OK {
		return statusErr("ucp_worker_create", st)
	}
	if mode == C.UCS_THREAD_MODE_SINGLE {
		// Not expected of UCX; then one thread it is, slower. The
		// thread ends with the goroutine, which never unlocks it.
		w.log.Warn("UCX made a single-threaded worker; locking its goroutine to a thread")
		runtime.LockOSThread()
	}
	if maxHeader < hdrLen {
		return fmt.Errorf("ucx transport: the transports UCX chose carry active message headers of %d bytes, fewer than the %d needed", maxHeader, hdrLen)
	}
	var efd C.int
	if st := C.ucp_worker_get_efd(w.uw, &efd); st != C.UCS_OK {
		return statusErr("ucp_worker_get_efd", st)
	}
	w.efd = int(efd)
	var err error
	if w.epfd, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC); err != nil {
		return fmt.Errorf("ucx transport: epoll_create1: %w", err)
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(w.efd)}
	if err := unix.EpollCtl(w.epfd, unix.EPOLL_CTL_ADD, w.efd, &ev); err != nil {
		return fmt.Errorf("ucx transport: epoll_ctl: %w", err)
	}
	// Non-blocking, so that os.NewFile puts it in the netpoller.
	if err := unix.SetNonblock(w.epfd, true); err != nil {
		return fmt.Errorf("ucx transport: epoll fd: %w", err)
	}
	w.epoll = os.NewFile(uintptr(w.epfd), "ucx-epoll")
	if w.epollConn, err = w.epoll.SyscallConn(); err != nil {
		return fmt.Errorf("ucx transport: epoll fd: %w", err)
	}
	w.timer = time.NewTimer(tick)
	w.timer.Stop()
	go w.waker()
	tun := w.t.tun
	if w.sendPool, err = newPool(w.uctx, tun.chunk, tun.sendSlots); err != nil {
		return err
	}
	if w.recvPool, err = newPool(w.uctx, tun.chunk, tun.recvSlots); err != nil {
		return err
	}
	return nil
}

// ucxDefault is a UCX option dyadfs needs otherwise than UCX's default,
// applied unless the environment sets it (or an option it inherits from).
type ucxDefault struct {
	name, value string
	env         []string
}

var ucxDefaults = []ucxDefault{
	// A daemon restarted on its address must listen there again at once,
	// while connections of its last life linger in TIME_WAIT (Go's
	// listeners set SO_REUSEADDR too).
	{"CM_REUSEADDR", "y", []string{"UCX_CM_REUSEADDR", "UCX_TCP_CM_REUSEADDR"}},
	// Shared memory for the data of daemons on one host. UCX 1.13 gives
	// an endpoint that handles peer failures a bulk (rma_bw) lane only on
	// memory domains that can invalidate a registration, so that a
	// request failed by a peer's death cannot be read afterwards; CMA
	// claims that only when told to, and so moved nothing on one host
	// (ucx_perftest am_bw with -e, sm,tcp: 6.0 GB/s over TCP loopback,
	// 17.5 GB/s with CMA). UCX invalidates only memory it registered
	// itself, never ours (every send and receive passes our own memory
	// handle), so the option changes nothing but the lane: what guards
	// our buffers instead is that a rendezvous is pulled (get_zcopy: a
	// peer reads a send buffer, never writes ours), that a send buffer
	// returns to its pool only when its request completed, and that a
	// failed send aborts its transfer, whose copy is then never
	// installed (and a copy is checked against its checksum besides).
	{"MEMORY_INVALIDATE", "y", []string{"UCX_CMA_MEMORY_INVALIDATE", "UCX_MEMORY_INVALIDATE"}},
}

// set reports whether the environment sets the option.
func (d ucxDefault) set() bool {
	for _, e := range d.env {
		if _, ok := os.LookupEnv(e); ok {
			return true
		}
	}
	return false
}

// configModify sets one UCX option of the context to be created.
func configModify(cfg *C.ucp_config_t, name, value string) error {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	cvalue := C.CString(value)
	defer C.free(unsafe.Pointer(cvalue))
	if st := C.ucp_config_modify(cfg, cname, cvalue); st != C.UCS_OK {
		return statusErr(fmt.Sprintf("ucp_config_modify %s=%s", name, value), st)
	}
	return nil
}

// cleanup destroys what init made, in reverse, whatever it got to. Every
// endpoint is closed and every request completed by now (or given up on
// after exitWait: their memory is then left alone).
func (w *worker) cleanup() {
	if w.listener != nil {
		C.ucp_listener_destroy(w.listener)
		w.listener = nil
	}
	if w.uw != nil {
		C.ucp_worker_destroy(w.uw)
		w.uw = nil
	}
	if w.inflight == 0 {
		for _, p := range []*pool{w.sendPool, w.recvPool} {
			if p != nil {
				p.destroy(w.uctx)
			}
		}
	} else {
		w.log.Error("UCX did not complete every request; leaving their buffers mapped", "requests", w.inflight)
	}
	if w.uctx != nil {
		C.ucp_cleanup(w.uctx)
		w.uctx = nil
	}
	if w.self != 0 {
		w.self.Delete()
	}
	if w.epoll != nil {
		w.wakerStop.Store(true)
		close(w.watch)
		w.epoll.Close() // ends a wait of the waker
		<-w.wakerDone
	} else if w.epfd >= 0 {
		unix.Close(w.epfd)
	}
}

// submit hands f to the worker; it reports false if the worker is gone.
// A worker asleep is parked on the channel: the sender readies it, and
// it runs on the sender's thread once the sender blocks.
func (w *worker) submit(f func(*worker)) bool {
	select {
	case w.cmds <- f:
		return true
	case <-w.done:
		return false
	}
}

// do runs f on the worker and waits for it.
func (w *worker) do(f func(*worker)) bool {
	ran := make(chan struct{})
	if !w.submit(func(w *worker) { f(w); close(ran) }) {
		return false
	}
	select {
	case <-ran:
		return true
	case <-w.done:
		select {
		case <-ran:
			return true
		default:
			return false
		}
	}
}

// releaseRecv gives a receive buffer back from any goroutine, waking the
// worker if a chunk waits for one.
func (w *worker) releaseRecv(slot int) {
	w.recvPool.put(slot)
	if w.npending.Load() > 0 {
		select {
		case w.kick <- struct{}{}:
		default: // a kick is pending already
		}
	}
}

// loop progresses the worker while there is work, and otherwise arms it
// and sleeps until a command, a kick, UCX's events (through the waker) or
// housekeeping is due. Completion is only ever learnt from UCX's
// callbacks, never by polling on a timer.
func (w *worker) loop() {
	for {
		w.runCommands()
		progressed := C.ucp_worker_progress(w.uw) != 0
		w.runLater()
		w.startPending()
		w.runLater()
		if w.exiting && (w.inflight == 0 || time.Since(w.exitSince) > exitWait) {
			return
		}
		now := time.Now()
		if !now.Before(w.nextTick) {
			w.housekeep(now)
			w.nextTick = now.Add(tick)
		}
		if progressed || len(w.later) > 0 || len(w.cmds) > 0 {
			continue
		}
		switch st := C.ucp_worker_arm(w.uw); st {
		case C.UCS_OK:
		case C.UCS_ERR_BUSY:
			continue // events arrived meanwhile
		default:
			w.log.Error("ucp_worker_arm failed", "err", statusErr("ucp_worker_arm", st))
		}
		w.sleep()
	}
}

// sleep parks the worker until a command or a kick comes, the armed UCX
// worker has an event, or the next tick if there is anything to look
// after. It parks on channels, not on a file descriptor: a goroutine that
// sends a command readies the worker without a system call, and the
// worker runs on the sender's thread when it blocks; only UCX's events
// come through the netpoller, to the waker.
func (w *worker) sleep() {
	if !w.watching {
		w.watching = true
		w.watch <- struct{}{} // never blocks: the waker took the last one
	}
	var tick <-chan time.Time
	if len(w.eps) > 0 || w.exiting {
		w.timer.Reset(time.Until(w.nextTick))
		tick = w.timer.C
	}
	select {
	case f := <-w.cmds:
		f(w)
	case <-w.kick:
	case <-w.ucxReady:
		w.watching = false
	case <-tick:
	}
	if tick != nil {
		w.timer.Stop()
	}
}

// waker waits, each time the worker asks, until the epoll set holding
// UCX's event fd is readable, and tells the worker. It ends when the
// worker closes watch or the epoll set.
func (w *worker) waker() {
	defer close(w.wakerDone)
	events := make([]unix.EpollEvent, 1)
	for range w.watch {
		err := w.epollConn.Read(func(fd uintptr) bool {
			n, err := unix.EpollWait(int(fd), events, 0)
			if err != nil {
				return !errors.Is(err, unix.EINTR)
			}
			return n > 0
		})
		if err != nil {
			if !w.wakerStop.Load() {
				w.log.Error("waiting for UCX events failed", "err", err)
			}
			return
		}
		w.ucxReady <- struct{}{} // never blocks: one per watch
	}
}

// runCommands runs the commands queued now (not those they queue, so that
// progress is never starved).
func (w *worker) runCommands() {
	for n := len(w.cmds); n > 0; n-- {
		f := <-w.cmds
		f(w)
	}
}

// runLater runs the work callbacks queued, and the work it queues.
func (w *worker) runLater() {
	for len(w.later) > 0 {
		fns := w.later
		w.later = nil
		for _, f := range fns {
			f()
		}
	}
}

// started accounts for an operation just started with handle h: if it
// finished in place (or failed to start), no callback will come, and it
// completes from the loop, never inside the caller.
func (w *worker) started(op string, st C.ucs_status_t, h cgo.Handle, r *request) {
	r.op = op
	if st == C.UCS_INPROGRESS {
		w.inflight++
		w.nInFlight.Add(1)
		return
	}
	h.Delete()
	var err error
	if st != C.UCS_OK {
		err = statusErr(op, st)
	}
	w.later = append(w.later, func() { w.complete(r, err, r.length) })
}

// callbackDone is a request's callback (callbacks.go).
func (w *worker) callbackDone(r *request, st C.ucs_status_t, n int64) {
	w.inflight--
	w.nInFlight.Add(-1)
	var err error
	if st != C.UCS_OK {
		err = statusErr(r.op, st)
	}
	w.later = append(w.later, func() { w.complete(r, err, n) })
}

func (w *worker) complete(r *request, err error, n int64) {
	if r.cmem != nil {
		C.free(r.cmem)
		r.cmem = nil
	}
	if r.done != nil {
		r.done(err, n)
	}
}

// newRequest makes a request and the handle UCX calls it back with.
func (w *worker) newRequest(cmem unsafe.Pointer, done func(err error, n int64)) (*request, cgo.Handle) {
	r := &request{w: w, cmem: cmem, done: done}
	return r, cgo.NewHandle(r)
}

// send sends one eager message on e. The header and payload are copied
// into C memory, which lives until UCX is done with it. done, if not nil,
// is called with the outcome, from the loop.
func (w *worker) send(e *endpoint, h header, payload []byte, done func(error)) {
	complete := func(err error, _ int64) {
		if done != nil {
			done(err)
		}
	}
	if e.state == stClosed {
		w.later = append(w.later, func() { complete(e.err, 0) })
		return
	}
	size := hdrLen + len(payload)
	cmem := C.malloc(C.size_t(size))
	b := unsafe.Slice((*byte)(cmem), size)
	h.put(b[:hdrLen])
	copy(b[hdrLen:], payload)
	r, hd := w.newRequest(cmem, complete)
	st := C.shim_am_send(e.ep, cmem, hdrLen, unsafe.Add(cmem, hdrLen), C.size_t(len(payload)),
		C.UCP_AM_SEND_FLAG_EAGER|C.UCP_AM_SEND_FLAG_REPLY, nil, C.uintptr_t(hd))
	w.started("ucp_am_send_nbx", st, hd, r)
}

// sendChunk sends pool slot's first n bytes as a rendezvous message with
// header h: the peer pulls the data, and the request completes once it
// has.
func (w *worker) sendChunk(e *endpoint, p *pool, slot int, n int64, h header, done func(error)) {
	complete := func(err error, _ int64) { done(err) }
	if e.state == stClosed {
		w.later = append(w.later, func() { complete(e.err, 0) })
		return
	}
	h.put(unsafe.Slice((*byte)(p.hdr(slot)), hdrLen))
	r, hd := w.newRequest(nil, complete)
	st := C.shim_am_send(e.ep, p.hdr(slot), hdrLen, p.ptr(slot), C.size_t(n),
		C.UCP_AM_SEND_FLAG_RNDV|C.UCP_AM_SEND_FLAG_REPLY, p.memh, C.uintptr_t(hd))
	w.started("ucp_am_send_nbx", st, hd, r)
}

// onAM handles an arriving active message, inside ucp_worker_progress. It
// copies what it keeps and defers the rest; a rendezvous chunk's
// descriptor is kept (UCS_INPROGRESS) until a receive buffer takes it.
func (w *worker) onAM(hp unsafe.Pointer, hlen int, data unsafe.Pointer, length int64, attr C.uint64_t, replyEP C.ucp_ep_h) C.ucs_status_t {
	rndv := attr&C.UCP_AM_RECV_ATTR_FLAG_RNDV != 0
	// What drops a message: for a rendezvous one, an error status,
	// which UCX passes to the sender's request.
	drop := C.ucs_status_t(C.UCS_OK)
	if rndv {
		drop = C.UCS_ERR_CANCELED
	}
	e := w.eps[replyEP]
	if e == nil || e.state == stClosed {
		return drop
	}
	if hlen != hdrLen {
		w.protocolError(e, protoErr("message header of %d bytes, want %d", hlen, hdrLen))
		return drop
	}
	h, _ := parseHeader(unsafe.Slice((*byte)(hp), hdrLen))
	if h.typ.toServer() == e.client || (h.typ == tData) != rndv {
		w.protocolError(e, protoErr("unexpected %v message (rendezvous %v)", h.typ, rndv))
		return drop
	}
	if rndv {
		return w.onData(e, h, data, length)
	}
	if length > maxEager {
		w.protocolError(e, protoErr("%v message of %d bytes", h.typ, length))
		return drop
	}
	payload := C.GoBytes(data, C.int(length))
	w.later = append(w.later, func() { w.handle(e, h, payload) })
	return C.UCS_OK
}

// maxEager bounds an eager message's payload: a whole small file with its
// description, or a message.
var maxEager = int64(max(dtl.MaxMessage, infoLen+inlineMax, maxPath, maxReason+64))

// handle dispatches a message, from the loop.
func (w *worker) handle(e *endpoint, h header, payload []byte) {
	if e.state == stClosed {
		return
	}
	e.lastUsed = time.Now()
	if e.client {
		w.clientHandle(e, h, payload)
	} else {
		w.serverHandle(e, h, payload)
	}
}

// startPending receives the waiting chunks that a free buffer can take,
// oldest first, at most tuning.pulls of one live transfer at a time.
func (w *worker) startPending() {
	kept := w.pending[:0]
	for i, pd := range w.pending {
		live := pd.ep.ops[pd.op.id] == pd.op
		if live && pd.op.pulling >= w.t.tun.pulls {
			kept = append(kept, pd)
			continue
		}
		slot, ok := w.recvPool.tryGet()
		if !ok {
			kept = append(kept, w.pending[i:]...)
			break
		}
		w.receive(pd, slot)
	}
	clear(w.pending[len(kept):])
	w.pending = kept
	w.npending.Store(int32(len(w.pending)))
}

// receive pulls a rendezvous chunk into a receive buffer and hands it to
// its Fetch, which writes it out and frees the buffer. A chunk whose Fetch
// has given up is received all the same (so that its sender's request
// completes normally) and its buffer freed.
func (w *worker) receive(pd pendingData, slot int) {
	op := pd.op
	op.pulling++
	r, hd := w.newRequest(nil, func(err error, n int64) {
		op.pulling--
		if err == nil && n != pd.n {
			err = protoErr("chunk of %d bytes at %d: %d arrived", pd.n, pd.off, n)
		}
		if err != nil {
			w.recvPool.put(slot)
			if pd.ep.ops[op.id] == op {
				w.failOp(pd.ep, op, fmt.Errorf("ucx transport: receiving %d bytes at %d from %s: %w", pd.n, pd.off, pd.ep.addr, err))
			}
			return
		}
		if !op.push(opEvent{kind: evChunk, slot: slot, off: pd.off, n: pd.n, size: pd.size}) {
			w.recvPool.put(slot)
		}
	})
	r.length = pd.n
	st := C.shim_am_recv(w.uw, pd.desc, w.recvPool.ptr(slot), C.size_t(pd.n), w.recvPool.memh, C.uintptr_t(hd))
	w.started("ucp_am_recv_data_nbx", st, hd, r)
}

// housekeep closes endpoints idle for too long and handshakes that took
// too long.
func (w *worker) housekeep(now time.Time) {
	for _, e := range w.eps {
		switch {
		case e.state != stReady && now.After(e.deadline):
			err := fmt.Errorf("ucx transport: %w: %s: no handshake within %v", dtl.ErrUnavailable, e.addr, e.deadline.Sub(e.since).Round(time.Millisecond))
			if !e.client {
				w.log.Debug("peer did not authenticate in time", "peer", e.addr)
			}
			w.closeEP(e, err, true)
		case e.client && len(e.ops) == 0 && now.Sub(e.lastUsed) > w.t.tun.idleTTL,
			!e.client && len(e.serving) == 0 && now.Sub(e.lastUsed) > w.t.tun.serverIdle:
			w.log.Debug("closing idle endpoint", "peer", e.addr, "node", e.node, "client", e.client)
			w.closeEP(e, fmt.Errorf("ucx transport: endpoint to %s closed after %v idle", e.addr, now.Sub(e.lastUsed).Round(time.Second)), true)
		}
	}
}

// shutdown is Close's first step: refuse what comes, close the listener,
// end every transfer and close every endpoint. The worker runs on until
// every goroutine of the transport has returned (exit).
func (w *worker) shutdown() {
	w.closing = true
	w.runLater() // connection requests reported so far are rejected
	if w.listener != nil {
		C.ucp_listener_destroy(w.listener)
		w.listener = nil
	}
	for _, e := range w.eps {
		w.closeEP(e, errClosed, true)
	}
}

// exit is Close's last step: leave once UCX has completed every request.
func (w *worker) exit() {
	w.exiting = true
	w.exitSince = time.Now()
}

// statusErr describes a UCX failure.
func statusErr(op string, st C.ucs_status_t) error {
	return &StatusError{Op: op, Status: int(st), Text: C.GoString(C.ucs_status_string(st))}
}

// createListener opens the UCP listener on ip:port and returns the port
// it got.
func (w *worker) createListener(ip string, port uint16) (uint16, error) {
	cip := C.CString(ip)
	defer C.free(unsafe.Pointer(cip))
	var bound C.uint16_t
	if st := C.shim_listen(w.uw, cip, C.uint16_t(port), C.uintptr_t(w.self), &w.listener, &bound); st != C.UCS_OK {
		w.listener = nil
		return 0, statusErr("ucp_listener_create", st)
	}
	return uint16(bound), nil
}
