package test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/dyadfs/dyadfs/internal/ucxperf"
)

// BenchmarkClusterTransports compares the data transports between the same
// two network namespaces in one run: ucx_perftest's bandwidth and latency
// with UCX_TLS=tcp as UCX's own baseline, then dyadfs end to end over the
// TCP transport and over UCX (UCX_TLS=tcp), the two alternating over
// rounds (the value is the median, the range in parentheses), each round
// beside what the consumer's node-local storage takes (files written into
// its backing directory with dd, no dyadfs). scripts/bench.sh ucx runs it
// with -benchtime 1x; the transports alone (between namespaces, and on
// one host with shared memory) are the benchmarks of dtl/ucx.
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
	rounds := 3
	if v, err := strconv.Atoi(os.Getenv("DYADFS_BENCH_ROUNDS")); err == nil && v > 0 {
		rounds = v
	}
	var rows []benchRow
	add := func(r benchRow) {
		rows = append(rows, r)
		fmt.Fprintf(os.Stderr, "  %-60s %12.1f %s %s\n", r.name, r.value, r.unit, r.spread)
	}
	c := newCluster(b, 2)
	a, n := c.nodes[0], c.nodes[1]
	add(benchRow{name: "network: iperf3 single stream", unit: "Gbit/s", value: iperf3(b, a, n)})
	amBW := ucxPerftest(b, a, n, "ucp_am_bw", 1<<20, 2000)
	add(benchRow{name: "ucx_perftest ucp_am_bw 1 MiB (UCX_TLS=tcp)", unit: "MB/s", value: amBW})
	putBW := ucxPerftest(b, a, n, "ucp_put_bw", 1<<20, 1000)
	add(benchRow{name: "ucx_perftest ucp_put_bw 1 MiB (UCX_TLS=tcp)", unit: "MB/s", value: putBW})
	add(benchRow{name: "ucx_perftest ucp_am_lat 4 KiB p50 one way (UCX_TLS=tcp)", unit: "us", value: ucxPerftest(b, a, n, "ucp_am_lat", 4096, 10000)})
	best := max(amBW, putBW)

	type result struct{ small, lock, large e2eResult }
	clusters := []*cluster{c, newClusterOn(b, ucxWire, 2)}
	names := []string{"TCP transport", "UCX transport (UCX_TLS=tcp)"}
	var storage, storage1M []float64
	res := make([][]result, len(clusters))
	for round := range rounds {
		order := []int{0, 1}
		if round%2 == 1 {
			order = []int{1, 0}
		}
		storage = append(storage, storageWrite(b, n, 20, 64<<20, "512K"))
		storage1M = append(storage1M, storageWrite(b, n, 20, 64<<20, "1M"))
		for _, i := range order {
			a, n := clusters[i].nodes[0], clusters[i].nodes[1]
			dir := fmt.Sprintf("r%d-", round)
			r := result{
				small: e2e(b, a, n, dir+"small", 1000, 4096, false),
				lock:  e2e(b, a, n, dir+"lockstep", 1000, 4096, true),
			}
			// Each large run starts with nothing dirty to write back.
			syscall.Sync()
			r.large = e2e(b, a, n, dir+"large", 20, 64<<20, false)
			res[i] = append(res[i], r)
			// What a round wrote goes, so that rounds do not pile up
			// in the page cache.
			a.mustSh("rm -rf " + dir + "*")
		}
	}
	// Their ranges are what matters: new memory the host backs on first
	// touch (the slow end) or pages just freed (the fast end). Consumers
	// write in 512 KiB pieces (internal/pagecache); 1 MiB writes, as the
	// producer here makes, get page-cache folios the host backs anew.
	st := summarize(storage)
	add(benchRow{name: "node-local storage: 20 x 64 MiB written by dd bs=512K into a backing directory", unit: "MB/s", value: st.median, spread: st.spread})
	st = summarize(storage1M)
	add(benchRow{name: "node-local storage: the same with bs=1M", unit: "MB/s", value: st.median, spread: st.spread})
	tcpSmall := summarize(each(res[0], func(r result) float64 { return r.small.filesPerSec() }))
	tcpLock := summarize(each(res[0], func(r result) float64 { return r.lock.percentile(0.5) }))
	for i, name := range names {
		small := summarize(each(res[i], func(r result) float64 { return r.small.filesPerSec() }))
		lock := summarize(each(res[i], func(r result) float64 { return r.lock.percentile(0.5) }))
		lock99 := summarize(each(res[i], func(r result) float64 { return r.lock.percentile(0.99) }))
		large := summarize(each(res[i], func(r result) float64 { return r.large.mbPerSec() }))
		add(benchRow{name: "dyadfs, " + name + ": 1,000 x 4 KiB pipelined", unit: "files/s", value: small.median, spread: small.spread,
			ratio: small.median / tcpSmall.median, target: "≥ 1 (of TCP's)"})
		add(benchRow{name: "dyadfs, " + name + ": 4 KiB latency p50", unit: "us", value: lock.median, spread: lock.spread,
			ratio: lock.median / tcpLock.median, target: "≤ 1 (of TCP's)"})
		add(benchRow{name: "dyadfs, " + name + ": 4 KiB latency p99", unit: "us", value: lock99.median, spread: lock99.spread})
		add(benchRow{name: "dyadfs, " + name + ": 20 x 64 MiB pipelined", unit: "MB/s", value: large.median, spread: large.spread,
			ratio: large.median / best, target: "≥ 0.8 of ucx_perftest's best"})
	}
	printRows(rows)
}

