// Command bench measures dyadfs against the filesystem under its backing
// directory, in one run, and prints a table: each figure through the mount,
// the same figure natively, and the ratio (dyadfs speed / native speed, so
// 1.0 means as fast as native). scripts/bench.sh runs it.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"golang.org/x/sys/unix"
)

type config struct {
	bin      string
	dir      string
	seqBytes int64
	files    int
	many     int
	writers  int
	wakes    int
	reps     int
	extra    []string
}

func main() {
	var c config
	var extra string
	flag.StringVar(&c.bin, "dyadfs", "", "dyadfs binary (required)")
	flag.StringVar(&c.dir, "dir", "/var/tmp", "directory on the disk to measure; scratch space goes below it")
	flag.Int64Var(&c.seqBytes, "seq-bytes", 1<<30, "size of the sequential file")
	flag.IntVar(&c.files, "files", 10000, "number of small files")
	flag.IntVar(&c.many, "many-files", 100000, "number of 1 KiB files the many writers create (0: none)")
	flag.IntVar(&c.writers, "writers", 16, "number of writers creating the many files")
	flag.IntVar(&c.wakes, "wakes", 1000, "number of publish-to-wake samples")
	flag.IntVar(&c.reps, "reps", 3, "repetitions of each throughput figure (alternating dyadfs and native; the median is reported)")
	flag.StringVar(&extra, "mount-flags", "", "extra flags for dyadfs mount, space-separated")
	flag.Parse()
	if c.bin == "" {
		fmt.Fprintln(os.Stderr, "bench: -dyadfs is required")
		os.Exit(2)
	}
	c.extra = strings.Fields(extra)
	reps = max(1, c.reps)
	if err := run(c); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// row is one line of the table.
type row struct {
	name           string
	unit           string
	dyadfs, native float64
	lowerIsBetter  bool
	note           string
}

func (r row) ratio() float64 {
	if r.dyadfs == 0 || r.native == 0 {
		return 0
	}
	if r.lowerIsBetter {
		return r.native / r.dyadfs
	}
	return r.dyadfs / r.native
}

func run(c config) error {
	base, err := os.MkdirTemp(c.dir, "dyadfs-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(base)
	native, backing, mnt := filepath.Join(base, "native"), filepath.Join(base, "backing"), filepath.Join(base, "mnt")
	for _, d := range []string{native, backing, mnt} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return err
		}
	}
	args := append([]string{"mount", "--backing", backing, "--node", "bench", "--log-file", filepath.Join(base, "dyadfs.log"), "--log-level", "warn"}, c.extra...)
	if out, err := exec.Command(c.bin, append(args, mnt)...).CombinedOutput(); err != nil {
		return fmt.Errorf("dyadfs mount: %v: %s", err, out)
	}
	defer exec.Command("fusermount3", "-u", "-z", mnt).Run()
	st, err := readStatus(mnt)
	if err != nil {
		return err
	}

	var rows []row
	add := func(r row, err error) error {
		if err != nil {
			return fmt.Errorf("%s: %w", r.name, err)
		}
		rows = append(rows, r)
		fmt.Fprintf(os.Stderr, "  %-36s dyadfs %10.1f  native %10.1f %s\n", r.name, r.dyadfs, r.native, r.unit)
		return nil
	}
	// measure fills in r's figures with pair's, and adds it.
	measure := func(r row, f func(d string) (float64, error)) error {
		var err error
		r.dyadfs, r.native, err = pair(f, mnt, native)
		return add(r, err)
	}
	fmt.Fprintf(os.Stderr, "measuring in %s (passthrough %s)\n", base, st.Passthrough)

	size := c.seqBytes
	mb := float64(size) / 1e6
	for _, seq := range []struct {
		name string // a format of the file's size
		f    func(p string) (float64, error)
	}{
		{"sequential write %s", func(p string) (float64, error) {
			return rate(mb, func() error { return writeFile(p, size) })
		}},
		{"sequential read %s, page cache", func(p string) (float64, error) {
			readFile(p) // warm
			return rate(mb, func() error { return readFile(p) })
		}},
		{"sequential read %s, caches dropped", func(p string) (float64, error) {
			if err := dropCaches(); err != nil {
				return 0, err
			}
			return rate(mb, func() error { return readFile(p) })
		}},
	} {
		r := row{name: fmt.Sprintf(seq.name, human(size)), unit: "MB/s"}
		if err := measure(r, func(d string) (float64, error) { return seq.f(filepath.Join(d, "seq.dat")) }); err != nil {
			return err
		}
	}
	os.Remove(filepath.Join(mnt, "seq.dat"))
	os.Remove(filepath.Join(native, "seq.dat"))

	round := map[string]int{}
	var lastSmall = map[string]string{}
	err = measure(row{name: fmt.Sprintf("create+write+close %d x 4 KiB", c.files), unit: "files/s"}, func(d string) (float64, error) {
		// Every repetition creates its files in a new directory; the
		// stat rows use the last one.
		round[d]++
		sub := filepath.Join(d, fmt.Sprintf("small-%d", round[d]))
		lastSmall[d] = sub
		return rate(float64(c.files), func() error { return createFiles(sub, c.files) })
	})
	if err != nil {
		return err
	}
	statRate := func(d string) (float64, error) {
		return rate(float64(c.files), func() error { return statFiles(lastSmall[d], c.files) })
	}
	err = measure(row{name: fmt.Sprintf("create+write+close %d x 4 KiB, python3", c.files/2), unit: "files/s",
		note: "the same loop in python3 (os.open, os.write, os.close): what an interpreted application sees"},
		func(d string) (float64, error) {
			round[d+"py"]++
			return pythonCreates(filepath.Join(d, fmt.Sprintf("py-%d", round[d+"py"])), c.files/2)
		})
	if err != nil {
		return err
	}

	// The first stat after a write asks the daemon (writes invalidate the
	// kernel's attributes); it can only be measured once per file.
	r := row{name: fmt.Sprintf("stat %d files, first after writing", c.files), unit: "stats/s"}
	r.dyadfs, err = statRate(mnt)
	if err == nil {
		r.native, err = statRate(native)
	}
	if err := add(r, err); err != nil {
		return err
	}
	if err := measure(row{name: fmt.Sprintf("stat %d published files", c.files), unit: "stats/s"}, statRate); err != nil {
		return err
	}

	wake, err := wakeLatency(mnt, c.wakes)
	if err != nil {
		return fmt.Errorf("wake latency: %w", err)
	}
	inotify, err := inotifyLatency(native, c.wakes)
	if err != nil {
		return fmt.Errorf("inotify latency: %w", err)
	}
	for _, q := range []struct {
		name string
		p    float64
	}{{"p50", 0.50}, {"p99", 0.99}} {
		rows = append(rows, row{
			name: "publish-to-wake latency " + q.name, unit: "us", lowerIsBetter: true,
			dyadfs: percentile(wake, q.p), native: percentile(inotify, q.p),
			note: "native: inotify IN_CLOSE_WRITE wake, then open",
		})
	}

	// Many writers at once, and what the daemon keeps per file.
	var memory string
	if c.many > 0 {
		pid := st.PID
		rssBefore, _ := rssBytes(pid)
		r := row{name: fmt.Sprintf("create+write+close %d x 1 KiB, %d writers", c.many, c.writers), unit: "files/s"}
		r.dyadfs, err = manyWriters(filepath.Join(mnt, "many"), c.writers, c.many)
		if err == nil {
			r.native, err = manyWriters(filepath.Join(native, "many"), c.writers, c.many)
		}
		if err := add(r, err); err != nil {
			return err
		}
		rssAfter, err := rssBytes(pid)
		if err != nil {
			return err
		}
		grown := float64(rssAfter - rssBefore)
		memory = fmt.Sprintf("daemon RSS over those %d creates: %.0f MB to %.0f MB, %.0f bytes per file (target: at most 1,000)",
			c.many, float64(rssBefore)/1e6, float64(rssAfter)/1e6, grown/float64(c.many))
	}

	// Count the requests of one more set of creates.
	before, _ := readStatus(mnt)
	if err := createFiles(filepath.Join(mnt, "counted"), 1000); err != nil {
		return err
	}
	syscall.Sync() // let the asynchronous RELEASEs arrive
	after, _ := readStatus(mnt)

	printTable(os.Stdout, rows, st.Passthrough)
	if memory != "" {
		fmt.Println(memory)
	}
	fmt.Printf("\nFUSE requests per small-file create: %s\n", perFile(before, after, 1000))
	return nil
}

