package tcp

import (
	"bufio"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/dyadfs/dyadfs/internal/poll"

	"github.com/dyadfs/dyadfs/dtl"
	"github.com/dyadfs/dyadfs/dtl/dtltest"

	"github.com/dyadfs/dyadfs/dtl/peerauth"
)

// Tests that speak the wire protocol by hand: raw clients against a real
// server, and fake servers against a real client.

type rawConn struct {
	t    *testing.T
	conn net.Conn
	br   *bufio.Reader
	buf  []byte
}

func rawDial(t *testing.T, addr string) *rawConn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	return &rawConn{t: t, conn: c, br: bufio.NewReader(c)}
}

func (r *rawConn) write(b []byte) {
	r.t.Helper()
	if _, err := r.conn.Write(b); err != nil {
		r.t.Fatal(err)
	}
}

func (r *rawConn) read() (frameType, []byte, error) {
	return readFrame(r.br, &r.buf)
}

// expectError reads an error frame with code, then the end of the
// connection.
func (r *rawConn) expectError(code uint16) errFrame {
	r.t.Helper()
	typ, p, err := r.read()
	if err != nil || typ != tError {
		r.t.Fatalf("got %v %v, want an error frame", typ, err)
	}
	e, err := decodeError(p)
	if err != nil || e.Code != code {
		r.t.Fatalf("got %+v %v, want code %d", e, err, code)
	}
	r.expectEOF()
	return e
}

func (r *rawConn) expectEOF() {
	r.t.Helper()
	if typ, _, err := r.read(); err == nil || errors.Is(err, dtl.ErrProtocol) {
		r.t.Fatalf("got %v %v, want the connection closed", typ, err)
	}
}

// authenticate runs the client's handshake by hand.
func (r *rawConn) authenticate(secret []byte) {
	r.t.Helper()
	h := hello{Version: protoVersion, Nonce: peerauth.NewNonce(), Node: "raw"}
	r.write(appendHello(nil, h))
	typ, p, err := r.read()
	if err != nil || typ != tChallenge {
		r.t.Fatalf("got %v %v, want a challenge", typ, err)
	}
	ch, err := decodeChallenge(p)
	if err != nil {
		r.t.Fatal(err)
	}
	pr := peerauth.Proof{ClientNonce: h.Nonce, ServerNonce: ch.Nonce, ClientNode: h.Node, ServerNode: ch.Node}
	r.write(appendAuth(nil, authMsg{MAC: peerauth.Sign(secret, labelClient, pr)}))
	if typ, _, err := r.read(); err != nil || typ != tReady {
		r.t.Fatalf("got %v %v, want ready", typ, err)
	}
}

