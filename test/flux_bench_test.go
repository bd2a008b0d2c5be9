//go:build flux

package test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/dyadfs/dyadfs/dtl/dtltest"
	"github.com/dyadfs/dyadfs/flux"
	"github.com/dyadfs/dyadfs/flux/fluxtest"
	"github.com/dyadfs/dyadfs/fs"
	"github.com/dyadfs/dyadfs/internal/poll"
)

// BenchmarkFlux measures sharing between two brokers of one Flux test
// instance (`flux start --test-size=2`, this machine), in one run: the
// raw Flux RPC baselines between the ranks, then dyadfs end to end with
// the Flux KVS as its store over each transport (--dtl flux, --dtl tcp),
// then DYAD itself (dyad.so on each rank, its LD_PRELOAD wrapper around
// python3 programs) with FLUX_RPC and with UCX over TCP, on the same
// workloads. Data always flows from rank 0 (producer) to rank 1
// (consumer). It prints a table like BenchmarkCluster's.
func BenchmarkFlux(b *testing.B) {
	if b.N > 1 {
		b.Skip("run with -benchtime 1x: each row is a fixed workload")
	}
	requireEnv(b)
	dy := findDYAD(b)
	// The brokers load DYAD's module, whose UCX mode takes UCX_TLS from
	// the broker's environment: set before the instance starts.
	b.Setenv("UCX_TLS", "tcp")
	in := fluxtest.Start(b, 2)
	progress := func(name, unit string, v float64) {
		fmt.Fprintf(os.Stderr, "  %-60s %12.1f %s\n", name, v, unit)
	}

	// (a) Flux RPC between the ranks, no dyadfs.
	base := fluxRPCBaselines(b, in)
	progress("flux: 4 KiB RPC round trip p50", "us", base.rttP50)
	progress("flux: 64 MiB in one response", "MB/s", base.one)
	progress("flux: 64 MiB streamed", "MB/s", base.stream)
	progress("flux: 64 MiB by windowed reads", "MB/s", base.windowed)

	// (b) dyadfs with the Flux KVS as its store.
	dyadfsRes := map[string]fbWorkloads{}
	for _, dtl := range []string{"flux", "tcp"} {
		w := dyadfsOnFlux(b, in, dtl, false)
		dyadfsRes[dtl] = w
		progress("dyadfs --dtl "+dtl+": 1,000 x 4 KiB pipelined", "files/s", w.small.filesPerSec())
		progress("dyadfs --dtl "+dtl+": 4 KiB latency p50", "us", w.lock.percentile(0.5))
		progress("dyadfs --dtl "+dtl+": 20 x 64 MiB pipelined", "MB/s", w.large.mbPerSec())
	}
	// A close that does not wait for the KVS commit (DYAD_ASYNC_PUBLISH):
	// what the producer's synchronous publish costs the pipeline.
	async := dyadfsOnFlux(b, in, "flux", true, "--publish-wait", "0")
	progress("dyadfs --dtl flux --publish-wait 0: 1,000 x 4 KiB pipelined", "files/s", async.small.filesPerSec())

	// (c) DYAD itself. Its failures are rows of the table, not the
	// benchmark's.
	dyadRes := map[string]fbWorkloads{}
	for _, mode := range []string{"FLUX_RPC", "UCX"} {
		w := dyadOnFlux(b, in, dy, mode, false)
		dyadRes[mode] = w
		if w.err != nil {
			fmt.Fprintf(os.Stderr, "  DYAD %s: %v\n", mode, w.err)
			continue
		}
		progress("DYAD "+mode+": 1,000 x 4 KiB pipelined", "files/s", w.small.filesPerSec())
		progress("DYAD "+mode+": 4 KiB latency p50", "us", w.lock.percentile(0.5))
		progress("DYAD "+mode+": 20 x 64 MiB pipelined", "MB/s", w.large.mbPerSec())
	}

	rows := []benchRow{
		{name: "flux: 4 KiB RPC round trip p50 (rank 1 to 0)", unit: "us", value: base.rttP50},
		{name: "flux: 4 KiB RPC round trip p99 (rank 1 to 0)", unit: "us", value: base.rttP99},
		{name: "flux: 64 MiB in one response + ENODATA (DYAD's way)", unit: "MB/s", value: base.one},
		{name: "flux: 64 MiB streamed, 1 MiB responses + ENODATA", unit: "MB/s", value: base.stream},
		{name: "flux: 64 MiB by reads of 1 MiB, 8 in flight", unit: "MB/s", value: base.windowed},
	}
	ratioTo := func(v, ref float64) float64 {
		if math.IsNaN(v) || math.IsNaN(ref) || ref == 0 {
			return 0
		}
		return v / ref
	}
	for _, dtl := range []string{"flux", "tcp"} {
		w := dyadfsRes[dtl]
		// Each transport against DYAD's like it; the Flux one's
		// throughput against what Flux RPCs carry.
		peer, peerName := dyadRes["FLUX_RPC"], "DYAD FLUX_RPC"
		largeRef, largeTarget := base.windowed, "vs flux reads, 8 in flight"
		if dtl == "tcp" {
			peer, peerName = dyadRes["UCX"], "DYAD UCX"
			largeRef, largeTarget = peer.mbPerSec(), "vs DYAD UCX"
		}
		p := "dyadfs --dtl " + dtl + ": "
		rows = append(rows,
			benchRow{name: p + "1,000 x 4 KiB pipelined", unit: "files/s", value: w.small.filesPerSec(),
				ratio: ratioTo(w.small.filesPerSec(), peer.filesPerSec()), target: "vs " + peerName},
			benchRow{name: p + "producer's close of a 4 KiB file p50", unit: "us", value: w.small.closePercentile(0.5)},
			benchRow{name: p + "4 KiB latency p50", unit: "us", value: w.lock.percentile(0.5)},
			benchRow{name: p + "4 KiB latency p99", unit: "us", value: w.lock.percentile(0.99)},
			benchRow{name: p + "20 x 64 MiB pipelined", unit: "MB/s", value: w.large.mbPerSec(),
				ratio: ratioTo(w.large.mbPerSec(), largeRef), target: largeTarget},
		)
	}
	rows = append(rows,
		benchRow{name: "dyadfs --dtl flux --publish-wait 0: 1,000 x 4 KiB pipelined", unit: "files/s", value: async.small.filesPerSec(),
			ratio: ratioTo(async.small.filesPerSec(), dyadRes["FLUX_RPC"].filesPerSec()), target: "vs DYAD FLUX_RPC"},
		benchRow{name: "dyadfs --dtl flux --publish-wait 0: producer's close of a 4 KiB file p50", unit: "us", value: async.small.closePercentile(0.5)},
	)
	for _, mode := range []string{"FLUX_RPC", "UCX"} {
		w := dyadRes[mode]
		p := "DYAD " + mode + ": "
		if mode == "UCX" {
			p = "DYAD UCX (UCX_TLS=tcp): "
		}
		if w.err != nil {
			rows = append(rows, benchRow{name: p + "failed", unit: "-", value: math.NaN(), target: fbOneLine(w.err.Error())})
			continue
		}
		large := benchRow{name: p + "20 x 64 MiB pipelined", unit: "MB/s", value: w.large.mbPerSec()}
		if mode == "FLUX_RPC" {
			large.ratio, large.target = ratioTo(w.large.mbPerSec(), base.one), "vs flux one response"
		}
		rows = append(rows,
			benchRow{name: p + "1,000 x 4 KiB pipelined", unit: "files/s", value: w.small.filesPerSec()},
			benchRow{name: p + "producer's close of a 4 KiB file p50", unit: "us", value: w.small.closePercentile(0.5)},
			benchRow{name: p + "4 KiB latency p50", unit: "us", value: w.lock.percentile(0.5)},
			benchRow{name: p + "4 KiB latency p99", unit: "us", value: w.lock.percentile(0.99)},
			large,
		)
	}
	printRows(rows)
	fmt.Println("flux rows: this process, a service on rank 0 and a client on rank 1, median of 3 runs; dyadfs: --store flux://")
	fmt.Println("and each rank's own daemon; DYAD: dyad.so on each rank, python3 programs under libdyad_wrapper.so.")
}

