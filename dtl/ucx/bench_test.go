//go:build ucx

package ucx

import (
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dyadfs/dyadfs/dtl"
	"github.com/dyadfs/dyadfs/dtl/dtltest"
	"github.com/dyadfs/dyadfs/dtl/tcp"
	"github.com/dyadfs/dyadfs/internal/digest"
)

// Benchmarks of whole fetches (a file of the Source into a new file, as
// the Fetcher does) over UCX on TCP (UCX_TLS=tcp) and with shared memory
// enabled (UCX_TLS=sm,tcp), with the TCP transport as the baseline
// measured in the same run, and of small messages:
//
//	go test -tags ucx -run '^$' -bench . -benchtime 2s ./dtl/ucx/
//
// Why rendezvous active messages. The ways UCP can move a chunk were
// measured with ucx_perftest 1.13 between two processes on the
// development machine (2 cores, loopback, endpoints with peer error
// handling as ours; 1 MiB messages unless said):
//
//	                            UCX_TLS=tcp        UCX_TLS=sm,tcp
//	ucp_am_bw, rendezvous       2861 MB/s          2879 MB/s
//	ucp_am_bw, eager only       2641 MB/s          3089 MB/s
//	ucp_put_bw                   278 MB/s           326 MB/s
//	ucp_put_bw, 4 KiB            494 MB/s
//	ucp_am_bw, 4 KiB             541 MB/s
//
// Put is ruled out: on TCP UCX 1.13 emulates remote memory access in
// software, 10 times slower, and it would also need the receiver's
// buffers and rkeys advertised, credits to say which buffer is free, and
// a flush or a fence before a separate completion message (DYAD polls its
// buffer with sleeps instead). Eager and rendezvous active messages are
// within 10% of each other on TCP, so the choice rests on what only
// rendezvous gives: the receiver picks the buffer when the message
// arrives (ucp_am_recv_data_nbx into a registered buffer: RDMA reads it
// there on a fabric, no bounce buffer), the sender's request completes
// when the data has been pulled, which is the flow control, and nothing
// piles up unexpected at a slow receiver. Tagged messages would give the
// same with a tag per transfer and chunk and receives posted ahead, for
// no gain. Files up to inlineMax go eager, whole, with their description:
// one message each way.
//
// benchPair makes a UCX server and client for tls, or TCP transports
// for "tcp-transport".
func benchPair(b *testing.B, wire string) (server dtl.Transport, client dtl.Transport, src *dtltest.Source) {
	s := dtltest.NewSecret()
	src = dtltest.NewSource(b.TempDir())
	if wire == "tcp-transport" {
		mk := func(node string) *tcp.Transport {
			cfg := dtl.DefaultConfig()
			cfg.Node, cfg.Listen, cfg.Secret = node, "127.0.0.1:0", s
			cfg.Log = slog.New(slog.DiscardHandler)
			tr, err := tcp.New(cfg)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { tr.Close() })
			return tr
		}
		server, client = mk("server"), mk("client")
	} else {
		server, _ = testTransport(b, s, opts{tls: wire})
		client, _ = testTransport(b, s, opts{tls: wire})
	}
	if err := server.Serve(src); err != nil {
		b.Fatal(err)
	}
	return server, client, src
}

var benchWires = []struct{ name, tls string }{
	{"ucx-tcp", "tcp"},
	{"ucx-shm", "sm,tcp"},
	{"tcp-transport", "tcp-transport"},
}

// benchFetch fetches a size-byte file, each time into a new file, from
// parallel goroutines, and reports the latency's median and 99th
// percentile besides the rate.
func benchFetch(b *testing.B, wire string, size, parallel int) {
	server, client, src := benchPair(b, wire)
	data := make([]byte, size)
	rand.Read(data)
	if err := src.WriteFile("f", data); err != nil {
		b.Fatal(err)
	}
	// Hashed once, as a producer does at publish.
	if err := src.Publish("f"); err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	ctx := context.Background()
	var n, reread atomic.Int64
	var mu sync.Mutex
	var lat []time.Duration
	fetch := func() {
		f, err := os.Create(filepath.Join(dir, fmt.Sprint(n.Add(1))))
		if err != nil {
			b.Error(err)
			return
		}
		start := time.Now()
		sink := dtl.NewSink(f)
		info, err := client.Fetch(ctx, server.Addr(), dtl.Request{Path: "f"}, sink)
		if err == nil {
			// The check the Fetcher makes.
			var sum digest.Sum
			if sum, err = sink.Sum(info.Size); err == nil && sum != info.Checksum {
				err = fmt.Errorf("checksum %v, want %v", sum, info.Checksum)
			}
			reread.Add(sink.Reread())
		}
		took := time.Since(start)
		f.Close()
		os.Remove(f.Name())
		if err != nil {
			b.Error(err)
			return
		}
		mu.Lock()
		lat = append(lat, took)
		mu.Unlock()
	}
	fetch() // connect outside the measurement
	lat = lat[:0]
	b.SetBytes(int64(size))
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	var next atomic.Int64
	for range parallel {
		wg.Go(func() {
			for next.Add(1) <= int64(b.N) {
				fetch()
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	slices.Sort(lat)
	if len(lat) > 0 {
		b.ReportMetric(float64(len(lat))/elapsed.Seconds(), "files/s")
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
		// Blocks whose chunks completed out of order are read back.
		b.ReportMetric(float64(reread.Load())/float64(len(lat)), "reread-B/op")
	}
}

func BenchmarkFetch64MiB(b *testing.B) {
	for _, w := range benchWires {
		b.Run(w.name, func(b *testing.B) { benchFetch(b, w.tls, 64<<20, 1) })
	}
}

func BenchmarkFetch64MiBx4(b *testing.B) {
	for _, w := range benchWires {
		b.Run(w.name, func(b *testing.B) { benchFetch(b, w.tls, 64<<20, 4) })
	}
}

func BenchmarkFetch4KiB(b *testing.B) {
	for _, w := range benchWires {
		b.Run(w.name, func(b *testing.B) { benchFetch(b, w.tls, 4<<10, 1) })
	}
}

func BenchmarkFetch4KiBx16(b *testing.B) {
	for _, w := range benchWires {
		b.Run(w.name, func(b *testing.B) { benchFetch(b, w.tls, 4<<10, 16) })
	}
}

// BenchmarkMessage64 measures small messages (the locator's notices).
func BenchmarkMessage64(b *testing.B) {
	for _, w := range benchWires {
		b.Run(w.name, func(b *testing.B) {
			server, client, _ := benchPair(b, w.tls)
			if u, ok := server.(*Transport); ok {
				echo := handlerFunc(func(ctx context.Context, from string, msg []byte) ([]byte, error) { return msg, nil })
				u.handler.Store(&echo)
			} else {
				b.Skip("the TCP transport's handler is set by its Source")
			}
			m := client.(dtl.Messenger)
			msg := make([]byte, 64)
			ctx := context.Background()
			if _, err := m.Message(ctx, server.Addr(), "", msg); err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				if _, err := m.Message(ctx, server.Addr(), "", msg); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
