// Package ucxperf reads what ucx_perftest (Debian's ucx-utils) prints, for
// the benchmarks that take UCX's own figures as their baseline.
package ucxperf

import (
	"crypto/rand"
	"encoding/binary"
	"strconv"
	"strings"
)

// Port is a random port for a ucx_perftest server (20000–39999): a server
// serves one run, so every run needs a port of its own.
func Port() string {
	var p [2]byte
	rand.Read(p[:])
	return strconv.Itoa(20000 + int(binary.BigEndian.Uint16(p[:]))%20000)
}

// Result is the figure of a finished run of test in out: for a latency
// test (ucp_*_lat) its median one-way latency in µs, for the others its
// overall bandwidth in MB/s (10^6 bytes; ucx_perftest prints MiB/s). It
// reports false if out has no final line.
func Result(test, out string) (float64, bool) {
	// Final: iterations, latency p50, average, overall, bandwidth
	// average, overall, message rate average, overall.
	col, scale := 6, 1.048576
	if strings.HasSuffix(test, "_lat") {
		col, scale = 2, 1
	}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 9 && f[0] == "Final:" {
			v, err := strconv.ParseFloat(f[col], 64)
			return v * scale, err == nil
		}
	}
	return 0, false
}