// fbWorkloads are the three runs of one system: 1,000 x 4 KiB pipelined
// and in lock-step, and 20 x 64 MiB pipelined; err says why they could
// not be measured.
type fbWorkloads struct {
	small, lock, large e2eResult
	err                error
}

func (w fbWorkloads) filesPerSec() float64 {
	if w.err != nil {
		return math.NaN()
	}
	return w.small.filesPerSec()
}

func (w fbWorkloads) mbPerSec() float64 {
	if w.err != nil {
		return math.NaN()
	}
	return w.large.mbPerSec()
}

// fbBaselines are the raw Flux RPC figures.
type fbBaselines struct {
	rttP50, rttP99 float64 // µs
	// MB/s of 64 MiB: one response, a stream of 1 MiB responses, reads
	// of 1 MiB with 8 in flight.
	one, stream, windowed float64
}

const (
	fbChunk  = 1 << 20
	fbTotal  = 64 << 20
	fbWindow = 8
)

// fluxRPCBaselines measures Flux RPCs from a client on rank 1 to a
// service on rank 0, both in this process, through the flux package.
func fluxRPCBaselines(b *testing.B, in *fluxtest.Instance) fbBaselines {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	srv, err := flux.Open(in.URIs[0])
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Close()
	cli, err := flux.Open(in.URIs[1])
	if err != nil {
		b.Fatal(err)
	}
	defer cli.Close()
	svc, err := srv.Serve(ctx, "fbench")
	if err != nil {
		b.Fatal(err)
	}
	defer svc.Close()

	data := make([]byte, fbTotal)
	rand.Read(data)
	svc.Handle("echo", func(r flux.Request) { r.Respond(r.Payload()) })
	// whole answers as DYAD's module does: the file in one response,
	// then ENODATA.
	svc.Handle("whole", func(r flux.Request) {
		if err := r.Stream(data); err != nil {
			r.RespondError(syscall.EIO, err.Error())
			return
		}
		r.RespondError(syscall.ENODATA, "")
	})
	svc.Handle("stream", func(r flux.Request) {
		for off := 0; off < len(data); off += fbChunk {
			if err := r.Stream(data[off : off+fbChunk]); err != nil {
				r.RespondError(syscall.EIO, err.Error())
				return
			}
		}
		r.RespondError(syscall.ENODATA, "")
	})
	// read OFF LEN (two little-endian uint64s) answers data[OFF:OFF+LEN].
	svc.Handle("read", func(r flux.Request) {
		p := r.Payload()
		if len(p) != 16 {
			r.RespondError(syscall.EINVAL, "want 16 bytes")
			return
		}
		off, n := binary.LittleEndian.Uint64(p), binary.LittleEndian.Uint64(p[8:])
		if off > uint64(len(data)) || n > uint64(len(data))-off {
			r.RespondError(syscall.EINVAL, "out of range")
			return
		}
		r.Respond(data[off : off+n])
	})

	var res fbBaselines
	// Round trips: warm up, then 2,000.
	msg := make([]byte, 4096)
	rand.Read(msg)
	var rtts []float64
	for i := range 2200 {
		t := time.Now()
		resp, err := cli.RPC(ctx, "fbench.echo", 0, msg, 10*time.Second)
		if err != nil {
			b.Fatalf("echo RPC: %v", err)
		}
		if !bytes.Equal(resp, msg) {
			b.Fatalf("echo RPC: %d bytes back, not the 4 KiB sent", len(resp))
		}
		if i >= 200 {
			rtts = append(rtts, float64(time.Since(t).Nanoseconds())/1e3)
		}
	}
	sort.Float64s(rtts)
	res.rttP50, res.rttP99 = fbPercentile(rtts, 0.5), fbPercentile(rtts, 0.99)

	// A stream of responses, checked against data as they come.
	streamed := func(method string) error {
		var off int
		err := cli.Stream(ctx, "fbench."+method, 0, nil, func(p []byte) error {
			if off+len(p) > len(data) || !bytes.Equal(p, data[off:off+len(p)]) {
				return fmt.Errorf("response at %d differs from what was sent", off)
			}
			off += len(p)
			return nil
		})
		if err == nil && off != len(data) {
			err = fmt.Errorf("%d bytes streamed, want %d", off, len(data))
		}
		return err
	}
	windowed := func() error {
		var next atomic.Int64
		errs := make(chan error, fbWindow)
		for range fbWindow {
			go func() {
				for {
					off := next.Add(fbChunk) - fbChunk
					if off >= fbTotal {
						errs <- nil
						return
					}
					var req [16]byte
					binary.LittleEndian.PutUint64(req[:], uint64(off))
					binary.LittleEndian.PutUint64(req[8:], fbChunk)
					p, err := cli.RPC(ctx, "fbench.read", 0, req[:], 30*time.Second)
					if err == nil && !bytes.Equal(p, data[off:off+fbChunk]) {
						err = fmt.Errorf("read at %d: %d bytes differ from what was sent", off, len(p))
					}
					if err != nil {
						next.Store(fbTotal) // the others stop too
						errs <- err
						return
					}
				}
			}()
		}
		var first error
		for range fbWindow {
			if err := <-errs; err != nil && first == nil {
				first = err
			}
		}
		return first
	}
	rate := func(what string, f func() error) float64 {
		var v []float64
		for range 3 {
			start := time.Now()
			if err := f(); err != nil {
				b.Fatalf("%s: %v", what, err)
			}
			v = append(v, fbTotal/1e6/time.Since(start).Seconds())
		}
		sort.Float64s(v)
		return v[1]
	}
	res.one = rate("64 MiB in one response", func() error { return streamed("whole") })
	res.stream = rate("64 MiB streamed", func() error { return streamed("stream") })
	res.windowed = rate("64 MiB by windowed reads", windowed)
	return res
}