// TestRawClients: peers that do not speak the protocol, or not this
// version, or do not hold the secret, are refused and never reach the
// Source; each refusal is logged.
func TestRawClients(t *testing.T) {
	secret := dtltest.NewSecret()
	server, src, lg := served(t, secret, opts{stall: time.Second})
	src.WriteFile("f", []byte("f"))
	addr := server.Addr()
	frame := func(typ frameType, payload []byte) []byte {
		b, s := beginFrame(nil, typ)
		return endFrame(append(b, payload...), s)
	}
	helloWith := func(m string, version uint16) []byte {
		b, s := beginFrame(nil, tHello)
		b = append(b, m...)
		b = binary.BigEndian.AppendUint16(b, version)
		b = append(b, make([]byte, nonceLen)...)
		b = appendStr8(b, "raw")
		return endFrame(b, s)
	}

	t.Run("WrongVersion", func(t *testing.T) {
		r := rawDial(t, addr)
		r.write(helloWith(magic, 99))
		e := r.expectError(dtl.CodeVersion)
		if len(e.Versions) != 1 || e.Versions[0] != protoVersion || !strings.Contains(e.Msg, "99") {
			t.Errorf("version error %+v does not name the versions spoken", e)
		}
	})
	t.Run("OlderVersions", func(t *testing.T) {
		// Version 1 (no messages, MACs without node ids), version 2 (no
		// checksum in the header).
		for _, v := range []uint16{1, 2} {
			r := rawDial(t, addr)
			r.write(helloWith(magic, v))
			e := r.expectError(dtl.CodeVersion)
			if len(e.Versions) != 1 || e.Versions[0] != protoVersion {
				t.Errorf("version %d: version error %+v does not name version %d", v, e, protoVersion)
			}
		}
	})
	t.Run("WrongMagic", func(t *testing.T) {
		r := rawDial(t, addr)
		r.write(helloWith("dyadfs-xxx", protoVersion))
		r.expectError(dtl.CodeProtocol)
	})
	t.Run("HTTP", func(t *testing.T) {
		r := rawDial(t, addr)
		r.write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
		r.expectError(dtl.CodeProtocol)
	})
	t.Run("OversizedFrame", func(t *testing.T) {
		r := rawDial(t, addr)
		b := []byte{byte(tHello), 0, 0, 0, 0}
		binary.BigEndian.PutUint32(b[1:], maxFrame+1)
		r.write(b)
		r.expectError(dtl.CodeProtocol)
	})
	t.Run("HugeFrame", func(t *testing.T) {
		r := rawDial(t, addr)
		r.write([]byte{byte(tHello), 0xff, 0xff, 0xff, 0xff})
		r.expectError(dtl.CodeProtocol)
	})
	t.Run("TruncatedHello", func(t *testing.T) {
		r := rawDial(t, addr)
		b := helloWith(magic, protoVersion)
		r.write(b[:20])
		r.conn.(*net.TCPConn).CloseWrite()
		r.expectEOF()
	})
	t.Run("HelloTooShort", func(t *testing.T) {
		r := rawDial(t, addr)
		r.write(frame(tHello, []byte(magic+"\x00\x04short")))
		r.expectError(dtl.CodeProtocol)
	})
	t.Run("GetWithoutHandshake", func(t *testing.T) {
		r := rawDial(t, addr)
		r.write(appendGet(nil, getReq{Path: "f"}))
		r.expectError(dtl.CodeProtocol)
	})
	t.Run("GetWithoutAuth", func(t *testing.T) {
		r := rawDial(t, addr)
		r.write(appendHello(nil, hello{Version: protoVersion, Nonce: peerauth.NewNonce()}))
		if typ, _, err := r.read(); typ != tChallenge || err != nil {
			t.Fatalf("got %v %v, want a challenge", typ, err)
		}
		r.write(appendGet(nil, getReq{Path: "f"}))
		r.expectError(dtl.CodeProtocol)
	})
	t.Run("WrongMAC", func(t *testing.T) {
		r := rawDial(t, addr)
		r.write(appendHello(nil, hello{Version: protoVersion, Nonce: peerauth.NewNonce()}))
		if typ, _, err := r.read(); typ != tChallenge || err != nil {
			t.Fatalf("got %v %v, want a challenge", typ, err)
		}
		r.write(appendAuth(nil, authMsg{}))
		r.expectError(dtl.CodeUnauthorized)
	})
	t.Run("MsgWithoutAuth", func(t *testing.T) {
		r := rawDial(t, addr)
		r.write(appendHello(nil, hello{Version: protoVersion, Nonce: peerauth.NewNonce()}))
		if typ, _, err := r.read(); typ != tChallenge || err != nil {
			t.Fatalf("got %v %v, want a challenge", typ, err)
		}
		r.write(appendMsg(nil, []byte("hi")))
		r.expectError(dtl.CodeProtocol)
	})
	t.Run("MACForAnotherNode", func(t *testing.T) {
		// A client's proof covers the node id of its hello: a proof
		// made for another id is refused.
		r := rawDial(t, addr)
		h := hello{Version: protoVersion, Nonce: peerauth.NewNonce(), Node: "raw"}
		r.write(appendHello(nil, h))
		_, p, _ := r.read()
		ch, err := decodeChallenge(p)
		if err != nil {
			t.Fatal(err)
		}
		pr := peerauth.Proof{ClientNonce: h.Nonce, ServerNonce: ch.Nonce, ClientNode: "other", ServerNode: ch.Node}
		r.write(appendAuth(nil, authMsg{MAC: peerauth.Sign(secret, labelClient, pr)}))
		r.expectError(dtl.CodeUnauthorized)
	})
	t.Run("ReplayedServerMAC", func(t *testing.T) {
		// The server's own proof is no proof for a client.
		r := rawDial(t, addr)
		h := hello{Version: protoVersion, Nonce: peerauth.NewNonce()}
		r.write(appendHello(nil, h))
		_, p, _ := r.read()
		ch, err := decodeChallenge(p)
		if err != nil {
			t.Fatal(err)
		}
		r.write(appendAuth(nil, authMsg{MAC: ch.MAC}))
		r.expectError(dtl.CodeUnauthorized)
	})
	t.Run("Silent", func(t *testing.T) {
		r := rawDial(t, addr)
		start := time.Now()
		r.expectEOF()
		if took := time.Since(start); took > 5*time.Second {
			t.Errorf("server waited %v for a hello (stall timeout 1s)", took)
		}
	})
	if n := src.Calls(); n != 0 {
		t.Errorf("the Source was called %d times by unauthenticated peers", n)
	}
	if n := strings.Count(lg.String(), "refused peer"); n != 14 {
		t.Errorf("%d refusals logged, want 14:\n%s", n, lg)
	}

	t.Run("AuthenticatedBadRequests", func(t *testing.T) {
		r := rawDial(t, addr)
		r.authenticate(secret)
		for _, p := range []string{"../f", "/f", "./f", "a/../f", "f\x00"} {
			r.write(appendGet(nil, getReq{Path: p}))
			typ, pl, err := r.read()
			if err != nil || typ != tError {
				t.Fatalf("%q: got %v %v, want an error frame", p, typ, err)
			}
			if e, _ := decodeError(pl); e.Code != dtl.CodeOutside {
				t.Errorf("%q: got %+v, want code %d", p, e, dtl.CodeOutside)
			}
		}
		if n := src.Calls(); n != 0 {
			t.Errorf("the Source was called %d times for bad paths", n)
		}
		r.write(appendGet(nil, getReq{Path: "f"}))
		if typ, _, err := r.read(); err != nil || typ != tHeader {
			t.Fatalf("got %v %v, want a header", typ, err)
		}
		typ, p, err := r.read()
		if err != nil || typ != tChunk {
			t.Fatalf("got %v %v, want a chunk", typ, err)
		}
		ch, _ := decodeChunk(p)
		if _, err := r.br.Discard(int(ch.Len)); err != nil {
			t.Fatal(err)
		}
		if typ, _, err := r.read(); err != nil || typ != tEnd {
			t.Fatalf("got %v %v, want the end", typ, err)
		}
		// A path longer than PATH_MAX is a protocol error.
		b, s := beginFrame(nil, tGet)
		b = binary.BigEndian.AppendUint64(b, 0)
		b = appendStr16(b, strings.Repeat("a", maxPath+1))
		r.write(endFrame(b, s))
		r.expectError(dtl.CodeProtocol)
	})
	t.Run("OversizedMsg", func(t *testing.T) {
		// A message longer than dtl.MaxMessage is a protocol error,
		// though it fits in a frame.
		if dtl.MaxMessage+1 > maxFrame {
			t.Fatal("dtl.MaxMessage no longer fits in a frame")
		}
		r := rawDial(t, addr)
		r.authenticate(secret)
		r.write(appendMsg(nil, make([]byte, dtl.MaxMessage+1)))
		r.expectError(dtl.CodeProtocol)
	})
}

