package ucxperf

import (
	"context"
	"os/exec"
	"testing"
	"time"
)

func TestResult(t *testing.T) {
	const out = `+--------------+--------------+------------------------------+---------------------+-----------------------+
|              |              |       overhead (usec)        |   bandwidth (MB/s)  |  message rate (msg/s) |
+--------------+--------------+----------+---------+---------+----------+----------+-----------+-----------+
|    Stage     | # iterations | 50.0%ile | average | overall |  average |  overall |  average  |  overall  |
+--------------+--------------+----------+---------+---------+----------+----------+-----------+-----------+
Final:                  2000     4.125   470.123   470.123     2127.13     2127.13        2127        2127
`
	if v, ok := Result("ucp_am_bw", out); !ok || v != 2127.13*1.048576 {
		t.Errorf("bandwidth %v %v, want %v MB/s", v, ok, 2127.13*1.048576)
	}
	if v, ok := Result("ucp_am_lat", out); !ok || v != 4.125 {
		t.Errorf("latency %v %v, want 4.125 µs", v, ok)
	}
	if _, ok := Result("ucp_am_bw", "[1700000000.0] ucx_perftest: connection refused\n"); ok {
		t.Error("a result from a run that failed")
	}
	if p := Port(); p < "20000" || p > "39999" || len(p) != 5 {
		t.Errorf("port %q", p)
	}
}

// TestMeasure runs ucx_perftest on loopback, as the benchmarks run it
// between namespaces.
func TestMeasure(t *testing.T) {
	if _, err := exec.LookPath("ucx_perftest"); err != nil {
		t.Skip("skipping: ucx_perftest is not installed (Debian: ucx-utils; scripts/setup.sh installs it)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r := Run{IP: "127.0.0.1", TLS: "tcp", Devices: [2]string{"lo", "lo"}, Test: "ucp_am_lat", Size: 4096, Iters: 1000, Flags: []string{"-e"}}
	v, err := Measure(ctx, r)
	if err != nil || v <= 0 {
		t.Fatalf("latency %v, %v", v, err)
	}
	r.Test, r.Size, r.Iters = "ucp_am_bw", 1<<20, 200
	if v, err := Measure(ctx, r); err != nil || v <= 0 {
		t.Fatalf("bandwidth %v, %v", v, err)
	}
}
