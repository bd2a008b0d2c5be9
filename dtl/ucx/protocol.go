//go:build ucx

package ucx

import (
	"encoding/binary"
	"fmt"
	"strings"

	"github.com/dyadfs/dyadfs/dtl"
	"github.com/dyadfs/dyadfs/dtl/peerauth"
	"github.com/dyadfs/dyadfs/dtl/wire"
)

// The wire format. Every message is one active message (one AM id; UCX
// keeps message boundaries) with a fixed header of hdrLen bytes, big
// endian:
//
//	type u8, reserved u8, code u16, version u32, id u64, a u64, b u64
//
// and a payload that depends on the type. C→S is consumer to owner,
// S→C the reverse.
//
//	C→S hello      version; payload: magic, client nonce [32], node u8-string
//	S→C challenge  version; payload: server nonce [32], server MAC [32], node u8-string
//	C→S auth       payload: client MAC [32]
//	S→C ready
//	C→S get        id, a = generation, b = a range's length (0: the whole
//	               file); payload: the range's offset u64 if b > 0, then
//	               the path
//	S→C header     id; payload: the file's description (infoLen bytes: size,
//	               mode, uid, gid, mtime, generation, checksum [16])
//	S→C file       id; payload: the description, then the whole file
//	S→C data       id, a = offset, b = the file's size; payload: a chunk (rendezvous)
//	S→C end        id, a = the sum of the chunks' lengths
//	S→C error      id (0: about the endpoint), code, a = the version spoken
//	               (dtl.CodeVersion); payload: the reason
//	C→S msg        id; payload: the message
//	S→C reply      id; payload: the reply
//	C→S cancel     id: the consumer gave up on that request
//
// The handshake comes first (the MACs as in auth.go); nothing else is
// answered on an endpoint that has not finished it. A request is answered
// by an error, or a file, or a header, data and an end (or an error in
// place of the end, when the owner could not read the whole file or found
// it changed). Chunks of one file do not overlap and stay within its size.
// Every message but data goes eager; data goes by rendezvous (see
// doc.go). The owner sends the end once every chunk's request completed,
// but a chunk's data lands when the consumer's receive completes, which
// may come after later messages (and nothing promises the order of
// messages across lanes), so none relies on another's order: data carries
// the file's size, the end carries the total.
const (
	magic        = "dyadfs-ucx"
	protoVersion = uint32(3)
	hdrLen       = 32
	infoLen      = wire.InfoLen
	nonceLen     = peerauth.NonceLen
	macLen       = peerauth.MACLen
	maxNode      = peerauth.MaxNode
	maxPath      = wire.MaxPath
	// maxReason bounds an error's reason (longer ones are cut).
	maxReason = 1024
)

type msgType uint8

const (
	tHello msgType = iota + 1
	tChallenge
	tAuth
	tReady
	tGet
	tHeader
	tFile
	tData
	tEnd
	tError
	tMsg
	tReply
	tCancel
)

func (t msgType) String() string {
	names := [...]string{"", "hello", "challenge", "auth", "ready", "get", "header", "file", "data", "end", "error", "msg", "reply", "cancel"}
	if int(t) < len(names) && t != 0 {
		return names[t]
	}
	return fmt.Sprintf("message type %d", uint8(t))
}

// toServer tells the messages a consumer sends from those an owner sends:
// each side accepts only the other's.
func (t msgType) toServer() bool {
	switch t {
	case tHello, tAuth, tGet, tMsg, tCancel:
		return true
	}
	return false
}

// refusal is the error a consumer returns for an error message.
func refusal(code uint16, version uint64, reason string) error {
	if target, ok := dtl.RefusalOf(code); ok {
		return &dtl.RemoteError{Err: target, Msg: reason}
	}
	switch code {
	case dtl.CodeInternal:
		// Not a refusal: the owner failed to read its file; asking
		// again may help.
		return fmt.Errorf("owner failed: %s", reason)
	case dtl.CodeVersion:
		return protoErr("owner speaks version %d, not %d: %s", version, protoVersion, reason)
	case dtl.CodeProtocol:
		return protoErr("owner says: %s", reason)
	}
	return protoErr("error code %d: %s", code, reason)
}

