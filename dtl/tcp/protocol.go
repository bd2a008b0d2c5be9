package tcp

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"

	"github.com/dyadfs/dyadfs/dtl"
	"github.com/dyadfs/dyadfs/dtl/peerauth"
	"github.com/dyadfs/dyadfs/dtl/wire"
)

// The wire format. Every message is a frame:
//
//	type    u8
//	length  u32, big endian, at most maxFrame
//	payload length bytes
//
// Integers are big endian. A string is a length (u8 or u16, as noted)
// followed by that many bytes. A chunk frame is followed by the chunk's
// raw bytes, which are not part of its payload; nothing else is.
//
// Handshake (the client speaks first, the server proves first):
//
//	C→S hello      magic "dyadfs-dtl", version u16, client nonce [32],
//	               node u8-string
//	S→C challenge  version u16, server nonce [32], server MAC [32],
//	               node u8-string
//	C→S auth       client MAC [32]
//	S→C ready      (empty)
//
// Both MACs cover both nonces and both node names (see auth.go).
//
// Requests, any number, one at a time, on an authenticated connection,
// either a file:
//
//	C→S get        generation u64, path u16-string, offset u64, length u64
//	               (length 0: the whole file; otherwise only the chunks
//	               of [offset, offset+length) follow the header)
//	S→C error      code u16, versions u8-count + u16 each, message u16-string
//	or
//	S→C header     size i64, mode u32, uid u32, gid u32, mtime ns i64, generation u64,
//	               checksum [16] (all zero: none; see internal/digest)
//	S→C chunk      offset u64, length u32, then length bytes    (repeated)
//	S→C end        total u64: the sum of the chunk lengths
//	or, in place of end, when the server could not read the whole file
//	(the rest of the chunk it was in is sent as zeros first):
//	S→C error      dtl.CodeUnreadable, or dtl.CodeBusy if the file shrank
//
// or a message (version 2 on):
//
//	C→S msg        the message: the whole payload, at most dtl.MaxMessage
//	S→C reply      the reply: the whole payload, at most dtl.MaxMessage
//	or
//	S→C error      as above (dtl.CodeRefused, or the code of a dtl error)
//
// The magic and the version come first in the hello of every version, so
// that a server can always tell a client of another version and answer it
// with an error frame (dtl.CodeVersion) that lists the versions it speaks. A
// refusal of a request (error frame in place of a header or a reply)
// leaves the connection usable; any other error frame, and any failure in
// the middle of a reply, ends the connection. A msg or reply longer than
// dtl.MaxMessage breaks the protocol, as any frame longer than maxFrame
// does.
//
// Version 1 had no msg and reply, and its MACs did not cover the node
// names; version 2 had no checksum in the header; version 3 no range in
// get. A peer of an older
// version gets the version error.
const (
	magic = "dyadfs-dtl"
	// protoVersion is the version this package speaks.
	protoVersion = uint16(4)
	frameHeader  = 5
	// maxFrame bounds every frame's payload: a peer announcing more
	// breaks the protocol.
	maxFrame = 64 << 10
	nonceLen = peerauth.NonceLen
	macLen   = peerauth.MACLen
	maxNode  = peerauth.MaxNode
	maxPath  = wire.MaxPath
	// maxMsg bounds an error message (longer ones are cut).
	maxMsg = 1024
	// maxChunk is the largest chunk a client accepts; servers send
	// chunkSize.
	maxChunk = 16 << 20
)

// versions are the protocol versions this package speaks.
var versions = []uint16{protoVersion}

type frameType uint8

const (
	tHello frameType = iota + 1
	tChallenge
	tAuth
	tReady
	tGet
	tHeader
	tChunk
	tEnd
	tError
	tMsg
	tReply
)

func (t frameType) String() string {
	names := [...]string{"", "hello", "challenge", "auth", "ready", "get", "header", "chunk", "end", "error", "msg", "reply"}
	if int(t) < len(names) && t != 0 {
		return names[t]
	}
	return fmt.Sprintf("frame type %d", uint8(t))
}

type hello struct {
	Version uint16
	Nonce   [nonceLen]byte
	Node    string
}