// fakeServer accepts connections, runs the server's handshake with secret
// and hands each connection, past the handshake and its first request, to
// handle. Its goroutines end with the test.
func fakeServer(t *testing.T, secret []byte, handle func(c net.Conn, br *bufio.Reader, req getReq)) string {
	t.Helper()
	return fakeServerFrames(t, secret, "fake", func(c net.Conn, br *bufio.Reader, typ frameType, p []byte) {
		if typ != tGet {
			return
		}
		req, err := decodeGet(p)
		if err != nil {
			return
		}
		handle(c, br, req)
	})
}

// fakeServerFrames is fakeServer for a server of node that hands handle
// its first request frame, whatever it is.
func fakeServerFrames(t *testing.T, secret []byte, node string, handle func(c net.Conn, br *bufio.Reader, typ frameType, p []byte)) string {
	t.Helper()
	return dtltest.AcceptLoop(t, func(c net.Conn, track func(net.Conn)) {
		defer c.Close()
		br := bufio.NewReader(c)
		var buf []byte
		typ, p, err := readFrame(br, &buf)
		if err != nil || typ != tHello {
			return
		}
		h, err := decodeHello(p)
		if err != nil {
			return
		}
		ch := challenge{Version: protoVersion, Nonce: peerauth.NewNonce(), Node: node}
		ch.MAC = peerauth.Sign(secret, labelServer, peerauth.Proof{ClientNonce: h.Nonce, ServerNonce: ch.Nonce, ClientNode: h.Node, ServerNode: ch.Node})
		c.Write(appendChallenge(nil, ch))
		if typ, _, err := readFrame(br, &buf); err != nil || typ != tAuth {
			return
		}
		c.Write(appendReady(nil))
		typ, p, err = readFrame(br, &buf)
		if err != nil {
			return
		}
		handle(c, br, typ, p)
	})
}