// protoErr wraps dtl.ErrProtocol.
func protoErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", dtl.ErrProtocol, fmt.Sprintf(format, args...))
}

// header is the fixed header of every message.
type header struct {
	typ     msgType
	code    uint16
	version uint32
	id      uint64
	a, b    uint64
}

func (h header) put(b []byte) {
	b[0] = byte(h.typ)
	b[1] = 0
	binary.BigEndian.PutUint16(b[2:], h.code)
	binary.BigEndian.PutUint32(b[4:], h.version)
	binary.BigEndian.PutUint64(b[8:], h.id)
	binary.BigEndian.PutUint64(b[16:], h.a)
	binary.BigEndian.PutUint64(b[24:], h.b)
}

func parseHeader(b []byte) (header, error) {
	if len(b) != hdrLen {
		return header{}, protoErr("header of %d bytes, want %d", len(b), hdrLen)
	}
	return header{
		typ:     msgType(b[0]),
		code:    binary.BigEndian.Uint16(b[2:]),
		version: binary.BigEndian.Uint32(b[4:]),
		id:      binary.BigEndian.Uint64(b[8:]),
		a:       binary.BigEndian.Uint64(b[16:]),
		b:       binary.BigEndian.Uint64(b[24:]),
	}, nil
}

func appendStr8(b []byte, s string) []byte {
	if len(s) > 255 {
		s = s[:255]
	}
	return append(append(b, byte(len(s))), s...)
}

func parseInfo(b []byte) (dtl.FileInfo, error) {
	if len(b) != infoLen {
		return dtl.FileInfo{}, protoErr("file description of %d bytes, want %d", len(b), infoLen)
	}
	fi := dtl.FileInfo{
		Size:       int64(binary.BigEndian.Uint64(b)),
		Mode:       binary.BigEndian.Uint32(b[8:]),
		Uid:        binary.BigEndian.Uint32(b[12:]),
		Gid:        binary.BigEndian.Uint32(b[16:]),
		MtimeNs:    int64(binary.BigEndian.Uint64(b[20:])),
		Generation: binary.BigEndian.Uint64(b[28:]),
	}
	copy(fi.Checksum[:], b[36:])
	if fi.Size < 0 {
		return dtl.FileInfo{}, protoErr("negative file size %d", fi.Size)
	}
	return fi, nil
}

// hello is the consumer's first message; challenge the owner's answer.
type hello struct {
	nonce [nonceLen]byte
	node  string
}

type challenge struct {
	nonce [nonceLen]byte
	mac   [macLen]byte
	node  string
}

func appendHello(b []byte, h hello) []byte {
	b = append(b, magic...)
	b = append(b, h.nonce[:]...)
	return appendStr8(b, h.node)
}

func parseHello(p []byte) (hello, error) {
	var h hello
	if !strings.HasPrefix(string(p), magic) {
		return h, protoErr("not a dyadfs-ucx hello")
	}
	p = p[len(magic):]
	if len(p) < nonceLen+1 || len(p) != nonceLen+1+int(p[nonceLen]) {
		return h, protoErr("hello of %d bytes is malformed", len(p)+len(magic))
	}
	copy(h.nonce[:], p)
	h.node = string(p[nonceLen+1:])
	return h, nil
}

func appendChallenge(b []byte, c challenge) []byte {
	b = append(b, c.nonce[:]...)
	b = append(b, c.mac[:]...)
	return appendStr8(b, c.node)
}

func parseChallenge(p []byte) (challenge, error) {
	var c challenge
	const fixed = nonceLen + macLen
	if len(p) < fixed+1 || len(p) != fixed+1+int(p[fixed]) {
		return c, protoErr("challenge of %d bytes is malformed", len(p))
	}
	copy(c.nonce[:], p)
	copy(c.mac[:], p[nonceLen:])
	c.node = string(p[fixed+1:])
	return c, nil
}

// cut shortens a reason to what an error message carries.
func cut(s string) string {
	if len(s) > maxReason {
		return s[:maxReason]
	}
	return s
}
