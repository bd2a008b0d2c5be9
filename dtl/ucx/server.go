//go:build ucx

package ucx

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/dyadfs/dyadfs/dtl"
	"github.com/dyadfs/dyadfs/dtl/peerauth"
	"github.com/dyadfs/dyadfs/dtl/wire"
)

// serveOp is one request an owner answers: a file being sent, in its own
// goroutine (serve), with its own context and completion signals (I1).
// The worker keeps it in its endpoint's registry (endpoint.serving) until
// the goroutine is done, and aborts it when the consumer cancels, the
// endpoint fails or the transport closes.
type serveOp struct {
	t        *Transport
	ep       *endpoint // the worker's
	id       uint64
	path     string
	gen      uint64
	off, n   int64  // the range asked for (n 0: the whole file)
	peer     string // for logs
	node     string
	ctx      context.Context
	cancel   context.CancelFunc
	inflight atomic.Int32  // chunks sent and not yet pulled by the consumer
	freed    chan struct{} // a chunk completed (capacity 1)

	sending wire.Sending // the file being sent, and why the transfer was aborted
}

// final is the last message of an answer.
type final struct {
	h       header
	payload []byte
}

// abort ends the transfer from the worker: the goroutine sees its context
// end, and the file is closed whatever its read is blocked in (a pipe).
func (op *serveOp) abort(err error) {
	op.sending.Abort(err, op.cancel)
}

func (op *serveOp) isAborted() bool {
	aborted, _ := op.sending.Aborted()
	return aborted
}

// chunkDone is called by the worker when a chunk's request completed.
func (op *serveOp) chunkDone() {
	op.inflight.Add(-1)
	select {
	case op.freed <- struct{}{}:
	default:
	}
}

// waitChunks waits until at most limit chunks are in flight, for at most
// the stall timeout.
func (op *serveOp) waitChunks(limit int32, stall *time.Timer) error {
	if op.inflight.Load() <= limit {
		return nil
	}
	stall.Reset(op.t.cfg.StallTimeout)
	for op.inflight.Load() > limit {
		select {
		case <-op.freed:
		case <-op.ctx.Done():
			return op.ctx.Err()
		case <-stall.C:
			return fmt.Errorf("the consumer took no data for %v", op.t.cfg.StallTimeout)
		}
	}
	return nil
}

// The worker's side of the server.

// serverHandle handles a consumer's message (from the loop).
func (w *worker) serverHandle(e *endpoint, h header, p []byte) {
	switch h.typ {
	case tHello:
		w.onHello(e, h, p)
		return
	case tAuth:
		if e.state != stAuth || len(p) != macLen {
			w.refuseEP(e, dtl.CodeProtocol, 0, fmt.Sprintf("unexpected %v message", h.typ))
			return
		}
		var got [macLen]byte
		copy(got[:], p)
		pr := peerauth.Proof{ClientNonce: e.clientNonce, ServerNonce: e.serverNonce, ClientNode: e.node, ServerNode: w.t.cfg.Node}
		if !peerauth.Valid(w.t.cfg.Secret, labelClient, pr, got) {
			w.refuseEP(e, dtl.CodeUnauthorized, 0, "the peer does not hold this job's secret")
			return
		}
		e.state = stReady
		w.handshaking--
		w.send(e, header{typ: tReady}, nil, nil)
		return
	}
	if e.state != stReady {
		w.refuseEP(e, dtl.CodeProtocol, 0, fmt.Sprintf("%v message before the handshake", h.typ))
		return
	}
	switch h.typ {
	case tGet:
		w.onGet(e, h, p)
	case tMsg:
		w.onMessage(e, h, p)
	case tCancel:
		if op := e.serving[h.id]; op != nil {
			op.abort(context.Canceled)
		}
	default:
		w.refuseEP(e, dtl.CodeProtocol, 0, fmt.Sprintf("unexpected %v message", h.typ))
	}
}

// onHello answers a consumer's hello with the owner's proof.
func (w *worker) onHello(e *endpoint, h header, p []byte) {
	if e.state != stHello {
		w.refuseEP(e, dtl.CodeProtocol, 0, "unexpected hello")
		return
	}
	if h.version != protoVersion {
		w.refuseEP(e, dtl.CodeVersion, uint64(protoVersion), fmt.Sprintf("protocol version %d is not spoken here; this server speaks %d", h.version, protoVersion))
		return
	}
	hl, err := parseHello(p)
	if err != nil {
		w.refuseEP(e, dtl.CodeProtocol, 0, err.Error())
		return
	}
	e.node, e.clientNonce, e.serverNonce = hl.node, hl.nonce, peerauth.NewNonce()
	pr := peerauth.Proof{ClientNonce: e.clientNonce, ServerNonce: e.serverNonce, ClientNode: e.node, ServerNode: w.t.cfg.Node}
	c := challenge{nonce: e.serverNonce, mac: peerauth.Sign(w.t.cfg.Secret, labelServer, pr), node: w.t.cfg.Node}
	w.send(e, header{typ: tChallenge, version: protoVersion}, appendChallenge(nil, c), nil)
	e.state = stAuth
}

