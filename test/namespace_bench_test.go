package test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dyadfs/dyadfs/fs"
)

// The namespace's figures (see BenchmarkCluster): what a stat of a file
// published elsewhere costs, the first time and again; a stat of a path
// published nowhere; a listing of a large directory produced elsewhere
// against the same listing on its producer; how long a rewrite takes to be
// read on another node.

// namespaceBench runs the namespace's rows between producer a and
// consumer n.
func namespaceBench(b testing.TB, a, n *node) []benchRow {
	var rows []benchRow
	const files = 1000
	// Files are published right after their last close, asynchronously:
	// each row starts once the producer has published everything.
	produce := func(script string, count int) {
		b.Helper()
		before := a.status().DMD.Publishes
		a.mustSh(script)
		a.waitStatus("published", func(st fs.Status) bool { return st.DMD.Publishes >= before+uint64(count) })
	}
	produce(fmt.Sprintf("mkdir statdir && for i in $(seq 0 %d); do printf x > statdir/f$i; done", files-1), files+1)
	st := statBench(b, n, filepath.Join(n.c.mnt, "statdir"), files)
	rows = append(rows,
		benchRow{name: "stat of a file published elsewhere, first, p50", unit: "us", value: pct(st["first"], 0.5)},
		benchRow{name: "stat of a file published elsewhere, first, p99", unit: "us", value: pct(st["first"], 0.99)},
		benchRow{name: "stat of a file published elsewhere, again, p50", unit: "us", value: pct(st["again"], 0.5)},
		benchRow{name: "stat of a file published elsewhere, again, p99", unit: "us", value: pct(st["again"], 0.99)},
		benchRow{name: "stat of a path published nowhere, p50", unit: "us", value: pct(st["missing"], 0.5)},
		benchRow{name: "stat of a path published nowhere, p99", unit: "us", value: pct(st["missing"], 0.99), target: "< 1000"},
	)

	const big = 10000
	produce(fmt.Sprintf("mkdir big && cd big && for i in $(seq 1 %d); do : > f$i; done", big), big+1)
	// Each listed once on its producer (as ls after writing them) and
	// once on the consumer, which never saw the directory.
	producerLs := lsTime(b, a, "big", big)
	consumerLs := lsTime(b, n, "big", big)
	// Then every entry stat'ed once (find, as make or rsync would), the
	// listing known: the consumer answers from what it was promised.
	producerFind := findTime(b, a, "big")
	consumerFind := findTime(b, n, "big")
	rows = append(rows,
		benchRow{name: "readdir of 10,000 entries on their producer", unit: "ms", value: producerLs},
		benchRow{name: "readdir of 10,000 entries produced elsewhere", unit: "ms", value: consumerLs,
			ratio: consumerLs / producerLs, target: "≤ 3x producer"},
		benchRow{name: "stat of the 10,000 entries listed (find), on their producer", unit: "ms", value: producerFind},
		benchRow{name: "stat of the 10,000 entries listed (find), produced elsewhere", unit: "ms", value: consumerFind,
			ratio: consumerFind / producerFind},
	)

	rw := rewriteBench(b, a, n, 200)
	rows = append(rows,
		benchRow{name: "rewrite to visible elsewhere, p50", unit: "us", value: pct(rw, 0.5)},
		benchRow{name: "rewrite to visible elsewhere, p99", unit: "us", value: pct(rw, 0.99)},
	)
	return rows
}

func pct(xs []float64, p float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s) == 0 {
		return 0
	}
	i := int(p*float64(len(s))+0.5) - 1
	return s[max(0, min(i, len(s)-1))]
}

// statBench times, in node n, lstat of files f0..f(count-1) of dir twice,
// and of as many paths published nowhere.
func statBench(b testing.TB, n *node, dir string, count int) map[string][]float64 {
	out, err := n.run(helperCmd("stat-bench", dir, strconv.Itoa(count))...)
	if err != nil {
		b.Fatalf("stat-bench: %v %s", err, out)
	}
	var res map[string][]float64
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		b.Fatalf("stat-bench output: %v", err)
	}
	return res
}

// lsTime is how long reading the listing of dir takes in node n, in ms.
func lsTime(b testing.TB, n *node, dir string, want int) float64 {
	out, err := n.run(helperCmd("ls-time", filepath.Join(n.c.mnt, dir))...)
	if err != nil {
		b.Fatalf("ls-time: %v %s", err, out)
	}
	f := strings.Fields(out)
	if len(f) != 2 || f[1] != strconv.Itoa(want) {
		b.Fatalf("%s lists %q, want %d entries", n.name, out, want)
	}
	ms, _ := strconv.ParseFloat(f[0], 64)
	return ms
}

// findTime is how long find takes in node n to stat every entry of dir (a
// file newer than its directory: none), in ms, process starts included.
func findTime(b testing.TB, n *node, dir string) float64 {
	b.Helper()
	start := time.Now()
	n.mustSh("find " + dir + " -type f -newer " + dir + " > /dev/null")
	return float64(time.Since(start).Microseconds()) / 1000
}

