//go:build ucx

package ucx

/*
#include "shim.h"
*/
import "C"

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/dyadfs/dyadfs/dtl"
	"github.com/dyadfs/dyadfs/dtl/peerauth"
	"github.com/dyadfs/dyadfs/dtl/wire"
)

// clientOp is one Fetch or Message: its own state and completion signal
// (invariant I1). The worker fills its queue of events; the calling
// goroutine drains it. The registry of an endpoint's requests in flight
// (endpoint.ops) is what fails them all at once when the peer dies.
type clientOp struct {
	kind opKind
	addr string
	path string // fetch
	gen  uint64 // fetch
	// off and n are a fetch's range (n 0: the whole file).
	off, n int64
	owner  string // the node expected at addr ("": any)
	msg    []byte // message

	// Set by the worker.
	id       uint64
	ep       *endpoint
	sent     bool // the request went out
	reused   bool // on an endpoint that served earlier requests
	answered bool // some answer arrived
	pulling  int  // chunks being received (tuning.pulls at most)
	// settled is set by the worker once the op left its endpoint's
	// registry with its last event queued: the caller then has nothing
	// to cancel.
	settled atomic.Bool

	mu     sync.Mutex
	queue  []opEvent
	closed bool // the caller is gone: events are refused
	notify chan struct{}
}

type opKind uint8

const (
	opFetch opKind = iota
	opMessage
)

// opEvent is what the worker tells a Fetch or a Message.
type opEvent struct {
	kind  evKind
	info  dtl.FileInfo
	data  []byte // evFile, evReply
	slot  int    // evChunk: the receive buffer holding the chunk
	off   int64  // evChunk
	n     int64  // evChunk
	size  int64  // evChunk: the file's size, as the owner said with the chunk
	total int64  // evEnd
	err   error  // evFail
	// stale (evFail): the request failed before any answer on an
	// endpoint that had served earlier ones: the owner may have closed
	// it meanwhile, and one retry on a new endpoint is due.
	stale bool
}

type evKind uint8

const (
	evHeader evKind = iota
	evFile
	evChunk
	evEnd
	evReply
	evFail
)

func newOp(kind opKind, addr string) *clientOp {
	return &clientOp{kind: kind, addr: addr, notify: make(chan struct{}, 1)}
}

// push queues an event for the caller; it reports false if the caller is
// gone (the worker then frees what the event holds).
func (op *clientOp) push(ev opEvent) bool {
	op.mu.Lock()
	if op.closed {
		op.mu.Unlock()
		return false
	}
	op.queue = append(op.queue, ev)
	op.mu.Unlock()
	select {
	case op.notify <- struct{}{}:
	default:
	}
	return true
}

func (op *clientOp) take(buf []opEvent) []opEvent {
	op.mu.Lock()
	defer op.mu.Unlock()
	buf = append(buf[:0], op.queue...)
	clear(op.queue)
	op.queue = op.queue[:0]
	return buf
}

// end is the caller's last word: it refuses further events, frees the
// buffers of chunks not written, and, if the worker still holds the op,
// tells it to forget it (and the owner to stop).
func (op *clientOp) end(w *worker) {
	op.mu.Lock()
	op.closed = true
	left := op.queue
	op.queue = nil
	op.mu.Unlock()
	for _, ev := range left {
		if ev.kind == evChunk {
			w.releaseRecv(ev.slot)
		}
	}
	if !op.settled.Load() {
		w.submit(func(w *worker) { w.cancelOp(op) })
	}
}

// enter counts a Fetch or a Message in, unless the transport is closed.
func (t *Transport) enter() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return errClosed
	}
	t.wg.Add(1)
	return nil
}

// FetchesRanges implements dtl.RangeFetcher.
func (t *Transport) FetchesRanges() bool { return true }

// Fetch asks the owner at addr for req and writes the file into dst (see
// dtl.Transport). Requests to one owner share one endpoint, any number at
// once; if that endpoint turns out to have been closed by the owner before
// it answered, Fetch retries once on a new one.
func (t *Transport) Fetch(ctx context.Context, addr string, req dtl.Request, dst *dtl.Sink) (dtl.FileInfo, error) {
	if err := wire.CheckFetch("ucx", req, dst); err != nil {
		return dtl.FileInfo{}, err
	}
	if err := t.enter(); err != nil {
		return dtl.FileInfo{}, err
	}
	defer t.wg.Done()
	for attempt := 0; ; attempt++ {
		op := newOp(opFetch, addr)
		op.path, op.gen, op.owner, op.off, op.n = req.Path, req.Generation, req.Owner, req.Off, req.Len
		info, stale, err := t.fetch(ctx, op, dst)
		if err == nil {
			if req.Len > 0 {
				t.stats.BytesRecv.Add(min(req.Len, max(0, info.Size-req.Off)))
			} else {
				t.stats.BytesRecv.Add(info.Size)
			}
			return info, nil
		}
		if stale && attempt == 0 {
			t.stats.Retried.Add(1)
			t.log.Debug("endpoint was closed by the owner; retrying on a new one", "addr", addr, "err", err)
			continue
		}
		t.log.Debug("fetch failed", "addr", addr, "path", req.Path, "err", err)
		return dtl.FileInfo{}, err
	}
}

