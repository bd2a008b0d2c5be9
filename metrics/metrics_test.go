package metrics

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/dyadfs/dyadfs/metrics/metricstest"
)

type opStat struct {
	Count  uint64  `json:"count"`
	MeanUS float64 `json:"mean_us"`
}

type fakeStatus struct {
	Info        map[string]string `json:"info"`
	Uptime      float64           `json:"uptime_seconds" metric:"-"`
	Passthrough bool              `json:"passthrough"`
	DMD         struct {
		Publishes   uint64  `json:"publishes"`
		WaitSeconds float64 `json:"wait_seconds_total"`
		BusyFiles   int     `json:"busy_files"`
	} `json:"dmd" metric:"inline"`
	Waiters []string             `json:"waiting_opens"`
	Ops     map[string]opStat    `json:"ops"`
	Errnos  map[string]uint64    `json:"errors_by_errno"`
	Extra   map[string]any       `json:"extra" metric:"inline"`
	Skipped map[int]uint64       `json:"skipped"`
	Nested  map[string]*struct{} `json:"nested"`
}

// TestServe: the status's counters, gauges and labelled maps, the
// histograms and the runtime's metrics, in the text format Prometheus
// scrapes, which promtool accepts.
func TestServe(t *testing.T) {
	st := fakeStatus{
		Info:        map[string]string{"version": "test", "store": "embedded://"},
		Uptime:      12.5,
		Passthrough: true,
		Ops:         map[string]opStat{"LOOKUP": {Count: 7, MeanUS: 3.5}},
		Errnos:      map[string]uint64{"ENOENT": 4},
		Extra:       map[string]any{"transport": map[string]any{"transfers": uint64(9), "send_buffers_busy": 2}},
	}
	st.DMD.Publishes, st.DMD.WaitSeconds, st.DMD.BusyFiles = 3, 1.5, 1
	s, err := Serve("127.0.0.1:0", func() any { return st })
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	OpenWait.Observe(0.25)
	FetchDuration.WithLabelValues(Outcome(nil)).Observe(0.01)
	resp, err := http.Get("http://" + s.Addr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	text := string(body)
	for _, want := range []string{
		"# HELP dyadfs_publishes_total Publishes, counted since the daemon started.\n# TYPE dyadfs_publishes_total counter\ndyadfs_publishes_total 3\n",
		"# TYPE dyadfs_wait_seconds_total counter\ndyadfs_wait_seconds_total 1.5\n",
		"# HELP dyadfs_busy_files Busy files, now.\n# TYPE dyadfs_busy_files gauge\ndyadfs_busy_files 1\n",
		"dyadfs_passthrough 1\n",
		`dyadfs_ops_total{op="LOOKUP"} 7`,
		`dyadfs_ops_mean_seconds{op="LOOKUP"} 3.5e-06`,
		`dyadfs_errors_by_errno_total{errno="ENOENT"} 4`,
		"dyadfs_transport_transfers_total 9\n",
		"dyadfs_transport_send_buffers_busy 2\n",
		`dyadfs_info{store="embedded://",version="test"} 1`,
		"dyadfs_open_wait_seconds_count 1\n",
		`dyadfs_fetch_duration_seconds_count{outcome="ok"} 1`,
		"go_goroutines ",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("missing %q", want)
		}
	}
	if strings.Contains(text, "waiting_opens") || strings.Contains(text, "skipped") || strings.Contains(text, "uptime") {
		t.Error("lists or maps not keyed by strings were exported")
	}
	if t.Failed() {
		t.Fatalf("scraped:\n%s", text)
	}
	metricstest.CheckFormat(t, text)
}

// TestServeRefusesABadAddress: the mount fails when the address cannot be
// listened on.
func TestServeRefusesABadAddress(t *testing.T) {
	if _, err := Serve("256.0.0.1:1", func() any { return nil }); err == nil {
		t.Fatal("Serve listened on 256.0.0.1")
	}
}
