package test

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// BenchmarkClusterRanges measures reading a 1 GiB file of another node in
// ranges against fetching it whole first (--range-threshold 0): 10 reads
// of 1 MiB at random offsets (the same program, the same offsets, on two
// consumers), and the whole file read in order (cat). Each round
// publishes new files, so that nothing of them is here yet; the two
// consumers take turns. Each row gives the median of the rounds; the
// ranges rows give their ratio to reading after a whole fetch (time for
// the random reads, throughput for the sequential read).
func BenchmarkClusterRanges(b *testing.B) {
	rows, add := fixedWorkload(b, 60)
	const rounds = 3
	c := newClusterWith(b, clusterOptions{nodes: 0, logLevel: "info"})
	p := c.addNode("p")
	r := c.addNode("r", "--range-threshold", "64MiB")
	w := c.addNode("w", "--range-threshold", "0")
	p.mustSh("head -c 1073741824 /dev/urandom > /tmp/seed-" + c.id)
	defer p.sh("rm -f /tmp/seed-" + c.id)
	var randR, randW, seqR, seqW []float64
	for round := range rounds {
		name := fmt.Sprintf("f%d", round)
		p.mustSh(fmt.Sprintf("cp /tmp/seed-%s %s && cp /tmp/seed-%s s%s", c.id, name, c.id, name))
		var offs []string
		for range 10 {
			offs = append(offs, fmt.Sprint(rand.IntN(1024)))
		}
		script := fmt.Sprintf("python3 -c '%s' %s %s > /dev/null", rangeReads, name, strings.Join(offs, " "))
		order := []*node{r, w}
		if round%2 == 1 {
			order = []*node{w, r}
		}
		for _, n := range order {
			res, took := timedSh(n, script)
			if res.err != nil {
				b.Fatalf("%s: %v", n.name, res)
			}
			if n == r {
				randR = append(randR, float64(took)/float64(time.Millisecond))
			} else {
				randW = append(randW, float64(took)/float64(time.Millisecond))
			}
		}
		for _, n := range order {
			res, took := timedSh(n, "cat s"+name+" > /dev/null")
			if res.err != nil {
				b.Fatalf("%s: %v", n.name, res)
			}
			mbps := float64(1<<30) / 1e6 / took.Seconds()
			if n == r {
				seqR = append(seqR, mbps)
			} else {
				seqW = append(seqW, mbps)
			}
		}
		b.Logf("round %d: random reads %.0f ms in ranges, %.0f ms whole; in order %.0f MB/s in ranges, %.0f MB/s whole",
			round+1, randR[round], randW[round], seqR[round], seqW[round])
		// The copies fetched whole go, for the next round's space.
		for _, n := range []*node{r, w} {
			n.sh("rm -f " + name + " s" + name)
		}
	}
	add(benchRow{name: "10 x 1 MiB random reads of 1 GiB, fetched whole first", unit: "ms", value: medianOf(randW), spread: spreadOf(randW)})
	add(benchRow{name: "10 x 1 MiB random reads of 1 GiB, in ranges", unit: "ms", value: medianOf(randR), spread: spreadOf(randR),
		ratio: medianOf(randR) / medianOf(randW), target: "< 0.2"})
	add(benchRow{name: "1 GiB read in order (cat), fetched whole first", unit: "MB/s", value: medianOf(seqW), spread: spreadOf(seqW)})
	add(benchRow{name: "1 GiB read in order (cat), in ranges", unit: "MB/s", value: medianOf(seqR), spread: spreadOf(seqR),
		ratio: medianOf(seqR) / medianOf(seqW)})
	printRows(*rows)
}
