package test

import (
	"testing"
)

// BenchmarkClusterEviction measures what a cache capacity costs the rows
// of two nodes (1,000 × 4 KiB and 20 × 64 MiB pipelined): without one,
// with one never reached, and with one every fetch reaches (low watermark
// 1: each fetch evicts one copy). The three take turns, so that the
// machine's drift falls on each alike; each row gives the median of the
// rounds and its ratio to the row without a capacity.
func BenchmarkClusterEviction(b *testing.B) {
	rows, add := fixedWorkload(b, 60)
	const rounds = 5
	type config struct {
		name         string
		small, large []string // the consumer's flags for each row
	}
	configs := []config{
		{name: "no capacity"},
		{name: "under capacity", small: []string{"--cache-capacity", "1TiB"}, large: []string{"--cache-capacity", "1TiB"}},
		{name: "every fetch evicts",
			small: []string{"--cache-capacity", "64KiB", "--cache-low-watermark", "1", "--cache-grace", "0"},
			large: []string{"--cache-capacity", "256MiB", "--cache-low-watermark", "1", "--cache-grace", "0"}},
	}
	small := make([][]float64, len(configs))
	large := make([][]float64, len(configs))
	for round := range rounds {
		for i, cfg := range configs {
			c := newClusterWith(b, clusterOptions{nodes: 0, logLevel: "info"})
			p := c.addNode("p")
			s := c.addNode("s", cfg.small...)
			small[i] = append(small[i], e2e(b, p, s, "small", 1000, 4096, false).filesPerSec())
			if st := s.status().DMD.Cache; cfg.small != nil && st.HeldBytes > st.CapacityBytes {
				b.Fatalf("%s: %d bytes held over a capacity of %d", cfg.name, st.HeldBytes, st.CapacityBytes)
			}
			s.stop()
			s.flags = cfg.large
			s.start()
			large[i] = append(large[i], e2e(b, p, s, "large", 20, 64<<20, false).mbPerSec())
			st := s.status().DMD.Cache
			b.Logf("round %d, %s: %.0f files/s, %.0f MB/s; evictions %d", round+1, cfg.name, small[i][round], large[i][round], st.Evictions)
			c.teardown()
		}
	}
	for i, cfg := range configs {
		ratio := 0.0
		if i > 0 {
			ratio = medianOf(small[i]) / medianOf(small[0])
		}
		add(benchRow{name: "1,000 x 4 KiB pipelined, " + cfg.name, unit: "files/s", value: medianOf(small[i]), spread: spreadOf(small[i]), ratio: ratio})
	}
	for i, cfg := range configs {
		ratio := 0.0
		if i > 0 {
			ratio = medianOf(large[i]) / medianOf(large[0])
		}
		add(benchRow{name: "20 x 64 MiB pipelined, " + cfg.name, unit: "MB/s", value: medianOf(large[i]), spread: spreadOf(large[i]), ratio: ratio})
	}
	printRows(*rows)
}
