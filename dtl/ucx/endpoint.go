//go:build ucx

package ucx

/*
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"net"
	"runtime/cgo"
	"time"
	"unsafe"

	"github.com/dyadfs/dyadfs/dtl"
)

// endpoint is one UCP endpoint and what rides on it: a consumer's
// (client) to an owner, or an owner's (server) accepted from a consumer.
// Only the worker touches it.
type endpoint struct {
	w      *worker
	ep     C.ucp_ep_h // invalid once state is stClosed
	h      cgo.Handle // the error callback's argument, deleted once the close completed
	client bool
	addr   string // the address dialled (client), the peer's (server)
	node   string // the peer's node id: proven by its MAC (client), announced in its hello (server)
	state  epState
	err    error // why it was closed

	// The handshake.
	clientNonce, serverNonce [nonceLen]byte
	since, deadline          time.Time
	lastUsed                 time.Time

	// Client: the registry of requests in flight by id, and those waiting
	// for the handshake.
	nextID  uint64
	ops     map[uint64]*clientOp
	waiting []*clientOp
	// Server: the requests being answered, by id.
	serving map[uint64]*serveOp
}

type epState uint8

const (
	stHello epState = iota // client: hello sent; server: waiting for it
	stAuth                 // client: auth sent; server: challenge sent
	stReady                // authenticated both ways
	stClosed
)

// errClosed is returned by a Transport that is closed.
var errClosed = fmt.Errorf("ucx transport: %w", net.ErrClosed)

func (w *worker) newEndpoint(client bool, addr string, handshake time.Duration) *endpoint {
	now := time.Now()
	e := &endpoint{w: w, client: client, addr: addr, since: now, deadline: now.Add(handshake), lastUsed: now}
	if client {
		e.ops = make(map[uint64]*clientOp)
	} else {
		e.serving = make(map[uint64]*serveOp)
	}
	e.h = cgo.NewHandle(e)
	return e
}

// accept makes an endpoint for a connection request of the listener, or
// rejects it when closing or when too many peers are authenticating.
func (w *worker) accept(req C.ucp_conn_request_h) {
	if w.listener == nil {
		return // closed: UCX rejects what it still holds
	}
	if w.closing {
		C.ucp_listener_reject(w.listener, req)
		return
	}
	var buf [64]C.char
	peer := "unknown peer"
	if C.shim_conn_request_peer(req, &buf[0], C.size_t(len(buf))) > 0 {
		peer = C.GoString(&buf[0])
	}
	if w.handshaking >= maxHandshaking {
		w.t.stats.Refused.Add(1)
		w.log.Warn("too many peers authenticating; refused one", "peer", peer, "max", maxHandshaking)
		C.ucp_listener_reject(w.listener, req)
		return
	}
	e := w.newEndpoint(false, peer, w.t.cfg.StallTimeout)
	if st := C.shim_accept(w.uw, req, C.uintptr_t(e.h), &e.ep); st != C.UCS_OK {
		e.h.Delete()
		w.log.Warn("could not accept a peer", "peer", peer, "err", statusErr("ucp_ep_create", st))
		return
	}
	w.eps[e.ep] = e
	w.nEndpoints.Add(1)
	w.handshaking++
	w.t.stats.Accepts.Add(1)
}

// epFailed is an endpoint's error callback: the peer died, closed, or
// cannot be reached.
func (w *worker) epFailed(e *endpoint, st C.ucs_status_t) {
	if e.state == stClosed {
		return
	}
	cause := statusErr("endpoint", st)
	var err error
	if e.state == stReady {
		err = fmt.Errorf("ucx transport: connection to %s lost: %w", e.addr, cause)
	} else {
		err = fmt.Errorf("ucx transport: %w: %s: %w", dtl.ErrUnavailable, e.addr, cause)
	}
	w.log.Debug("endpoint failed", "peer", e.addr, "node", e.node, "client", e.client, "err", cause)
	w.closeEP(e, err, true)
}

// protocolError ends an endpoint whose peer broke the protocol; an owner
// tells its consumer why first.
func (w *worker) protocolError(e *endpoint, err error) {
	w.later = append(w.later, func() {
		if e.state == stClosed {
			return
		}
		if e.client {
			w.log.Warn("owner broke the protocol", "addr", e.addr, "node", e.node, "err", err)
			w.closeEP(e, fmt.Errorf("ucx transport: %s: %w", e.addr, err), true)
			return
		}
		w.refuseEP(e, dtl.CodeProtocol, 0, err.Error())
	})
}

// refuseEP tells a consumer why it is disconnected (an error message about
// the endpoint, id 0) and closes the endpoint after flushing it, so that
// the message arrives first.
func (w *worker) refuseEP(e *endpoint, code uint16, version uint64, reason string) {
	w.t.stats.Refused.Add(1)
	w.log.Warn("refused peer", "peer", e.addr, "node", e.node, "reason", reason)
	w.send(e, header{typ: tError, code: code, a: version}, []byte(cut(reason)), nil)
	w.closeEP(e, fmt.Errorf("ucx transport: refused peer %s: %s", e.addr, reason), false)
}

// closeEP ends an endpoint: every request on it fails with err (every
// transfer it serves is aborted), chunks waiting for a buffer are
// released, and UCX closes it (force: at once, failing its requests;
// otherwise after flushing what was sent). The endpoint's handle lives
// until the close completes: its error callback may still come.
func (w *worker) closeEP(e *endpoint, err error, force bool) {
	if e.state == stClosed {
		return
	}
	if !e.client && e.state != stReady {
		w.handshaking--
	}
	e.state = stClosed
	e.err = err
	delete(w.eps, e.ep)
	if e.client && w.peers[e.addr] == e {
		delete(w.peers, e.addr)
	}
	for _, op := range e.ops {
		w.failOp(e, op, err)
	}
	for _, op := range e.waiting {
		w.failOp(e, op, err)
	}
	e.waiting = nil
	for _, op := range e.serving {
		op.abort(err)
	}
	// Chunks of this endpoint that wait for a buffer: their sender is
	// gone or going, release the descriptors.
	kept := w.pending[:0]
	for _, pd := range w.pending {
		if pd.ep == e {
			C.ucp_am_data_release(w.uw, pd.desc)
			continue
		}
		kept = append(kept, pd)
	}
	clear(w.pending[len(kept):])
	w.pending = kept
	w.npending.Store(int32(len(w.pending)))

	ep := e.ep
	e.ep = nil
	r, hd := w.newRequest(nil, func(err error, _ int64) {
		if err != nil && !errors.Is(err, errClosed) {
			w.log.Debug("endpoint close", "peer", e.addr, "err", err)
		}
		e.h.Delete()
		w.nEndpoints.Add(-1)
	})
	f := C.int(0)
	if force {
		f = 1
	}
	st := C.shim_ep_close(ep, f, C.uintptr_t(hd))
	w.started("ucp_ep_close_nbx", st, hd, r)
}

// epInfo describes the endpoint to addr, its lanes included (for tests
// and debugging).
func (w *worker) epInfo(addr string) string {
	e := w.peers[addr]
	if e == nil {
		return ""
	}
	p := C.shim_ep_info(e.ep)
	if p == nil {
		return ""
	}
	defer C.free(unsafe.Pointer(p))
	return C.GoString(p)
}
