package dtl_test

import (
	"bytes"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/dyadfs/dyadfs/dtl"
	"github.com/dyadfs/dyadfs/dtl/dtltest"
	"github.com/dyadfs/dyadfs/internal/digest"
)

// newSink is a Sink writing into a new file, closed at the end of the
// test.
func newSink(t *testing.T) (*dtl.Sink, *os.File) {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "copy"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return dtl.NewSink(f), f
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rand.Uint32())
	}
	return b
}

// Writers on several goroutines, chunks in any order (as the Flux
// transport's window writes them): the Sink's checksum is the content's,
// and whole blocks are never read back.
func TestSinkConcurrentWriters(t *testing.T) {
	const size = 9*digest.BlockSize + 1234
	data := randomBytes(size)
	sink, _ := newSink(t)
	offs := make(chan int)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for off := range offs {
				end := min(off+digest.BlockSize, size)
				if _, err := sink.WriteAt(data[off:end], int64(off)); err != nil {
					t.Error(err)
				}
			}
		})
	}
	for _, i := range rand.Perm(10) {
		offs <- i * digest.BlockSize
	}
	close(offs)
	wg.Wait()
	if err := sink.Truncate(size); err != nil {
		t.Fatal(err)
	}
	got, err := sink.Sum(size)
	if err != nil || got != digest.Bytes(data) || sink.Reread() != 0 {
		t.Fatalf("sum %v (%v), want %v; read back %d bytes, want 0", got, err, digest.Bytes(data), sink.Reread())
	}
}

// Writes that start and end anywhere, each larger than one write into the
// file goes (the Sink splits them): the file and its checksum are the
// content, in increasing order as the TCP and UCX transports write.
func TestSinkUnalignedWrites(t *testing.T) {
	data := randomBytes(5<<20 + 99)
	sink, f := newSink(t)
	for off := 0; off < len(data); {
		end := min(len(data), off+1<<20+int(rand.IntN(300<<10)))
		if n, err := sink.WriteAt(data[off:end], int64(off)); n != end-off || err != nil {
			t.Fatalf("WriteAt %d bytes at %d: %d, %v", end-off, off, n, err)
		}
		off = end
	}
	got, err := os.ReadFile(f.Name())
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("file of %d bytes (%v) differs from the %d written", len(got), err, len(data))
	}
	sum, err := sink.Sum(int64(len(data)))
	if err != nil || sum != digest.Bytes(data) {
		t.Fatalf("sum %v (%v), want %v", sum, err, digest.Bytes(data))
	}
}

// CopyFrom: data extents spliced from a socket at their offsets, holes
// between them: the checksum is the content's, nothing is read back.
func TestSinkCopyFrom(t *testing.T) {
	const size = 5*digest.BlockSize + 77
	data := make([]byte, size)
	extents := [][2]int{{0, 3000}, {digest.BlockSize + 4096, 3*digest.BlockSize + 5}, {4 * digest.BlockSize, size}}
	for _, e := range extents {
		for i := e[0]; i < e[1]; i++ {
			data[i] = byte(rand.Uint32())
		}
	}
	addr := dtltest.AcceptLoop(t, func(c net.Conn, _ func(net.Conn)) {
		defer c.Close()
		for _, e := range extents {
			c.Write(data[e[0]:e[1]])
		}
	})
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	sink, f := newSink(t)
	sink.InOrder()
	for _, e := range extents {
		if n, err := sink.CopyFrom(conn, int64(e[0]), int64(e[1]-e[0])); err != nil || n != int64(e[1]-e[0]) {
			t.Fatalf("CopyFrom %v: %d, %v", e, n, err)
		}
	}
	if err := sink.Truncate(size); err != nil {
		t.Fatal(err)
	}
	got, err := sink.Sum(size)
	if err != nil || got != digest.Bytes(data) || sink.Reread() != 0 {
		t.Fatalf("sum %v (%v), want %v; read back %d bytes, want 0", got, err, digest.Bytes(data), sink.Reread())
	}
	back, _ := os.ReadFile(f.Name())
	if !bytes.Equal(back, data) {
		t.Fatal("the file is not what was sent")
	}
}