// reps is how many times pair measures each side.
var reps = 3

// pair measures f through dyadfs and natively, reps times each,
// alternating so that drift on the shared machine hits both sides alike,
// and returns the medians. Before every measurement dirty data is written
// back, so that one side does not pay for the other's writes.
func pair(f func(dir string) (float64, error), mnt, native string) (float64, float64, error) {
	var a, b []float64
	for i := 0; i < reps; i++ {
		syscall.Sync()
		x, err := f(mnt)
		if err != nil {
			return 0, 0, fmt.Errorf("through dyadfs: %w", err)
		}
		syscall.Sync()
		y, err := f(native)
		if err != nil {
			return 0, 0, fmt.Errorf("native: %w", err)
		}
		a, b = append(a, x), append(b, y)
	}
	return percentile(a, 0.5), percentile(b, 0.5), nil
}

func rate(units float64, f func() error) (float64, error) {
	start := time.Now()
	if err := f(); err != nil {
		return 0, err
	}
	return units / time.Since(start).Seconds(), nil
}

func human(n int64) string {
	if n >= 1<<30 && n%(1<<30) == 0 {
		return fmt.Sprintf("%d GiB", n>>30)
	}
	return fmt.Sprintf("%d MiB", n>>20)
}

func writeFile(p string, size int64) error {
	f, err := os.Create(p)
	if err != nil {
		return err
	}
	buf := bytes.Repeat([]byte("dyadfs-bench-data"), (1<<20)/17+1)[:1<<20]
	for done := int64(0); done < size; done += int64(len(buf)) {
		if _, err := f.Write(buf); err != nil {
			f.Close()
			return err
		}
	}
	return f.Close()
}