type challenge struct {
	Version uint16
	Nonce   [nonceLen]byte
	MAC     [macLen]byte
	Node    string
}

type authMsg struct {
	MAC [macLen]byte
}

type getReq struct {
	Generation uint64
	Path       string
	Off, Len   int64 // a range; Len 0: the whole file
}

type chunkHdr struct {
	Off int64
	Len int64
}

type errFrame struct {
	Code     uint16
	Versions []uint16
	Msg      string
}

// errVersion is returned by decodeHello for a well-formed hello of a
// version this package does not speak.
type errVersion struct{ version uint16 }

func (e errVersion) Error() string {
	return fmt.Sprintf("protocol version %d is not spoken (this side speaks %v)", e.version, versions)
}

// protoErr wraps dtl.ErrProtocol.
func protoErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", dtl.ErrProtocol, fmt.Sprintf(format, args...))
}

// Encoding. Every append* function appends one whole frame to b.

func beginFrame(b []byte, t frameType) ([]byte, int) {
	start := len(b)
	b = append(b, byte(t), 0, 0, 0, 0)
	return b, start
}

func endFrame(b []byte, start int) []byte {
	binary.BigEndian.PutUint32(b[start+1:], uint32(len(b)-start-frameHeader))
	return b
}

func appendStr8(b []byte, s string) []byte {
	if len(s) > 255 {
		s = s[:255]
	}
	return append(append(b, byte(len(s))), s...)
}

func appendStr16(b []byte, s string) []byte {
	if len(s) > 0xffff {
		s = s[:0xffff]
	}
	return append(binary.BigEndian.AppendUint16(b, uint16(len(s))), s...)
}

func appendHello(b []byte, h hello) []byte {
	b, s := beginFrame(b, tHello)
	b = append(b, magic...)
	b = binary.BigEndian.AppendUint16(b, h.Version)
	b = append(b, h.Nonce[:]...)
	b = appendStr8(b, h.Node)
	return endFrame(b, s)
}

func appendChallenge(b []byte, c challenge) []byte {
	b, s := beginFrame(b, tChallenge)
	b = binary.BigEndian.AppendUint16(b, c.Version)
	b = append(b, c.Nonce[:]...)
	b = append(b, c.MAC[:]...)
	b = appendStr8(b, c.Node)
	return endFrame(b, s)
}

func appendAuth(b []byte, a authMsg) []byte {
	b, s := beginFrame(b, tAuth)
	b = append(b, a.MAC[:]...)
	return endFrame(b, s)
}

func appendReady(b []byte) []byte {
	b, s := beginFrame(b, tReady)
	return endFrame(b, s)
}

func appendGet(b []byte, g getReq) []byte {
	b, s := beginFrame(b, tGet)
	b = binary.BigEndian.AppendUint64(b, g.Generation)
	b = appendStr16(b, g.Path)
	b = binary.BigEndian.AppendUint64(b, uint64(g.Off))
	b = binary.BigEndian.AppendUint64(b, uint64(g.Len))
	return endFrame(b, s)
}

func appendHeader(b []byte, fi dtl.FileInfo) []byte {
	b, s := beginFrame(b, tHeader)
	b = wire.AppendInfo(b, fi)
	return endFrame(b, s)
}

func appendChunk(b []byte, c chunkHdr) []byte {
	b, s := beginFrame(b, tChunk)
	b = binary.BigEndian.AppendUint64(b, uint64(c.Off))
	b = binary.BigEndian.AppendUint32(b, uint32(c.Len))
	return endFrame(b, s)
}

func appendEnd(b []byte, total int64) []byte {
	b, s := beginFrame(b, tEnd)
	b = binary.BigEndian.AppendUint64(b, uint64(total))
	return endFrame(b, s)
}

// appendMsg and appendReply copy m into the frame; m must not be longer
// than dtl.MaxMessage.
func appendMsg(b []byte, m []byte) []byte {
	b, s := beginFrame(b, tMsg)
	return endFrame(append(b, m...), s)
}

