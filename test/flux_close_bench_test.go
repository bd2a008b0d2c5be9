//go:build flux

package test

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/dyadfs/dyadfs/flux"
	"github.com/dyadfs/dyadfs/flux/fluxtest"
)

// BenchmarkFluxClose measures what a close that publishes costs inside
// Flux, against DYAD's own commit and a bare KVS commit, in one run: the
// pipelined 4 KiB workload of BenchmarkFlux with dyadfs (--dtl flux,
// closes that wait for the KVS) and DYAD (FLUX_RPC) taking turns, three
// rounds, and one-key commits through the KVS from each rank. Rows are
// medians, with the rounds' range.
func BenchmarkFluxClose(b *testing.B) {
	if b.N > 1 {
		b.Skip("run with -benchtime 1x: each row is a fixed workload")
	}
	requireEnv(b)
	dy := findDYAD(b)
	in := fluxtest.Start(b, 2)

	var commit [2][]float64 // µs, by rank
	for r := range commit {
		commit[r] = bareCommits(b, in, r, 300)
	}
	const rounds = 3
	var ours, theirs, oursClose, theirsClose, ratio []float64
	for i := range rounds {
		w := dyadfsOnFlux(b, in, "flux", true)
		d := dyadOnFlux(b, in, dy, "FLUX_RPC", true)
		if d.err != nil {
			b.Fatalf("DYAD FLUX_RPC: %v", d.err)
		}
		ours = append(ours, w.small.filesPerSec())
		theirs = append(theirs, d.small.filesPerSec())
		oursClose = append(oursClose, w.small.closePercentile(0.5))
		theirsClose = append(theirsClose, d.small.closePercentile(0.5))
		ratio = append(ratio, w.small.filesPerSec()/d.small.filesPerSec())
		fmt.Fprintf(os.Stderr, "  round %d: dyadfs %.0f files/s, close p50 %.0f us; DYAD %.0f files/s, close p50 %.0f us\n",
			i+1, ours[i], oursClose[i], theirs[i], theirsClose[i])
	}
	med := func(name, unit string, v []float64) benchRow {
		s := append([]float64(nil), v...)
		sort.Float64s(s)
		return benchRow{name: name, unit: unit, value: s[len(s)/2], spread: fmt.Sprintf("%.0f-%.0f", s[0], s[len(s)-1])}
	}
	// The ratios to DYAD: of the rates, round by round (the median
	// round); of the closes, the medians'.
	rate := med("dyadfs --dtl flux: 1,000 x 4 KiB pipelined", "files/s", ours)
	rate.ratio, rate.target = med("", "", ratio).value, ">= 2x DYAD (median of the rounds' ratios)"
	closes := med("dyadfs --dtl flux: producer's close p50", "us", oursClose)
	closes.ratio, closes.target = closes.value/med("", "", theirsClose).value, "<= 1x DYAD's"
	rows := []benchRow{
		med("flux kvs commit of one key, rank 0, p50", "us", commit[0]),
		med("flux kvs commit of one key, rank 1, p50", "us", commit[1]),
		rate,
		med("DYAD FLUX_RPC: 1,000 x 4 KiB pipelined", "files/s", theirs),
		closes,
		med("DYAD FLUX_RPC: producer's close p50", "us", theirsClose),
	}
	printRows(rows)
	fmt.Println("producer on rank 0, consumer on rank 1; dyadfs and DYAD take turns, " + strconv.Itoa(rounds) + " rounds; commits: 300 puts of one 200-byte key each, one at a time")
}

// bareCommits times n one-key KVS commits from rank r, one at a time,
// into a namespace of their own, in µs, sorted.
func bareCommits(b *testing.B, in *fluxtest.Instance, r, n int) []float64 {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	h, err := flux.Open(in.URIs[r])
	if err != nil {
		b.Fatal(err)
	}
	defer h.Close()
	ns := fmt.Sprintf("fbcommit%d", r)
	if err := h.CreateNamespace(ctx, ns, ^uint32(0)); err != nil {
		b.Fatal(err)
	}
	defer h.RemoveNamespace(context.Background(), ns)
	v := make([]byte, 200)
	var took []float64
	for i := range n + 20 {
		t := time.Now()
		if _, err := h.Commit(ctx, ns, []flux.Op{flux.Put(fmt.Sprintf("d.k%d", i), v)}); err != nil {
			b.Fatal(err)
		}
		if i >= 20 {
			took = append(took, float64(time.Since(t).Microseconds()))
		}
	}
	sort.Float64s(took)
	return took
}