// hold keeps a connection open, sending nothing, until the test ends.
func hold(c net.Conn) { io.Copy(io.Discard, c) }

// TestStalls: a server that stops sending fails the transfer within about
// the stall timeout, with an error that is not a refusal.
func TestStalls(t *testing.T) {
	const stall = 200 * time.Millisecond
	secret := dtltest.NewSecret()
	cases := map[string]func(c net.Conn, br *bufio.Reader, req getReq){
		"NoReply": func(c net.Conn, br *bufio.Reader, req getReq) { hold(c) },
		"AfterHeader": func(c net.Conn, br *bufio.Reader, req getReq) {
			c.Write(appendHeader(nil, dtl.FileInfo{Size: 10 << 20}))
			hold(c)
		},
		"MidChunk": func(c net.Conn, br *bufio.Reader, req getReq) {
			b := appendHeader(nil, dtl.FileInfo{Size: 10 << 20})
			b = appendChunk(b, chunkHdr{Off: 0, Len: 1 << 20})
			c.Write(append(b, make([]byte, 100_000)...))
			hold(c)
		},
		"BeforeEnd": func(c net.Conn, br *bufio.Reader, req getReq) {
			b := appendHeader(nil, dtl.FileInfo{Size: 10})
			b = appendChunk(b, chunkHdr{Off: 0, Len: 10})
			c.Write(append(b, make([]byte, 10)...))
			hold(c)
		},
		"Trickle": func(c net.Conn, br *bufio.Reader, req getReq) {
			// Progress slower than a byte per stall timeout.
			b := appendHeader(nil, dtl.FileInfo{Size: 10 << 20})
			b = appendChunk(b, chunkHdr{Off: 0, Len: 10 << 20})
			c.Write(b)
			tick := time.NewTicker(stall / 2)
			defer tick.Stop()
			for range tick.C {
				if _, err := c.Write([]byte{1}); err != nil {
					return
				}
			}
		},
	}
	for name, handle := range cases {
		t.Run(name, func(t *testing.T) {
			addr := fakeServer(t, secret, handle)
			client, _ := newTransport(t, secret, opts{stall: stall})
			start := time.Now()
			_, err := client.Fetch(ctxFor(t), addr, dtl.Request{Path: "f"}, dtl.NewSink(dtltest.Dst(t)))
			took := time.Since(start)
			var re *dtl.RemoteError
			if err == nil || errors.As(err, &re) || errors.Is(err, dtl.ErrUnavailable) || errors.Is(err, dtl.ErrProtocol) {
				t.Errorf("got %v, want a transfer failure", err)
			}
			if name != "Trickle" && (took < stall || took > stall+time.Second) {
				t.Errorf("failed after %v, stall timeout %v", took, stall)
			}
			if name == "Trickle" && took > 3*time.Second {
				// A byte every stall/2 renews nothing before a
				// piece completes; only the piece's deadline
				// bounds this.
				t.Errorf("failed after %v", took)
			}
			t.Logf("%v: %v", took, err)
		})
	}
}

