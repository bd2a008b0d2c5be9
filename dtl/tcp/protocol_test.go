package tcp

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"reflect"
	"testing"

	"github.com/dyadfs/dyadfs/dtl"

	"github.com/dyadfs/dyadfs/dtl/peerauth"
)

// validClientStreams are well-formed client byte streams: the seed corpus.
func validClientStreams() [][]byte {
	h := hello{Version: protoVersion, Nonce: peerauth.NewNonce(), Node: "node-1"}
	a := authMsg{MAC: peerauth.Sign([]byte("0123456789abcdef"), labelClient, peerauth.Proof{ClientNonce: h.Nonce, ServerNonce: peerauth.NewNonce(), ClientNode: h.Node, ServerNode: "owner"})}
	var full []byte
	full = appendHello(full, h)
	full = appendAuth(full, a)
	full = appendGet(full, getReq{Generation: 42, Path: "run1/step7.dat"})
	full = appendGet(full, getReq{Generation: 1<<64 - 1, Path: "a/b/c"})
	full = appendMsg(full, []byte("publish run1/step7.dat"))
	full = appendMsg(full, nil)
	return [][]byte{
		full,
		appendHello(nil, h),
		appendHello(nil, hello{Version: 1}),
		appendAuth(nil, a),
		appendGet(nil, getReq{Path: "x"}),
		appendGet(nil, getReq{Path: ""}),
		appendMsg(nil, []byte{0, 1, 2}),
		// And the server's messages, which the client decodes.
		appendChallenge(nil, challenge{Version: protoVersion, Node: "owner"}),
		appendReady(nil),
		appendHeader(nil, dtl.FileInfo{Size: 5 << 30, Mode: 0o100644, MtimeNs: 1, Generation: 9}),
		append(appendChunk(nil, chunkHdr{Off: 4096, Len: 3}), 'a', 'b', 'c'),
		appendEnd(nil, 3),
		appendReply(nil, []byte("ok")),
		appendReply(nil, nil),
		appendError(nil, errFrame{Code: dtl.CodeRefused, Msg: "no handler"}),
		appendError(nil, errFrame{Code: dtl.CodeVersion, Versions: []uint16{1, 2}, Msg: "no"}),
		{byte(tHello), 0xff, 0xff, 0xff, 0xff},
	}
}

// decodeAny decodes a frame with the decoder for its type and, when it
// decodes, checks that encoding the result gives back the same frame.
func decodeAny(t *testing.T, typ frameType, p []byte) {
	var again []byte
	switch typ {
	case tHello:
		h, err := decodeHello(p)
		if err != nil {
			return
		}
		if len(h.Node) > maxNode {
			t.Fatalf("node of %d bytes", len(h.Node))
		}
		again = appendHello(nil, h)
	case tAuth:
		a, err := decodeAuth(p)
		if err != nil {
			return
		}
		again = appendAuth(nil, a)
	case tGet:
		g, err := decodeGet(p)
		if err != nil {
			return
		}
		if len(g.Path) > maxPath {
			t.Fatalf("path of %d bytes accepted", len(g.Path))
		}
		again = appendGet(nil, g)
	case tChallenge:
		c, err := decodeChallenge(p)
		if err != nil {
			return
		}
		again = appendChallenge(nil, c)
	case tHeader:
		fi, err := decodeHeader(p)
		if err != nil {
			return
		}
		if fi.Size < 0 {
			t.Fatalf("negative size %d accepted", fi.Size)
		}
		again = appendHeader(nil, fi)
	case tChunk:
		c, err := decodeChunk(p)
		if err != nil {
			return
		}
		if c.Off < 0 || c.Len < 0 {
			t.Fatalf("chunk %+v", c)
		}
		again = appendChunk(nil, c)
	case tEnd:
		n, err := decodeEnd(p)
		if err != nil {
			return
		}
		again = appendEnd(nil, n)
	case tError:
		e, err := decodeError(p)
		if err != nil || len(e.Msg) > maxMsg {
			return // long messages are cut when encoded
		}
		again = appendError(nil, e)
	case tReady:
		if decodeEmpty(typ, p) != nil {
			return
		}
		again = appendReady(nil)
	case tMsg:
		m, err := decodeMsg(p)
		if err != nil {
			if len(p) <= dtl.MaxMessage {
				t.Fatalf("msg of %d bytes refused: %v", len(p), err)
			}
			return
		}
		if len(m) > dtl.MaxMessage {
			t.Fatalf("msg of %d bytes accepted", len(m))
		}
		again = appendMsg(nil, m)
	case tReply:
		m, err := decodeReply(p)
		if err != nil {
			if len(p) <= dtl.MaxMessage {
				t.Fatalf("reply of %d bytes refused: %v", len(p), err)
			}
			return
		}
		if len(m) > dtl.MaxMessage {
			t.Fatalf("reply of %d bytes accepted", len(m))
		}
		again = appendReply(nil, m)
	default:
		return
	}
	if !bytes.Equal(again[frameHeader:], p) {
		t.Fatalf("%v: decoded and encoded again\n%x\nwas\n%x", typ, again[frameHeader:], p)
	}
}

