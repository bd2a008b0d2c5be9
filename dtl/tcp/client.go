package tcp

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"time"

	"github.com/dyadfs/dyadfs/dtl"
	"github.com/dyadfs/dyadfs/dtl/wire"

	"github.com/dyadfs/dyadfs/dtl/peerauth"
)

// clientConn is an authenticated connection to one server. A Fetch or a
// Message owns it while it is in t.active; otherwise it waits in t.idle.
type clientConn struct {
	conn  *net.TCPConn
	addr  string
	node  string // the node the server proved to be
	br    *bufio.Reader
	buf   []byte // frame payloads
	out   []byte // frames being encoded
	since time.Time
	kill  func() // closes conn (a cancelled context calls it)
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

// Fetch asks the server at addr for req and writes the file into dst (see
// dtl.Transport). It takes an idle connection to addr if there is one;
// if that connection turns out to have been closed by the server before
// it answered, Fetch retries once on a new one.
func (t *Transport) Fetch(ctx context.Context, addr string, req dtl.Request, dst *dtl.Sink) (dtl.FileInfo, error) {
	if err := wire.CheckFetch("tcp", req, dst); err != nil {
		return dtl.FileInfo{}, err
	}
	var info dtl.FileInfo
	what := func() string { return "fetch " + req.Path + " from " + addr }
	err := t.call(ctx, addr, req.Owner, what, func(cc *clientConn) (keep, stale bool, err error) {
		info, keep, stale, err = t.receive(cc, req, dst)
		return keep, stale, err
	})
	if err != nil {
		return dtl.FileInfo{}, err
	}
	t.stats.BytesRecv.Add(info.Size)
	return info, nil
}

// Message sends msg to the daemon at addr and returns its reply (see
// dtl.Messenger). It goes on the connections Fetch uses, and like Fetch
// takes an idle one to addr if there is one and retries once on a new one
// if that turns out to have been closed by the server before it answered.
func (t *Transport) Message(ctx context.Context, addr, node string, msg []byte) ([]byte, error) {
	if len(msg) > dtl.MaxMessage {
		return nil, fmt.Errorf("tcp transport: message of %d bytes to %s exceeds the %d-byte limit", len(msg), addr, dtl.MaxMessage)
	}
	var reply []byte
	what := func() string { return "message to " + addr }
	err := t.call(ctx, addr, node, what, func(cc *clientConn) (keep, stale bool, err error) {
		reply, keep, stale, err = t.roundTrip(cc, msg)
		return keep, stale, err
	})
	if err != nil {
		return nil, err
	}
	t.stats.Messages.Add(1)
	return reply, nil
}

// call runs one exchange with the server at addr: it takes a connection
// (pooled or new), checks that node (if not empty) answers there, and runs
// exchange on it, which reports whether the connection is still in step
// with the server and may be pooled again (keep), and whether it failed
// before any answer arrived, as a connection the server has closed does
// (stale). A stale pooled connection is replaced once. A cancelled ctx
// closes the connection, which ends whatever read or write exchange is
// blocked in at once. what names the exchange in errors.
func (t *Transport) call(ctx context.Context, addr, node string, what func() string, exchange func(cc *clientConn) (keep, stale bool, err error)) error {
	if err := t.enter(); err != nil {
		return err
	}
	defer t.wg.Done()
	for attempt := 0; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("tcp transport: %s: %w", what(), err)
		}
		cc, reused, err := t.conn(ctx, addr, attempt == 0)
		if err != nil {
			return err
		}
		if node != "" && cc.node != node {
			// The node moved (it restarted elsewhere) and another
			// daemon took its address.
			t.release(cc)
			return fmt.Errorf("tcp transport: %w: %s answers as node %q, not %q", dtl.ErrUnavailable, addr, cc.node, node)
		}
		stop := cc.watch(ctx)
		keep, stale, err := exchange(cc)
		if !stop() {
			keep, stale = false, false
			if err != nil {
				err = fmt.Errorf("tcp transport: %s: %w", what(), ctx.Err())
			}
		} else if err != nil {
			var re *dtl.RemoteError
			switch {
			case t.isClosed():
				keep, stale = false, false
				err = fmt.Errorf("tcp transport: %s: transport closed: %w", what(), net.ErrClosed)
			case errors.As(err, &re):
			case errors.Is(err, os.ErrDeadlineExceeded):
				err = fmt.Errorf("tcp transport: %s: stalled, no progress for %v: %w", what(), t.cfg.StallTimeout, err)
			default:
				err = fmt.Errorf("tcp transport: %s: %w", what(), err)
			}
		}
		if keep {
			t.release(cc)
		} else {
			t.discard(cc)
		}
		if err == nil {
			return nil
		}
		if stale && reused && attempt == 0 {
			t.stats.Retried.Add(1)
			t.log.Debug("pooled connection was closed by the server; retrying on a new one", "addr", addr, "err", err)
			continue
		}
		// The caller (dtl.Fetcher, the locator) logs failures with what
		// it knows; this line is for debugging the transport.
		t.log.Debug("request failed", "addr", addr, "what", what(), "err", err)
		return err
	}
}