// TestCutMidTransfer: a connection lost in the middle of a reply is a
// transfer failure, not a refusal and not a protocol error.
func TestCutMidTransfer(t *testing.T) {
	secret := dtltest.NewSecret()
	addr := fakeServer(t, secret, func(c net.Conn, br *bufio.Reader, req getReq) {
		b := appendHeader(nil, dtl.FileInfo{Size: 10 << 20})
		b = appendChunk(b, chunkHdr{Off: 0, Len: 1 << 20})
		c.Write(append(b, make([]byte, 100_000)...))
		c.(*net.TCPConn).SetLinger(0)
		c.Close()
	})
	client, _ := newTransport(t, secret, opts{})
	_, err := client.Fetch(ctxFor(t), addr, dtl.Request{Path: "f"}, dtl.NewSink(dtltest.Dst(t)))
	var re *dtl.RemoteError
	if err == nil || errors.As(err, &re) || errors.Is(err, dtl.ErrProtocol) || errors.Is(err, dtl.ErrUnavailable) {
		t.Errorf("got %v, want a transfer failure", err)
	}
	t.Log(err)
}

// TestBadServers: replies that break the protocol wrap dtl.ErrProtocol.
func TestBadServers(t *testing.T) {
	secret := dtltest.NewSecret()
	send := func(frames ...[]byte) func(c net.Conn, br *bufio.Reader, req getReq) {
		return func(c net.Conn, br *bufio.Reader, req getReq) {
			for _, f := range frames {
				c.Write(f)
			}
			hold(c)
		}
	}
	hdr := func(size int64) []byte { return appendHeader(nil, dtl.FileInfo{Size: size}) }
	chunk := func(off, n int64) []byte {
		return append(appendChunk(nil, chunkHdr{Off: off, Len: n}), make([]byte, n)...)
	}
	cases := map[string]func(c net.Conn, br *bufio.Reader, req getReq){
		"ChunkBeyondSize":  send(hdr(10), chunk(5, 10)),
		"ChunkAfterEOF":    send(hdr(10), chunk(10, 1)),
		"OverlappingChunk": send(hdr(100), chunk(0, 10), chunk(5, 10)),
		"BackwardsChunk":   send(hdr(100), chunk(50, 10), chunk(0, 10)),
		"EmptyChunk":       send(hdr(100), chunk(0, 0)),
		"HugeOffset":       send(hdr(100), appendChunk(nil, chunkHdr{Off: 1<<63 - 1, Len: 1})),
		"NegativeSize":     send(appendHeader(nil, dtl.FileInfo{Size: -1})),
		"WrongTotal":       send(hdr(10), chunk(0, 10), appendEnd(nil, 11)),
		"OversizedFrame":   send([]byte{byte(tHeader), 0, 1, 0, 1}),
		"UnknownFrame":     send([]byte{200, 0, 0, 0, 0}),
		"ReadyAgain":       send(appendReady(nil)),
		"ShortHeader":      send([]byte{byte(tHeader), 0, 0, 0, 3, 1, 2, 3}),
		"TrailingBytes":    send(hdr(0), []byte{byte(tEnd), 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0}),
		"UnknownCode":      send(appendError(nil, errFrame{Code: 999, Msg: "?"})),
	}
	for name, handle := range cases {
		t.Run(name, func(t *testing.T) {
			addr := fakeServer(t, secret, handle)
			client, _ := newTransport(t, secret, opts{})
			_, err := client.Fetch(ctxFor(t), addr, dtl.Request{Path: "f"}, dtl.NewSink(dtltest.Dst(t)))
			if !errors.Is(err, dtl.ErrProtocol) {
				t.Errorf("got %v, want %v", err, dtl.ErrProtocol)
			}
			if idleConns(client) != 0 {
				t.Error("a connection that broke the protocol was pooled")
			}
		})
	}
}