// Message sends msg to the daemon at addr and returns its reply (see
// dtl.Messenger). It goes on the endpoint Fetch uses, and like Fetch
// retries once on a new endpoint if that one turns out closed before any
// answer.
func (t *Transport) Message(ctx context.Context, addr, node string, msg []byte) ([]byte, error) {
	if len(msg) > dtl.MaxMessage {
		return nil, fmt.Errorf("ucx transport: message of %d bytes to %s exceeds the %d-byte limit", len(msg), addr, dtl.MaxMessage)
	}
	if err := t.enter(); err != nil {
		return nil, err
	}
	defer t.wg.Done()
	for attempt := 0; ; attempt++ {
		op := newOp(opMessage, addr)
		op.owner, op.msg = node, msg
		reply, stale, err := t.message(ctx, op)
		if err == nil {
			t.stats.Messages.Add(1)
			return reply, nil
		}
		if stale && attempt == 0 {
			t.stats.Retried.Add(1)
			continue
		}
		t.log.Debug("message failed", "addr", addr, "err", err)
		return nil, err
	}
}

// begin resolves op's address and hands op to the worker.
func (t *Transport) begin(ctx context.Context, op *clientOp) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	ap, err := resolve(ctx, op.addr, false)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("ucx transport: %w: %w", dtl.ErrUnavailable, err)
	}
	if !t.w.submit(func(w *worker) { w.start(op, ap) }) {
		return errClosed
	}
	return nil
}

// wait waits for op's next events, for at most the stall timeout.
func (t *Transport) wait(ctx context.Context, op *clientOp, stall *time.Timer, buf []opEvent) ([]opEvent, error) {
	stall.Reset(t.cfg.StallTimeout)
	for {
		if evs := op.take(buf); len(evs) > 0 {
			return evs, nil
		}
		select {
		case <-op.notify:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-stall.C:
			return nil, fmt.Errorf("stalled, no progress for %v", t.cfg.StallTimeout)
		}
	}
}

// fetch runs one attempt of a Fetch.
func (t *Transport) fetch(ctx context.Context, op *clientOp, dst *dtl.Sink) (info dtl.FileInfo, stale bool, err error) {
	what := func() string { return "fetch " + op.path + " from " + op.addr }
	defer func() {
		if err != nil && !stale {
			var re *dtl.RemoteError
			if !errors.As(err, &re) && !errors.Is(err, dtl.ErrUnavailable) && !errors.Is(err, net.ErrClosed) {
				err = fmt.Errorf("ucx transport: %s: %w", what(), err)
			}
		}
	}()
	if err := t.begin(ctx, op); err != nil {
		return info, false, err
	}
	defer op.end(t.w)
	stall := time.NewTimer(t.cfg.StallTimeout)
	defer stall.Stop()
	var (
		evs     []opEvent
		st      = fetchState{size: -1, total: -1, off: op.off, n: op.n}
		done    bool
		handled int
	)
	// Chunks not written when the fetch ends go back to their pool.
	defer func() {
		for _, ev := range evs[handled:] {
			if ev.kind == evChunk {
				t.w.releaseRecv(ev.slot)
			}
		}
	}()
	for {
		handled = 0
		evs, err = t.wait(ctx, op, stall, evs[:0])
		if err != nil {
			return info, false, err
		}
		for handled = 0; handled < len(evs); {
			ev := evs[handled]
			handled++
			if done, stale, err = st.apply(t, ev, dst); done || err != nil {
				return st.info, stale, err
			}
		}
		if done, err = st.complete(dst); done || err != nil {
			return st.info, false, err
		}
	}
}

// fetchState is what a Fetch has received so far.
type fetchState struct {
	info      dtl.FileInfo
	gotHeader bool
	written   int64
	size      int64 // the size the owner gave with its chunks (-1 before any)
	total     int64 // from the end message (-1 before it)
	off, n    int64 // the range asked for (n 0: the whole file)
}