func appendReply(b []byte, m []byte) []byte {
	b, s := beginFrame(b, tReply)
	return endFrame(append(b, m...), s)
}

func appendError(b []byte, e errFrame) []byte {
	b, s := beginFrame(b, tError)
	b = binary.BigEndian.AppendUint16(b, e.Code)
	vs := e.Versions
	if len(vs) > 255 {
		vs = vs[:255]
	}
	b = append(b, byte(len(vs)))
	for _, v := range vs {
		b = binary.BigEndian.AppendUint16(b, v)
	}
	msg := e.Msg
	if len(msg) > maxMsg {
		msg = msg[:maxMsg]
	}
	b = appendStr16(b, msg)
	return endFrame(b, s)
}

// readFrame reads one frame from r. The payload is read into *buf, which
// grows as needed but never beyond maxFrame, and is valid until the next
// call. A frame announcing more than maxFrame is refused before anything
// is allocated for it.
func readFrame(r *bufio.Reader, buf *[]byte) (frameType, []byte, error) {
	return readFrameOwned(r, buf, 0)
}

// readFrameOwned is readFrame, except that the payload of a frame of type
// owned is read into a new slice of its size, which the caller keeps
// (rather than into *buf and copied from there).
func readFrameOwned(r *bufio.Reader, buf *[]byte, owned frameType) (frameType, []byte, error) {
	hdr, err := r.Peek(frameHeader)
	if err != nil {
		if len(hdr) > 0 && err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, err
	}
	t := frameType(hdr[0])
	n := binary.BigEndian.Uint32(hdr[1:])
	if n > maxFrame {
		return 0, nil, protoErr("%v frame of %d bytes exceeds the %d-byte limit", t, n, maxFrame)
	}
	r.Discard(frameHeader)
	var p []byte
	if owned != 0 && t == owned {
		p = make([]byte, n)
	} else {
		if cap(*buf) < int(n) {
			*buf = make([]byte, n, max(int(n), 512))
		}
		p = (*buf)[:n]
	}
	if _, err := io.ReadFull(r, p); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, err
	}
	return t, p, nil
}

// decoder reads fields from a payload; the first shortage sticks.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) take(n int) []byte {
	if d.err != nil {
		return nil
	}
	if n > len(d.b) {
		d.err = protoErr("payload too short")
		return nil
	}
	p := d.b[:n]
	d.b = d.b[n:]
	return p
}

func (d *decoder) u8() uint8 {
	if p := d.take(1); p != nil {
		return p[0]
	}
	return 0
}

func (d *decoder) u16() uint16 {
	if p := d.take(2); p != nil {
		return binary.BigEndian.Uint16(p)
	}
	return 0
}

func (d *decoder) u32() uint32 {
	if p := d.take(4); p != nil {
		return binary.BigEndian.Uint32(p)
	}
	return 0
}

func (d *decoder) u64() uint64 {
	if p := d.take(8); p != nil {
		return binary.BigEndian.Uint64(p)
	}
	return 0
}

func (d *decoder) str8() string  { return string(d.take(int(d.u8()))) }
func (d *decoder) str16() string { return string(d.take(int(d.u16()))) }

// finish reports the first error, or trailing bytes.
func (d *decoder) finish(what frameType) error {
	if d.err == nil && len(d.b) != 0 {
		d.err = protoErr("%d unexpected bytes after %v", len(d.b), what)
	}
	if d.err != nil {
		return fmt.Errorf("%v: %w", what, d.err)
	}
	return nil
}

// Decoders of the client's messages (what a server reads from anyone).

// decodeHello reads a hello. A hello with the right magic and a version
// this side does not speak yields errVersion, whatever follows.
func decodeHello(p []byte) (hello, error) {
	d := decoder{b: p}
	if string(d.take(len(magic))) != magic {
		return hello{}, protoErr("not a dyadfs-dtl hello")
	}
	var h hello
	h.Version = d.u16()
	if d.err == nil && h.Version != protoVersion {
		return hello{}, errVersion{h.Version}
	}
	copy(h.Nonce[:], d.take(nonceLen))
	h.Node = d.str8()
	return h, d.finish(tHello)
}