// fbPercentile is the p-th percentile of sorted values.
func fbPercentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	i := int(p*float64(len(sorted))+0.5) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// dyadfsOnFlux mounts dyadfs on both ranks with the Flux KVS as the store
// and transport dtl, runs the three workloads and unmounts.
func dyadfsOnFlux(b *testing.B, in *fluxtest.Instance, dtl string, smallOnly bool, extra ...string) fbWorkloads {
	id := make([]byte, 3)
	rand.Read(id)
	ns := "fbench" + hex.EncodeToString(id)
	ms := make([]*fbMount, 2)
	for r := range ms {
		args := []string{"--store", "flux://", "--namespace", ns, "--dtl", dtl,
			"--fetch-timeout", "30s", "--stall-timeout", "2s"}
		args = append(args, extra...)
		if dtl == "tcp" {
			args = append(args, "--listen", "127.0.0.1:"+freePort(b))
		}
		ms[r] = fbMountOn(b, in.URIs[r], args...)
	}
	defer func() {
		for _, m := range ms {
			m.cleanup()
			os.RemoveAll(m.root) // 2.6 GiB of copies: not kept till the end
		}
	}()
	p, c := ms[0], ms[1]
	run := func(dir string, n int, size int64, lockstep bool) e2eResult {
		mode := "pipelined"
		if lockstep {
			mode = "lockstep"
		}
		res, err := fbFlow{
			prod:  helperCmd("produce", filepath.Join(p.mnt, dir), strconv.Itoa(n), strconv.FormatInt(size, 10), mode),
			cons:  helperCmd("consume", filepath.Join(c.mnt, dir), strconv.Itoa(n)),
			n:     n,
			size:  size,
			lock:  lockstep,
			limit: 10 * time.Minute,
			ready: func() bool {
				st, err := c.status()
				return err == nil && st.DMD.Waiting >= 1
			},
			before: func() error { return os.MkdirAll(filepath.Join(p.mnt, dir), 0o755) },
		}.run()
		if err != nil {
			b.Fatalf("dyadfs --dtl %s, %s: %v\nrank 0 log:\n%s\nrank 1 log:\n%s", dtl, dir, err, fbTail(p.logFile), fbTail(c.logFile))
		}
		return res
	}
	var w fbWorkloads
	w.small = run("small", 1000, 4096, false)
	if smallOnly {
		return w
	}
	w.lock = run("lockstep", 1000, 4096, true)
	w.large = run("large", 20, 64<<20, false)
	return w
}