// FuzzDecode feeds arbitrary bytes to the frame reader and to the decoders
// a server applies to what a client sends (hello, auth, get, msg), and
// those a client applies to a server's replies (challenge, ready, header,
// chunk, end, reply, error). Nothing may panic, no payload may
// exceed maxFrame, and whatever decodes must encode back to the same bytes.
func FuzzDecode(f *testing.F) {
	for _, s := range validClientStreams() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bufio.NewReaderSize(bytes.NewReader(data), 4096)
		var buf []byte
		for range 64 {
			typ, p, err := readFrame(r, &buf)
			if err != nil {
				return
			}
			if len(p) > maxFrame || cap(buf) > maxFrame {
				t.Fatalf("payload of %d bytes, buffer of %d", len(p), cap(buf))
			}
			decodeAny(t, typ, p)
			// The server's first look at any frame is as a hello,
			// and a well-formed hello of another version must be
			// told apart.
			if _, err := decodeHello(p); err != nil {
				_ = err.Error()
			}
			if typ == tChunk {
				if c, err := decodeChunk(p); err == nil && c.Len <= maxChunk {
					r.Discard(int(c.Len))
				}
			}
		}
	})
}

func TestRoundTrip(t *testing.T) {
	for _, s := range validClientStreams() {
		r := bufio.NewReader(bytes.NewReader(s))
		var buf []byte
		for {
			typ, p, err := readFrame(r, &buf)
			if err != nil {
				break
			}
			decodeAny(t, typ, p)
			if typ == tChunk {
				c, _ := decodeChunk(p)
				r.Discard(int(c.Len))
			}
		}
	}
	h := hello{Version: protoVersion, Nonce: peerauth.NewNonce(), Node: "n"}
	got, err := decodeHello(appendHello(nil, h)[frameHeader:])
	if err != nil || !reflect.DeepEqual(got, h) {
		t.Errorf("hello: %+v %v", got, err)
	}
	// A future hello, longer or shorter, is told apart by its version.
	future := appendHello(nil, hello{Version: protoVersion + 1})
	_, err = decodeHello(append(future[frameHeader:frameHeader+len(magic)+2], "anything"...))
	if ev, ok := err.(errVersion); !ok || ev.version != protoVersion+1 {
		t.Errorf("future hello: %v", err)
	}
	// Messages and replies up to dtl.MaxMessage, not one byte more (the
	// fuzzer spends its time minimizing seeds that large, so they are
	// checked here).
	for _, n := range []int{0, 1, dtl.MaxMessage} {
		m := make([]byte, n)
		if got, err := decodeMsg(appendMsg(nil, m)[frameHeader:]); err != nil || len(got) != n {
			t.Errorf("msg of %d bytes: %d, %v", n, len(got), err)
		}
		if got, err := decodeReply(appendReply(nil, m)[frameHeader:]); err != nil || len(got) != n {
			t.Errorf("reply of %d bytes: %d, %v", n, len(got), err)
		}
	}
	long := make([]byte, dtl.MaxMessage+1)
	if _, err := decodeMsg(long); !errors.Is(err, dtl.ErrProtocol) {
		t.Errorf("msg of %d bytes: %v", len(long), err)
	}
	if _, err := decodeReply(long); !errors.Is(err, dtl.ErrProtocol) {
		t.Errorf("reply of %d bytes: %v", len(long), err)
	}
	// Frame header limits.
	big := []byte{byte(tGet), 0, 0, 0, 0}
	binary.BigEndian.PutUint32(big[1:], maxFrame+1)
	var buf []byte
	if _, _, err := readFrame(bufio.NewReader(bytes.NewReader(big)), &buf); err == nil || buf != nil {
		t.Errorf("oversized frame: %v, buffer %d", err, cap(buf))
	}
}
