package notice

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/dyadfs/dyadfs/hfl"
	"github.com/dyadfs/dyadfs/internal/digest"
)

// TestCodecRoundTrip: every field of a notice and of a reply comes back
// as it went, and every message cut short is refused.
func TestCodecRoundTrip(t *testing.T) {
	started := time.Unix(1700000000, 123456789)
	rec := &hfl.Record{Path: "d/f", Owner: "n1", Size: -1, Mode: 0o100644, Uid: 1 << 31, Gid: 7, MtimeNs: -5,
		Target: "../t", Alloc: 9, Sum: digest.Sum{1, 2, 3}, Ino: 1 << 63, Writing: true, Provisional: true, Generation: 42}
	notices := []notice{
		{},
		{Kind: kindPublished, Rec: rec, Inline: &hfl.Inline{Data: []byte{}}, Publish: 1 << 60, Sync: true, Forwarded: true},
		{Kind: kindBreak, Path: "d/f", Gen: 3, Listing: true, ListingEnded: true, Held: true, Inline: &hfl.Inline{Data: []byte("abc")}},
		{Kind: kindAsk, Path: "x", After: 8, Ahead: true},
		{Kind: kindJoin, Member: &hfl.Member{Node: "n2", Transport: "tcp", Addr: "10.0.0.2:1", Started: started}},
		{Kind: kindJoin, Member: &hfl.Member{Node: "n3"}},
	}
	for _, want := range notices {
		b := encodeNotice(want)
		got, err := decodeNotice(b)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("notice %+v came back as %+v, %v", want, got, err)
		}
		for i := range b {
			if _, err := decodeNotice(b[:i]); err == nil {
				t.Errorf("notice %+v cut at %d of %d bytes was taken", want, i, len(b))
			}
		}
	}
	replies := []reply{
		{},
		{Rec: rec, Inline: &hfl.Inline{Data: []byte("x")}, Known: true, Gen: 5, Home: started, NoPromise: true},
	}
	for _, want := range replies {
		b := encodeReply(want)
		got, err := decodeReply(b)
		if err != nil || !reflect.DeepEqual(got, want) || !got.Home.Equal(want.Home) {
			t.Errorf("reply %+v came back as %+v, %v", want, got, err)
		}
		for i := 1; i < len(b); i++ {
			if _, err := decodeReply(b[:i]); err == nil {
				t.Errorf("reply %+v cut at %d of %d bytes was taken", want, i, len(b))
			}
		}
	}
}

// BenchmarkCodec: encoding and decoding the two notices of one publish
// and the home's reply.
// TestEncodeAllocatesOnce: a notice is written into one buffer, sized
// before: a small file's bytes are not copied into a larger one midway.
func TestEncodeAllocatesOnce(t *testing.T) {
	rec := hfl.Record{Path: strings.Repeat("d/", 60) + "out.dat", Owner: "node-017", Size: 4096, Mode: 0o100644,
		Uid: 1 << 31, Gid: 1 << 31, MtimeNs: -1, Sum: digest.Sum{1}, Ino: ^uint64(0), Generation: ^uint64(0),
		Alloc: -1, Target: "t", Writing: true, Provisional: true}
	data := make([]byte, 4096)
	for _, msg := range []notice{
		{Kind: kindPublished, Path: rec.Path, After: ^uint64(0), Gen: ^uint64(0), Publish: ^uint64(0), Rec: &rec, Inline: &hfl.Inline{Data: data}},
		{Kind: kindJoin, Member: &hfl.Member{Node: "node-017", Transport: "tcp", Addr: "10.0.0.1:7447", Started: time.Now()}},
	} {
		if n := testing.AllocsPerRun(10, func() { encodeNotice(msg) }); n != 1 {
			t.Errorf("encoding a %v notice allocates %v times, want once", msg.Kind, n)
		}
	}
}

func BenchmarkCodec(b *testing.B) {
	rec := hfl.Record{Path: "run/step-000123/out.dat", Owner: "node-017", Size: 4096, Mode: 0o100644, Uid: 1000, Gid: 1000,
		MtimeNs: time.Now().UnixNano(), Sum: digest.Sum{1}, Ino: 1234567890123, Generation: 987654}
	prov := rec
	prov.Provisional, prov.Generation = true, 0
	data := make([]byte, 4096)
	r := reply{Known: true, Gen: rec.Generation, Home: time.Now()}
	b.ReportAllocs()
	for b.Loop() {
		for _, msg := range []notice{{Kind: kindPublished, Rec: &prov, Inline: &hfl.Inline{Data: data}, Publish: 7}, {Kind: kindPublished, Rec: &rec, Publish: 7, Sync: true}} {
			if _, err := decodeNotice(encodeNotice(msg)); err != nil {
				b.Fatal(err)
			}
			if _, err := decodeReply(encodeReply(r)); err != nil {
				b.Fatal(err)
			}
		}
	}
}
