package test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/dyadfs/dyadfs/fs/dmd"
)

// BenchmarkClusterCost measures what one published file costs, on two
// nodes (etcd and the backing directories on tmpfs): the CPU of etcd and
// of each daemon, etcd's
// transactions and database bytes, and the FUSE requests of a create,
// per file of 2,000 × 4 KiB pipelined, with closes that wait for the
// store and with --publish-wait 0; then 16 writers on one node against
// one; then a ring of N nodes (node i writes what node i+1 reads) for N =
// 2 and 4. scripts/bench.sh cost runs it; README "What one file costs"
// quotes it.
//
// The backing directories are on tmpfs so that a daemon's CPU is its own:
// on this machine's disk (ext4 without a journal) a create after many
// deletes scans the inode bitmap past every recently freed inode, and the
// kernel's openat alone then took 290 to 540 µs, up to ten times all the
// rest, varying from run to run with what ran before.
func BenchmarkClusterCost(b *testing.B) {
	rows, add := fixedWorkload(b, 64)
	const files = 2000
	for _, mode := range []struct{ name, wait string }{{"closes that wait", ""}, {"--publish-wait 0", "0"}} {
		var flags []string
		if mode.wait != "" {
			flags = []string{"--publish-wait", mode.wait}
		}
		c := newClusterWith(b, clusterOptions{nodes: 2, flags: flags, logLevel: "info", backingOnTmpfs: true})
		a, n := c.nodes[0], c.nodes[1]
		var bare float64
		if mode.wait == "" {
			etcd := cpuMs(c.etcd.Process.Pid)
			bare = c.barePutP50(b, a)
			add(benchRow{name: "bare etcd commit p50 (one put, from node 1)", unit: "us", value: bare})
			// etcd's own floor: what a lone put costs it, nothing else running.
			add(benchRow{name: "bare etcd commit: etcd CPU per lone put", unit: "us", value: 1000 * (cpuMs(c.etcd.Process.Pid) - etcd) / barePuts})
		}
		before := c.costNow(a, n)
		res := e2e(b, a, n, "cost", files, 4096, false)
		after := c.costNow(a, n)
		d := after.minus(before)
		per := func(v float64) float64 { return v / files }
		us := func(ms float64) float64 { return 1000 * ms / files }
		add(benchRow{name: "1 file (" + mode.name + "): pipelined rate", unit: "files/s", value: res.filesPerSec()})
		closeRow := benchRow{name: "1 file (" + mode.name + "): producer's close p50", unit: "us", value: res.closePercentile(0.5)}
		if bare > 0 {
			closeRow.ratio, closeRow.target = closeRow.value/bare, "≤ 1.3× bare commit"
		}
		add(closeRow)
		add(benchRow{name: "1 file (" + mode.name + "): etcd CPU", unit: "us", value: us(d.etcdCPU), target: "≤ 150 overlapped, 300 lone"})
		add(benchRow{name: "1 file (" + mode.name + "): producer daemon CPU", unit: "us", value: us(d.cpu[0]), target: "≤ 300"})
		add(benchRow{name: "1 file (" + mode.name + "): consumer daemon CPU", unit: "us", value: us(d.cpu[1]), target: "≤ 300"})
		add(benchRow{name: "1 file (" + mode.name + "): etcd transactions per 100 files", unit: "txn", value: 100 * per(d.txns)})
		add(benchRow{name: "1 file (" + mode.name + "): etcd write requests per 100 files (Put, Txn, DeleteRange)", unit: "req", value: 100 * per(d.etcdWrites)})
		add(benchRow{name: "1 file (" + mode.name + "): etcd read requests per 100 files (Range)", unit: "req", value: 100 * per(d.etcdReads)})
		add(benchRow{name: "1 file (" + mode.name + "): etcd database growth", unit: "B", value: per(d.dbBytes), target: "≤ 300"})
		add(benchRow{name: "1 file (" + mode.name + "): producer daemon heap allocations", unit: "allocs", value: per(d.allocs[0])})
		add(benchRow{name: "1 file (" + mode.name + "): consumer daemon heap allocations", unit: "allocs", value: per(d.allocs[1])})
		add(benchRow{name: "1 file (" + mode.name + "): producer daemon heap bytes allocated", unit: "B", value: per(d.allocBytes[0])})
		add(benchRow{name: "1 file (" + mode.name + "): consumer daemon heap bytes allocated", unit: "B", value: per(d.allocBytes[1])})
		add(benchRow{name: "1 file (" + mode.name + "): producer FUSE requests", unit: "req", value: per(d.requests[0])})
		add(benchRow{name: "1 file (" + mode.name + "): consumer FUSE requests", unit: "req", value: per(d.requests[1])})
		add(benchRow{name: "1 file (" + mode.name + "): messages between the daemons (notices, both ways)", unit: "msg", value: per(d.messages)})
		add(benchRow{name: "1 file (" + mode.name + "): connections opened between the daemons", unit: "conn", value: per(d.dials[0] + d.dials[1])})
		add(benchRow{name: "1 file (" + mode.name + "): questions the consumer asked of a home", unit: "msg", value: per(d.asked)})
		closeRows(add, "1 file ("+mode.name+")", d.closes)
		c.teardown()
	}

	// 16 writers on one node of two, closes that wait, against one.
	c := newClusterWith(b, clusterOptions{nodes: 2, logLevel: "info", backingOnTmpfs: true})
	before := c.nodes[0].status().DMD.Closes
	one := c.writers(b, c.nodes[0], "one", 1, 1000)
	add(benchRow{name: "1 writer on one node of two (closes that wait)", unit: "files/s", value: one})
	// A lone writer, nobody reading: one waiting close with nothing else
	// running.
	closeRows(add, "1 writer", closesSince(c.nodes[0].status().DMD.Closes, before))
	many := c.writers(b, c.nodes[0], "many", 16, 250)
	add(benchRow{name: "16 writers on one node of two (closes that wait)", unit: "files/s", value: many, ratio: many / one, target: "≥ 5×"})
	c.teardown()

	for _, nodes := range []int{2, 4} {
		files, cpu := ring(b, nodes, 1000)
		add(benchRow{name: fmt.Sprintf("ring of %d nodes: aggregate, 1,000 × 4 KiB each", nodes), unit: "files/s", value: files})
		add(benchRow{name: fmt.Sprintf("ring of %d nodes: etcd CPU per file", nodes), unit: "us", value: 1000 * cpu})
	}
	printRows(*rows)
}