// watch makes a cancelled ctx close cc's connection. stop reports false if
// that happened (or is under way), as context.AfterFunc's stop does.
func (cc *clientConn) watch(ctx context.Context) (stop func() bool) {
	if ctx.Done() == nil {
		return neverCancelled // context.Background and the like: nothing to watch
	}
	return context.AfterFunc(ctx, cc.kill)
}

func neverCancelled() bool { return true }

// roundTrip sends msg on cc and reads the reply: one write and, for a
// reply that arrives whole, one read. The reply is read into a slice of
// its own, which the caller keeps.
func (t *Transport) roundTrip(cc *clientConn, msg []byte) (reply []byte, keep, stale bool, err error) {
	cc.conn.SetDeadline(time.Now().Add(t.cfg.StallTimeout))
	cc.out = appendMsg(cc.out[:0], msg)
	if _, err := cc.conn.Write(cc.out); err != nil {
		return nil, false, connGone(err), err
	}
	typ, p, err := readFrameOwned(cc.br, &cc.buf, tReply)
	if err != nil {
		return nil, false, connGone(err), err
	}
	switch typ {
	case tReply:
	case tError:
		keep, err := refusal(p)
		return nil, keep, false, err
	default:
		return nil, false, false, protoErr("%v frame where a reply was expected", typ)
	}
	if p, err = decodeReply(p); err != nil {
		return nil, false, false, err
	}
	// Anything after the end of a reply is out of step.
	return p, cc.br.Buffered() == 0, false, nil
}

func (t *Transport) receive(cc *clientConn, req dtl.Request, dst *dtl.Sink) (info dtl.FileInfo, keep, stale bool, err error) {
	dst.InOrder() // chunks come in order; the gaps are holes
	stall := t.cfg.StallTimeout
	cc.conn.SetWriteDeadline(time.Now().Add(stall))
	cc.out = appendGet(cc.out[:0], getReq{Generation: req.Generation, Path: req.Path, Off: req.Off, Len: req.Len})
	if _, err := cc.conn.Write(cc.out); err != nil {
		return info, false, connGone(err), err
	}
	cc.conn.SetReadDeadline(time.Now().Add(stall))
	typ, p, err := readFrame(cc.br, &cc.buf)
	if err != nil {
		return info, false, connGone(err), err
	}
	switch typ {
	case tError:
		keep, err := refusal(p)
		return info, keep, false, err
	case tHeader:
	default:
		return info, false, false, protoErr("%v frame where a reply was expected", typ)
	}
	if info, err = decodeHeader(p); err != nil {
		return info, false, false, err
	}
	var next, total int64 // where the next chunk may start; data received
	for {
		cc.conn.SetReadDeadline(time.Now().Add(stall))
		typ, p, err := readFrame(cc.br, &cc.buf)
		if err != nil {
			return info, false, false, err
		}
		switch typ {
		case tChunk:
			ch, err := decodeChunk(p)
			if err != nil {
				return info, false, false, err
			}
			if req.Len > 0 && (ch.Off < req.Off || ch.Off+ch.Len > req.Off+req.Len) {
				return info, false, false, protoErr("chunk of %d bytes at %d outside the range of %d bytes at %d asked for", ch.Len, ch.Off, req.Len, req.Off)
			}
			if ch.Len == 0 || ch.Len > maxChunk || ch.Off < next || ch.Off > info.Size || ch.Len > info.Size-ch.Off {
				return info, false, false, protoErr("chunk of %d bytes at %d: out of order, empty, too large or beyond the %d-byte file (next may start at %d)", ch.Len, ch.Off, info.Size, next)
			}
			if err := cc.copyData(dst, ch.Off, ch.Len, stall); err != nil {
				return info, false, false, fmt.Errorf("receiving %d bytes at %d: %w", ch.Len, ch.Off, err)
			}
			next, total = ch.Off+ch.Len, total+ch.Len
		case tError:
			// The file changed while it was sent: what arrived is not
			// the file described. The stream is in step again.
			keep, err := refusal(p)
			return info, keep, false, err
		case tEnd:
			sent, err := decodeEnd(p)
			if err != nil {
				return info, false, false, err
			}
			if sent != total {
				return info, false, false, protoErr("server says it sent %d bytes, %d arrived", sent, total)
			}
			if req.Len == 0 {
				if err := dst.Truncate(info.Size); err != nil {
					return info, false, false, err
				}
			}
			// Anything after the end of a reply is out of step.
			return info, cc.br.Buffered() == 0, false, nil
		default:
			return info, false, false, protoErr("%v frame inside a reply", typ)
		}
	}
}

