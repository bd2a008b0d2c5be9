package tcp

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"time"

	"github.com/dyadfs/dyadfs/dtl"
	"github.com/dyadfs/dyadfs/dtl/peerauth"
	"github.com/dyadfs/dyadfs/dtl/wire"
)

// lingerTime bounds how long a server reads what a refused peer still sends
// after the error frame, so that closing does not reset the connection
// before the peer has read why it was refused.
const (
	lingerTime = time.Second
	lingerMax  = 1 << 20
)

// serverConn is one accepted connection; one goroutine serves it.
type serverConn struct {
	t      *Transport
	conn   *net.TCPConn
	br     *bufio.Reader
	bw     *bufio.Writer
	buf    []byte // frame payloads
	out    []byte // frames being encoded
	data   []byte // small chunks and non-regular files
	remote string
	node   string // the peer's node id, as it claims in its hello (bound by its MAC)

	sending wire.Sending // the file being sent
}

func (t *Transport) acceptLoop(ln net.Listener, src dtl.Source) {
	defer t.wg.Done()
	var backoff time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			if t.isClosed() || errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors and the like: wait, do not spin.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			t.log.Warn("accept failed", "err", err, "retry_in", backoff)
			timer := time.NewTimer(backoff)
			select {
			case <-t.ctx.Done():
				timer.Stop()
				return
			case <-timer.C:
			}
			continue
		}
		backoff = 0
		t.stats.Accepts.Add(1)
		tc, ok := c.(*net.TCPConn)
		if !ok {
			c.Close()
			continue
		}
		// Connections that have not authenticated yet cost a goroutine
		// and buffers each: beyond a bound, new ones are turned away.
		select {
		case t.handshaking <- struct{}{}:
		default:
			t.stats.Refused.Add(1)
			t.log.Warn("too many connections authenticating; refused one", "peer", c.RemoteAddr().String(), "max", cap(t.handshaking))
			c.Close()
			continue
		}
		sc := &serverConn{
			t: t, conn: tc, remote: c.RemoteAddr().String(),
			br: bufio.NewReaderSize(tc, 4096), bw: bufio.NewWriterSize(tc, bufSize),
		}
		t.mu.Lock()
		if t.closed {
			t.mu.Unlock()
			<-t.handshaking
			c.Close()
			return
		}
		t.serving[sc] = struct{}{}
		t.wg.Add(1)
		t.mu.Unlock()
		go sc.serve(src)
	}
}

// abort ends the connection from another goroutine (Close): it closes the
// socket and the file being sent, whatever either is blocked in.
func (sc *serverConn) abort() {
	sc.conn.Close()
	sc.sending.Abort(nil, nil)
}

func (sc *serverConn) serve(src dtl.Source) {
	t := sc.t
	defer func() {
		sc.conn.Close()
		t.mu.Lock()
		delete(t.serving, sc)
		t.mu.Unlock()
		t.wg.Done()
	}()
	authenticated := sc.handshake()
	<-t.handshaking
	if !authenticated {
		return
	}
	for {
		sc.conn.SetReadDeadline(time.Now().Add(t.serverIdle))
		typ, p, err := readFrame(sc.br, &sc.buf)
		if err != nil {
			if errors.Is(err, dtl.ErrProtocol) {
				sc.refuse(dtl.CodeProtocol, nil, err.Error())
			}
			return // the peer left, went idle too long, or we are closing
		}
		var ok bool
		switch typ {
		case tGet:
			req, err := decodeGet(p)
			if err != nil {
				sc.refuse(dtl.CodeProtocol, nil, err.Error())
				return
			}
			ok = sc.answer(src, req)
		case tMsg:
			msg, err := decodeMsg(p)
			if err != nil {
				sc.refuse(dtl.CodeProtocol, nil, err.Error())
				return
			}
			ok = sc.answerMessage(msg)
		default:
			sc.refuse(dtl.CodeProtocol, nil, fmt.Sprintf("%v frame where a request was expected", typ))
			return
		}
		if !ok {
			return
		}
	}
}