func readFile(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for {
		_, err := f.Read(buf)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

func dropCaches() error {
	syscall.Sync()
	return os.WriteFile("/proc/sys/vm/drop_caches", []byte("3\n"), 0)
}

func createFiles(dir string, n int) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	data := bytes.Repeat([]byte("x"), 4096)
	for i := 0; i < n; i++ {
		fd, err := syscall.Open(filepath.Join(dir, fmt.Sprintf("f%05d", i)), syscall.O_CREAT|syscall.O_WRONLY|syscall.O_TRUNC|syscall.O_CLOEXEC, 0o644)
		if err != nil {
			return err
		}
		if _, err := syscall.Write(fd, data); err != nil {
			return err
		}
		if err := syscall.Close(fd); err != nil {
			return err
		}
	}
	return nil
}

// manyWriters creates n files of 1 KiB below dir, spread over 1,000
// directories, from writers goroutines at once (each create a system
// call of its own thread), and returns the files created per second.
func manyWriters(dir string, writers, n int) (float64, error) {
	const dirs = 1000
	for i := range dirs {
		if err := os.MkdirAll(filepath.Join(dir, strconv.Itoa(i)), 0o755); err != nil {
			return 0, err
		}
	}
	data := bytes.Repeat([]byte("y"), 1024)
	return rate(float64(n), func() error {
		errs := make(chan error, writers)
		for w := range writers {
			go func() {
				for i := w; i < n; i += writers {
					p := filepath.Join(dir, strconv.Itoa(i%dirs), "f"+strconv.Itoa(i))
					fd, err := syscall.Open(p, syscall.O_CREAT|syscall.O_WRONLY|syscall.O_TRUNC|syscall.O_CLOEXEC, 0o644)
					if err == nil {
						_, err = syscall.Write(fd, data)
						if cerr := syscall.Close(fd); err == nil {
							err = cerr
						}
					}
					if err != nil {
						errs <- fmt.Errorf("%s: %w", p, err)
						return
					}
				}
				errs <- nil
			}()
		}
		var first error
		for range writers {
			if err := <-errs; err != nil && first == nil {
				first = err
			}
		}
		return first
	})
}

// rssBytes returns the resident memory of process pid.
func rssBytes(pid int) (int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}

// pythonCreates runs the create loop in python3 and returns its files/s.
func pythonCreates(dir string, n int) (float64, error) {
	prog := `
import os, sys, time
d, n = sys.argv[1], int(sys.argv[2])
os.makedirs(d)
data = b"x" * 4096
t = time.perf_counter()
for i in range(n):
    fd = os.open("%s/f%05d" % (d, i), os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    os.write(fd, data)
    os.close(fd)
print(n / (time.perf_counter() - t))
`
	out, err := exec.Command("python3", "-c", prog, dir, fmt.Sprint(n)).Output()
	if err != nil {
		return 0, fmt.Errorf("python3: %w", err)
	}
	var rate float64
	_, err = fmt.Sscan(string(out), &rate)
	return rate, err
}

func statFiles(dir string, n int) error {
	var st syscall.Stat_t
	for i := 0; i < n; i++ {
		if err := syscall.Stat(filepath.Join(dir, fmt.Sprintf("f%05d", i)), &st); err != nil {
			return err
		}
	}
	return nil
}

// wakeLatency measures, n times, the time from a producer's call to close
// of a new file to the return of a reader's open that was waiting for it.
func wakeLatency(mnt string, n int) ([]float64, error) {
	dir := filepath.Join(mnt, "wake")
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, err
	}
	var out []float64
	for i := 0; i < n; i++ {
		p := filepath.Join(dir, fmt.Sprintf("w%05d", i))
		opened := make(chan time.Time, 1)
		errc := make(chan error, 1)
		go func() {
			fd, err := syscall.Open(p, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
			for errors.Is(err, syscall.EINTR) {
				// The Go runtime's preemption signal interrupted the
				// wait: open again, as a C program's SA_RESTART would.
				fd, err = syscall.Open(p, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
			}
			t := time.Now()
			if err != nil {
				errc <- err
				return
			}
			syscall.Close(fd)
			opened <- t
		}()
		if err := waitWaiting(mnt, 1); err != nil {
			return nil, err
		}
		closed, err := produce(p)
		if err != nil {
			return nil, err
		}
		select {
		case t := <-opened:
			out = append(out, float64(t.Sub(closed).Microseconds()))
		case err := <-errc:
			return nil, err
		case <-time.After(30 * time.Second):
			return nil, fmt.Errorf("reader of %s never woke", p)
		}
	}
	return out, nil
}

// produce writes a 4 KiB file and returns the time it called close. The
// latency is measured from that call: the kernel may wake a reader (an
// inotify IN_CLOSE_WRITE event is sent from within close) before close
// returns to the producer, so a clock read after close could come after
// the reader's and give a negative latency.
func produce(p string) (time.Time, error) {
	fd, err := syscall.Open(p, syscall.O_CREAT|syscall.O_WRONLY|syscall.O_TRUNC|syscall.O_CLOEXEC, 0o644)
	if err != nil {
		return time.Time{}, err
	}
	syscall.Write(fd, make([]byte, 4096))
	closing := time.Now()
	err = syscall.Close(fd)
	return closing, err
}

// inotifyLatency is the native counterpart: a reader blocked on inotify
// for IN_CLOSE_WRITE of the file, then opening it.
func inotifyLatency(native string, n int) ([]float64, error) {
	dir := filepath.Join(native, "wake")
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, err
	}
	ifd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
	if err != nil {
		return nil, err
	}
	defer unix.Close(ifd)
	if _, err := unix.InotifyAddWatch(ifd, dir, unix.IN_CLOSE_WRITE); err != nil {
		return nil, err
	}
	var out []float64
	buf := make([]byte, 64<<10)
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("w%05d", i)
		p := filepath.Join(dir, name)
		opened := make(chan time.Time, 1)
		ready := make(chan struct{})
		go func() {
			close(ready)
			for {
				k, err := unix.Read(ifd, buf)
				if err != nil {
					return
				}
				if bytes.Contains(buf[:k], []byte(name)) {
					fd, err := syscall.Open(p, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
					t := time.Now()
					if err == nil {
						syscall.Close(fd)
					}
					opened <- t
					return
				}
			}
		}()
		<-ready
		closed, err := produce(p)
		if err != nil {
			return nil, err
		}
		t := <-opened
		out = append(out, float64(t.Sub(closed).Microseconds()))
	}
	return out, nil
}

func percentile(xs []float64, p float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s) == 0 {
		return 0
	}
	i := int(p*float64(len(s))+0.5) - 1
	return s[max(0, min(i, len(s)-1))]
}

