//go:build ucx

package ucx

import (
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
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
	"github.com/dyadfs/dyadfs/internal/ucxperf"
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
	if wire == "tcp-transport" {
		server, client = tcpTransport(b, "server", s), tcpTransport(b, "client", s)
	} else {
		server, _ = testTransport(b, s, opts{tls: wire})
		client, _ = testTransport(b, s, opts{tls: wire})
	}
	return server, client, dtltest.Serving(b, server)
}

// tcpTransport is a TCP transport on loopback, closed at the end of the
// benchmark.
func tcpTransport(b *testing.B, node string, secret []byte) *tcp.Transport {
	return dtltest.Loopback(b, node, secret, func(cfg dtl.Config) (*tcp.Transport, error) {
		cfg.Log = slog.New(slog.DiscardHandler)
		return tcp.New(cfg)
	})
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
	dtltest.PublishRandom(b, src, "f", size)
	measureFetches(b, client, server.Addr(), "f", size, parallel)
}

// measureFetches fetches p, a size-byte file, from addr b.N times, each
// time into a new file, from parallel goroutines, checks each copy's
// checksum, reports the rate and the latency's median and 99th
// percentile, and returns the rate in MB/s.
func measureFetches(b *testing.B, client dtl.Transport, addr, p string, size, parallel int) float64 {
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
		info, err := client.Fetch(ctx, addr, dtl.Request{Path: p}, sink)
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
	if len(lat) == 0 {
		return 0
	}
	b.ReportMetric(float64(len(lat))/elapsed.Seconds(), "files/s")
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
	// Blocks whose chunks completed out of order are read back.
	b.ReportMetric(float64(reread.Load())/float64(len(lat)), "reread-B/op")
	return float64(len(lat)) * float64(size) / 1e6 / elapsed.Seconds()
}

func BenchmarkFetch64MiB(b *testing.B) {
	// UCX's own baselines on this host, for each UCX_TLS the transport
	// runs with, in both of ucx_perftest's error modes (dyadfs's
	// endpoints handle peer errors, as -e does).
	if _, err := exec.LookPath("ucx_perftest"); err == nil {
		lo := [2]string{"lo", "lo"}
		for _, tls := range []string{"tcp", "sm,tcp"} {
			plain := perftest(b, nil, "127.0.0.1", tls, lo, "ucp_am_bw")
			peer := perftest(b, nil, "127.0.0.1", tls, lo, "ucp_am_bw", "-e")
			fmt.Printf("ucx_perftest ucp_am_bw 1 MiB on one host (UCX_TLS=%s): %.0f MB/s, with peer error handling (-e) %.0f MB/s\n", tls, plain, peer)
			lat := perftest(b, nil, "127.0.0.1", tls, lo, "ucp_am_lat", "-e")
			fmt.Printf("ucx_perftest ucp_am_lat 4 KiB on one host (UCX_TLS=%s, -e): %.1f µs one way (p50)\n", tls, lat)
		}
	}
	fetchOnEachWire(b, 64<<20, 1)
}

// fetchOnEachWire runs benchFetch of size bytes from parallel goroutines
// on each wire.
func fetchOnEachWire(b *testing.B, size, parallel int) {
	for _, w := range benchWires {
		b.Run(w.name, func(b *testing.B) { benchFetch(b, w.tls, size, parallel) })
	}
}

func BenchmarkFetch64MiBx4(b *testing.B) { fetchOnEachWire(b, 64<<20, 4) }

func BenchmarkFetch4KiB(b *testing.B) { fetchOnEachWire(b, 4<<10, 1) }

func BenchmarkFetch4KiBx16(b *testing.B) { fetchOnEachWire(b, 4<<10, 16) }

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