// fbMount is one dyadfs daemon for the broker at a FLUX_URI (its node id
// is the broker's rank).
type fbMount struct {
	tb                          testing.TB
	root, mnt, backing, logFile string
	pid                         int
	once                        sync.Once
}

// fbMountOn mounts dyadfs for the broker at uri with flags; the mount is
// removed when the benchmark ends, if not before.
func fbMountOn(tb testing.TB, uri string, flags ...string) *fbMount {
	tb.Helper()
	root, err := os.MkdirTemp("", "dyadfs-fbench-")
	if err != nil {
		tb.Fatal(err)
	}
	m := &fbMount{tb: tb, root: root, mnt: filepath.Join(root, "mnt"), backing: filepath.Join(root, "backing"),
		logFile: filepath.Join(root, "dyadfs.log")}
	tb.Cleanup(func() { m.cleanup(); os.RemoveAll(root) })
	for _, d := range []string{m.mnt, m.backing} {
		if err := os.Mkdir(d, 0o755); err != nil {
			tb.Fatal(err)
		}
	}
	args := append([]string{"mount", "--backing", m.backing, "--log-file", m.logFile, "--log-level", "debug"}, flags...)
	out, err := dyadfsEnv(tb, []string{"FLUX_URI=" + uri}, append(args, m.mnt)...)
	if err != nil {
		tb.Fatalf("dyadfs mount: %v\n%s\nlog:\n%s", err, out, fbTail(m.logFile))
	}
	st, err := m.status()
	if err != nil {
		tb.Fatal(err)
	}
	m.pid = st.PID
	return m
}