// cost is what the cluster has spent so far.
// closeRows adds the rows of where a waiting close's time went (the
// producer's status, over the closes in cl).
func closeRows(add func(benchRow), prefix string, cl dmd.CloseStats) {
	if cl.Count == 0 {
		return
	}
	mean := func(s float64) float64 { return 1e6 * s / float64(cl.Count) }
	for _, st := range []struct {
		what string
		s    float64
	}{
		{"last-close check (/proc/<pid>/fd)", cl.CheckSeconds},
		{"record (attributes, marks, bytes, checksum)", cl.RecordSeconds},
		{"store commit", cl.CommitSeconds},
		{"home and holders told", cl.TellSeconds},
		{"the rest", cl.TotalSeconds - cl.CheckSeconds - cl.RecordSeconds - cl.CommitSeconds - cl.TellSeconds},
		{"whole close (FLUSH handler)", cl.TotalSeconds},
	} {
		add(benchRow{name: prefix + ": waiting close, mean: " + st.what, unit: "us", value: mean(st.s)})
	}
}

// closesSince is what the closes counted in now add to those in before.
func closesSince(now, before dmd.CloseStats) dmd.CloseStats {
	return dmd.CloseStats{Count: now.Count - before.Count,
		CheckSeconds: now.CheckSeconds - before.CheckSeconds, RecordSeconds: now.RecordSeconds - before.RecordSeconds,
		CommitSeconds: now.CommitSeconds - before.CommitSeconds, TellSeconds: now.TellSeconds - before.TellSeconds,
		TotalSeconds: now.TotalSeconds - before.TotalSeconds}
}