// onGet starts answering a request for a file; a path that is not clean
// is refused before the Source sees it.
func (w *worker) onGet(e *endpoint, h header, p []byte) {
	if h.id == 0 || e.serving[h.id] != nil {
		w.refuseEP(e, dtl.CodeProtocol, 0, fmt.Sprintf("request id %d reused", h.id))
		return
	}
	var off, n int64
	if h.b > 0 {
		if len(p) < 8 || h.b > 1<<62 {
			w.refuseEP(e, dtl.CodeProtocol, 0, "malformed range")
			return
		}
		off, n, p = int64(binary.BigEndian.Uint64(p)), int64(h.b), p[8:]
		if off < 0 {
			w.refuseEP(e, dtl.CodeProtocol, 0, "malformed range")
			return
		}
	}
	if len(p) > maxPath {
		w.refuseEP(e, dtl.CodeProtocol, 0, fmt.Sprintf("path of %d bytes exceeds %d", len(p), maxPath))
		return
	}
	path := string(p)
	if err := wire.CheckPath(path); err != nil {
		w.refuseRequest(e, h.id, path, h.a, dtl.CodeOutside, err)
		return
	}
	if w.closing || w.src == nil {
		return
	}
	ctx, cancel := context.WithCancel(w.t.ctx)
	op := &serveOp{
		t: w.t, ep: e, id: h.id, path: path, gen: h.a, off: off, n: n, peer: e.addr, node: e.node,
		ctx: ctx, cancel: cancel, freed: make(chan struct{}, 1),
	}
	e.serving[h.id] = op
	w.t.wg.Add(1)
	go w.t.serve(op, w.src)
}

// refuseRequest answers a request with an error; the endpoint stays.
func (w *worker) refuseRequest(e *endpoint, id uint64, path string, gen uint64, code uint16, err error) {
	w.t.stats.Refused.Add(1)
	w.log.Info("refused request", "peer", e.addr, "node", e.node, "path", path, "gen", gen, "err", err)
	w.send(e, header{typ: tError, id: id, code: code}, []byte(cut(err.Error())), nil)
}

// sendData sends a chunk the serving goroutine read into a send buffer,
// unless the transfer is over; the buffer and the window place come back
// when the consumer has pulled the chunk (or the send failed).
func (w *worker) sendData(op *serveOp, slot int, off, n, size int64) {
	done := func(err error) {
		w.sendPool.put(slot)
		if err != nil {
			op.abort(fmt.Errorf("sending %d bytes at %d: %w", n, off, err))
		} else {
			w.t.stats.BytesSent.Add(n)
		}
		op.chunkDone()
	}
	if op.isAborted() {
		done(nil)
		return
	}
	w.sendChunk(op.ep, w.sendPool, slot, n, header{typ: tData, id: op.id, a: uint64(off), b: uint64(size)}, done)
}

// serveDone sends a transfer's last message, if it has one and is not
// aborted, and forgets the transfer.
func (w *worker) serveDone(op *serveOp, f *final) {
	e := op.ep
	if e.serving[op.id] == op {
		delete(e.serving, op.id)
	}
	e.lastUsed = time.Now()
	if f != nil && !op.isAborted() {
		w.send(e, f.h, f.payload, nil)
	}
}

// onMessage answers a message with the handler's reply in a goroutine of
// its own (handlers may take a while; the worker must not).
func (w *worker) onMessage(e *endpoint, h header, p []byte) {
	hp := w.t.handler.Load()
	if hp == nil {
		w.refuseMessage(e, h.id, dtl.CodeRefused, fmt.Sprintf("node %q handles no messages", w.t.cfg.Node), slog.LevelInfo)
		return
	}
	if len(p) > dtl.MaxMessage {
		w.refuseEP(e, dtl.CodeProtocol, 0, fmt.Sprintf("msg of %d bytes exceeds the %d-byte limit", len(p), dtl.MaxMessage))
		return
	}
	if w.closing {
		return
	}
	from, id, t := e.node, h.id, w.t
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		reply, err := (*hp)(t.ctx, from, p)
		t.w.submit(func(w *worker) { w.answer(e, id, reply, err) })
	}()
}