func (m *fbMount) status() (fs.Status, error) {
	var st fs.Status
	data, err := os.ReadFile(filepath.Join(m.mnt, ".dyadfs", "status"))
	if err != nil {
		return st, fmt.Errorf("read status: %w", err)
	}
	if err := json.Unmarshal(data, &st); err != nil {
		return st, fmt.Errorf("parse status: %w", err)
	}
	return st, nil
}

// cleanup unmounts and ends the daemon, whatever state they are in.
func (m *fbMount) cleanup() {
	m.once.Do(func() {
		if isMounted(m.mnt) {
			if _, err := runOut("fusermount3", "-u", m.mnt); err != nil {
				runOut("fusermount3", "-u", "-z", m.mnt)
			}
		}
		if m.pid != 0 && !waitExit(m.pid, 10*time.Second) {
			syscall.Kill(m.pid, syscall.SIGKILL)
			waitExit(m.pid, 10*time.Second)
		}
		if isMounted(m.mnt) {
			m.tb.Errorf("%s is still mounted after cleanup", m.mnt)
		}
	})
}

// fbTail is the end of a log file, for failure messages.
func fbTail(path string) string {
	data, _ := os.ReadFile(path)
	if len(data) > 8000 {
		data = data[len(data)-8000:]
	}
	return string(data)
}

// dyadInstall is where DYAD and the programs that drive it are.
type dyadInstall struct {
	module, wrapper string
	// python is the interpreter itself (not a shim script, which would
	// run under DYAD's wrapper too).
	python     string
	prod, cons string // the python3 programs
}