type cost struct {
	etcdCPU, txns, dbBytes float64
	// etcdWrites, etcdReads: the requests etcd answered (its own
	// metrics): Put, Txn and DeleteRange; Range.
	etcdWrites, etcdReads float64
	cpu, requests         [2]float64
	allocs, allocBytes    [2]float64
	dials                 [2]float64     // connections each daemon opened to the other
	closes                dmd.CloseStats // the producer's
	messages              float64        // notice messages both daemons sent
	asked                 float64        // questions the consumer sent to the producer's home
}

func (c cost) minus(o cost) cost {
	d := cost{etcdCPU: c.etcdCPU - o.etcdCPU, txns: c.txns - o.txns, dbBytes: c.dbBytes - o.dbBytes,
		etcdWrites: c.etcdWrites - o.etcdWrites, etcdReads: c.etcdReads - o.etcdReads}
	d.closes = closesSince(c.closes, o.closes)
	d.messages = c.messages - o.messages
	d.asked = c.asked - o.asked
	for i := range c.cpu {
		d.cpu[i] = c.cpu[i] - o.cpu[i]
		d.requests[i] = c.requests[i] - o.requests[i]
		d.allocs[i] = c.allocs[i] - o.allocs[i]
		d.allocBytes[i] = c.allocBytes[i] - o.allocBytes[i]
		d.dials[i] = c.dials[i] - o.dials[i]
	}
	return d
}

// costNow reads etcd's and the nodes' CPU (ms) and counters.
func (c *cluster) costNow(nodes ...*node) cost {
	var k cost
	k.etcdCPU = cpuMs(c.etcd.Process.Pid)
	k.etcdWrites, k.etcdReads = c.etcdRequests()
	for i, n := range nodes[:2] {
		st := n.status()
		k.cpu[i] = cpuMs(n.pid)
		k.allocs[i], k.allocBytes[i] = float64(st.Heap.Allocs), float64(st.Heap.AllocBytes)
		k.dials[i] = float64(transportCounter(st, "connections_opened"))
		for _, op := range st.Ops {
			k.requests[i] += float64(op.Count)
		}
		if nst := st.Locator.Notices; nst != nil {
			k.messages += float64(nst.Sent)
			if i == 1 {
				k.asked = float64(nst.Asked)
			}
		}
		if i == 0 {
			k.closes = st.DMD.Closes
			store := storeSection(st)
			k.txns, _ = store["transactions"].(float64)
			k.dbBytes, _ = store["db_bytes"].(float64)
		}
	}
	return k
}

// etcdRequests counts the requests etcd answered so far, from its metrics
// (grpc_server_handled_total): writes (Put, Txn, DeleteRange) and reads
// (Range). Both are 0 if the metrics cannot be read.
func (c *cluster) etcdRequests() (writes, reads float64) {
	out, err := exec.Command("ip", "netns", "exec", c.etcdNS, "python3", "-c",
		`import urllib.request, sys; sys.stdout.write(urllib.request.urlopen("http://`+etcdAddr+`/metrics").read().decode())`).Output()
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(string(out), "\n") {
		if !strings.HasPrefix(line, "grpc_server_handled_total{") || !strings.Contains(line, `grpc_code="OK"`) {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			continue
		}
		switch {
		case strings.Contains(line, `grpc_method="Range"`):
			reads += v
		case strings.Contains(line, `grpc_method="Put"`), strings.Contains(line, `grpc_method="Txn"`), strings.Contains(line, `grpc_method="DeleteRange"`):
			writes += v
		}
	}
	return writes, reads
}

// cpuMs is the user and system CPU process pid spent so far, in ms.
func cpuMs(pid int) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(data)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	utime, _ := strconv.ParseFloat(f[11], 64)
	stime, _ := strconv.ParseFloat(f[12], 64)
	return (utime + stime) * 10 // clock ticks of 10 ms
}

