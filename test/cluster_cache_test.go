package test

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	dfs "github.com/dyadfs/dyadfs/fs"
)

// copiesOnDisk is the bytes of the regular files in n's backing directory,
// its own state aside.
func copiesOnDisk(t *testing.T, n *node, skip ...string) int64 {
	t.Helper()
	var total int64
	filepath.WalkDir(n.backing, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		rel, _ := filepath.Rel(n.backing, p)
		if e.IsDir() && rel == ".dyadfs" {
			return filepath.SkipDir
		}
		for _, s := range skip {
			if rel == s {
				return nil
			}
		}
		if e.Type().IsRegular() {
			if info, err := e.Info(); err == nil {
				total += info.Size()
			}
		}
		return nil
	})
	return total
}

// TestClusterCacheCapacity: a consumer with a 64 MiB capacity reads 256 MiB
// of files published on another node, one after another; its backing
// directory never holds more than 64 MiB of copies, and reading the first
// files again fetches them again, with the same bytes. A copy open for
// reading is not evicted, nor a file published on the consumer itself.
// With every copy open, one more fetch fails with ENOSPC at once, leaving
// nothing behind. A restart finds the copies again.
func TestClusterCacheCapacity(t *testing.T) {
	const mib = 1 << 20
	const capacity = 64 * mib
	c := newClusterWith(t, clusterOptions{nodes: 0})
	a := c.addNode("a")
	b := c.addNode("b", "--cache-capacity", "64MiB", "--cache-low-watermark", "0.75", "--metrics", ":9464")
	a.mustSh(`mkdir data
i=0
while [ $i -lt 32 ]; do head -c 8388608 /dev/urandom > data/f$i; i=$((i+1)); done`)
	want := make(map[string]string)
	for i := range 32 {
		want[fmt.Sprintf("data/f%d", i)] = sha(a, fmt.Sprintf("data/f%d", i))
	}
	b.mustSh("head -c 8388608 /dev/urandom > mine")
	mine := sha(b, "mine")

	check := func(when string) {
		t.Helper()
		if got := copiesOnDisk(t, b, "mine"); got > capacity {
			t.Fatalf("%s: the consumer's backing directory holds %d bytes of copies, more than its capacity %d", when, got, capacity)
		}
	}
	const statCmd = "stat -c '%n %i %s %Y %a' data/*"
	statBefore := b.mustSh(statCmd)
	for i := range 32 {
		p := fmt.Sprintf("data/f%d", i)
		if got := sha(b, p); got != want[p] {
			t.Fatalf("%s reads %s on the consumer, %s on its producer", p, got, want[p])
		}
		check("after reading " + p)
	}
	// Evicted or not, a file shows the same attributes.
	if after := b.mustSh(statCmd); after != statBefore {
		t.Fatalf("stat of the files before reading them:\n%s\nafter, with most evicted:\n%s", statBefore, after)
	}
	st := b.status().DMD.Cache
	t.Logf("after one pass: %+v", st)
	if st.Evictions == 0 || st.HeldBytes > capacity || st.CapacityBytes != capacity {
		t.Fatalf("status after reading 256 MiB through a 64 MiB capacity: %+v", st)
	}
	metricsText := b.mustSh(`python3 -c 'import urllib.request, sys; sys.stdout.write(urllib.request.urlopen("http://` + b.ip + `:9464/metrics").read().decode())'`)
	if n := sample(metricsText, "dyadfs_cache_evictions_total"); n != float64(st.Evictions) {
		t.Errorf("metrics count %v evictions, the status %d", n, st.Evictions)
	}
	if n := sample(metricsText, "dyadfs_cache_capacity_bytes"); n != capacity {
		t.Errorf("metrics give a capacity of %v bytes, want %d", n, capacity)
	}
	// The first files again: fetched again, the same bytes.
	before := transferCount(b.status())
	for i := range 4 {
		p := fmt.Sprintf("data/f%d", i)
		if got := sha(b, p); got != want[p] {
			t.Fatalf("%s, fetched again, reads %s, want %s", p, got, want[p])
		}
		check("after reading " + p + " again")
	}
	if n := transferCount(b.status()) - before; n != 4 {
		t.Fatalf("reading 4 evicted files again made %d transfers, want 4", n)
	}
	if st := b.status().DMD.Cache; st.Refetches < 4 {
		t.Fatalf("status counts %d refetches, want at least 4: %+v", st.Refetches, st)
	}
	if got := sha(b, "mine"); got != mine {
		t.Fatalf("the consumer's own file reads %s after the evictions, want %s", got, mine)
	}

	// An open copy is not evicted while it is read: f10 stays open while
	// 12 other files (96 MiB) go through.
	release := filepath.Join(c.dir, "release-reader")
	reader := b.startSh(`exec 3< data/f10
head -c 1048576 <&3 > /dev/null
while [ ! -e ` + release + ` ]; do sleep 0.1; done
cat <&3 > /dev/null
echo done`)
	b.waitStatus("f10 open", func(st dfs.Status) bool { return st.DMD.Cache.PinnedByOpen >= 1 })
	for i := 11; i < 23; i++ {
		sha(b, fmt.Sprintf("data/f%d", i))
		check(fmt.Sprintf("after reading data/f%d with f10 open", i))
	}
	if _, err := os.Stat(filepath.Join(b.backing, "data/f10")); err != nil {
		t.Fatalf("data/f10 was evicted while open: %v", err)
	}
	os.WriteFile(release, nil, 0o644)
	if r := within(t, "the reader of the open copy", bound, reader); r.err != nil || !strings.Contains(r.stdout, "done") {
		t.Fatalf("reader of an open copy: %v", r)
	}

	// A mapped copy, its descriptor closed, is not evicted either: the
	// kernel releases it at munmap.
	unmap := filepath.Join(c.dir, "release-mapper")
	mapper := b.startSh(`python3 -c '
import hashlib, mmap, os, sys, time
f = open("data/f5", "rb")
m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
f.close()
print("mapped", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.1)
print(hashlib.sha256(m).hexdigest())
' ` + unmap)
	b.waitStatus("f5 mapped", func(st dfs.Status) bool { return st.DMD.Cache.PinnedByOpen >= 1 })
	for i := 11; i < 23; i++ {
		sha(b, fmt.Sprintf("data/f%d", i))
	}
	if _, err := os.Stat(filepath.Join(b.backing, "data/f5")); err != nil {
		t.Fatalf("data/f5 was evicted while mapped: %v", err)
	}
	os.WriteFile(unmap, nil, 0o644)
	if r := within(t, "the mapper", bound, mapper); r.err != nil || !strings.Contains(r.stdout, want["data/f5"]) {
		t.Fatalf("a mapped copy read %v, want %s", r, want["data/f5"])
	}

	// Everything open (8 × 8 MiB): one more fetch fails at once with ENOSPC.
	hold := filepath.Join(c.dir, "release-holders")
	holders := b.startSh(`python3 -c '
import os, sys, time
files = [open("data/f%d" % i, "rb") for i in range(23, 31)]
while not os.path.exists(sys.argv[1]):
    time.sleep(0.1)
' ` + hold)
	b.waitStatus("8 copies open", func(st dfs.Status) bool { return st.DMD.Cache.PinnedByOpen >= 8 })
	start := time.Now()
	r := b.sh("cat data/f31 > /dev/null")
	if r.err == nil || !strings.Contains(r.stderr, "No space left on device") || time.Since(start) > 10*time.Second {
		t.Fatalf("a fetch with every copy open: %v after %v, want ENOSPC at once", r, time.Since(start))
	}
	if _, err := os.Stat(filepath.Join(b.backing, "data/f31")); err == nil {
		t.Fatal("a refused fetch left data/f31 in the backing directory")
	}
	tmp, _ := filepath.Glob(filepath.Join(b.backing, ".dyadfs", "tmp-*", "*"))
	for _, f := range tmp {
		// The fetcher keeps empty temporary files ready; none has bytes.
		if info, err := os.Stat(f); err == nil && info.Size() > 0 {
			t.Fatalf("a refused fetch left %s, %d bytes", f, info.Size())
		}
	}
	if log := b.readLog(); !strings.Contains(log, "cannot fetch: the copies here fill the cache capacity and none can be evicted") {
		t.Fatalf("no log line says why the fetch was refused:\n%s", log)
	}
	if st := b.status().DMD.Cache; st.NoRoom == 0 {
		t.Fatalf("status counts no refused fetch: %+v", st)
	}
	os.WriteFile(hold, nil, 0o644)
	within(t, "the holders of open copies", bound, holders)
	if got := sha(b, "data/f31"); got != want["data/f31"] {
		t.Fatalf("data/f31, once copies are closed, reads %s, want %s", got, want["data/f31"])
	}
	if got := sha(b, "mine"); got != mine {
		t.Fatalf("the consumer's own file reads %s, want %s", got, mine)
	}

	// A restart finds the copies and their bytes again.
	held := copiesOnDisk(t, b, "mine")
	b.stop()
	b.start()
	if st := b.status().DMD.Cache; st.HeldBytes != held || st.Copies == 0 {
		t.Fatalf("after a restart the registry holds %+v, want %d bytes of copies", st, held)
	}
	check("after a restart")
	for i := 20; i < 32; i++ {
		p := fmt.Sprintf("data/f%d", i)
		if got := sha(b, p); got != want[p] {
			t.Fatalf("after a restart %s reads %s, want %s", p, got, want[p])
		}
		check("after a restart and reading " + p)
	}
}