// copyData writes the n bytes of a chunk's data to dst at off: what is
// already buffered first, the rest straight from the socket (splice) in
// pieces, renewing the read deadline for each; dst hashes each piece as
// it lands.
func (cc *clientConn) copyData(dst *dtl.Sink, off, n int64, stall time.Duration) error {
	for n > 0 {
		cc.conn.SetReadDeadline(time.Now().Add(stall))
		if b := cc.br.Buffered(); b > 0 {
			k := int(min(int64(b), n))
			p, _ := cc.br.Peek(k)
			if _, err := dst.WriteAt(p, off); err != nil {
				return err
			}
			cc.br.Discard(k)
			off, n = off+int64(k), n-int64(k)
			continue
		}
		if n >= smallChunk {
			w, err := dst.CopyFrom(cc.conn, off, min(n, piece))
			off, n = off+w, n-w
			if err != nil {
				if err == io.EOF {
					err = io.ErrUnexpectedEOF
				}
				return err
			}
			continue
		}
		if _, err := cc.br.Peek(1); err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
	}
	return nil
}

// refusal turns an error frame answering a request into the error Fetch
// returns, and tells whether the connection stays usable.
func refusal(p []byte) (keep bool, err error) {
	e, err := decodeError(p)
	if err != nil {
		return false, err
	}
	if target, ok := dtl.RefusalOf(e.Code); ok {
		return true, &dtl.RemoteError{Err: target, Msg: e.Msg}
	}
	switch e.Code {
	case dtl.CodeInternal:
		// Not a refusal: the server failed to read its file. Retrying
		// may help.
		return true, fmt.Errorf("server failed: %s", e.Msg)
	case dtl.CodeVersion:
		return false, protoErr("server speaks versions %v, not %d: %s", e.Versions, protoVersion, e.Msg)
	case dtl.CodeProtocol:
		return false, protoErr("server says: %s", e.Msg)
	}
	return false, protoErr("error code %d: %s", e.Code, e.Msg)
}

// connGone tells errors of a connection the peer has closed.
func connGone(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// conn returns an idle connection to addr if pooled is true and there is
// one, else a new authenticated one.
func (t *Transport) conn(ctx context.Context, addr string, pooled bool) (cc *clientConn, reused bool, err error) {
	if pooled {
		if cc := t.takeIdle(addr); cc != nil {
			t.stats.Reused.Add(1)
			return cc, true, nil
		}
	}
	cc, err = t.dial(ctx, addr)
	return cc, false, err
}

func (t *Transport) takeIdle(addr string) *clientConn {
	t.mu.Lock()
	list := t.idle[addr]
	if len(list) == 0 {
		t.mu.Unlock()
		return nil
	}
	cc := list[len(list)-1]
	if time.Since(cc.since) > idleTTL {
		// The newest is too old, so are all the others.
		delete(t.idle, addr)
		t.nIdle -= len(list)
		t.mu.Unlock()
		for _, old := range list {
			old.conn.Close()
		}
		return nil
	}
	// An emptied list stays, so that release does not allocate a new
	// one each time the only connection to a peer comes back (one entry
	// per peer address: as many as the job has daemons).
	list[len(list)-1] = nil
	t.idle[addr] = list[:len(list)-1]
	t.nIdle--
	t.active[cc] = struct{}{}
	t.mu.Unlock()
	return cc
}

// release returns a connection in step with its server to the pool, or
// closes it if the pool is full.
func (t *Transport) release(cc *clientConn) {
	t.mu.Lock()
	delete(t.active, cc)
	if t.closed || len(t.idle[cc.addr]) >= maxIdlePerAddr || t.nIdle >= maxIdle {
		t.mu.Unlock()
		cc.conn.Close()
		return
	}
	cc.since = time.Now()
	t.idle[cc.addr] = append(t.idle[cc.addr], cc)
	t.nIdle++
	t.mu.Unlock()
}

// discard closes a connection whose transfer failed or was cancelled.
func (t *Transport) discard(cc *clientConn) {
	t.mu.Lock()
	delete(t.active, cc)
	t.mu.Unlock()
	cc.conn.Close()
}

// dial connects to addr and runs the client's side of the handshake. Errors
// reaching the server wrap dtl.ErrUnavailable; a server without the job
// secret, or one refusing ours, gives a *dtl.RemoteError for
// dtl.ErrUnauthorized.
func (t *Transport) dial(ctx context.Context, addr string) (*clientConn, error) {
	// Close ends dials in progress too.
	dctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stopClose := context.AfterFunc(t.ctx, cancel)
	defer stopClose()

	d := net.Dialer{Timeout: t.cfg.DialTimeout}
	c, err := d.DialContext(dctx, "tcp", addr)
	if err != nil {
		switch {
		case ctx.Err() != nil:
			return nil, fmt.Errorf("tcp transport: dial %s: %w", addr, ctx.Err())
		case t.isClosed():
			return nil, errClosed
		}
		return nil, fmt.Errorf("tcp transport: %w: %w", dtl.ErrUnavailable, err)
	}
	cc := &clientConn{conn: c.(*net.TCPConn), addr: addr, br: bufio.NewReaderSize(c, bufSize), kill: func() { c.Close() }}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		c.Close()
		return nil, errClosed
	}
	t.active[cc] = struct{}{}
	t.mu.Unlock()

	stop := context.AfterFunc(dctx, func() { c.Close() })
	err = t.handshake(cc)
	if !stop() {
		t.discard(cc)
		if ctx.Err() != nil {
			return nil, fmt.Errorf("tcp transport: handshake with %s: %w", addr, ctx.Err())
		}
		return nil, errClosed
	}
	if err != nil {
		t.discard(cc)
		return nil, err
	}
	t.stats.Dials.Add(1)
	return cc, nil
}