// apply takes one event; done reports the fetch finished.
func (s *fetchState) apply(t *Transport, ev opEvent, dst *dtl.Sink) (done, stale bool, err error) {
	switch ev.kind {
	case evFail:
		return false, ev.stale, ev.err
	case evHeader:
		s.info, s.gotHeader = ev.info, true
	case evFile:
		if s.n > 0 {
			return false, false, protoErr("a whole file in answer to a range")
		}
		if len(ev.data) > 0 {
			if _, err := dst.WriteAt(ev.data, 0); err != nil {
				return false, false, err
			}
		}
		if err := dst.Truncate(ev.info.Size); err != nil {
			return false, false, err
		}
		s.info = ev.info
		return true, false, nil
	case evChunk:
		if s.n > 0 && (ev.off < s.off || ev.off+ev.n > s.off+s.n) {
			t.w.releaseRecv(ev.slot)
			return false, false, protoErr("chunk of %d bytes at %d outside the range of %d bytes at %d asked for", ev.n, ev.off, s.n, s.off)
		}
		_, err := dst.WriteAt(t.w.recvPool.buf(ev.slot)[:ev.n], ev.off)
		t.w.releaseRecv(ev.slot)
		if err != nil {
			return false, false, err
		}
		if s.size >= 0 && ev.size != s.size {
			return false, false, protoErr("chunks describe files of %d and %d bytes", s.size, ev.size)
		}
		s.size = ev.size
		s.written += ev.n
	case evEnd:
		s.total = ev.total
	}
	return false, false, nil
}

// complete checks what arrived and reports whether the file is whole.
func (s *fetchState) complete(dst *dtl.Sink) (bool, error) {
	if s.gotHeader && s.size >= 0 && s.size != s.info.Size {
		return false, protoErr("chunks of a %d-byte file for a %d-byte one", s.size, s.info.Size)
	}
	if s.total >= 0 && s.written > s.total {
		return false, protoErr("owner says it sent %d bytes, %d arrived", s.total, s.written)
	}
	if !s.gotHeader || s.total < 0 || s.written != s.total {
		return false, nil
	}
	if s.n > 0 {
		return true, nil // a range: the size is the destination's own
	}
	return true, dst.Truncate(s.info.Size)
}

// message runs one attempt of a Message.
func (t *Transport) message(ctx context.Context, op *clientOp) (reply []byte, stale bool, err error) {
	if err := t.begin(ctx, op); err != nil {
		return nil, false, err
	}
	defer op.end(t.w)
	stall := time.NewTimer(t.cfg.StallTimeout)
	defer stall.Stop()
	for {
		evs, err := t.wait(ctx, op, stall, nil)
		if err != nil {
			return nil, false, fmt.Errorf("ucx transport: message to %s: %w", op.addr, err)
		}
		for _, ev := range evs {
			switch ev.kind {
			case evFail:
				return nil, ev.stale, ev.err
			case evReply:
				return ev.data, false, nil
			}
		}
	}
}

// resolve turns "host:port" into an address UCX takes. A listening
// address may leave the host out (all interfaces).
func resolve(ctx context.Context, addr string, listen bool) (netip.AddrPort, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return netip.AddrPort{}, err
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		n, lerr := net.DefaultResolver.LookupPort(ctx, "tcp", port)
		if lerr != nil {
			return netip.AddrPort{}, fmt.Errorf("port %q: %w", port, lerr)
		}
		p = uint64(n)
	}
	if host == "" {
		if !listen {
			return netip.AddrPort{}, fmt.Errorf("address %q names no host", addr)
		}
		host = "0.0.0.0"
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		ips, lerr := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		if lerr != nil {
			return netip.AddrPort{}, fmt.Errorf("host %q: %w", host, lerr)
		}
		if len(ips) == 0 {
			return netip.AddrPort{}, fmt.Errorf("host %q has no address", host)
		}
		ip = ips[0]
		for _, a := range ips {
			if a.Is4() || a.Is4In6() {
				ip = a
				break
			}
		}
	}
	return netip.AddrPortFrom(ip.Unmap(), uint16(p)), nil
}

// The worker's side of the client.

// start sends op on the endpoint to its address, dialling one if there is
// none; on an endpoint still authenticating, op waits for it.
func (w *worker) start(op *clientOp, ap netip.AddrPort) {
	if w.closing {
		w.failOp(nil, op, errClosed)
		return
	}
	e := w.peers[op.addr]
	if e == nil {
		var err error
		if e, err = w.dial(op.addr, ap); err != nil {
			w.failOp(nil, op, err)
			return
		}
	} else if e.state == stReady {
		op.reused = true
		w.t.stats.Reused.Add(1)
	}
	op.ep = e
	if e.state != stReady {
		e.waiting = append(e.waiting, op)
		return
	}
	w.request(e, op)
}