// handshake runs the server's side of the handshake (see auth.go). It
// reports whether the peer proved it holds the job secret; if not, the
// peer has been told why and the connection is to be closed.
func (sc *serverConn) handshake() bool {
	t := sc.t
	sc.conn.SetDeadline(time.Now().Add(t.cfg.StallTimeout))
	typ, p, err := readFrame(sc.br, &sc.buf)
	if err != nil {
		if errors.Is(err, dtl.ErrProtocol) {
			sc.refuse(dtl.CodeProtocol, nil, err.Error())
		} else {
			t.log.Debug("peer left during the handshake", "peer", sc.remote, "err", err)
		}
		return false
	}
	if typ != tHello {
		sc.refuse(dtl.CodeProtocol, nil, fmt.Sprintf("%v frame where a hello was expected", typ))
		return false
	}
	h, err := decodeHello(p)
	var ev errVersion
	if errors.As(err, &ev) {
		sc.refuse(dtl.CodeVersion, versions, fmt.Sprintf("protocol version %d is not spoken here; this server speaks %v", ev.version, versions))
		return false
	}
	if err != nil {
		sc.refuse(dtl.CodeProtocol, nil, err.Error())
		return false
	}
	sc.node = h.Node
	ch := challenge{Version: protoVersion, Nonce: peerauth.NewNonce(), Node: t.cfg.Node}
	pr := peerauth.Proof{ClientNonce: h.Nonce, ServerNonce: ch.Nonce, ClientNode: h.Node, ServerNode: ch.Node}
	ch.MAC = peerauth.Sign(t.cfg.Secret, labelServer, pr)
	if err := sc.send(appendChallenge(sc.out[:0], ch)); err != nil {
		return false
	}
	typ, p, err = readFrame(sc.br, &sc.buf)
	if err != nil {
		if errors.Is(err, dtl.ErrProtocol) {
			sc.refuse(dtl.CodeProtocol, nil, err.Error())
		} else {
			// A client that finds the server cannot prove the secret
			// hangs up here.
			t.log.Debug("peer left during the handshake", "peer", sc.remote, "node", sc.node, "err", err)
		}
		return false
	}
	if typ != tAuth {
		sc.refuse(dtl.CodeProtocol, nil, fmt.Sprintf("%v frame where auth was expected", typ))
		return false
	}
	a, err := decodeAuth(p)
	if err != nil {
		sc.refuse(dtl.CodeProtocol, nil, err.Error())
		return false
	}
	if !peerauth.Valid(t.cfg.Secret, labelClient, pr, a.MAC) {
		sc.refuse(dtl.CodeUnauthorized, nil, "the peer does not hold this job's secret")
		return false
	}
	if err := sc.send(appendReady(sc.out[:0])); err != nil {
		return false
	}
	sc.conn.SetDeadline(time.Time{})
	return true
}

// send writes whole frames and flushes them.
func (sc *serverConn) send(frames []byte) error {
	sc.out = frames[:0]
	sc.conn.SetWriteDeadline(time.Now().Add(sc.t.cfg.StallTimeout))
	sc.bw.Write(frames)
	return sc.bw.Flush()
}

// refuse tells the peer why it is being disconnected, logs it, and lingers
// briefly so that the error frame is read before the connection closes.
func (sc *serverConn) refuse(code uint16, vs []uint16, reason string) {
	t := sc.t
	t.stats.Refused.Add(1)
	t.log.Warn("refused peer", "peer", sc.remote, "node", sc.node, "reason", reason)
	deadline := time.Now().Add(min(t.cfg.StallTimeout, lingerTime))
	sc.conn.SetDeadline(deadline)
	sc.bw.Write(appendError(sc.out[:0], errFrame{Code: code, Versions: vs, Msg: reason}))
	if sc.bw.Flush() != nil {
		return
	}
	sc.conn.CloseWrite()
	io.CopyN(io.Discard, sc.conn, lingerMax)
}

// answer serves one request. It reports whether the connection can carry
// the next one: a refusal leaves it usable, a failed transfer does not.
func (sc *serverConn) answer(src dtl.Source, req getReq) bool {
	t := sc.t
	if err := wire.CheckPath(req.Path); err != nil {
		return sc.refuseRequest(req, dtl.CodeOutside, err)
	}
	f, info, err := src.OpenPublished(t.ctx, dtl.Request{Path: req.Path, Generation: req.Generation})
	if err != nil {
		if t.ctx.Err() != nil {
			return false
		}
		return sc.refuseRequest(req, dtl.CodeOf(err), err)
	}
	if !sc.sending.Set(f) {
		return false
	}
	defer sc.sending.Clear()
	regular, err := wire.CheckFile(f, info)
	if err != nil {
		return sc.refuseRequest(req, dtl.CodeInternal, err)
	}
	start := time.Now()
	// The end frame goes out only if the file is still what was described
	// once its data is sent (see sendFile); otherwise a refusal replaces it.
	unchanged := func() error { return src.Unchanged(f, info) }
	err = sc.sendFile(f, info, regular, req.Off, req.Len, unchanged)
	var se *wire.SourceError
	if errors.As(err, &se) {
		// Told to the consumer in place of the end frame: the
		// connection is in step.
		t.stats.Refused.Add(1)
		t.log.Warn("could not read a file while sending it; refused", "peer", sc.remote, "node", sc.node, "path", req.Path, "size", info.Size, "err", se.Err)
		return true
	}
	if err != nil {
		if !t.isClosed() {
			t.log.Warn("transfer failed", "peer", sc.remote, "node", sc.node, "path", req.Path, "size", info.Size, "err", err)
		}
		return false
	}
	t.stats.Served.Add(1)
	t.log.Debug("served", "peer", sc.remote, "node", sc.node, "path", req.Path, "size", info.Size, "took", time.Since(start))
	return true
}