// findDYAD finds DYAD and python3, or skips the benchmark.
func findDYAD(b *testing.B) dyadInstall {
	b.Helper()
	d := dyadInstall{module: "/opt/dyad/lib/dyad.so", wrapper: "/opt/dyad/lib/libdyad_wrapper.so"}
	for _, p := range []string{d.module, d.wrapper} {
		if _, err := os.Stat(p); err != nil {
			b.Skipf("skipping: DYAD is not installed (%v): run ../shared/flux/install.sh", err)
		}
	}
	out, err := runOut("python3", "-c", "import sys; print(sys.executable)")
	if err != nil {
		b.Skipf("skipping: python3: %v %s", err, out)
	}
	d.python = strings.TrimSpace(out)
	dir := b.TempDir()
	d.prod, d.cons = filepath.Join(dir, "dyad_prod.py"), filepath.Join(dir, "dyad_cons.py")
	for p, src := range map[string]string{d.prod: dyadProducerPy, d.cons: dyadConsumerPy} {
		if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	return d
}

// The python3 programs that DYAD's wrapper intercepts. They speak the
// produce and consume helpers' protocol (cluster_bench_test.go). CPython
// opens files through open64, which DYAD's wrapper does not interpose
// (it wraps open, fopen, close and fclose): both call libc's open through
// ctypes, which the preloaded wrapper answers; os.close reaches its close.
const dyadProducerPy = `import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int]
prefix, n, size, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
buf = os.urandom(min(size, 1 << 20))
out = sys.stdout
out.write("start %d\n" % time.time_ns()); out.flush()
for i in range(n):
    if mode == "lockstep" and not sys.stdin.readline():
        sys.exit(1)
    p = ("%s%05d" % (prefix, i)).encode()
    fd = libc.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    if fd < 0:
        sys.stderr.write("open %s: %s\n" % (p, os.strerror(ctypes.get_errno()))); sys.exit(1)
    left = size
    while left > 0:
        left -= os.write(fd, buf[:min(left, len(buf))])
    closing = time.time_ns()
    os.close(fd)
    out.write("closed %d %d %d\n" % (i, closing, time.time_ns())); out.flush()
`

const dyadConsumerPy = `import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.open.argtypes = [ctypes.c_char_p, ctypes.c_int]
prefix, n = sys.argv[1], int(sys.argv[2])
buf = bytearray(1 << 20)
out = sys.stdout
for i in range(n):
    out.write("next %d\n" % i); out.flush()
    p = ("%s%05d" % (prefix, i)).encode()
    fd = libc.open(p, os.O_RDONLY)
    if fd < 0:
        sys.stderr.write("open %s: %s\n" % (p, os.strerror(ctypes.get_errno()))); sys.exit(1)
    nb = 0
    while True:
        k = os.readv(fd, [buf])
        if k == 0:
            break
        nb += k
    os.close(fd)
    out.write("done %d %d %d\n" % (i, time.time_ns(), nb)); out.flush()
`

// dyadOnFlux loads DYAD's module in mode on both ranks, each with its own
// managed directory, and runs the three workloads with a producer on rank
// 0 and a consumer on rank 1 under DYAD's wrapper. What fails is returned
// in the result's err.
func dyadOnFlux(b *testing.B, in *fluxtest.Instance, dy dyadInstall, mode string, smallOnly bool) (w fbWorkloads) {
	base, err := os.MkdirTemp("", "dyad-fbench-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(base) })
	defer os.RemoveAll(base) // 2.6 GiB of files: not kept till the end
	dirs := []string{filepath.Join(base, "rank0"), filepath.Join(base, "rank1")}
	for _, d := range dirs {
		if err := os.Mkdir(d, 0o755); err != nil {
			b.Fatal(err)
		}
	}
	id := make([]byte, 3)
	rand.Read(id)
	ns := "dyadbench" + strings.ToLower(strings.ReplaceAll(mode, "_", "")) + hex.EncodeToString(id)
	if out, err := fbFluxCmd(in.URIs[0], time.Minute, "kvs", "namespace", "create", ns); err != nil {
		return fbWorkloads{err: fmt.Errorf("flux kvs namespace create: %v: %s", err, fbOneLine(out))}
	}
	// Whatever happens, the namespace and the modules go when this
	// function returns (the next mode loads its own), or else when the
	// benchmark ends.
	removeNS := sync.OnceFunc(func() { fbFluxCmd(in.URIs[0], 20*time.Second, "kvs", "namespace", "remove", ns) })
	b.Cleanup(removeNS)
	defer removeNS()
	for r, uri := range in.URIs {
		// Removed on every rank, loaded or not: a module that loaded on
		// rank 0 must not stay if rank 1's failed.
		unload := sync.OnceFunc(func() { fbFluxCmd(uri, 20*time.Second, "module", "remove", "-f", "dyad") })
		b.Cleanup(unload)
		defer unload()
		if out, err := fbFluxCmd(uri, time.Minute, "module", "load", dy.module, "--mode="+mode, dirs[r]); err != nil {
			return fbWorkloads{err: fmt.Errorf("flux module load dyad.so --mode=%s on rank %d: %v: %s", mode, r, err, fbOneLine(out))}
		}
	}
	env := func(r int) []string {
		e := []string{"FLUX_URI=" + in.URIs[r], "LD_PRELOAD=" + dy.wrapper,
			"DYAD_KVS_NAMESPACE=" + ns, "DYAD_DTL_MODE=" + mode, "UCX_TLS=tcp"}
		if r == 0 {
			return append(e, "DYAD_PATH_PRODUCER="+dirs[0])
		}
		return append(e, "DYAD_PATH_CONSUMER="+dirs[1])
	}
	run := func(name string, n int, size int64, lockstep bool, limit time.Duration) (e2eResult, error) {
		mode := "pipelined"
		if lockstep {
			mode = "lockstep"
		}
		res, err := fbFlow{
			prod:    []string{dy.python, dy.prod, filepath.Join(dirs[0], name+"-f"), strconv.Itoa(n), strconv.FormatInt(size, 10), mode},
			prodEnv: env(0),
			cons:    []string{dy.python, dy.cons, filepath.Join(dirs[1], name+"-f"), strconv.Itoa(n)},
			consEnv: env(1),
			n:       n,
			size:    size,
			lock:    lockstep,
			limit:   limit,
		}.run()
		if err != nil {
			return res, fmt.Errorf("%s: %w", name, err)
		}
		return res, nil
	}
	if w.small, err = run("small", 1000, 4096, false, 5*time.Minute); err != nil || smallOnly {
		w.err = err
		return w
	}
	if w.lock, err = run("lockstep", 1000, 4096, true, 5*time.Minute); err != nil {
		return fbWorkloads{err: err}
	}
	if w.large, err = run("large", 20, 64<<20, false, 10*time.Minute); err != nil {
		return fbWorkloads{err: err}
	}
	return w
}

// fbFluxCmd runs the flux command against the broker at uri, bounded.
func fbFluxCmd(uri string, limit time.Duration, args ...string) (string, error) {
	bin, err := fluxtest.Binary()
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), "FLUX_URI="+uri)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		err = fmt.Errorf("no answer within %v", limit)
	}
	return string(out), err
}