// dial creates an endpoint to ap and sends the hello. UCX connects in
// the background; a peer it cannot reach shows as the endpoint's failure.
func (w *worker) dial(addr string, ap netip.AddrPort) (*endpoint, error) {
	e := w.newEndpoint(true, addr, w.t.cfg.DialTimeout)
	ip := C.CString(ap.Addr().String())
	defer C.free(unsafe.Pointer(ip))
	if st := C.shim_connect(w.uw, ip, C.uint16_t(ap.Port()), C.uintptr_t(e.h), &e.ep); st != C.UCS_OK {
		e.h.Delete()
		return nil, fmt.Errorf("ucx transport: %w: %s: %w", dtl.ErrUnavailable, addr, statusErr("ucp_ep_create", st))
	}
	w.eps[e.ep] = e
	w.peers[addr] = e
	w.nEndpoints.Add(1)
	e.clientNonce = peerauth.NewNonce()
	w.send(e, header{typ: tHello, version: protoVersion}, appendHello(nil, hello{nonce: e.clientNonce, node: w.t.cfg.Node}), nil)
	return e, nil
}

// request sends op on a ready endpoint: first the node check, then the
// request, registered under a new id.
func (w *worker) request(e *endpoint, op *clientOp) {
	if op.owner != "" && op.owner != e.node {
		// The node moved (it restarted elsewhere) and another daemon
		// took its address.
		w.failOp(e, op, fmt.Errorf("ucx transport: %w: %s answers as node %q, not %q", dtl.ErrUnavailable, e.addr, e.node, op.owner))
		return
	}
	e.nextID++
	op.id = e.nextID
	op.sent = true
	e.ops[op.id] = op
	e.lastUsed = time.Now()
	var h header
	var payload []byte
	switch op.kind {
	case opFetch:
		h, payload = header{typ: tGet, id: op.id, a: op.gen}, []byte(op.path)
		if op.n > 0 {
			h.b = uint64(op.n)
			payload = append(binary.BigEndian.AppendUint64(nil, uint64(op.off)), op.path...)
		}
	case opMessage:
		h, payload = header{typ: tMsg, id: op.id}, op.msg
	}
	w.send(e, h, payload, func(err error) {
		if err != nil && e.ops[op.id] == op {
			w.failOp(e, op, fmt.Errorf("ucx transport: sending to %s: %w", e.addr, err))
		}
	})
}

// failOp ends op with err: it leaves its endpoint's registry and its
// caller gets err.
func (w *worker) failOp(e *endpoint, op *clientOp, err error) {
	if e != nil && op.sent && e.ops[op.id] == op {
		delete(e.ops, op.id)
	}
	if w.closing && !errors.Is(err, net.ErrClosed) {
		err = fmt.Errorf("ucx transport: transport closed (%w): %w", net.ErrClosed, err)
	}
	op.settled.Store(true)
	op.push(opEvent{kind: evFail, err: err, stale: op.reused && !op.answered && !w.closing})
}

// settle ends op with its last event.
func (w *worker) settle(e *endpoint, op *clientOp, ev opEvent) {
	delete(e.ops, op.id)
	op.settled.Store(true)
	op.push(ev)
}

// cancelOp forgets an op its caller gave up on and tells the owner to stop
// answering it.
func (w *worker) cancelOp(op *clientOp) {
	e := op.ep
	if e == nil || op.settled.Load() {
		return
	}
	op.settled.Store(true)
	if !op.sent {
		for i, o := range e.waiting {
			if o == op {
				e.waiting = append(e.waiting[:i], e.waiting[i+1:]...)
				break
			}
		}
		return
	}
	if e.ops[op.id] != op {
		return
	}
	delete(e.ops, op.id)
	if e.state == stReady {
		w.send(e, header{typ: tCancel, id: op.id}, nil, nil)
	}
}

// onData takes a rendezvous chunk's descriptor (inside progress): kept
// for a receive buffer if its Fetch is alive and the chunk well formed,
// dropped otherwise, which completes the owner's request with an error.
func (w *worker) onData(e *endpoint, h header, desc unsafe.Pointer, n int64) C.ucs_status_t {
	op := e.ops[h.id]
	if op == nil || op.kind != opFetch {
		return C.UCS_ERR_CANCELED // a request given up on
	}
	off, size := int64(h.a), int64(h.b)
	if n <= 0 || n > int64(w.t.tun.chunk) || off < 0 || size < 0 || off > size || n > size-off {
		err := protoErr("chunk of %d bytes at %d of a %d-byte file", n, off, size)
		w.later = append(w.later, func() {
			if e.ops[op.id] == op {
				w.failOp(e, op, fmt.Errorf("ucx transport: %s: %w", e.addr, err))
			}
		})
		// The owner's request fails with this: it stops the transfer.
		return C.UCS_ERR_INVALID_PARAM
	}
	op.answered = true
	w.pending = append(w.pending, pendingData{desc: desc, ep: e, op: op, off: off, n: n, size: size})
	w.npending.Store(int32(len(w.pending)))
	return C.UCS_INPROGRESS
}

