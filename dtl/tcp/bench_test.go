package tcp

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/dyadfs/dyadfs/dtl"
)

// benchFetch fetches a file of size bytes, each time into a new file, as
// the Fetcher does. The baseline, in the same run, is benchCopy: the same
// file copied into a new file on this machine.
func benchFetch(b *testing.B, size int, parallel bool) {
	s := newSecret()
	server, src, _ := served(b, s, opts{})
	client, _ := newTransport(b, s, opts{})
	data := make([]byte, size)
	rand.Read(data)
	if err := src.WriteFile("f", data); err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	ctx := context.Background()
	var n atomic.Int64
	fetch := func() {
		f, err := os.Create(filepath.Join(dir, fmt.Sprint(n.Add(1))))
		if err != nil {
			b.Fatal(err)
		}
		if _, err := client.Fetch(ctx, server.Addr(), dtl.Request{Path: "f"}, f); err != nil {
			b.Fatal(err)
		}
		f.Close()
		os.Remove(f.Name())
	}
	b.SetBytes(int64(size))
	if parallel {
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				fetch()
			}
		})
	} else {
		for b.Loop() {
			fetch()
		}
	}
	b.ReportMetric(float64(client.Stats().Dials), "dials")
}

func benchCopy(b *testing.B, size int) {
	dir := b.TempDir()
	data := make([]byte, size)
	rand.Read(data)
	name := filepath.Join(dir, "f")
	os.WriteFile(name, data, 0o644)
	b.SetBytes(int64(size))
	for i := 0; b.Loop(); i++ {
		in, _ := os.Open(name)
		out, err := os.Create(filepath.Join(dir, fmt.Sprint(i)))
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(out, in)
		in.Close()
		out.Close()
		os.Remove(out.Name())
	}
}

func BenchmarkFetch4KiB(b *testing.B)         { benchFetch(b, 4096, false) }
func BenchmarkFetch4KiBParallel(b *testing.B) { benchFetch(b, 4096, true) }
func BenchmarkFetch1MiB(b *testing.B)         { benchFetch(b, 1<<20, false) }
func BenchmarkFetch256MiB(b *testing.B)       { benchFetch(b, 256<<20, false) }
func BenchmarkLocalCopy4KiB(b *testing.B)     { benchCopy(b, 4096) }
func BenchmarkLocalCopy256MiB(b *testing.B)   { benchCopy(b, 256<<20) }
