package tcp

import (
	"bufio"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/dyadfs/dyadfs/dtl"
	"github.com/dyadfs/dyadfs/dtl/dtltest"
)

// benchFetch fetches a file of size bytes, each time into a new file, as
// the Fetcher does. The baseline, in the same run, is benchCopy: the same
// file copied into a new file on this machine.
func benchFetch(b *testing.B, size int, parallel bool) {
	server, client, src := dtltest.Pair(b, opts{}, newTransport)
	dtltest.PublishRandom(b, src, "f", size)
	dir := b.TempDir()
	ctx := context.Background()
	var n atomic.Int64
	fetch := func() {
		f, err := os.Create(filepath.Join(dir, fmt.Sprint(n.Add(1))))
		if err != nil {
			b.Fatal(err)
		}
		sink := dtl.NewSink(f)
		info, err := client.Fetch(ctx, server.Addr(), dtl.Request{Path: "f"}, sink)
		if err != nil {
			b.Fatal(err)
		}
		// The check the Fetcher makes.
		if sum, err := sink.Sum(info.Size); err != nil || sum != info.Checksum {
			b.Fatalf("checksum %v (%v), want %v", sum, err, info.Checksum)
		}
		f.Close()
		os.Remove(f.Name())
	}
	b.SetBytes(int64(size))
	measure(b, parallel, fetch, client)
}

// measure runs op b.N times, from parallel goroutines if parallel, and
// reports how many connections client dialed.
func measure(b *testing.B, parallel bool, op func(), client *Transport) {
	if parallel {
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				op()
			}
		})
	} else {
		for b.Loop() {
			op()
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

// benchMessage sends messages of size bytes to a handler that answers with
// as many, on a pooled connection. The baseline, in the same run, is
// benchPingPong: the same exchange over one bare loopback TCP connection.
func benchMessage(b *testing.B, size int, parallel bool) {
	s := dtltest.NewSecret()
	server, _ := newTransport(b, s, opts{})
	reply := make([]byte, size)
	answer := handlerFunc(func(ctx context.Context, from string, msg []byte) ([]byte, error) {
		return reply, nil
	})
	server.handler.Store(&answer)
	if err := server.Serve(dtltest.NewSource(b.TempDir())); err != nil {
		b.Fatal(err)
	}
	client, _ := newTransport(b, s, opts{})
	msg := make([]byte, size)
	ctx := context.Background()
	send := func() {
		if _, err := client.Message(ctx, server.Addr(), "", msg); err != nil {
			b.Fatal(err)
		}
	}
	send() // dial outside the measurement
	b.SetBytes(int64(2 * size))
	b.ReportAllocs()
	measure(b, parallel, send, client)
}

// benchPingPong is the floor under benchMessage: a size-byte request and a
// size-byte answer, each a 5-byte header and its payload in one write,
// over a bare loopback connection.
func benchPingPong(b *testing.B, size int) {
	addr := dtltest.AcceptLoop(b, func(c net.Conn, _ func(net.Conn)) {
		br := bufio.NewReaderSize(c, bufSize)
		var buf []byte
		out := appendReply(nil, make([]byte, size))
		for {
			if _, _, err := readFrame(br, &buf); err != nil {
				return
			}
			if _, err := c.Write(out); err != nil {
				return
			}
		}
	})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReaderSize(c, bufSize)
	var buf []byte
	out := appendMsg(nil, make([]byte, size))
	b.SetBytes(int64(2 * size))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Write(out); err != nil {
			b.Fatal(err)
		}
		if _, _, err := readFrame(br, &buf); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkMessage64(b *testing.B)         { benchMessage(b, 64, false) }
func BenchmarkMessage64Parallel(b *testing.B) { benchMessage(b, 64, true) }
func BenchmarkMessage4KiB(b *testing.B)       { benchMessage(b, 4096, false) }
func BenchmarkMessageMax(b *testing.B)        { benchMessage(b, dtl.MaxMessage, false) }
func BenchmarkPingPong64(b *testing.B)        { benchPingPong(b, 64) }
func BenchmarkPingPong4KiB(b *testing.B)      { benchPingPong(b, 4096) }
func BenchmarkPingPongMax(b *testing.B)       { benchPingPong(b, dtl.MaxMessage) }
