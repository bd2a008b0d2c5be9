package ucxperf

import "testing"

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
