package test

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/dyadfs/dyadfs/fs"
	"github.com/dyadfs/dyadfs/fs/dmd"
	"github.com/dyadfs/dyadfs/hfl"
)

// BenchmarkCluster measures sharing between two nodes over veth, in one run:
// the network and disk baselines, then dyadfs end to end, and the locator's
// levels. It prints a table (scripts/bench.sh runs it with -benchtime 1x).
func BenchmarkCluster(b *testing.B) {
	rows, add := fixedWorkload(b, 52)

	c := newCluster(b, 2)
	a, n := c.nodes[0], c.nodes[1]

	if os.Getenv(benchRowsEnv) == "compare" {
		// Only the rows every release has: scripts/bench.sh compare
		// runs them with each binary in turn.
		small := e2e(b, a, n, "small", 1000, 4096, false)
		add(benchRow{name: "dyadfs: 1,000 x 4 KiB pipelined", unit: "files/s", value: small.filesPerSec()})
		lock := e2e(b, a, n, "lockstep", 1000, 4096, true)
		add(benchRow{name: "dyadfs: 4 KiB latency p50 (etcd on tmpfs)", unit: "us", value: lock.percentile(0.5)})
		add(benchRow{name: "dyadfs: 4 KiB latency p99 (etcd on tmpfs)", unit: "us", value: lock.percentile(0.99)})
		large := e2e(b, a, n, "large", 20, 64<<20, false)
		add(benchRow{name: "dyadfs: 20 x 64 MiB pipelined", unit: "MB/s", value: large.mbPerSec()})
		printRows(*rows)
		return
	}

	iperf := iperf3(b, a, n)
	add(benchRow{name: "network: iperf3 single stream", unit: "Gbit/s", value: iperf})
	rtt := tcpRTT(b, a, n)
	add(benchRow{name: "network: TCP 64-byte round trip p50", unit: "us", value: rtt})
	disk := diskWrite(b, n)
	add(benchRow{name: "disk: consumer writes 1 GiB + fsync", unit: "MB/s", value: disk})

	creates := diskCreates(b, n, 1000, 4096)
	add(benchRow{name: "disk: create+write+close 1,000 x 4 KiB", unit: "files/s", value: creates})

	small := e2e(b, a, n, "small", 1000, 4096, false)
	add(benchRow{name: "dyadfs: 1,000 x 4 KiB pipelined", unit: "files/s", value: small.filesPerSec(), ratio: small.filesPerSec() / creates, target: "≥ 1000"})
	add(benchRow{name: "dyadfs: producer's close of a 4 KiB file p50", unit: "us", value: small.closePercentile(0.5)})
	add(benchRow{name: "dyadfs: producer's close of a 4 KiB file p99", unit: "us", value: small.closePercentile(0.99)})
	lock := e2e(b, a, n, "lockstep", 1000, 4096, true)
	add(benchRow{name: "dyadfs: 4 KiB latency p50 (etcd on tmpfs)", unit: "us", value: lock.percentile(0.5), target: "< 1000"})
	add(benchRow{name: "dyadfs: 4 KiB latency p99 (etcd on tmpfs)", unit: "us", value: lock.percentile(0.99)})
	large := e2e(b, a, n, "large", 20, 64<<20, false)
	lower := min(iperf*1000/8, disk)
	add(benchRow{name: "dyadfs: 20 x 64 MiB pipelined", unit: "MB/s", value: large.mbPerSec(), ratio: large.mbPerSec() / lower,
		target: "≥ 0.8 of min(iperf3, disk)"})
	for _, lv := range locateBench(b, n) {
		add(lv)
	}
	for _, r := range namespaceBench(b, a, n) {
		add(r)
	}

	// Backing directories on tmpfs: node-local storage without a disk.
	ct := newClusterWith(b, clusterOptions{nodes: 2, backingOnTmpfs: true})
	tmpfsSmall := e2e(b, ct.nodes[0], ct.nodes[1], "small", 1000, 4096, false)
	add(benchRow{name: "dyadfs: 1,000 x 4 KiB pipelined (backing on tmpfs)", unit: "files/s", value: tmpfsSmall.filesPerSec(), target: "≥ 1000"})
	tmpfsLock := e2e(b, ct.nodes[0], ct.nodes[1], "lockstep", 1000, 4096, true)
	add(benchRow{name: "dyadfs: 4 KiB latency p50 (backing on tmpfs)", unit: "us", value: tmpfsLock.percentile(0.5), target: "< 1000"})
	add(benchRow{name: "dyadfs: 4 KiB latency p99 (backing on tmpfs)", unit: "us", value: tmpfsLock.percentile(0.99)})

	// Asynchronous publishes (DYAD_ASYNC_PUBLISH): closes do not wait for
	// the store's verdict.
	ca := newCluster(b, 2, "--publish-wait", "0")
	asyncSmall := e2e(b, ca.nodes[0], ca.nodes[1], "small", 1000, 4096, false)
	add(benchRow{name: "dyadfs: 1,000 x 4 KiB pipelined (asynchronous publish)", unit: "files/s", value: asyncSmall.filesPerSec(), target: "≥ 1000"})
	add(benchRow{name: "dyadfs: producer's close of a 4 KiB file p50 (asynchronous publish)", unit: "us", value: asyncSmall.closePercentile(0.5)})

	// etcd on disk: a cluster of its own.
	cd := newClusterWith(b, clusterOptions{nodes: 2, etcdOnDisk: true})
	diskLock := e2e(b, cd.nodes[0], cd.nodes[1], "lockstep", 1000, 4096, true)
	add(benchRow{name: "dyadfs: 4 KiB latency p50 (etcd on disk)", unit: "us", value: diskLock.percentile(0.5)})
	add(benchRow{name: "dyadfs: 4 KiB latency p99 (etcd on disk)", unit: "us", value: diskLock.percentile(0.99)})

	printRows(*rows)
}