// fbOneLine squeezes a program's output into one line for a table row.
func fbOneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 300 {
		s = s[:300] + "..."
	}
	return s
}

// fbFlow is one workload between a producer and a consumer program that
// speak the produce and consume helpers' protocol: the producer prints
// "start NS", then "closed I NS NS" (before and after its close) per
// file, and in lock-step writes file I when it reads a line; the consumer
// prints "next I" before it opens file I and "done I NS BYTES" once it has
// read it.
type fbFlow struct {
	prod, cons       []string
	prodEnv, consEnv []string
	n                int
	size             int64
	lock             bool
	// limit bounds the whole workload: past it both programs are killed.
	limit time.Duration
	// ready reports that the consumer waits for file 0 (nil: its
	// "next 0" is enough); before runs just before the producer starts.
	ready  func() bool
	before func() error
}

// fbProc is a program of a flow: its output lines, its errors.
type fbProc struct {
	cmd    *exec.Cmd
	lines  chan string
	stdin  io.WriteCloser
	stderr *dtltest.LogBuf
	once   sync.Once
	err    error
}

// fbStart starts argv in a process group of its own that ctx's end kills.
func fbStart(ctx context.Context, argv, env []string, lines int) (*fbProc, error) {
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	p := &fbProc{cmd: cmd, lines: make(chan string, lines), stderr: &dtltest.LogBuf{}}
	cmd.Stderr = p.stderr
	var err error
	if p.stdin, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
	}()
	return p, nil
}