// clientHandle handles an owner's message (from the loop).
func (w *worker) clientHandle(e *endpoint, h header, p []byte) {
	switch h.typ {
	case tChallenge:
		w.onChallenge(e, h, p)
		return
	case tReady:
		if e.state != stAuth || len(p) != 0 {
			w.protocolError(e, protoErr("unexpected ready"))
			return
		}
		w.t.stats.Dials.Add(1)
		w.ready(e)
		return
	case tError:
		err := refusal(h.code, h.a, cut(string(p)))
		if h.id == 0 {
			// About the endpoint: the owner refused us.
			w.closeEP(e, fmt.Errorf("ucx transport: %s: %w", e.addr, err), true)
			return
		}
		if op := e.ops[h.id]; op != nil {
			op.answered = true
			w.settle(e, op, opEvent{kind: evFail, err: err})
		}
		return
	}
	if e.state != stReady {
		w.protocolError(e, protoErr("%v message before the handshake", h.typ))
		return
	}
	op := e.ops[h.id]
	if op == nil {
		return // an answer to a request given up on
	}
	op.answered = true
	switch h.typ {
	case tHeader, tFile:
		if op.kind != opFetch || len(p) < infoLen {
			w.protocolError(e, protoErr("malformed %v message", h.typ))
			return
		}
		info, err := parseInfo(p[:infoLen])
		if err != nil {
			w.protocolError(e, err)
			return
		}
		if h.typ == tHeader {
			if len(p) != infoLen {
				w.protocolError(e, protoErr("header of %d bytes", len(p)))
				return
			}
			op.push(opEvent{kind: evHeader, info: info})
			return
		}
		data := p[infoLen:]
		if int64(len(data)) != info.Size {
			w.protocolError(e, protoErr("file message with %d bytes of a %d-byte file", len(data), info.Size))
			return
		}
		w.settle(e, op, opEvent{kind: evFile, info: info, data: data})
	case tEnd:
		if op.kind != opFetch || h.a > 1<<62 {
			w.protocolError(e, protoErr("malformed end"))
			return
		}
		w.settle(e, op, opEvent{kind: evEnd, total: int64(h.a)})
	case tReply:
		if op.kind != opMessage || len(p) > dtl.MaxMessage {
			w.protocolError(e, protoErr("reply of %d bytes", len(p)))
			return
		}
		w.settle(e, op, opEvent{kind: evReply, data: p})
	default:
		w.protocolError(e, protoErr("unexpected %v message", h.typ))
	}
}

// ready opens an authenticated endpoint to requests.
func (w *worker) ready(e *endpoint) {
	e.state = stReady
	waiting := e.waiting
	e.waiting = nil
	for _, op := range waiting {
		w.request(e, op)
	}
}

// onChallenge checks the owner's proof and sends ours.
func (w *worker) onChallenge(e *endpoint, h header, p []byte) {
	if e.state != stHello {
		w.protocolError(e, protoErr("unexpected challenge"))
		return
	}
	if h.version != protoVersion {
		w.protocolError(e, protoErr("owner answered with version %d to a version %d hello", h.version, protoVersion))
		return
	}
	c, err := parseChallenge(p)
	if err != nil {
		w.protocolError(e, err)
		return
	}
	secret := w.t.cfg.Secret
	pr := peerauth.Proof{ClientNonce: e.clientNonce, ServerNonce: c.nonce, ClientNode: w.t.cfg.Node, ServerNode: c.node}
	if !peerauth.Valid(secret, labelServer, pr, c.mac) {
		w.log.Warn("the node answering does not hold this job's secret (job secrets differ); nothing is fetched from it", "addr", e.addr, "node", c.node)
		w.closeEP(e, fmt.Errorf("ucx transport: %s: %w", e.addr, &dtl.RemoteError{Err: dtl.ErrUnauthorized, Msg: fmt.Sprintf("server %q could not prove it holds this job's secret", c.node)}), true)
		return
	}
	e.node = c.node
	m := peerauth.Sign(secret, labelClient, pr)
	w.send(e, header{typ: tAuth}, m[:], nil)
	e.state = stAuth
}