// fixedWorkload starts a benchmark whose rows are fixed workloads, run
// once (-benchtime 1x): it returns the rows and the function that adds
// one, printing it as it comes (names padded to width).
func fixedWorkload(b *testing.B, width int) (*[]benchRow, func(benchRow)) {
	if b.N > 1 {
		b.Skip("run with -benchtime 1x: each row is a fixed workload")
	}
	rows := new([]benchRow)
	return rows, func(r benchRow) {
		*rows = append(*rows, r)
		fmt.Fprintf(os.Stderr, "  %-*s %12.1f %s\n", width, r.name, r.value, r.unit)
	}
}

// benchRowsEnv, set to "compare", limits BenchmarkCluster to the rows that
// every release has.
const benchRowsEnv = "DYADFS_BENCH_ROWS"

// printRows prints the table scripts/bench.sh shows.
func printRows(rows []benchRow) {
	fmt.Println()
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "figure\tunit\tvalue\tratio\ttarget\t")
	for _, r := range rows {
		ratio := ""
		if r.ratio != 0 {
			ratio = fmt.Sprintf("%.2f", r.ratio)
		}
		value := fmt.Sprintf("%.1f", r.value)
		if r.spread != "" {
			value += " (" + r.spread + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t\n", r.name, r.unit, value, ratio, r.target)
	}
	tw.Flush()
	fmt.Println("\npipelined: the consumer waits for file 0 before the producer starts, then reads the files in order while")
	fmt.Println("the producer writes them; latency: lock-step, the producer writes file i once the consumer waits for it;")
	fmt.Println("latency is from the producer's close to the end of the consumer's read.")
}