// handshake runs the client's side (see auth.go), bounded by DialTimeout.
func (t *Transport) handshake(cc *clientConn) error {
	addr := cc.addr
	unavailable := func(err error) error {
		if errors.Is(err, dtl.ErrProtocol) {
			return fmt.Errorf("tcp transport: handshake with %s: %w", addr, err)
		}
		return fmt.Errorf("tcp transport: %w: handshake with %s: %w", dtl.ErrUnavailable, addr, err)
	}
	cc.conn.SetDeadline(time.Now().Add(t.cfg.DialTimeout))
	h := hello{Version: protoVersion, Nonce: peerauth.NewNonce(), Node: t.cfg.Node}
	cc.out = appendHello(cc.out[:0], h)
	if _, err := cc.conn.Write(cc.out); err != nil {
		return unavailable(err)
	}
	typ, p, err := readFrame(cc.br, &cc.buf)
	if err != nil {
		return unavailable(err)
	}
	switch typ {
	case tChallenge:
	case tError:
		_, err := refusal(p)
		return fmt.Errorf("tcp transport: handshake with %s: %w", addr, err)
	default:
		return unavailable(protoErr("%v frame where a challenge was expected", typ))
	}
	ch, err := decodeChallenge(p)
	if err != nil {
		return unavailable(err)
	}
	pr := peerauth.Proof{ClientNonce: h.Nonce, ServerNonce: ch.Nonce, ClientNode: h.Node, ServerNode: ch.Node}
	if !peerauth.Valid(t.cfg.Secret, labelServer, pr, ch.MAC) {
		t.log.Warn("the node answering does not hold this job's secret (job secrets differ); nothing is fetched from it", "addr", addr, "node", ch.Node)
		return fmt.Errorf("tcp transport: %s: %w", addr, &dtl.RemoteError{Err: dtl.ErrUnauthorized, Msg: fmt.Sprintf("server %q could not prove it holds this job's secret", ch.Node)})
	}
	cc.node = ch.Node
	cc.out = appendAuth(cc.out[:0], authMsg{MAC: peerauth.Sign(t.cfg.Secret, labelClient, pr)})
	if _, err := cc.conn.Write(cc.out); err != nil {
		return unavailable(err)
	}
	typ, p, err = readFrame(cc.br, &cc.buf)
	if err != nil {
		return unavailable(err)
	}
	switch typ {
	case tReady:
		if err := decodeEmpty(tReady, p); err != nil {
			return unavailable(err)
		}
	case tError:
		_, err := refusal(p)
		return fmt.Errorf("tcp transport: handshake with %s: %w", addr, err)
	default:
		return unavailable(protoErr("%v frame where ready was expected", typ))
	}
	cc.conn.SetDeadline(time.Time{})
	return nil
}