// answer sends a handler's reply, or its refusal.
func (w *worker) answer(e *endpoint, id uint64, reply []byte, err error) {
	if w.closing || e.state == stClosed {
		return // the peer sees the endpoint end
	}
	if err != nil {
		code := dtl.CodeOf(err)
		if code == dtl.CodeInternal {
			code = dtl.CodeRefused
		}
		w.refuseMessage(e, id, code, err.Error(), slog.LevelDebug)
		return
	}
	if len(reply) > dtl.MaxMessage {
		w.refuseMessage(e, id, dtl.CodeRefused, fmt.Sprintf("the handler's reply of %d bytes exceeds the %d-byte limit", len(reply), dtl.MaxMessage), slog.LevelWarn)
		return
	}
	w.send(e, header{typ: tReply, id: id}, reply, func(err error) {
		if err == nil {
			w.t.stats.Answered.Add(1)
		}
	})
}

func (w *worker) refuseMessage(e *endpoint, id uint64, code uint16, reason string, level slog.Level) {
	w.t.stats.Refused.Add(1)
	w.log.Log(context.Background(), level, "refused message", "peer", e.addr, "node", e.node, "reason", reason)
	w.send(e, header{typ: tError, id: id, code: code}, []byte(cut(reason)), nil)
}

// The serving goroutine.

// serve answers one request for a file, then tells the worker its last
// message.
func (t *Transport) serve(op *serveOp, src dtl.Source) {
	defer t.wg.Done()
	f := t.serveFile(op, src)
	op.cancel()
	t.w.submit(func(w *worker) { w.serveDone(op, f) })
}

// serveFile sends a file: small ones whole in one message with their
// description, others as description, chunks of their data extents, and
// an end once every chunk reached the consumer and the file proved
// unchanged. It returns the last message, or nil if the transfer was
// aborted.
func (t *Transport) serveFile(op *serveOp, src dtl.Source) *final {
	f, info, err := src.OpenPublished(op.ctx, dtl.Request{Path: op.path, Generation: op.gen})
	if err != nil {
		if op.ctx.Err() != nil {
			return nil
		}
		return op.refusal(dtl.CodeOf(err), err)
	}
	if !op.sending.Set(f) {
		return nil
	}
	defer op.sending.Clear()
	regular, err := wire.CheckFile(f, info)
	if err != nil {
		return op.refusal(dtl.CodeInternal, err)
	}
	start := time.Now()
	if info.Size <= inlineMax && op.n == 0 {
		return t.serveSmall(op, src, f, info, regular)
	}
	t.w.submit(func(w *worker) {
		if !op.isAborted() {
			w.send(op.ep, header{typ: tHeader, id: op.id}, wire.AppendInfo(nil, info), nil)
		}
	})
	stall := time.NewTimer(t.cfg.StallTimeout)
	defer stall.Stop()
	total, err := t.sendExtents(op, f, info, regular, stall)
	// Every chunk must have reached the consumer (or failed) before the
	// verdict.
	if werr := op.waitChunks(0, stall); werr != nil && err == nil {
		err = werr
	}
	if aborted, why := op.sending.Aborted(); aborted {
		t.log.Debug("transfer aborted", "peer", op.peer, "node", op.node, "path", op.path, "why", why)
		return nil
	}
	var se *wire.SourceError
	switch {
	case errors.As(err, &se):
		t.stats.Refused.Add(1)
		t.log.Warn("could not read a file while sending it; refused", "peer", op.peer, "node", op.node, "path", op.path, "size", info.Size, "err", se.Err)
		return &final{header{typ: tError, id: op.id, code: se.Code()}, []byte(cut(se.Err.Error()))}
	case err != nil:
		if op.ctx.Err() == nil {
			t.log.Warn("transfer failed", "peer", op.peer, "node", op.node, "path", op.path, "size", info.Size, "err", err)
		}
		op.abort(err)
		return nil
	}
	if err := src.Unchanged(f, info); err != nil {
		t.log.Info("file changed while it was sent; refused", "peer", op.peer, "node", op.node, "path", op.path, "err", err)
		return &final{header{typ: tError, id: op.id, code: dtl.CodeOf(err)}, []byte(cut(err.Error()))}
	}
	t.stats.Served.Add(1)
	t.log.Debug("served", "peer", op.peer, "node", op.node, "path", op.path, "size", info.Size, "sent", total, "took", time.Since(start))
	return &final{h: header{typ: tEnd, id: op.id, a: uint64(total)}}
}