// medianOf is the median of the rounds v.
func medianOf(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// spreadOf is the range of the rounds v, as a row shows it.
func spreadOf(v []float64) string { return fmt.Sprintf("%.0f–%.0f", slices.Min(v), slices.Max(v)) }

type benchRow struct {
	name, unit string
	value      float64
	// spread is the range of the rounds whose median value is.
	spread string
	ratio  float64
	target string
}

// iperf3 measures single-stream TCP throughput from a to n.
func iperf3(b testing.TB, a, n *node) float64 {
	if _, err := exec.LookPath("iperf3"); err != nil {
		b.Skip("skipping: iperf3 is not installed: run scripts/setup.sh")
	}
	// The server stays up (no -1) so that a client attempt that failed
	// half-way can be repeated; it is killed when done.
	server := exec.Command("ip", "netns", "exec", n.netns, "iperf3", "-s", "-B", n.ip)
	if err := server.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { server.Process.Kill(); server.Wait() }()
	var res struct {
		Error string `json:"error"`
		End   struct {
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	eventually(b, "an iperf3 run", func() bool {
		out, err := a.c.inNet(a.netns, "iperf3", "-c", n.ip, "-t", "5", "-J")
		if err != nil {
			return false
		}
		res.Error, res.End.SumReceived.BitsPerSecond = "", 0
		return json.Unmarshal([]byte(out), &res) == nil && res.Error == "" && res.End.SumReceived.BitsPerSecond > 0
	})
	return res.End.SumReceived.BitsPerSecond / 1e9
}

// tcpRTT measures the median round trip of 64-byte messages from a to n.
func tcpRTT(b testing.TB, a, n *node) float64 {
	addr := n.ip + ":7999"
	server := exec.Command("ip", append([]string{"netns", "exec", n.netns}, helperCmd("echo-server", addr)...)...)
	stdout, _ := server.StdoutPipe()
	if err := server.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { server.Process.Kill(); server.Wait() }()
	bufio.NewReader(stdout).ReadString('\n') // "listening"
	out, err := n.c.inNet(a.netns, helperCmd("ping-pong", addr, "2000")...)
	if err != nil {
		b.Fatalf("ping-pong: %v %s", err, out)
	}
	v, _ := strconv.ParseFloat(strings.TrimSpace(out), 64)
	return v
}

// diskWrite measures writing 1 GiB with fsync into n's backing directory.
func diskWrite(b testing.TB, n *node) float64 {
	p := filepath.Join(n.backing, ".dyadfs", "disk-bench")
	defer os.Remove(p)
	syscall.Sync()
	start := time.Now()
	out, err := runOut("dd", "if=/dev/zero", "of="+p, "bs=1M", "count=1024", "conv=fsync", "status=none")
	if err != nil {
		b.Fatalf("dd: %v %s", err, out)
	}
	return 1024 * (1 << 20) / 1e6 / time.Since(start).Seconds()
}

// diskCreates measures creating, writing and closing n files of size bytes
// natively in n's backing directory: what the disk under dyadfs does with
// small files. The files stay until the benchmark ends, so that removing
// them does not slow the rows after it.
func diskCreates(b testing.TB, n *node, count int, size int) float64 {
	dir := filepath.Join(n.backing, ".dyadfs", "create-bench")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	buf := make([]byte, size)
	start := time.Now()
	for i := 0; i < count; i++ {
		fd, err := syscall.Open(fmt.Sprintf("%s/f%05d", dir, i), syscall.O_CREAT|syscall.O_WRONLY|syscall.O_TRUNC|syscall.O_CLOEXEC, 0o644)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := syscall.Write(fd, buf); err != nil {
			b.Fatal(err)
		}
		syscall.Close(fd)
	}
	return float64(count) / time.Since(start).Seconds()
}

// e2eResult holds, per file, when the producer closed it and when the
// consumer finished reading it.
type e2eResult struct {
	closed, done []time.Time
	// closeTook is how long each of the producer's closes took.
	closeTook []time.Duration
	start     time.Time
	bytes     int64
}

// closePercentile is a percentile of the producer's close times, in µs.
func (r e2eResult) closePercentile(p float64) float64 {
	l := make([]float64, len(r.closeTook))
	for i, d := range r.closeTook {
		l[i] = float64(d.Microseconds())
	}
	sort.Float64s(l)
	i := int(p*float64(len(l))+0.5) - 1
	return l[max(0, min(i, len(l)-1))]
}

func (r e2eResult) latencies() []float64 {
	var l []float64
	for i := range r.done {
		l = append(l, float64(r.done[i].Sub(r.closed[i]).Microseconds()))
	}
	sort.Float64s(l)
	return l
}

func (r e2eResult) percentile(p float64) float64 {
	l := r.latencies()
	i := int(p*float64(len(l))+0.5) - 1
	return l[max(0, min(i, len(l)-1))]
}

func (r e2eResult) elapsed() time.Duration { return r.done[len(r.done)-1].Sub(r.start) }

func (r e2eResult) filesPerSec() float64 { return float64(len(r.done)) / r.elapsed().Seconds() }

func (r e2eResult) mbPerSec() float64 { return float64(r.bytes) / 1e6 / r.elapsed().Seconds() }

// e2e has producer write n files of size bytes into dir while consumer
// reads them, waiting for each; in lock-step the producer writes a file
// only when the consumer is about to open it.
func e2e(b testing.TB, producer, consumer *node, dir string, n int, size int64, lockstep bool) e2eResult {
	b.Helper()
	mode := "pipelined"
	if lockstep {
		mode = "lockstep"
	}
	mnt := producer.c.mnt
	consArgv := consumer.argv(helperCmd("consume", filepath.Join(mnt, dir), strconv.Itoa(n))...)
	cons := exec.Command(consArgv[0], consArgv[1:]...)
	consOut, _ := cons.StdoutPipe()
	cons.Stderr = os.Stderr
	if err := cons.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { cons.Process.Kill(); cons.Wait() }()
	consumer.waitStatus("consumer waiting", func(st fs.Status) bool { return st.DMD.Waiting >= 1 })

	producer.mustSh("mkdir -p " + dir)
	prodArgv := producer.argv(helperCmd("produce", filepath.Join(mnt, dir), strconv.Itoa(n), strconv.FormatInt(size, 10), mode)...)
	prod := exec.Command(prodArgv[0], prodArgv[1:]...)
	prodIn, _ := prod.StdinPipe()
	prodOut, _ := prod.StdoutPipe()
	prod.Stderr = os.Stderr
	if err := prod.Start(); err != nil {
		b.Fatal(err)
	}
	// Whatever happens, nothing outlives the bound.
	limit := time.AfterFunc(10*time.Minute, func() { prod.Process.Kill(); cons.Process.Kill() })
	defer limit.Stop()
	defer prod.Process.Kill()

	res := e2eResult{closed: make([]time.Time, n), done: make([]time.Time, n), closeTook: make([]time.Duration, n)}
	prodDone := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(prodOut)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			switch f[0] {
			case "start":
				res.start = parseNs(f[1])
			case "closed":
				i, _ := strconv.Atoi(f[1])
				res.closed[i] = parseNs(f[2])
				res.closeTook[i] = parseNs(f[3]).Sub(res.closed[i])
			}
		}
		err := prod.Wait()
		if err != nil {
			cons.Process.Kill() // it would wait for files that never come
		}
		prodDone <- err
	}()
	sc := bufio.NewScanner(consOut)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch f[0] {
		case "next":
			if lockstep {
				fmt.Fprintln(prodIn, f[1])
			}
		case "done":
			i, _ := strconv.Atoi(f[1])
			res.done[i] = parseNs(f[2])
			nb, _ := strconv.ParseInt(f[3], 10, 64)
			res.bytes += nb
		}
	}
	consErr := cons.Wait()
	prodIn.Close()
	if err := <-prodDone; err != nil {
		b.Fatalf("producer: %v", err)
	}
	if consErr != nil {
		b.Fatalf("consumer: %v", consErr)
	}
	if res.bytes != int64(n)*size {
		b.Fatalf("consumer read %d bytes, want %d", res.bytes, int64(n)*size)
	}
	return res
}

