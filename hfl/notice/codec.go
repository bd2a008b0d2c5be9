package notice

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/dyadfs/dyadfs/hfl"
	"github.com/dyadfs/dyadfs/internal/digest"
)

// Notices and replies travel in a compact binary form: every published
// file costs a few of them on each side, and encoding/json spent more CPU
// on them than anything else in the protocol. A message is a version
// byte, then the fields a bit set says are there, in a fixed order:
// unsigned integers as uvarints, signed ones as varints, strings and bytes
// after their length. Every daemon of a job runs one release, so the
// version only tells a stray message from another release.

// codecVersion is the first byte of every message.
const codecVersion = 2

// Fields of a notice, as bits of its field set.
const (
	nPath uint64 = 1 << iota
	nAfter
	nGen
	nPublish
	nRec
	nMember
	nInline
	nAhead
	nSync
	nListing
	nListingEnded
	nHeld
	nForwarded
	nSettle
)

// Fields of a reply.
const (
	rRec uint64 = 1 << iota
	rInline
	rKnown
	rGen
	rHome
	rNoPromise
	rPending
)

// Fields of a record.
const (
	recTarget uint64 = 1 << iota
	recAlloc
	recSum
	recIno
	recWriting
	recProvisional
)

// setIf adds bit to the field set f when on.
func setIf(f *uint64, bit uint64, on bool) {
	if on {
		*f |= bit
	}
}

// errBadMessage is wrapped by every decoding failure.
var errBadMessage = errors.New("malformed message")

// encodeNotice encodes msg; msg.Rec's own bytes are not sent (msg.Inline
// carries them).
func encodeNotice(msg notice) []byte {
	var f uint64
	setIf(&f, nPath, msg.Path != "")
	setIf(&f, nAfter, msg.After != 0)
	setIf(&f, nGen, msg.Gen != 0)
	setIf(&f, nPublish, msg.Publish != 0)
	setIf(&f, nRec, msg.Rec != nil)
	setIf(&f, nMember, msg.Member != nil)
	setIf(&f, nInline, msg.Inline != nil)
	setIf(&f, nAhead, msg.Ahead)
	setIf(&f, nSync, msg.Sync)
	setIf(&f, nListing, msg.Listing)
	setIf(&f, nListingEnded, msg.ListingEnded)
	setIf(&f, nHeld, msg.Held)
	setIf(&f, nForwarded, msg.Forwarded)
	setIf(&f, nSettle, msg.Settle)
	// Sized once: a notice that outgrew its buffer by a byte would copy a
	// small file's bytes into one twice their size.
	size := 96 + len(msg.Path) + inlineLen(msg.Inline)
	if msg.Rec != nil {
		size += recordMax + len(msg.Rec.Path) + len(msg.Rec.Owner) + len(msg.Rec.Target)
	}
	if msg.Member != nil {
		size += 32 + len(msg.Member.Node) + len(msg.Member.Transport) + len(msg.Member.Addr)
	}
	b := make([]byte, 0, size)
	b = append(b, codecVersion, byte(msg.Kind))
	b = binary.AppendUvarint(b, f)
	if f&nPath != 0 {
		b = appendString(b, msg.Path)
	}
	if f&nAfter != 0 {
		b = binary.AppendUvarint(b, msg.After)
	}
	if f&nGen != 0 {
		b = binary.AppendUvarint(b, msg.Gen)
	}
	if f&nPublish != 0 {
		b = binary.AppendUvarint(b, msg.Publish)
	}
	if f&nRec != 0 {
		b = appendRecord(b, msg.Rec)
	}
	if f&nMember != 0 {
		b = appendString(b, msg.Member.Node)
		b = appendString(b, msg.Member.Transport)
		b = appendString(b, msg.Member.Addr)
		b = appendTime(b, msg.Member.Started)
	}
	if f&nInline != 0 {
		b = appendBytes(b, msg.Inline.Data)
	}
	return b
}

