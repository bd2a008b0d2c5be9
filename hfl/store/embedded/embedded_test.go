package embedded

import (
	"context"
	"testing"
	"time"
	"unsafe"

	"github.com/dyadfs/dyadfs/hfl/store"
	"github.com/dyadfs/dyadfs/hfl/store/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return New() })
}

func TestAbandonedWaitsLeaveNothing(t *testing.T) {
	s := New()
	defer s.Close()
	for i := 0; i < 100; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
		s.Wait(ctx, store.Slot{Key: "never", Dir: "d", Name: "never"}, 0)
		cancel()
	}
	if n := s.waitersLen(); n != 0 {
		t.Fatalf("%d keys still have waiters after every wait gave up", n)
	}
}

// TestKeepsEveryField: what the store keeps of a record in its compact
// form reads back whole, by lookup, by name and by listing, a link's target
// included; only what no store keeps (Provisional, Inline) is dropped.
func TestKeepsEveryField(t *testing.T) {
	s := New()
	defer s.Close()
	ctx := context.Background()
	full := store.Record{Path: "d/l", Owner: "n1", Size: 5, Mode: 0o120777, Uid: 7, Gid: 8, MtimeNs: 9,
		Target: "../t", Alloc: 10, Ino: 11, Writing: true}
	full.Sum[0], full.Sum[15] = 1, 2
	sent := full
	sent.Provisional, sent.Inline = true, &store.Inline{}
	slot := store.Slot{Key: "ns/k", Dir: "ns/d", Name: "l"}
	out, err := s.Publish(ctx, slot, sent)
	if err != nil {
		t.Fatal(err)
	}
	full.Generation = out.Generation
	got, err := s.Lookup(ctx, slot)
	if err != nil || got != full {
		t.Fatalf("looked up %+v, %v; want %+v", got, err, full)
	}
	if got, ok := s.Held("ns/d", "l"); !ok || got != full {
		t.Fatalf("held %+v, %v; want %+v", got, ok, full)
	}
	list, err := s.ListDir(ctx, "ns/d", "", 0)
	if err != nil || len(list) != 1 || list[0] != full {
		t.Fatalf("listed %+v, %v; want %+v", list, err, full)
	}
}

// TestLinkTargetsGoWithTheirRecords: a link's target, kept apart from its
// record, goes when the link is replaced by a file, removed or forgotten,
// and not with the link of the same path in another namespace; each
// record keeps its own owner.
func TestLinkTargetsGoWithTheirRecords(t *testing.T) {
	s := New()
	defer s.Close()
	ctx := context.Background()
	link := store.Slot{Key: "ns/k1", Dir: "ns/d", Name: "l"}
	other := store.Slot{Key: "ns/k2", Dir: "ns/d", Name: "m"}
	mustPublish := func(slot store.Slot, r store.Record) {
		t.Helper()
		if _, err := s.Publish(ctx, slot, r); err != nil {
			t.Fatal(err)
		}
	}
	elsewhere := store.Slot{Key: "ns2/k1", Dir: "ns2/d", Name: "l"}
	mustPublish(elsewhere, store.Record{Path: "d/l", Owner: "n3", Mode: 0o120777, Target: "z"})
	mustPublish(link, store.Record{Path: "d/l", Owner: "n1", Mode: 0o120777, Target: "a"})
	mustPublish(other, store.Record{Path: "d/m", Owner: "n2", Mode: 0o120777, Target: "b"})
	mustPublish(link, store.Record{Path: "d/l", Owner: "n2", Mode: 0o100644, Size: 3})
	if got, _ := s.Lookup(ctx, link); got.Target != "" || got.Owner != "n2" || got.Size != 3 {
		t.Fatalf("a link replaced by a file reads %+v", got)
	}
	if got, _ := s.Lookup(ctx, other); got.Target != "b" || got.Owner != "n2" {
		t.Fatalf("the other link reads %+v", got)
	}
	if _, err := s.Remove(ctx, other, store.RemoveCond{}); err != nil {
		t.Fatal(err)
	}
	mustPublish(link, store.Record{Path: "d/l", Owner: "n1", Mode: 0o120777, Target: "c"})
	if got, _ := s.Lookup(ctx, link); got.Target != "c" || got.Owner != "n1" {
		t.Fatalf("a file replaced by a link reads %+v", got)
	}
	if _, err := s.Forget(ctx, "ns", 0, nil); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Lookup(ctx, elsewhere); got.Target != "z" || got.Owner != "n3" {
		t.Fatalf("the same path's link in another namespace reads %+v after the first was forgotten", got)
	}
	if _, err := s.Forget(ctx, "ns2", 0, nil); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.apart) != 0 || s.records != 0 {
		t.Fatalf("after removing and forgetting every link, %d records kept apart and %d records are kept", len(s.apart), s.records)
	}
}

// TestPathsReadBackAsPublished: a record's path comes back as it was
// published, whether its directory makes it from the name (the usual
// case, kept in no room of the record's own) or not; a record kept small
// stays at 80 bytes.
func TestPathsReadBackAsPublished(t *testing.T) {
	s := New()
	defer s.Close()
	ctx := context.Background()
	slot := func(dir, name string) store.Slot { return store.Slot{Key: dir + "|" + name, Dir: dir, Name: name} }
	publish := func(sl store.Slot, path string) {
		t.Helper()
		if _, err := s.Publish(ctx, sl, store.Record{Path: path, Owner: "n1", Mode: 0o100644}); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		slot store.Slot
		path string
	}{
		{slot("ns/a", "x"), "a/x"},        // the directory's base: a
		{slot("ns/a", "y"), "a/y"},        // made from the base
		{slot("ns/a", "z"), "b/z"},        // another directory: kept apart
		{slot("ns/a", "w"), "a/ww"},       // not its name: kept apart
		{slot("ns/", "top"), "top"},       // at the top: the name alone
		{slot("ns/", "odd"), "elsewhere"}, // kept apart
		{slot("ns/q", "v"), "v-not-q"},    // no base at all
		{slot("ns/q", "u"), "q/u"},        // kept apart too
	}
	for _, c := range cases {
		publish(c.slot, c.path)
	}
	check := func() {
		t.Helper()
		for _, c := range cases {
			if got, err := s.Lookup(ctx, c.slot); err != nil || got.Path != c.path {
				t.Errorf("%s/%s reads path %q (%v), published as %q", c.slot.Dir, c.slot.Name, got.Path, err, c.path)
			}
			recs, _ := s.ListDir(ctx, c.slot.Dir, "", 0)
			found := false
			for _, r := range recs {
				found = found || r.Path == c.path
			}
			if !found {
				t.Errorf("listing %s has no %q: %+v", c.slot.Dir, c.path, recs)
			}
		}
	}
	check()
	s.mu.Lock()
	if n := len(s.apart); n != 5 {
		t.Errorf("%d records kept apart, want the 5 whose directory does not make their path", n)
	}
	s.mu.Unlock()
	// Published again under the path the directory makes: nothing apart.
	cases[2].path, cases[3].path = "a/z", "a/w"
	publish(cases[2].slot, cases[2].path)
	publish(cases[3].slot, cases[3].path)
	check()
	s.mu.Lock()
	if n := len(s.apart); n != 3 {
		t.Errorf("%d records kept apart after two came back to their directory's path, want 3", n)
	}
	s.mu.Unlock()
	if size := unsafe.Sizeof(keptRecord{}); size > 80 {
		t.Errorf("a kept record takes %d bytes, more than the 80-byte size class", size)
	}
}