// refuseRequest answers a request with an error frame; the connection stays
// usable.
func (sc *serverConn) refuseRequest(req getReq, code uint16, err error) bool {
	t := sc.t
	t.stats.Refused.Add(1)
	t.log.Info("refused request", "peer", sc.remote, "node", sc.node, "path", req.Path, "gen", req.Generation, "err", err)
	return sc.send(appendError(sc.out[:0], errFrame{Code: code, Msg: err.Error()})) == nil
}

// answerMessage answers one message with the handler's reply, or refuses
// it. It reports whether the connection can carry the next request: a
// refusal leaves it usable. The reply goes out in one write, straight to
// the socket (the buffered writer is empty between requests).
func (sc *serverConn) answerMessage(msg []byte) bool {
	t := sc.t
	h := t.handler.Load()
	if h == nil {
		return sc.refuseMessage(dtl.CodeRefused, fmt.Sprintf("node %q handles no messages", t.cfg.Node), slog.LevelInfo)
	}
	reply, err := (*h)(t.ctx, sc.node, msg)
	if t.ctx.Err() != nil {
		return false // closing: the peer sees the connection end
	}
	if err != nil {
		code := dtl.CodeOf(err)
		if code == dtl.CodeInternal {
			code = dtl.CodeRefused
		}
		return sc.refuseMessage(code, err.Error(), slog.LevelDebug)
	}
	if len(reply) > dtl.MaxMessage {
		return sc.refuseMessage(dtl.CodeRefused, fmt.Sprintf("the handler's reply of %d bytes exceeds the %d-byte limit", len(reply), dtl.MaxMessage), slog.LevelWarn)
	}
	sc.out = appendReply(sc.out[:0], reply)
	sc.conn.SetWriteDeadline(time.Now().Add(t.cfg.StallTimeout))
	if _, err := sc.conn.Write(sc.out); err != nil {
		t.log.Debug("reply not sent", "peer", sc.remote, "node", sc.node, "err", err)
		return false
	}
	t.stats.Answered.Add(1)
	return true
}

// refuseMessage answers a message with an error frame, logged at level; the
// connection stays usable.
func (sc *serverConn) refuseMessage(code uint16, reason string, level slog.Level) bool {
	t := sc.t
	t.stats.Refused.Add(1)
	t.log.Log(t.ctx, level, "refused message", "peer", sc.remote, "node", sc.node, "reason", reason)
	return sc.send(appendError(sc.out[:0], errFrame{Code: code, Msg: reason})) == nil
}