// decodeNotice decodes what encodeNotice encoded. Bytes are copied: b is
// the transport's.
func decodeNotice(b []byte) (notice, error) {
	var msg notice
	d := decoder{b: b}
	if d.byte() != codecVersion {
		return msg, fmt.Errorf("%w: not a notice of this release", errBadMessage)
	}
	msg.Kind = kind(d.byte())
	f := d.uvarint()
	if f&nPath != 0 {
		msg.Path = d.string()
	}
	if f&nAfter != 0 {
		msg.After = d.uvarint()
	}
	if f&nGen != 0 {
		msg.Gen = d.uvarint()
	}
	if f&nPublish != 0 {
		msg.Publish = d.uvarint()
	}
	if f&nRec != 0 {
		msg.Rec = d.record()
	}
	if f&nMember != 0 {
		msg.Member = &hfl.Member{Node: d.string(), Transport: d.string(), Addr: d.string(), Started: d.time()}
	}
	if f&nInline != 0 {
		msg.Inline = &hfl.Inline{Data: d.bytes()}
	}
	msg.Ahead, msg.Sync, msg.Listing = f&nAhead != 0, f&nSync != 0, f&nListing != 0
	msg.ListingEnded, msg.Held, msg.Forwarded = f&nListingEnded != 0, f&nHeld != 0, f&nForwarded != 0
	msg.Settle = f&nSettle != 0
	return msg, d.end()
}

// encodeReply encodes r.
func encodeReply(r reply) []byte {
	var f uint64
	setIf(&f, rRec, r.Rec != nil)
	setIf(&f, rInline, r.Inline != nil)
	setIf(&f, rKnown, r.Known)
	setIf(&f, rGen, r.Gen != 0)
	setIf(&f, rHome, !r.Home.IsZero())
	setIf(&f, rNoPromise, r.NoPromise)
	setIf(&f, rPending, r.Pending)
	b := make([]byte, 0, 96+len(r.PendingOwner)+inlineLen(r.Inline))
	b = append(b, codecVersion)
	b = binary.AppendUvarint(b, f)
	if f&rRec != 0 {
		b = appendRecord(b, r.Rec)
	}
	if f&rInline != 0 {
		b = appendBytes(b, r.Inline.Data)
	}
	if f&rGen != 0 {
		b = binary.AppendUvarint(b, r.Gen)
	}
	if f&rHome != 0 {
		b = appendTime(b, r.Home)
	}
	if f&rPending != 0 {
		b = appendString(b, r.PendingOwner)
		b = binary.AppendUvarint(b, r.PendingPublish)
	}
	return b
}

// decodeReply decodes a home's reply (none: an empty one).
func decodeReply(b []byte) (reply, error) {
	var r reply
	if len(b) == 0 {
		return r, nil
	}
	d := decoder{b: b}
	if d.byte() != codecVersion {
		return r, fmt.Errorf("%w: not a reply of this release", errBadMessage)
	}
	f := d.uvarint()
	if f&rRec != 0 {
		r.Rec = d.record()
	}
	if f&rInline != 0 {
		r.Inline = &hfl.Inline{Data: d.bytes()}
	}
	if f&rGen != 0 {
		r.Gen = d.uvarint()
	}
	if f&rHome != 0 {
		r.Home = d.time()
	}
	if f&rPending != 0 {
		r.PendingOwner, r.PendingPublish = d.string(), d.uvarint()
	}
	r.Known, r.NoPromise, r.Pending = f&rKnown != 0, f&rNoPromise != 0, f&rPending != 0
	return r, d.end()
}

func inlineLen(in *hfl.Inline) int {
	if in == nil {
		return 0
	}
	return len(in.Data)
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func appendBytes(b, p []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(p)))
	return append(b, p...)
}

// appendTime appends t as nanoseconds since the epoch: the instant is
// kept exactly (a member's incarnation is compared with Equal).
func appendTime(b []byte, t time.Time) []byte {
	if t.IsZero() {
		return append(b, 0)
	}
	b = append(b, 1)
	return binary.AppendVarint(b, t.UnixNano())
}