func parseNs(s string) time.Time {
	v, _ := strconv.ParseInt(s, 10, 64)
	return time.Unix(0, v)
}

// locateBench measures lookups per second answered at each locator level,
// from inside node n (the global store is across the veth).
func locateBench(b testing.TB, n *node) []benchRow {
	out, err := n.run(helperCmd("locate-bench", "etcd://"+etcdAddr, n.c.namespace+"-bench")...)
	if err != nil {
		b.Fatalf("locate-bench: %v %s", err, out)
	}
	var rates map[string]float64
	if err := json.Unmarshal([]byte(out), &rates); err != nil {
		b.Fatalf("locate-bench output %q: %v", out, err)
	}
	return []benchRow{
		{name: "locator: lookups answered locally", unit: "lookups/s", value: rates["local"]},
		{name: "locator: lookups answered from the cache", unit: "lookups/s", value: rates["cache"], ratio: rates["cache"] / rates["global"], target: "≥ 100x global"},
		{name: "locator: lookups answered by etcd", unit: "lookups/s", value: rates["global"]},
	}
}

func init() {
	// produce DIR N SIZE MODE: write N files of SIZE bytes; in lockstep
	// mode, one per line read from stdin.
	helpers["produce"] = func(args []string) int {
		dir := args[0]
		n, _ := strconv.Atoi(args[1])
		size, _ := strconv.ParseInt(args[2], 10, 64)
		lockstep := args[3] == "lockstep"
		buf := make([]byte, min(size, 1<<20))
		rand.Read(buf)
		in := bufio.NewScanner(os.Stdin)
		fmt.Printf("start %d\n", time.Now().UnixNano())
		for i := 0; i < n; i++ {
			if lockstep && !in.Scan() {
				return 1
			}
			fd, err := syscall.Open(fmt.Sprintf("%s/f%05d", dir, i), syscall.O_CREAT|syscall.O_WRONLY|syscall.O_TRUNC|syscall.O_CLOEXEC, 0o644)
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			for left := size; left > 0; {
				k, err := syscall.Write(fd, buf[:min(left, int64(len(buf)))])
				if err != nil {
					fmt.Fprintln(os.Stderr, err)
					return 1
				}
				left -= int64(k)
			}
			// Latency counts from the call to close: a close that
			// publishes returns after its consumer may have been told.
			closing := time.Now()
			if err := syscall.Close(fd); err != nil {
				fmt.Fprintln(os.Stderr, "close:", err)
				return 1
			}
			fmt.Printf("closed %d %d %d\n", i, closing.UnixNano(), time.Now().UnixNano())
		}
		return 0
	}
	// consume DIR N: read N files in order, each waiting until published.
	helpers["consume"] = func(args []string) int {
		dir := args[0]
		n, _ := strconv.Atoi(args[1])
		w := bufio.NewWriter(os.Stdout)
		buf := make([]byte, 1<<20)
		for i := 0; i < n; i++ {
			fmt.Fprintf(w, "next %d\n", i)
			w.Flush()
			f, err := os.Open(fmt.Sprintf("%s/f%05d", dir, i))
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			nb, err := io.CopyBuffer(io.Discard, f, buf)
			f.Close()
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			fmt.Fprintf(w, "done %d %d %d\n", i, time.Now().UnixNano(), nb)
		}
		w.Flush()
		return 0
	}
	// echo-server ADDR: echo 64-byte messages.
	helpers["echo-server"] = func(args []string) int {
		l, err := net.Listen("tcp", args[0])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Println("listening")
		conn, err := l.Accept()
		if err != nil {
			return 1
		}
		buf := make([]byte, 64)
		for {
			if _, err := io.ReadFull(conn, buf); err != nil {
				return 0
			}
			conn.Write(buf)
		}
	}
	// ping-pong ADDR N: print the median round trip in microseconds.
	helpers["ping-pong"] = func(args []string) int {
		conn, err := net.Dial("tcp", args[0])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		n, _ := strconv.Atoi(args[1])
		buf := make([]byte, 64)
		var rtts []float64
		for i := 0; i < n; i++ {
			t := time.Now()
			conn.Write(buf)
			if _, err := io.ReadFull(conn, buf); err != nil {
				return 1
			}
			rtts = append(rtts, float64(time.Since(t).Nanoseconds())/1e3)
		}
		sort.Float64s(rtts)
		fmt.Printf("%.1f\n", rtts[len(rtts)/2])
		return 0
	}
	// locate-bench STORE-URL NAMESPACE: lookups per second at each level.
	helpers["locate-bench"] = func(args []string) int {
		ctx := context.Background()
		store, err := openEtcd(ctx, args[0])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer store.Close()
		cfg := hfl.DefaultLocatorConfig()
		cfg.Namespace = args[1]
		cfg.SingleNode = true // the levels, not the namespace's promises
		backing, _ := os.MkdirTemp("", "locate-bench-")
		defer os.RemoveAll(backing)
		dcfg := dmd.DefaultConfig()
		dcfg.Backing, dcfg.Node = backing, "bench"
		d, err := dmd.New(dcfg, dmd.Parts{Store: store, Locator: cfg})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer d.Close()
		loc := d.Locator()
		os.WriteFile(filepath.Join(backing, "here.dat"), []byte("x"), 0o644)
		loc.Publish(ctx, hfl.Record{Path: "cached.dat", Owner: "elsewhere", Size: 1}, hfl.PublishOptions{})
		loc.Publish(ctx, hfl.Record{Path: "global.dat", Owner: "elsewhere", Size: 1}, hfl.PublishOptions{})
		rate := func(n int, f func()) float64 {
			start := time.Now()
			for i := 0; i < n; i++ {
				f()
			}
			return float64(n) / time.Since(start).Seconds()
		}
		rates := map[string]float64{
			"local": rate(200000, func() { loc.Locate(ctx, "here.dat") }),
			"cache": rate(200000, func() { loc.Locate(ctx, "cached.dat") }),
			"global": rate(2000, func() {
				loc.Forget("global.dat")
				loc.Locate(ctx, "global.dat")
			}),
		}
		json.NewEncoder(os.Stdout).Encode(rates)
		return 0
	}
}