// serveSmall reads a small file whole and sends it with its description.
func (t *Transport) serveSmall(op *serveOp, src dtl.Source, f *os.File, info dtl.FileInfo, regular bool) *final {
	b := wire.AppendInfo(make([]byte, 0, infoLen+int(info.Size)), info)
	data := b[infoLen : infoLen+int(info.Size)]
	var k int
	var err error
	if regular {
		k, err = f.ReadAt(data, 0)
		if k == len(data) {
			err = nil // io.EOF with the last byte
		}
	} else {
		k, err = io.ReadFull(f, data)
	}
	if err != nil {
		if op.isAborted() {
			return nil
		}
		se := wire.ReadFailed(f, int64(k), err, 0)
		t.stats.Refused.Add(1)
		t.log.Warn("could not read a file to send it; refused", "peer", op.peer, "node", op.node, "path", op.path, "err", se.Err)
		return &final{header{typ: tError, id: op.id, code: se.Code()}, []byte(cut(se.Err.Error()))}
	}
	if err := src.Unchanged(f, info); err != nil {
		t.log.Info("file changed while it was read; refused", "peer", op.peer, "node", op.node, "path", op.path, "err", err)
		return &final{header{typ: tError, id: op.id, code: dtl.CodeOf(err)}, []byte(cut(err.Error()))}
	}
	t.stats.Served.Add(1)
	t.stats.BytesSent.Add(info.Size)
	return &final{header{typ: tFile, id: op.id}, b[:infoLen+int(info.Size)]}
}

// sendExtents reads f's data extents (all of a file that is not regular)
// chunk by chunk into send buffers and hands each to the worker, with at
// most window chunks of this transfer in flight. It returns the bytes
// handed over.
func (t *Transport) sendExtents(op *serveOp, f *os.File, info dtl.FileInfo, regular bool, stall *time.Timer) (int64, error) {
	pool, chunk := t.w.sendPool, int64(t.tun.chunk)
	var total int64
	emit := func(off, n int64) error {
		for n > 0 {
			c := min(n, chunk)
			if err := op.waitChunks(int32(t.tun.window)-1, stall); err != nil {
				return err
			}
			slot, err := op.takeSlot(pool, stall)
			if err != nil {
				return err
			}
			buf := pool.buf(slot)[:c]
			var k int
			if regular {
				k, err = f.ReadAt(buf, off)
				if k == len(buf) {
					err = nil
				}
			} else {
				k, err = io.ReadFull(f, buf)
			}
			if err != nil {
				pool.put(slot)
				if op.isAborted() {
					return op.ctx.Err()
				}
				return wire.ReadFailed(f, off+int64(k), err, 0)
			}
			op.inflight.Add(1)
			at := off
			if !t.w.submit(func(w *worker) { w.sendData(op, slot, at, c, info.Size) }) {
				pool.put(slot)
				op.inflight.Add(-1)
				return errClosed
			}
			off, n, total = off+c, n-c, total+c
		}
		return nil
	}
	if regular {
		// A failed seek is a file that cannot be read, told to the
		// consumer in place of the end.
		lo, hi := int64(0), info.Size
		if op.n > 0 {
			lo = min(op.off, info.Size)
			hi = lo + min(op.n, info.Size-lo)
		}
		return total, wire.DataExtentsIn(f, lo, hi, emit, func(err error) error { return wire.SeekFailed(f, err, 0) })
	}
	return total, emit(0, info.Size)
}

// takeSlot takes a free send buffer, waiting for at most the stall
// timeout.
func (op *serveOp) takeSlot(p *pool, stall *time.Timer) (int, error) {
	select {
	case i := <-p.free:
		return p.take(i), nil
	default:
	}
	stall.Reset(op.t.cfg.StallTimeout)
	select {
	case i := <-p.free:
		return p.take(i), nil
	case <-op.ctx.Done():
		return 0, op.ctx.Err()
	case <-stall.C:
		return 0, fmt.Errorf("no send buffer freed for %v", op.t.cfg.StallTimeout)
	}
}

// refusal logs and counts a refused request, and is its answer.
func (op *serveOp) refusal(code uint16, err error) *final {
	op.t.stats.Refused.Add(1)
	op.t.log.Info("refused request", "peer", op.peer, "node", op.node, "path", op.path, "gen", op.gen, "err", err)
	return &final{header{typ: tError, id: op.id, code: code}, []byte(cut(err.Error()))}
}