// TestServerWithoutSecret: a fake server that does not hold the secret
// cannot prove it, and the client tells.
func TestServerWithoutSecret(t *testing.T) {
	addr := fakeServer(t, dtltest.NewSecret(), func(c net.Conn, br *bufio.Reader, req getReq) {
		t.Error("the client sent a request to a server that could not prove the secret")
	})
	client, _ := newTransport(t, dtltest.NewSecret(), opts{})
	_, err := client.Fetch(ctxFor(t), addr, dtl.Request{Path: "f"}, dtl.NewSink(dtltest.Dst(t)))
	if !errors.Is(err, dtl.ErrUnauthorized) {
		t.Errorf("got %v, want %v", err, dtl.ErrUnauthorized)
	}
}

// TestVersionRefusedByServer: a client told that its version is not spoken
// reports a protocol error naming the server's versions.
func TestVersionRefusedByServer(t *testing.T) {
	addr := dtltest.AcceptLoop(t, func(c net.Conn, _ func(net.Conn)) {
		defer c.Close()
		var buf []byte
		readFrame(bufio.NewReader(c), &buf)
		c.Write(appendError(nil, errFrame{Code: dtl.CodeVersion, Versions: []uint16{7, 8}, Msg: "speak 7 or 8"}))
	})
	client, _ := newTransport(t, dtltest.NewSecret(), opts{})
	_, err := client.Fetch(ctxFor(t), addr, dtl.Request{Path: "f"}, dtl.NewSink(dtltest.Dst(t)))
	if !errors.Is(err, dtl.ErrProtocol) || !strings.Contains(err.Error(), "[7 8]") {
		t.Errorf("got %v, want a protocol error naming versions 7 and 8", err)
	}
}

// TestRefusalInsteadOfEnd: a server that finds, once the data is sent, that
// the file changed refuses in place of the end frame; the client reports
// the refusal and the connection stays in step.
func TestRefusalInsteadOfEnd(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	addr := fakeServer(t, secret, func(c net.Conn, br *bufio.Reader, req getReq) {
		c.Write(appendHeader(nil, dtl.FileInfo{Size: 10}))
		c.Write(append(appendChunk(nil, chunkHdr{Off: 0, Len: 10}), make([]byte, 10)...))
		c.Write(appendError(nil, errFrame{Code: dtl.CodeBusy, Msg: "rewritten while sent"}))
	})
	client, _ := newTransport(t, secret, opts{})
	_, err := client.Fetch(ctxFor(t), addr, dtl.Request{Path: "f"}, dtl.NewSink(dtltest.Dst(t)))
	var re *dtl.RemoteError
	if !errors.As(err, &re) || !errors.Is(err, dtl.ErrBusy) {
		t.Fatalf("got %v, want a busy refusal", err)
	}
}

// TestHandshakeBound: peers that connect and say nothing hold at most
// maxHandshaking slots; one more is turned away at once, and once the
// silent peers leave, a real client is served again.
func TestHandshakeBound(t *testing.T) {
	secret := dtltest.NewSecret()
	server, src, lg := served(t, secret, opts{})
	src.WriteFile("f", []byte("f"))
	silent := make([]*rawConn, maxHandshaking)
	for i := range silent {
		silent[i] = rawDial(t, server.Addr())
	}
	// Accepts are handled in order, so this one finds every slot taken.
	extra := rawDial(t, server.Addr())
	extra.expectEOF()
	if !strings.Contains(lg.String(), "too many connections authenticating") {
		t.Errorf("refusal not logged:\n%s", lg)
	}
	for _, r := range silent {
		r.conn.Close()
	}
	client, _ := newTransport(t, secret, opts{})
	// Slots are freed as the server notices each close.
	poll.Until(t, 10*time.Second, "a fetch after the silent peers left", func() bool {
		_, err := client.Fetch(ctxFor(t), server.Addr(), dtl.Request{Path: "f"}, dtl.NewSink(dtltest.Dst(t)))
		return err == nil
	})
}
