package test

import (
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestClusterPrefetch: dyadfs prefetch brings a tree of 1,000 files
// published on another node here, N at a time; reading them afterwards
// moves nothing (no new transfer or copy). A path published nowhere is
// reported at once, or waited for with --wait. The consumer's metrics
// count the fetches, their bytes and durations.
func TestClusterPrefetch(t *testing.T) {
	// Files of 16 KiB and more would be read in ranges: prefetch still
	// brings them whole.
	c := newCluster(t, 2, "--metrics", ":9464", "--range-threshold", "16KiB")
	a, b := c.nodes[0], c.nodes[1]
	// 20 KiB: larger than a file whose bytes travel with its notices, so
	// that each is a transfer.
	a.mustSh(`mkdir -p tree
for d in 0 1 2 3 4 5 6 7 8 9; do
	mkdir tree/d$d
	i=0
	while [ $i -lt 100 ]; do
		head -c 20480 /dev/urandom > tree/d$d/f$i
		i=$((i+1))
	done
done
find tree -type f | sort | xargs cat | sha256sum > /tmp/want-` + c.namespace)
	want := strings.Fields(a.mustSh("cat /tmp/want-" + c.namespace))[0]

	before := copyCount(b.status())
	start := time.Now()
	out, err := b.run(dyadfsBin, "prefetch", "--jobs", "8", c.mnt+"/tree")
	if err != nil || !strings.Contains(out, "prefetched 1000 files (0 here already, 1000 fetched), 19.5 MiB") || !strings.Contains(out, " 0 failed") {
		t.Fatalf("dyadfs prefetch: %v\n%s", err, out)
	}
	t.Logf("prefetch of 1,000 files took %v: %s", time.Since(start), strings.TrimSpace(out))
	st := b.status()
	if got := copyCount(st) - before; got != 1000 {
		t.Fatalf("%d copies made by the prefetch, want 1000", got)
	}
	if n := transportCounter(st, "transfers"); n < 1000 {
		t.Fatalf("%d transfers, want 1000", n)
	}
	metricsText := b.mustSh(`python3 -c 'import urllib.request, sys; sys.stdout.write(urllib.request.urlopen("http://` + b.ip + `:9464/metrics").read().decode())'`)
	if n := sample(metricsText, `dyadfs_fetch_duration_seconds_count{outcome="ok"}`); n < 1000 {
		t.Errorf("the consumer's metrics count %v fetches, want 1000", n)
	}
	if n := sample(metricsText, "dyadfs_fetch_bytes_sum"); n < 1000*20480 {
		t.Errorf("the consumer's metrics count %v bytes fetched, want %d", n, 1000*20480)
	}
	if n := sample(metricsText, "dyadfs_transport_transfers_total"); n < 1000 {
		t.Errorf("the consumer's metrics count %v transfers, want 1000", n)
	}
	if promtool, err := exec.LookPath("promtool"); err == nil {
		cmd := exec.Command(promtool, "check", "metrics")
		cmd.Stdin = strings.NewReader(metricsText)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool check metrics on a node sharing files: %v\n%s", err, out)
		}
	}
	if t.Failed() {
		t.Fatalf("scraped:\n%s", metricsText)
	}
	// Reads are local now.
	got := strings.Fields(b.mustSh("find tree -type f | sort | xargs cat | sha256sum"))[0]
	if got != want {
		t.Fatalf("after prefetch, the tree reads %s, want %s", got, want)
	}
	if n := copyCount(b.status()) - before; n != 1000 {
		t.Fatalf("reading the prefetched tree made %d more copies", n-1000)
	}
	// Again: everything is here already.
	if out, err := b.run(dyadfsBin, "prefetch", c.mnt+"/tree"); err != nil || !strings.Contains(out, "prefetched 1000 files (1000 here already, 0 fetched)") {
		t.Fatalf("a second prefetch: %v\n%s", err, out)
	}
	// Outside any dyadfs mount: refused, not "prefetched".
	if out, err := b.run(dyadfsBin, "prefetch", c.dir); err == nil || !strings.Contains(out, "not in a dyadfs mount") {
		t.Fatalf("prefetch of a path outside the mount: %v\n%s", err, out)
	}
	if out, err := b.run(dyadfsBin, "wait", c.dir+"/x"); err == nil || !strings.Contains(out, "not in a dyadfs mount") {
		t.Fatalf("wait for a path outside the mount: %v\n%s", err, out)
	}

	// Published nowhere: reported at once, exit 14; with --wait, waited.
	start = time.Now()
	out, err = b.run(dyadfsBin, "prefetch", c.mnt+"/later.dat")
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 14 || !strings.Contains(out, "later.dat: published nowhere (pass --wait to wait for it)") || time.Since(start) > 10*time.Second {
		t.Fatalf("prefetch of a path published nowhere: %v after %v, want exit 14\n%s", err, time.Since(start), out)
	}
	waiter := b.startSh(dyadfsBin + " prefetch --wait later.dat")
	b.waitStatus("prefetch --wait waits", waiting(1))
	a.mustSh("head -c 100000 /dev/urandom > later.dat")
	if r := within(t, "prefetch --wait", bound, waiter); r.err != nil || !strings.Contains(r.stdout, "prefetched 1 files (0 here already, 1 fetched), 97.7 KiB") {
		t.Fatalf("prefetch --wait: %v", r)
	}
	if a, b := sha(a, "later.dat"), sha(b, "later.dat"); a != b {
		t.Fatalf("later.dat reads %s on its consumer, %s on its producer", b, a)
	}
}