// rewriteBench has writer rewrite one file count times; after each close,
// reader opens and reads it and checks it reads the new bytes. It returns
// the microseconds from each close to the end of the read.
func rewriteBench(b testing.TB, writer, reader *node, count int) []float64 {
	path := filepath.Join(writer.c.mnt, "rewritten")
	writer.mustSh("printf start > rewritten")
	reader.mustSh("cat rewritten > /dev/null")
	start := func(n *node, helper string) (*exec.Cmd, io.WriteCloser, *bufio.Scanner) {
		argv := n.argv(helperCmd(helper, path)...)
		cmd := exec.Command(argv[0], argv[1:]...)
		in, _ := cmd.StdinPipe()
		out, _ := cmd.StdoutPipe()
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		return cmd, in, bufio.NewScanner(out)
	}
	w, win, wout := start(writer, "rewrite")
	r, rin, rout := start(reader, "reread")
	defer func() {
		win.Close()
		rin.Close()
		w.Process.Kill()
		r.Process.Kill()
		w.Wait()
		r.Wait()
	}()
	limit := time.AfterFunc(5*time.Minute, func() { w.Process.Kill(); r.Process.Kill() })
	defer limit.Stop()
	var lat []float64
	for i := 0; i < count; i++ {
		fmt.Fprintln(win, i)
		if !wout.Scan() {
			b.Fatalf("rewrite %d: the writer stopped", i)
		}
		closed, _ := strconv.ParseInt(wout.Text(), 10, 64)
		fmt.Fprintln(rin, i)
		if !rout.Scan() {
			b.Fatalf("rewrite %d: the reader stopped", i)
		}
		done, err := strconv.ParseInt(rout.Text(), 10, 64)
		if err != nil {
			b.Fatalf("rewrite %d: the reader says %q", i, rout.Text())
		}
		lat = append(lat, float64(done-closed)/1e3)
	}
	return lat
}

func init() {
	// stat-bench DIR N: lstat DIR/f0..f(N-1), twice, and N paths
	// published nowhere; print the microseconds of each as JSON.
	helpers["stat-bench"] = func(args []string) int {
		dir := args[0]
		n, _ := strconv.Atoi(args[1])
		res := map[string][]float64{}
		var st syscall.Stat_t
		timeAll := func(name string, path func(i int) string, wantErr bool) bool {
			for i := 0; i < n; i++ {
				t := time.Now()
				err := syscall.Lstat(path(i), &st)
				res[name] = append(res[name], float64(time.Since(t).Nanoseconds())/1e3)
				if (err != nil) != wantErr {
					fmt.Fprintf(os.Stderr, "lstat %s: %v\n", path(i), err)
					return false
				}
			}
			return true
		}
		file := func(i int) string { return fmt.Sprintf("%s/f%d", dir, i) }
		missing := func(i int) string { return fmt.Sprintf("%s/missing%d", dir, i) }
		if !timeAll("first", file, false) || !timeAll("again", file, false) || !timeAll("missing", missing, true) {
			return 1
		}
		json.NewEncoder(os.Stdout).Encode(res)
		return 0
	}
	// ls-time DIR: read DIR's listing; print the milliseconds and the
	// number of entries.
	helpers["ls-time"] = func(args []string) int {
		t := time.Now()
		entries, err := os.ReadDir(args[0])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Printf("%.3f %d\n", float64(time.Since(t).Microseconds())/1e3, len(entries))
		return 0
	}
	// rewrite PATH: for each line i read, rewrite PATH with version i and
	// print the time its close returned (unix ns).
	helpers["rewrite"] = func(args []string) int {
		in := bufio.NewScanner(os.Stdin)
		for in.Scan() {
			fd, err := syscall.Open(args[0], syscall.O_WRONLY|syscall.O_TRUNC|syscall.O_CLOEXEC, 0)
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			syscall.Write(fd, []byte("v"+in.Text()+strings.Repeat(".", 4000)))
			syscall.Close(fd)
			fmt.Println(time.Now().UnixNano())
		}
		return 0
	}
	// reread PATH: for each line i read, read PATH, check it is version
	// i, and print the time the read ended (unix ns), or what it read.
	helpers["reread"] = func(args []string) int {
		in := bufio.NewScanner(os.Stdin)
		for in.Scan() {
			data, err := os.ReadFile(args[0])
			now := time.Now().UnixNano()
			if err != nil || !strings.HasPrefix(string(data), "v"+in.Text()+".") {
				fmt.Printf("read %.20q, %v\n", data, err)
				return 1
			}
			fmt.Println(now)
		}
		return 0
	}
}

// BenchmarkClusterNamespace runs the namespace's rows alone (they are part
// of BenchmarkCluster too).
func BenchmarkClusterNamespace(b *testing.B) {
	if b.N > 1 {
		b.Skip("run with -benchtime 1x: each row is a fixed workload")
	}
	c := newCluster(b, 2)
	printRows(namespaceBench(b, c.nodes[0], c.nodes[1]))
}