// BenchmarkFetchNetns fetches 64 MiB files from an owner in another
// network namespace, through a veth as the multi-node tests' nodes are
// joined, with UCX_TLS=tcp: UCX's own baseline between the same two
// namespaces (ucx_perftest's ucp_am_bw, 1 MiB messages, in both of its
// error modes), then the UCX transport and the TCP transport, each
// fetching from the owner's page cache into a new file and checking the
// checksum as the Fetcher does, and sending messages (the locator's
// notices). "of-perftest" is the transport's rate over ucx_perftest's
// best.
func BenchmarkFetchNetns(b *testing.B) {
	if _, err := exec.LookPath("ucx_perftest"); err != nil {
		b.Skip("skipping: ucx_perftest is not installed (Debian: ucx-utils; scripts/setup.sh installs it)")
	}
	n := newNetns(b)
	enter := []string{"ip", "netns", "exec", n.name}
	// Every run uses the veth's two ends only (UCX_NET_DEVICES): left to
	// choose, UCX also pairs the two namespaces' loopback interfaces,
	// which lead each side to itself.
	ends := [2]string{n.hostIf, "eth0"}
	// Once, not per round of each sub-benchmark.
	plain := perftest(b, enter, n.nsIP, "tcp", ends, "ucp_am_bw")
	peer := perftest(b, enter, n.nsIP, "tcp", ends, "ucp_am_bw", "-e")
	best := max(plain, peer)
	fmt.Printf("ucx_perftest ucp_am_bw 1 MiB between the namespaces (UCX_TLS=tcp): %.0f MB/s, with peer error handling (-e) %.0f MB/s\n", plain, peer)
	// UCX's latency busy-polling, and waiting for events as a daemon
	// does (the worker armed, asleep on its event fd).
	polling := perftest(b, enter, n.nsIP, "tcp", ends, "ucp_am_lat", "-e")
	sleeping := perftest(b, enter, n.nsIP, "tcp", ends, "ucp_am_lat", "-e", "-E", "sleep")
	fmt.Printf("ucx_perftest ucp_am_lat 4 KiB between the namespaces (UCX_TLS=tcp, -e): %.1f µs one way (p50) busy-polling, %.1f µs waiting for events (-E sleep)\n", polling, sleeping)
	for _, w := range []struct{ name, transport string }{{"ucx-tcp", ""}, {"tcp-transport", "tcp"}} {
		b.Run(w.name, func(b *testing.B) {
			s := dtltest.NewSecret()
			h := startOwner(b, s, n.nsIP+":0", w.transport, []string{"UCX_TLS=tcp", "UCX_NET_DEVICES=" + ends[1]}, enter...)
			sizes := map[string]int{"64MiB": 64 << 20, "4KiB": 4 << 10}
			for name, size := range sizes {
				data := make([]byte, size)
				rand.Read(data)
				if err := os.WriteFile(filepath.Join(h.dir, name), data, 0o644); err != nil {
					b.Fatal(err)
				}
				h.publish(b, name)
			}
			var client dtl.Transport
			if w.transport == "tcp" {
				client = tcpTransport(b, "client", s)
			} else {
				client, _ = testTransport(b, s, opts{tls: "tcp", ucx: map[string]string{"NET_DEVICES": ends[0]}})
			}
			b.Run("64MiB", func(b *testing.B) {
				mbs := measureFetches(b, client, h.addr, "64MiB", sizes["64MiB"], 1)
				b.ReportMetric(mbs/best, "of-perftest")
			})
			b.Run("4KiB", func(b *testing.B) { measureFetches(b, client, h.addr, "4KiB", sizes["4KiB"], 1) })
			// Round trips of messages: a notice, and one carrying a 4 KiB
			// file (about 6,000 bytes).
			for _, size := range []int{64, 6000} {
				b.Run(fmt.Sprintf("message%d", size), func(b *testing.B) { measureMessages(b, client.(dtl.Messenger), h.addr, size) })
			}
		})
	}
}

// measureMessages sends messages of size bytes to the daemon at addr, one
// at a time, and reports the median round trip.
func measureMessages(b *testing.B, m dtl.Messenger, addr string, size int) {
	msg := make([]byte, size)
	ctx := context.Background()
	var lat []time.Duration
	for b.Loop() {
		start := time.Now()
		if _, err := m.Message(ctx, addr, "helper", msg); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
}

// perftest runs ucx_perftest's test (ucp_am_bw with 1 MiB messages, or
// ucp_am_lat with 4 KiB ones) between a server started under enter (in a
// namespace; nothing: here) at ip and a client here, with UCX_TLS=tls on
// the network devices ends (the client's, the server's), and returns its
// overall bandwidth in MB/s or its median one-way latency in µs. flags
// go to ucx_perftest: "-e" for endpoints that handle peer errors, as
// dyadfs's do; "-E", "sleep" to wait for events rather than busy-poll.
func perftest(b *testing.B, enter []string, ip, tls string, ends [2]string, test string, flags ...string) float64 {
	b.Helper()
	r := ucxperf.Run{ServerEnter: enter, IP: ip, TLS: tls, Devices: ends, Test: test, Size: 1 << 20, Iters: 2000}
	if test == "ucp_am_lat" {
		r.Size, r.Iters = 4096, 10000
	}
	r.Flags = flags
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	v, err := ucxperf.Measure(ctx, r)
	if err != nil {
		b.Fatal(err)
	}
	return v
}