// wait reads what is left of the program's output and reaps it; kill
// (ctx's cancel) first to end it.
func (p *fbProc) wait() error {
	p.once.Do(func() {
		p.stdin.Close()
		for range p.lines {
		}
		p.err = p.cmd.Wait()
		if p.err != nil {
			p.err = fmt.Errorf("%v (stderr: %s)", p.err, fbOneLine(p.stderr.String()))
		}
	})
	return p.err
}

// run runs the flow: the consumer first, waiting for file 0, then the
// producer.
func (f fbFlow) run() (res e2eResult, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), f.limit)
	defer cancel()
	timedOut := func(err error) error {
		if ctx.Err() != nil {
			return fmt.Errorf("not done within %v: %v", f.limit, err)
		}
		return err
	}
	cons, err := fbStart(ctx, f.cons, f.consEnv, 2*f.n+8)
	if err != nil {
		return res, fmt.Errorf("consumer: %w", err)
	}
	defer func() { cancel(); cons.wait() }()
	// The consumer's "next 0": it is about to open file 0.
	select {
	case line, ok := <-cons.lines:
		if !ok || line != "next 0" {
			cancel()
			return res, fmt.Errorf("consumer said %q, not \"next 0\": %v", line, cons.wait())
		}
	case <-time.After(bound):
		return res, fmt.Errorf("the consumer did not start within %v", bound)
	}
	if f.ready != nil && !poll.Within(bound, f.ready) {
		return res, fmt.Errorf("the consumer is not waiting for file 0 after %v", bound)
	}
	if f.before != nil {
		if err := f.before(); err != nil {
			return res, err
		}
	}
	prod, err := fbStart(ctx, f.prod, f.prodEnv, f.n+8)
	if err != nil {
		return res, fmt.Errorf("producer: %w", err)
	}
	defer func() { cancel(); prod.wait() }()
	var pres e2eResult // the producer's half, filled by its goroutine
	pres.closed, pres.closeTook = make([]time.Time, f.n), make([]time.Duration, f.n)
	prodDone := make(chan error, 1)
	go func() {
		for line := range prod.lines {
			w := strings.Fields(line)
			switch {
			case len(w) == 2 && w[0] == "start":
				pres.start = parseNs(w[1])
			case len(w) == 4 && w[0] == "closed":
				if i, err := strconv.Atoi(w[1]); err == nil && i >= 0 && i < f.n {
					pres.closed[i] = parseNs(w[2])
					pres.closeTook[i] = parseNs(w[3]).Sub(pres.closed[i])
				}
			}
		}
		err := prod.wait()
		if err != nil {
			cancel() // the consumer would wait for files that never come
		}
		prodDone <- err
	}()
	tell := func(i string) {
		if f.lock {
			fmt.Fprintln(prod.stdin, i)
		}
	}
	tell("0")
	res.done = make([]time.Time, f.n)
	for line := range cons.lines {
		w := strings.Fields(line)
		switch {
		case len(w) == 2 && w[0] == "next":
			tell(w[1])
		case len(w) == 4 && w[0] == "done":
			i, err := strconv.Atoi(w[1])
			if err != nil || i < 0 || i >= f.n {
				return res, fmt.Errorf("consumer said %q", line)
			}
			res.done[i] = parseNs(w[2])
			nb, _ := strconv.ParseInt(w[3], 10, 64)
			res.bytes += nb
		}
	}
	consErr := cons.wait()
	if consErr != nil {
		cancel() // the producer would go on for nobody
	}
	prod.stdin.Close()
	prodErr := <-prodDone
	if prodErr != nil {
		return res, timedOut(fmt.Errorf("producer: %w", prodErr))
	}
	if consErr != nil {
		return res, timedOut(fmt.Errorf("consumer: %w", consErr))
	}
	if res.bytes != int64(f.n)*f.size {
		return res, fmt.Errorf("the consumer read %d bytes, want %d", res.bytes, int64(f.n)*f.size)
	}
	res.start, res.closed, res.closeTook = pres.start, pres.closed, pres.closeTook
	for i := range f.n {
		if res.closed[i].IsZero() || res.done[i].IsZero() {
			return res, errors.New("a file has no close or no read time")
		}
	}
	return res, nil
}