// appendRecord appends rec without its bytes.
// recordMax bounds what appendRecord writes besides its strings: a flag
// word, the lengths of four strings, ten numbers as varints (at most 10
// bytes each) and the checksum.
const recordMax = 10 + 4*10 + 10*10 + 64

func appendRecord(b []byte, rec *hfl.Record) []byte {
	var f uint64
	if rec.Target != "" {
		f |= recTarget
	}
	if rec.Alloc != 0 {
		f |= recAlloc
	}
	if !rec.Sum.IsZero() {
		f |= recSum
	}
	if rec.Ino != 0 {
		f |= recIno
	}
	if rec.Writing {
		f |= recWriting
	}
	if rec.Provisional {
		f |= recProvisional
	}
	b = binary.AppendUvarint(b, f)
	b = appendString(b, rec.Path)
	b = appendString(b, rec.Owner)
	b = binary.AppendVarint(b, rec.Size)
	b = binary.AppendUvarint(b, uint64(rec.Mode))
	b = binary.AppendUvarint(b, uint64(rec.Uid))
	b = binary.AppendUvarint(b, uint64(rec.Gid))
	b = binary.AppendVarint(b, rec.MtimeNs)
	b = binary.AppendUvarint(b, rec.Generation)
	if f&recTarget != 0 {
		b = appendString(b, rec.Target)
	}
	if f&recAlloc != 0 {
		b = binary.AppendVarint(b, rec.Alloc)
	}
	if f&recSum != 0 {
		b = append(b, rec.Sum[:]...)
	}
	if f&recIno != 0 {
		b = binary.AppendUvarint(b, rec.Ino)
	}
	return b
}

// decoder reads a message; the first fault sticks, and what is read after
// it is zero.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s", errBadMessage, what)
	}
	d.b = nil
}

func (d *decoder) byte() byte {
	if len(d.b) == 0 {
		d.fail("cut short")
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

func (d *decoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	return d.number(v, n)
}

func (d *decoder) varint() int64 {
	v, n := binary.Varint(d.b)
	return int64(d.number(uint64(v), n))
}

// number passes v on once its n bytes are read (none: not a number).
func (d *decoder) number(v uint64, n int) uint64 {
	if n <= 0 {
		d.fail("bad number")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) uint32() uint32 {
	v := d.uvarint()
	if v > 1<<32-1 {
		d.fail("number out of range")
		return 0
	}
	return uint32(v)
}

// raw returns the next length-prefixed bytes, not copied.
func (d *decoder) raw() []byte {
	n := d.uvarint()
	if n > uint64(len(d.b)) {
		d.fail("length past the end")
		return nil
	}
	p := d.b[:n]
	d.b = d.b[n:]
	return p
}

func (d *decoder) string() string { return string(d.raw()) }

func (d *decoder) bytes() []byte { return append([]byte{}, d.raw()...) }

func (d *decoder) time() time.Time {
	if d.byte() == 0 {
		return time.Time{}
	}
	return time.Unix(0, d.varint())
}

func (d *decoder) record() *hfl.Record {
	f := d.uvarint()
	rec := &hfl.Record{Path: d.string(), Owner: d.string(), Size: d.varint(), Mode: d.uint32(), Uid: d.uint32(), Gid: d.uint32(),
		MtimeNs: d.varint(), Generation: d.uvarint()}
	if f&recTarget != 0 {
		rec.Target = d.string()
	}
	if f&recAlloc != 0 {
		rec.Alloc = d.varint()
	}
	if f&recSum != 0 {
		if len(d.b) < len(digest.Sum{}) {
			d.fail("cut short")
		} else {
			copy(rec.Sum[:], d.b)
			d.b = d.b[len(digest.Sum{}):]
		}
	}
	if f&recIno != 0 {
		rec.Ino = d.uvarint()
	}
	rec.Writing, rec.Provisional = f&recWriting != 0, f&recProvisional != 0
	return rec
}

// end reports the first fault, or bytes left over.
func (d *decoder) end() error {
	if d.err == nil && len(d.b) > 0 {
		d.fail("bytes after the end")
	}
	return d.err
}
