package test

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// BenchmarkClusterTransports compares the data transports between the same
// two network namespaces in one run: ucx_perftest's bandwidth and latency
// with UCX_TLS=tcp as UCX's own baseline, then dyadfs end to end over the
// TCP transport and over UCX (UCX_TLS=tcp). scripts/bench.sh ucx runs it
// with -benchtime 1x; the one-host rows (shared memory) are
// BenchmarkFetch in dtl/ucx.
func BenchmarkClusterTransports(b *testing.B) {
	if b.N > 1 {
		b.Skip("run with -benchtime 1x: each row is a fixed workload")
	}
	if ucxTag == "" {
		b.Skip("skipping: built without UCX (install libucx-dev and run with -tags ucx, as scripts/bench.sh does)")
	}
	if _, err := exec.LookPath("ucx_perftest"); err != nil {
		b.Skip("skipping: ucx_perftest is not installed (Debian: ucx-utils; scripts/setup.sh installs it)")
	}
	var rows []benchRow
	add := func(r benchRow) {
		rows = append(rows, r)
		fmt.Fprintf(os.Stderr, "  %-60s %12.1f %s\n", r.name, r.value, r.unit)
	}
	c := newCluster(b, 2)
	a, n := c.nodes[0], c.nodes[1]
	add(benchRow{name: "network: iperf3 single stream", unit: "Gbit/s", value: iperf3(b, a, n)})
	amBW := ucxPerftest(b, a, n, "ucp_am_bw", 1<<20, 2000)
	add(benchRow{name: "ucx_perftest ucp_am_bw 1 MiB (UCX_TLS=tcp)", unit: "MB/s", value: amBW})
	putBW := ucxPerftest(b, a, n, "ucp_put_bw", 1<<20, 1000)
	add(benchRow{name: "ucx_perftest ucp_put_bw 1 MiB (UCX_TLS=tcp)", unit: "MB/s", value: putBW})
	add(benchRow{name: "ucx_perftest ucp_am_lat 4 KiB p50 one way (UCX_TLS=tcp)", unit: "us", value: ucxPerftest(b, a, n, "ucp_am_lat", 4096, 10000)})

	type result struct{ small, lock, large e2eResult }
	measure := func(c *cluster) result {
		a, n := c.nodes[0], c.nodes[1]
		return result{
			small: e2e(b, a, n, "small", 1000, 4096, false),
			lock:  e2e(b, a, n, "lockstep", 1000, 4096, true),
			large: e2e(b, a, n, "large", 20, 64<<20, false),
		}
	}
	tcpRes := measure(c)
	ucxRes := measure(newClusterOn(b, ucxWire, 2))
	best := max(amBW, putBW)
	for _, w := range []struct {
		name string
		r    result
	}{{"TCP transport", tcpRes}, {"UCX transport (UCX_TLS=tcp)", ucxRes}} {
		add(benchRow{name: "dyadfs, " + w.name + ": 1,000 x 4 KiB pipelined", unit: "files/s", value: w.r.small.filesPerSec(),
			ratio: w.r.small.filesPerSec() / tcpRes.small.filesPerSec(), target: "≥ 1 (of TCP's)"})
		add(benchRow{name: "dyadfs, " + w.name + ": 4 KiB latency p50", unit: "us", value: w.r.lock.percentile(0.5),
			ratio: w.r.lock.percentile(0.5) / tcpRes.lock.percentile(0.5), target: "≤ 1 (of TCP's)"})
		add(benchRow{name: "dyadfs, " + w.name + ": 4 KiB latency p99", unit: "us", value: w.r.lock.percentile(0.99)})
		add(benchRow{name: "dyadfs, " + w.name + ": 20 x 64 MiB pipelined", unit: "MB/s", value: w.r.large.mbPerSec(),
			ratio: w.r.large.mbPerSec() / best, target: "≥ 0.8 of ucx_perftest's best"})
	}
	printRows(rows)
}

// ucxPerftest runs ucx_perftest's test between a (client) and n (server)
// with UCX_TLS=tcp and returns its bandwidth in MB/s (10^6 bytes; it
// prints MiB/s) or, for a latency test, its median one-way latency in µs.
func ucxPerftest(b testing.TB, a, n *node, test string, size, iters int) float64 {
	b.Helper()
	var p [2]byte
	rand.Read(p[:])
	port := strconv.Itoa(20000 + int(binary.BigEndian.Uint16(p[:]))%20000)
	server := exec.Command("ip", "netns", "exec", n.netns, "env", "UCX_TLS=tcp", "ucx_perftest", "-p", port)
	if err := server.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { server.Process.Kill(); server.Wait() }()
	var out string
	eventually(b, "ucx_perftest "+test, func() bool {
		var err error
		out, err = a.c.inNet(a.netns, "env", "UCX_TLS=tcp", "ucx_perftest", n.ip, "-p", port, "-t", test,
			"-s", strconv.Itoa(size), "-n", strconv.Itoa(iters))
		if err != nil {
			time.Sleep(200 * time.Millisecond)
			return false
		}
		return strings.Contains(out, "Final:")
	})
	// Final: iterations, latency p50, average, overall, bandwidth
	// average, overall, message rate average, overall.
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 9 && f[0] == "Final:" {
			i := 6 // bandwidth, overall
			if strings.HasSuffix(test, "_lat") {
				i = 2 // latency, 50th percentile
			}
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				b.Fatalf("ucx_perftest %s: %q", test, line)
			}
			if i == 6 {
				v *= 1.048576 // MiB/s to MB/s
			}
			return v
		}
	}
	b.Fatalf("ucx_perftest %s: no result in\n%s", test, out)
	return 0
}