// sendFile sends header, chunks and end for f. If, once the data is out,
// unchanged says the file changed meanwhile, a refusal (busy) replaces the
// end frame and the consumer discards what it received. So does one
// (unreadable, or busy if the file shrank) when f cannot be read to its
// end: sendFile returns a *wire.SourceError then, and the connection stays in
// step.
func (sc *serverConn) sendFile(f *os.File, info dtl.FileInfo, regular bool, rangeOff, rangeLen int64, unchanged func() error) error {
	sc.conn.SetWriteDeadline(time.Now().Add(sc.t.cfg.StallTimeout))
	sc.bw.Write(appendHeader(sc.out[:0], info))
	var total int64
	emit := func(off, n int64) error {
		for n > 0 {
			c := min(n, chunkSize)
			var err error
			if regular {
				err = sc.sendChunk(f, off, c)
			} else {
				err = sc.sendSequential(f, off, c)
			}
			if err != nil {
				return err
			}
			off, n, total = off+c, n-c, total+c
			sc.t.stats.BytesSent.Add(c)
		}
		return nil
	}
	var err error
	if rangeLen > 0 {
		// A range: only the data extents inside it.
		lo := min(rangeOff, info.Size)
		hi := lo + min(rangeLen, info.Size-lo)
		if regular {
			err = wire.DataExtentsIn(f, lo, hi, emit, func(err error) error { return err })
		} else {
			err = emit(0, info.Size) // only tests send other files
		}
	} else if regular && info.Size > smallChunk {
		// A failed seek fails the connection, as a failed send does.
		err = wire.DataExtents(f, info.Size, emit, func(err error) error { return err })
	} else {
		// Small files go whole, without looking for holes.
		err = emit(0, info.Size)
	}
	var se *wire.SourceError
	if errors.As(err, &se) {
		if err := sc.pad(se.Pad); err != nil {
			return err
		}
		sc.bw.Write(appendError(sc.out[:0], errFrame{Code: se.Code(), Msg: se.Err.Error()}))
		if err := sc.bw.Flush(); err != nil {
			return err
		}
		return se
	}
	if err != nil {
		return err
	}
	sc.conn.SetWriteDeadline(time.Now().Add(sc.t.cfg.StallTimeout))
	if err := unchanged(); err != nil {
		sc.t.log.Info("file changed while it was sent; refused", "peer", sc.remote, "node", sc.node, "path", f.Name(), "err", err)
		sc.bw.Write(appendError(sc.out[:0], errFrame{Code: dtl.CodeOf(err), Msg: err.Error()}))
		return sc.bw.Flush()
	}
	sc.bw.Write(appendEnd(sc.out[:0], total))
	return sc.bw.Flush()
}

// zeros pads chunks that a source error cut short.
var zeros [smallChunk]byte

func (sc *serverConn) pad(n int64) error {
	for n > 0 {
		k := min(n, int64(len(zeros)))
		sc.conn.SetWriteDeadline(time.Now().Add(sc.t.cfg.StallTimeout))
		if _, err := sc.bw.Write(zeros[:k]); err != nil {
			return err
		}
		n -= k
	}
	return nil
}

// sendChunk sends one chunk of a regular file: small ones through the
// buffer, with the frames around them, large ones with sendfile.
func (sc *serverConn) sendChunk(f *os.File, off, n int64) error {
	sc.conn.SetWriteDeadline(time.Now().Add(sc.t.cfg.StallTimeout))
	if n <= smallChunk {
		if sc.data == nil {
			sc.data = make([]byte, smallChunk)
		}
		// Read first: a file that cannot be read is refused before
		// its chunk begins.
		if k, err := f.ReadAt(sc.data[:n], off); err != nil {
			return wire.ReadFailed(f, off+int64(k), err, 0)
		}
		sc.bw.Write(appendChunk(sc.out[:0], chunkHdr{Off: off, Len: n}))
		_, err := sc.bw.Write(sc.data[:n])
		return err
	}
	sc.bw.Write(appendChunk(sc.out[:0], chunkHdr{Off: off, Len: n}))
	if err := sc.bw.Flush(); err != nil {
		return err
	}
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		return wire.SeekFailed(f, err, n)
	}
	// With an *os.File under the LimitedReader, ReadFrom is sendfile.
	sent, err := sc.conn.ReadFrom(&io.LimitedReader{R: f, N: n})
	if sent == n && err == nil {
		return nil
	}
	// Which end failed? Ask the file for the byte where it stopped.
	var b [1]byte
	if _, rerr := f.ReadAt(b[:], off+sent); rerr != nil || err == nil {
		if rerr == nil {
			rerr = io.EOF
		}
		return wire.ReadFailed(f, off+sent, rerr, n-sent)
	}
	return err // the connection failed
}

// sendSequential sends one chunk of a file that cannot seek, such as a
// pipe, as it comes.
func (sc *serverConn) sendSequential(f *os.File, off, n int64) error {
	if sc.data == nil {
		sc.data = make([]byte, smallChunk)
	}
	sc.conn.SetWriteDeadline(time.Now().Add(sc.t.cfg.StallTimeout))
	sc.bw.Write(appendChunk(sc.out[:0], chunkHdr{Off: off, Len: n}))
	for n > 0 {
		if err := sc.bw.Flush(); err != nil {
			return err
		}
		r, err := f.Read(sc.data[:min(n, int64(len(sc.data)))])
		if r > 0 {
			sc.conn.SetWriteDeadline(time.Now().Add(sc.t.cfg.StallTimeout))
			sc.bw.Write(sc.data[:r])
			n -= int64(r)
			off += int64(r)
		}
		if err != nil && n > 0 {
			return wire.ReadFailed(f, off, err, n)
		}
	}
	return nil
}
