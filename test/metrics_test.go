package test

import (
	"errors"
	"io"
	"net/http"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/dyadfs/dyadfs/metrics/metricstest"
)

// scrape reads a Prometheus text exposition from url.
func scrape(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape %s: %v %s", url, err, resp.Status)
	}
	return string(b)
}

// sample is the value of the sample named name (with its labels, as
// exposed), or -1.
func sample(text, name string) float64 {
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` (\S+)$`)
	m := re.FindStringSubmatch(text)
	if m == nil {
		return -1
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		return -1
	}
	return v
}

// TestMetrics: --metrics serves the status's counters and the histograms
// of waits, publishes and FUSE requests; after real writes and a waiting
// open their values moved, and promtool accepts the exposition.
func TestMetrics(t *testing.T) {
	m := newMount(t, "--metrics", "127.0.0.1:0")
	url := m.status().Info["metrics"]
	if !strings.HasPrefix(url, "http://127.0.0.1:") {
		t.Fatalf("the status names the metrics at %q", url)
	}
	before := scrape(t, url)
	mustSh(t, m.mnt, "for i in 1 2 3 4 5; do echo $i > f$i; done")
	waiter := start(t, m.mnt, "cat", "late")
	m.waitStatus("cat waits", waiting(1))
	mustSh(t, m.mnt, "echo late > late")
	if r := within(t, "cat late", bound, waiter); r.err != nil {
		t.Fatalf("cat late: %v", r)
	}
	after := scrape(t, url)
	for _, c := range []struct {
		name string
		min  float64
	}{
		{"dyadfs_publishes_total", 6},
		{"dyadfs_opens_waited_total", 1},
		{"dyadfs_open_wait_seconds_count", 1},
		{`dyadfs_publish_duration_seconds_count{outcome="ok"}`, 6},
		{`dyadfs_fuse_request_duration_seconds_count{op="create"}`, 6},
		{`dyadfs_ops_total{op="create"}`, 6},
	} {
		got, was := sample(after, c.name), max(sample(before, c.name), 0)
		if got-was < c.min {
			t.Errorf("%s went from %v to %v, want at least %v more", c.name, was, got, c.min)
		}
	}
	if sample(after, "dyadfs_busy_files") != 0 {
		t.Errorf("dyadfs_busy_files is not 0 after every writer closed")
	}
	// Named as Prometheus's own: no _count_total, no copies of the process
	// and Go collectors', no settings as gauges, no path labels, no
	// internal section names, and HELP that says what is counted.
	for _, bad := range []string{"_count_total", "dyadfs_pid", "dyadfs_uptime", "dyadfs_goroutines", "dyadfs_heap",
		"dyadfs_wait_timeout_seconds", "dyadfs_file_marks", "dyadfs_descriptors_limit", "log_file=", "dyadfs_extra_", "dyadfs_dmd_", "see dyadfs status"} {
		if strings.Contains(after, bad) {
			t.Errorf("the exposition has %q", bad)
		}
	}
	if !strings.Contains(after, "# HELP dyadfs_publishes_total Publishes, counted since the daemon started.") {
		t.Errorf("no HELP text saying what dyadfs_publishes_total counts")
	}
	if t.Failed() {
		t.Fatalf("scraped:\n%s", after)
	}
	metricstest.CheckFormat(t, after)
}

// TestMetricsAddressInUse: a mount whose metrics address is taken fails
// with a one-line message, and nothing is mounted.
func TestMetricsAddressInUse(t *testing.T) {
	m := newMount(t, "--metrics", "127.0.0.1:0")
	addr := strings.TrimSuffix(strings.TrimPrefix(m.status().Info["metrics"], "http://"), "/metrics")
	_, mnt, backing := mountDirs(t)
	removeDefaultLog(t, mnt)
	out, err := dyadfs(t, "mount", "--backing", backing, "--metrics", addr, mnt)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 15 || !strings.Contains(out, "--metrics "+addr) || strings.Count(strings.TrimSpace(out), "\n") != 0 {
		t.Fatalf("mount with a metrics address in use: %v\n%s", err, out)
	}
}
