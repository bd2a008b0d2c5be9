package dmd

import (
	"fmt"
	"slices"
	"syscall"
	"testing"
	"time"
)

func registryWith(t *testing.T, cfg CacheConfig, sizes ...int64) *copyRegistry {
	t.Helper()
	r := new(copyRegistry)
	r.init(cfg)
	base := time.Now().Add(-time.Hour)
	for i, size := range sizes {
		st := &syscall.Stat_t{Dev: 1, Ino: uint64(i + 1), Size: size}
		// f0 fetched first, f1 next, ...
		r.note(fmt.Sprintf("f%d", i), copyInfo{owner: "a", gen: 1}, st, base.Add(time.Duration(i)*time.Minute))
	}
	return r
}

func victimNames(vs []victim) []string {
	var out []string
	for _, v := range vs {
		out = append(out, v.rel)
	}
	return out
}

func keepNone(string, string) bool { return false }

// TestCopyVictims: eviction takes the copies the policy puts first, down to
// the low watermark, and never one that is open, fetched within the grace
// period and not opened yet, or kept for its owner; when even all the
// others would not make room it takes none.
func TestCopyVictims(t *testing.T) {
	const mb = 1 << 20
	cfg := CacheConfig{Capacity: 10 * mb, Policy: PolicyLRU, LowWatermark: 0.5, Grace: time.Minute}
	r := registryWith(t, cfg, 2*mb, 2*mb, 2*mb, 2*mb, 2*mb) // full
	r.touch("f0")                                           // f0 used last: LRU keeps it
	vs, _ := r.victims(1*mb, time.Now(), keepNone)
	// 10+1 MiB down to 5: at least 6 MiB, three copies, least recently used first.
	if got := victimNames(vs); !slices.Equal(got, []string{"f1", "f2", "f3"}) {
		t.Fatalf("LRU victims %v, want f1 f2 f3", got)
	}
	cfg.Policy = PolicyFIFO
	r = registryWith(t, cfg, 2*mb, 2*mb, 2*mb, 2*mb, 2*mb)
	r.touch("f0")
	if got := victimNames(first(r.victims(1*mb, time.Now(), keepNone))); !slices.Equal(got, []string{"f0", "f1", "f2"}) {
		t.Fatalf("FIFO victims %v, want f0 f1 f2", got)
	}

	// Open copies are skipped.
	r.opened(FileID{Dev: 1, Ino: 1})
	if got := victimNames(first(r.victims(1*mb, time.Now(), keepNone))); !slices.Equal(got, []string{"f1", "f2", "f3"}) {
		t.Fatalf("victims with f0 open: %v, want f1 f2 f3", got)
	}
	// Everything open but one: that one does not make room for 3 MiB.
	for i := 2; i <= 4; i++ {
		r.opened(FileID{Dev: 1, Ino: uint64(i)})
	}
	vs, pins := r.victims(3*mb, time.Now(), keepNone)
	if len(vs) != 0 || pins.open != 4 {
		t.Fatalf("with 4 of 5 copies open, victims %v (pinned %+v), want none and 4 open", victimNames(vs), pins)
	}
	r.closed(FileID{Dev: 1, Ino: 2})
	if got := victimNames(first(r.victims(3*mb, time.Now(), keepNone))); !slices.Equal(got, []string{"f1", "f4"}) {
		t.Fatalf("with f0, f2, f3 open: victims %v, want f1 f4", got)
	}

	// Within the grace period and not opened yet: kept; opened: not.
	r = new(copyRegistry)
	r.init(cfg)
	r.note("new", copyInfo{owner: "a"}, &syscall.Stat_t{Ino: 9, Size: 8 * mb}, time.Time{})
	vs, pins = r.victims(4*mb, time.Now(), keepNone)
	if len(vs) != 0 || pins.grace != 1 {
		t.Fatalf("a copy just fetched: victims %v (pinned %+v), want none, within grace", victimNames(vs), pins)
	}
	r.touch("new")
	if got := victimNames(first(r.victims(4*mb, time.Now(), keepNone))); !slices.Equal(got, []string{"new"}) {
		t.Fatalf("a copy opened once: victims %v, want it", got)
	}
	// Its owner gone: kept (this node may hold the job's only copy).
	vs, pins = r.victims(4*mb, time.Now(), func(string, string) bool { return true })
	if len(vs) != 0 || pins.owner != 1 {
		t.Fatalf("a copy whose owner left: victims %v (pinned %+v), want none", victimNames(vs), pins)
	}
}

func first(vs []victim, _ pinned) []victim { return vs }

// TestCopyRegistryAccounts: the bytes held follow notes, forgets, renames
// and reservations; a path reserved twice (two opens wait for one fetch)
// counts once.
func TestCopyRegistryAccounts(t *testing.T) {
	r := registryWith(t, CacheConfig{Capacity: 100}, 10, 20, 30)
	if s := r.stats(); s.HeldBytes != 60 || s.Copies != 3 {
		t.Fatalf("stats %+v, want 60 bytes in 3 copies", s)
	}
	r.forget("f1")
	r.renamed("f2", "g", false)
	r.renamed("f0", "g", false) // replaces g (f2's 30 bytes)
	r.moved("f0", "g")          // the rename's second look (Renamed) keeps it
	if c, ok := r.get("g"); !ok || c.owner != "a" {
		t.Fatalf("the copy renamed to g is gone from the registry")
	}
	if s := r.stats(); s.HeldBytes != 10 || s.Copies != 1 {
		t.Fatalf("after a forget and two renames: %+v, want 10 bytes in 1 copy", s)
	}
	if !r.reserve("x", 50) || !r.reserve("x", 50) || r.reserve("y", 50) {
		t.Fatal("reservations: want x twice (one fetch) and not y past the capacity")
	}
	r.unreserve("x")
	if s := r.stats(); s.ReservedBytes != 50 {
		t.Fatalf("one of two waiters done: %d reserved, want 50", s.ReservedBytes)
	}
	r.unreserve("x")
	if s := r.stats(); s.ReservedBytes != 0 || !r.reserve("y", 90) {
		t.Fatalf("both done: %+v; y should fit", s)
	}
}