// stat is the median of some rounds' values, and their range.
type stat struct {
	median float64
	spread string
}

func summarize(v []float64) stat {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return stat{}
	}
	return stat{median: s[len(s)/2], spread: fmt.Sprintf("%.0f–%.0f", s[0], s[len(s)-1])}
}

func each[T any](v []T, f func(T) float64) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = f(x)
	}
	return out
}

// storageWrite measures writing count files of size bytes with dd, in
// blocks of bs, into n's backing directory (to its page cache, as
// dyadfs's copies are written), after a sync and a pause that lets memory
// freed before go back to the host: the most a consumer's node-local
// storage takes new files at here. They are removed afterwards.
func storageWrite(b testing.TB, n *node, count int, size int64, bs string) float64 {
	dir := filepath.Join(n.backing, ".dyadfs", "storage-bench")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(dir)
	syscall.Sync()
	time.Sleep(5 * time.Second)
	start := time.Now()
	for i := range count {
		out, err := runOut("dd", "if=/dev/zero", "of="+filepath.Join(dir, strconv.Itoa(i)), "bs="+bs,
			"iflag=count_bytes", "count="+strconv.FormatInt(size, 10), "status=none")
		if err != nil {
			b.Fatalf("dd: %v %s", err, out)
		}
	}
	return float64(int64(count)*size) / 1e6 / time.Since(start).Seconds()
}

// ucxPerftest runs ucx_perftest's test between a (client) and n (server)
// with UCX_TLS=tcp and returns its bandwidth in MB/s (10^6 bytes; it
// prints MiB/s) or, for a latency test, its median one-way latency in µs.
func ucxPerftest(b testing.TB, a, n *node, test string, size, iters int) float64 {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// Both ends on the nodes' eth0: left to choose, UCX would also pair
	// the two namespaces' loopback interfaces, which lead each to itself.
	v, err := ucxperf.Measure(ctx, ucxperf.Run{
		ServerEnter: []string{"ip", "netns", "exec", n.netns}, ClientEnter: []string{"ip", "netns", "exec", a.netns},
		IP: n.ip, TLS: "tcp", Devices: [2]string{"eth0", "eth0"}, Test: test, Size: size, Iters: iters,
	})
	if err != nil {
		b.Fatal(err)
	}
	return v
}