type status struct {
	PID         int    `json:"pid"`
	Passthrough string `json:"passthrough"`
	DMD         struct {
		Waiting int `json:"waiting_paths"`
	} `json:"dmd"`
	Ops map[string]struct {
		Count uint64 `json:"count"`
	} `json:"ops"`
}

func readStatus(mnt string) (status, error) {
	var st status
	data, err := os.ReadFile(filepath.Join(mnt, ".dyadfs", "status"))
	if err != nil {
		return st, err
	}
	return st, json.Unmarshal(data, &st)
}

func waitWaiting(mnt string, n int) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, err := readStatus(mnt)
		if err != nil {
			return err
		}
		if st.DMD.Waiting >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("reader never started waiting")
		}
		time.Sleep(50 * time.Microsecond)
	}
}

func perFile(before, after status, files int) string {
	var parts []string
	var total uint64
	for op := range after.Ops {
		if op == "open" || op == "read" || op == "getattr" && after.Ops[op].Count-before.Ops[op].Count <= 2 {
			continue // the status file's own reads
		}
		n := after.Ops[op].Count - before.Ops[op].Count
		total += n
		if n > 0 {
			parts = append(parts, fmt.Sprintf("%s %.2f", op, float64(n)/float64(files)))
		}
	}
	return fmt.Sprintf("%.2f (%s)", float64(total)/float64(files), strings.Join(parts, ", "))
}

func printTable(w io.Writer, rows []row, passthrough string) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "figure\tunit\tdyadfs\tnative\tratio\t")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%.1f\t%.1f\t%.2f\t\n", r.name, r.unit, r.dyadfs, r.native, r.ratio())
	}
	tw.Flush()
	fmt.Fprintf(w, "\npassthrough: %s; ratio = dyadfs speed / native speed (for latencies native/dyadfs)\n", passthrough)
	for _, r := range rows {
		if r.note != "" {
			fmt.Fprintf(w, "%s: %s\n", r.name, r.note)
		}
	}
}