func decodeAuth(p []byte) (authMsg, error) {
	d := decoder{b: p}
	var a authMsg
	copy(a.MAC[:], d.take(macLen))
	return a, d.finish(tAuth)
}

func decodeGet(p []byte) (getReq, error) {
	d := decoder{b: p}
	var g getReq
	g.Generation = d.u64()
	n := int(d.u16())
	if d.err == nil && n > maxPath {
		return getReq{}, protoErr("path of %d bytes exceeds %d", n, maxPath)
	}
	g.Path = string(d.take(n))
	g.Off, g.Len = int64(d.u64()), int64(d.u64())
	if d.err == nil && (g.Off < 0 || g.Len < 0) {
		return getReq{}, protoErr("range of %d bytes at %d", g.Len, g.Off)
	}
	return g, d.finish(tGet)
}

// decodeMsg returns the message a msg frame carries: the payload itself,
// valid as long as p is.
func decodeMsg(p []byte) ([]byte, error) {
	if len(p) > dtl.MaxMessage {
		return nil, protoErr("msg of %d bytes exceeds the %d-byte limit", len(p), dtl.MaxMessage)
	}
	return p, nil
}

// Decoders of the server's messages (what a client reads).

// decodeReply returns the reply a reply frame carries: the payload
// itself, valid as long as p is.
func decodeReply(p []byte) ([]byte, error) {
	if len(p) > dtl.MaxMessage {
		return nil, protoErr("reply of %d bytes exceeds the %d-byte limit", len(p), dtl.MaxMessage)
	}
	return p, nil
}

func decodeChallenge(p []byte) (challenge, error) {
	d := decoder{b: p}
	var c challenge
	c.Version = d.u16()
	copy(c.Nonce[:], d.take(nonceLen))
	copy(c.MAC[:], d.take(macLen))
	c.Node = d.str8()
	if err := d.finish(tChallenge); err != nil {
		return challenge{}, err
	}
	if c.Version != protoVersion {
		return challenge{}, protoErr("server answered with version %d to a version %d hello", c.Version, protoVersion)
	}
	return c, nil
}

func decodeHeader(p []byte) (dtl.FileInfo, error) {
	d := decoder{b: p}
	var fi dtl.FileInfo
	fi.Size = int64(d.u64())
	fi.Mode = d.u32()
	fi.Uid = d.u32()
	fi.Gid = d.u32()
	fi.MtimeNs = int64(d.u64())
	fi.Generation = d.u64()
	copy(fi.Checksum[:], d.take(len(fi.Checksum)))
	if err := d.finish(tHeader); err != nil {
		return dtl.FileInfo{}, err
	}
	if fi.Size < 0 {
		return dtl.FileInfo{}, protoErr("negative file size %d", fi.Size)
	}
	return fi, nil
}

func decodeChunk(p []byte) (chunkHdr, error) {
	d := decoder{b: p}
	off := d.u64()
	n := d.u32()
	if err := d.finish(tChunk); err != nil {
		return chunkHdr{}, err
	}
	if off > 1<<63-1 {
		return chunkHdr{}, protoErr("chunk offset %d out of range", off)
	}
	return chunkHdr{Off: int64(off), Len: int64(n)}, nil
}

func decodeEnd(p []byte) (int64, error) {
	d := decoder{b: p}
	total := d.u64()
	if err := d.finish(tEnd); err != nil {
		return 0, err
	}
	if total > 1<<63-1 {
		return 0, protoErr("end total %d out of range", total)
	}
	return int64(total), nil
}

func decodeError(p []byte) (errFrame, error) {
	d := decoder{b: p}
	var e errFrame
	e.Code = d.u16()
	n := int(d.u8())
	for i := 0; i < n && d.err == nil; i++ {
		e.Versions = append(e.Versions, d.u16())
	}
	e.Msg = d.str16()
	return e, d.finish(tError)
}

// decodeEmpty checks that a frame that carries nothing carries nothing.
func decodeEmpty(t frameType, p []byte) error {
	d := decoder{b: p}
	return d.finish(t)
}