// writers runs k writers on n, each creating files 4 KiB files in a
// directory of its own with the test helper (one process per writer),
// and returns the aggregate rate.
func (c *cluster) writers(b *testing.B, n *node, dir string, k, files int) float64 {
	b.Helper()
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, k)
	for w := range k {
		wg.Go(func() {
			d := filepath.Join(c.mnt, dir, strconv.Itoa(w))
			if out, err := n.run("mkdir", "-p", d); err != nil {
				errs <- fmt.Errorf("mkdir: %v %s", err, out)
				return
			}
			argv := n.argv(helperCmd("produce", d, strconv.Itoa(files), "4096", "pipelined")...)
			cmd := exec.Command(argv[0], argv[1:]...)
			if out, err := cmd.CombinedOutput(); err != nil {
				errs <- fmt.Errorf("writer %d: %v %s", w, err, out)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	return float64(k*files) / time.Since(start).Seconds()
}

// ring runs nodes nodes in a ring: node i writes files 4 KiB files that
// node i+1 reads, waiting for each, all at once. It returns the aggregate
// rate and etcd's CPU per file (ms).
func ring(b *testing.B, nodes, files int) (float64, float64) {
	c := newClusterWith(b, clusterOptions{nodes: nodes, logLevel: "info", backingOnTmpfs: true})
	defer c.teardown()
	for i, n := range c.nodes {
		n.mustSh(fmt.Sprintf("mkdir -p ring%d", i))
	}
	cpu0 := cpuMs(c.etcd.Process.Pid)
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, 2*nodes)
	for i, prod := range c.nodes {
		cons := c.nodes[(i+1)%nodes]
		d := filepath.Join(c.mnt, fmt.Sprintf("ring%d", i))
		for _, side := range [][]string{cons.argv(helperCmd("consume", d, strconv.Itoa(files))...),
			prod.argv(helperCmd("produce", d, strconv.Itoa(files), "4096", "pipelined")...)} {
			wg.Go(func() {
				cmd := exec.Command(side[0], side[1:]...)
				t := time.AfterFunc(5*time.Minute, func() { cmd.Process.Kill() })
				defer t.Stop()
				if out, err := cmd.CombinedOutput(); err != nil {
					errs <- fmt.Errorf("%v: %v %s", side, err, out)
				}
			})
		}
	}
	wg.Wait()
	took := time.Since(start)
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	total := float64(nodes * files)
	return total / took.Seconds(), (cpuMs(c.etcd.Process.Pid) - cpu0) / total
}

// barePutP50 is the median of 300 sequential etcd puts of a record's size
// from node n, over the same network as its daemon's: what a store
// commit costs without dyadfs.
// barePuts is how many puts barePutP50 makes.
const barePuts = 300

func (c *cluster) barePutP50(b *testing.B, n *node) float64 {
	b.Helper()
	out, err := n.run(helperCmd("etcd-put-p50", etcdAddr, strconv.Itoa(barePuts))...)
	if err != nil {
		b.Fatalf("etcd-put-p50: %v %s", err, out)
	}
	v, err := strconv.ParseFloat(strings.TrimSpace(out), 64)
	if err != nil {
		b.Fatalf("etcd-put-p50: %q", out)
	}
	return v
}

func init() {
	// etcd-put-p50 ENDPOINT N: N sequential puts of 260 bytes; prints the
	// median in µs.
	helpers["etcd-put-p50"] = func(args []string) int {
		n, _ := strconv.Atoi(args[1])
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{args[0]}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer cli.Close()
		value := strings.Repeat("x", 260)
		took := make([]float64, n)
		for i := range n {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			start := time.Now()
			_, err := cli.Put(ctx, fmt.Sprintf("/bare-put/%d", i), value)
			took[i] = float64(time.Since(start).Microseconds())
			cancel()
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
		}
		sort.Float64s(took)
		fmt.Println(took[n/2])
		return 0
	}
}
