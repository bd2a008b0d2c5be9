// Package storetest is the conformance suite every store.Store backend must pass.
// A backend's test calls Run with a factory that returns a fresh, empty store
// (or a store scoped so that the keys used here are unseen).
package storetest

import (
	"context"
	"errors"
	"fmt"
	"path"
	"sync"
	"testing"
	"time"

	"github.com/dyadfs/dyadfs/hfl/store"
)

// Factory returns a store for one subtest. The suite closes it.
type Factory func(t *testing.T) store.Store

// bound caps every call in the suite so that a broken backend fails instead of
// hanging the test binary.
const bound = 30 * time.Second

// Run runs the whole suite against the stores newStore returns.
func Run(t *testing.T, newStore Factory) {
	tests := []struct {
		name string
		fn   func(*testing.T, store.Store)
	}{
		{"LookupMissing", lookupMissing},
		{"PublishLookup", publishLookup},
		{"GenerationsGrow", generationsGrow},
		{"WaitExisting", waitExisting},
		{"WaitForPublish", waitForPublish},
		{"WaitNewer", waitNewer},
		{"WaitCanceled", waitCanceled},
		{"WaitDeadline", waitDeadline},
		{"RemoveByOwner", removeByOwner},
		{"RemoveMissing", removeMissing},
		{"GenerationNotReusedAfterRemove", generationNotReused},
		{"OddKeys", oddKeys},
		{"ManyWaiters", manyWaiters},
		{"RegisterGet", registerGet},
		{"RegisterClaimOneWins", registerClaimOneWins},
		{"PutIfAbsentFirstWins", putIfAbsentFirstWins},
		{"ListByPrefix", listByPrefix},
		{"CloseEndsWaits", closeEndsWaits},
		{"ListDir", listDir},
		{"ListDirPages", listDirPages},
		{"ListDirFollowsRemove", listDirFollowsRemove},
		{"RecordFields", recordFields},
		{"HealthCountsRecords", healthCountsRecords},
		{"ForgetNamespace", forgetNamespace},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t)
			t.Cleanup(func() { s.Close() })
			tc.fn(t, s)
		})
	}
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	t.Cleanup(cancel)
	return ctx
}

func rec(path, owner string, size int64) store.Record {
	return store.Record{Path: path, Owner: owner, Size: size, Mode: 0o100644, Uid: 1000, Gid: 100, MtimeNs: 1700000000123456789}
}

// slotOf is the slot of a record of the suite: under key, and in the index
// of the record's directory (apart from other suites' directories).
func slotOf(key string, r store.Record) store.Slot {
	return store.Slot{Key: key, Dir: "kvtest/" + path.Dir(r.Path), Name: path.Base(r.Path)}
}

// at is the slot of key for a record at path p.
func at(key, p string) store.Slot { return slotOf(key, store.Record{Path: p}) }

// publish publishes r under key in its slot.
func publish(ctx context.Context, s store.Store, key string, r store.Record) (store.Record, error) {
	return s.Publish(ctx, slotOf(key, r), r)
}

func lookupMissing(t *testing.T, s store.Store) {
	_, err := s.Lookup(ctxFor(t), at("kvtest/missing", "missing"))
	if !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Lookup of a missing key: got %v, want ErrNotFound", err)
	}
}

func publishLookup(t *testing.T, s store.Store) {
	ctx := ctxFor(t)
	in := rec("run1/step7.dat", "nodeA", 4096)
	out, err := publish(ctx, s, "kvtest/a", in)
	if err != nil {
		t.Fatalf("Publish: %v", err)
	}
	if out.Generation == 0 {
		t.Fatalf("Publish returned generation 0")
	}
	got, err := s.Lookup(ctx, slotOf("kvtest/a", in))
	if err != nil {
		t.Fatalf("Lookup: %v", err)
	}
	in.Generation = out.Generation
	if got != in {
		t.Fatalf("Lookup = %+v, want %+v", got, in)
	}
}

func generationsGrow(t *testing.T, s store.Store) {
	ctx := ctxFor(t)
	var last uint64
	for i := 0; i < 5; i++ {
		out, err := publish(ctx, s, "kvtest/g", rec("g", "nodeA", int64(i)))
		if err != nil {
			t.Fatalf("Publish %d: %v", i, err)
		}
		if out.Generation <= last {
			t.Fatalf("publish %d: generation %d not above %d", i, out.Generation, last)
		}
		last = out.Generation
	}
	got, err := s.Lookup(ctx, at("kvtest/g", "g"))
	if err != nil || got.Size != 4 || got.Generation != last {
		t.Fatalf("Lookup after 5 publishes = %+v, %v; want size 4 generation %d", got, err, last)
	}
}

func waitExisting(t *testing.T, s store.Store) {
	ctx := ctxFor(t)
	out, err := publish(ctx, s, "kvtest/w", rec("w", "nodeA", 1))
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.Wait(ctx, at("kvtest/w", "w"), 0)
	if err != nil || got.Generation != out.Generation {
		t.Fatalf("Wait on an existing key = %+v, %v; want generation %d", got, err, out.Generation)
	}
}

func waitForPublish(t *testing.T, s store.Store) {
	ctx := ctxFor(t)
	type result struct {
		rec store.Record
		err error
	}
	done := make(chan result, 1)
	go func() {
		r, err := s.Wait(ctx, at("kvtest/later", "later"), 0)
		done <- result{r, err}
	}()
	out, err := publish(ctx, s, "kvtest/later", rec("later", "nodeB", 7))
	if err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || r.rec.Generation != out.Generation || r.rec.Owner != "nodeB" {
		t.Fatalf("Wait = %+v, %v; want the published record %+v", r.rec, r.err, out)
	}
}

func waitNewer(t *testing.T, s store.Store) {
	ctx := ctxFor(t)
	first, err := publish(ctx, s, "kvtest/n", rec("n", "nodeA", 1))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan store.Record, 1)
	errc := make(chan error, 1)
	go func() {
		r, err := s.Wait(ctx, at("kvtest/n", "n"), first.Generation)
		if err != nil {
			errc <- err
			return
		}
		done <- r
	}()
	second, err := publish(ctx, s, "kvtest/n", rec("n", "nodeA", 2))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if r.Generation != second.Generation || r.Size != 2 {
			t.Fatalf("Wait(after first) = %+v, want the second publish %+v", r, second)
		}
	case err := <-errc:
		t.Fatalf("Wait: %v", err)
	}
}

func waitCanceled(t *testing.T, s store.Store) {
	ctx, cancel := context.WithCancel(ctxFor(t))
	errc := make(chan error, 1)
	go func() {
		_, err := s.Wait(ctx, at("kvtest/never", "never"), 0)
		errc <- err
	}()
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait after cancel: got %v, want context.Canceled", err)
	}
}

func waitDeadline(t *testing.T, s store.Store) {
	ctx, cancel := context.WithTimeout(ctxFor(t), 50*time.Millisecond)
	defer cancel()
	_, err := s.Wait(ctx, at("kvtest/never", "never"), 0)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait past its deadline: got %v, want context.DeadlineExceeded", err)
	}
}

func removeByOwner(t *testing.T, s store.Store) {
	ctx := ctxFor(t)
	r := rec("r", "nodeA", 1)
	pub, err := publish(ctx, s, "kvtest/r", r)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Remove(ctx, slotOf("kvtest/r", r), store.RemoveCond{Owner: "nodeB"}); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("Remove by another owner: got %v, want ErrConflict", err)
	}
	if _, err := s.Lookup(ctx, slotOf("kvtest/r", r)); err != nil {
		t.Fatalf("record gone after Remove by another owner: %v", err)
	}
	if _, err := s.Remove(ctx, slotOf("kvtest/r", r), store.RemoveCond{MaxGeneration: pub.Generation - 1}); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("Remove of an older generation: got %v, want ErrConflict", err)
	}
	at, err := s.Remove(ctx, slotOf("kvtest/r", r), store.RemoveCond{Owner: "nodeA", MaxGeneration: pub.Generation})
	if err != nil {
		t.Fatalf("Remove by owner: %v", err)
	}
	if at <= pub.Generation {
		t.Fatalf("Remove at generation %d, not above the record's %d", at, pub.Generation)
	}
	if _, err := s.Lookup(ctx, slotOf("kvtest/r", r)); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Lookup after Remove: got %v, want ErrNotFound", err)
	}
	r2 := rec("r2", "nodeA", 1)
	if _, err := publish(ctx, s, "kvtest/r2", r2); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Remove(ctx, slotOf("kvtest/r2", r2), store.RemoveCond{}); err != nil {
		t.Fatalf("Remove with any owner: %v", err)
	}
	if _, err := s.Lookup(ctx, slotOf("kvtest/r2", r2)); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Lookup after unconditional Remove: got %v, want ErrNotFound", err)
	}
}

func removeMissing(t *testing.T, s store.Store) {
	if _, err := s.Remove(ctxFor(t), slotOf("kvtest/none", rec("none", "", 0)), store.RemoveCond{}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Remove of a missing key: got %v, want ErrNotFound", err)
	}
}

func generationNotReused(t *testing.T, s store.Store) {
	ctx := ctxFor(t)
	first, err := publish(ctx, s, "kvtest/re", rec("re", "nodeA", 1))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Remove(ctx, slotOf("kvtest/re", rec("re", "", 0)), store.RemoveCond{}); err != nil {
		t.Fatal(err)
	}
	second, err := publish(ctx, s, "kvtest/re", rec("re", "nodeA", 2))
	if err != nil {
		t.Fatal(err)
	}
	if second.Generation <= first.Generation {
		t.Fatalf("generation after remove and republish %d, not above %d", second.Generation, first.Generation)
	}
	// A waiter that saw the first generation must see the second.
	got, err := s.Wait(ctx, at("kvtest/re", "re"), first.Generation)
	if err != nil || got.Generation != second.Generation {
		t.Fatalf("Wait(after first) = %+v, %v; want generation %d", got, err, second.Generation)
	}
}

func oddKeys(t *testing.T, s store.Store) {
	ctx := ctxFor(t)
	keys := []string{"kvtest/with space", "kvtest/ünïcödé/ファイル", "kvtest/a.b.c/d", "kvtest/x%2F..y"}
	for i, k := range keys {
		if _, err := publish(ctx, s, k, rec(fmt.Sprint(i), "nodeA", int64(i))); err != nil {
			t.Fatalf("Publish %q: %v", k, err)
		}
	}
	for i, k := range keys {
		got, err := s.Lookup(ctx, at(k, fmt.Sprint(i)))
		if err != nil || got.Size != int64(i) {
			t.Fatalf("Lookup %q = %+v, %v; want size %d", k, got, err, i)
		}
	}
}

func manyWaiters(t *testing.T, s store.Store) {
	ctx := ctxFor(t)
	const keys, perKey = 20, 5
	var wg sync.WaitGroup
	errs := make(chan error, keys*perKey)
	for k := 0; k < keys; k++ {
		key := fmt.Sprintf("kvtest/many/%d", k)
		for w := 0; w < perKey; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r, err := s.Wait(ctx, at(key, key), 0)
				if err == nil && r.Path != key {
					err = fmt.Errorf("waiter on %s got record for %s", key, r.Path)
				}
				if err != nil {
					errs <- err
				}
			}()
		}
	}
	for k := 0; k < keys; k++ {
		key := fmt.Sprintf("kvtest/many/%d", k)
		if _, err := publish(ctx, s, key, rec(key, "nodeA", 1)); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func registerGet(t *testing.T, s store.Store) {
	ctx := ctxFor(t)
	if _, err := s.Get(ctx, "kvtest/nodes/a"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Get of an unregistered key: %v, want ErrNotFound", err)
	}
	if err := s.Register(ctx, "kvtest/nodes/a", []byte("addr-a"), 5*time.Second, nil); err != nil {
		t.Fatalf("Register: %v", err)
	}
	if err := s.Register(ctx, "kvtest/nodes/b", []byte("addr-b"), 5*time.Second, nil); err != nil {
		t.Fatalf("Register: %v", err)
	}
	for k, want := range map[string]string{"kvtest/nodes/a": "addr-a", "kvtest/nodes/b": "addr-b"} {
		got, err := s.Get(ctx, k)
		if err != nil || string(got) != want {
			t.Fatalf("Get(%s) = %q, %v; want %q", k, got, err, want)
		}
	}
	// A registered value is not a record.
	if _, err := s.Lookup(ctx, at("kvtest/nodes/a", "nodes/a")); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Lookup of a registered value: %v, want ErrNotFound", err)
	}
}

// registerClaimOneWins: of many registrations of one key at once, each
// refusing any value already there, exactly one succeeds, and each refused
// one was shown the winner's value.
func registerClaimOneWins(t *testing.T, s store.Store) {
	ctx := ctxFor(t)
	const n = 8
	errTaken := errors.New("taken")
	var wg sync.WaitGroup
	var mu sync.Mutex
	var won []string
	var saw []string
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v := fmt.Sprintf("claimant-%d", i)
			err := s.Register(ctx, "kvtest/nodes/contended", []byte(v), 5*time.Second, func(cur []byte) error {
				mu.Lock()
				saw = append(saw, string(cur))
				mu.Unlock()
				return errTaken
			})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				won = append(won, v)
			case !errors.Is(err, errTaken):
				t.Errorf("Register: %v, want nil or the claim's error", err)
			}
		}()
	}
	wg.Wait()
	if len(won) != 1 {
		t.Fatalf("%d registrations won (%v), want exactly 1", len(won), won)
	}
	for _, v := range saw {
		if v != won[0] {
			t.Errorf("a claim was shown %q, want the winner %q", v, won[0])
		}
	}
	if got, err := s.Get(ctx, "kvtest/nodes/contended"); err != nil || string(got) != won[0] {
		t.Errorf("Get = %q, %v; want the winner %q", got, err, won[0])
	}
	// A claim that accepts what is there replaces it.
	if err := s.Register(ctx, "kvtest/nodes/contended", []byte("successor"), 5*time.Second, func([]byte) error { return nil }); err != nil {
		t.Fatalf("Register with an accepting claim: %v", err)
	}
	if got, _ := s.Get(ctx, "kvtest/nodes/contended"); string(got) != "successor" {
		t.Errorf("Get = %q, want successor", got)
	}
}

func putIfAbsentFirstWins(t *testing.T, s store.Store) {
	ctx := ctxFor(t)
	const n = 8
	results := make(chan string, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v, err := s.PutIfAbsent(ctx, "kvtest/secret", []byte(fmt.Sprintf("candidate-%d", i)))
			if err != nil {
				t.Errorf("PutIfAbsent: %v", err)
			}
			results <- string(v)
		}()
	}
	wg.Wait()
	close(results)
	var first string
	for v := range results {
		if first == "" {
			first = v
		}
		if v != first {
			t.Fatalf("PutIfAbsent returned %q and %q: both racers must see the one stored value", first, v)
		}
	}
	if got, err := s.Get(ctx, "kvtest/secret"); err != nil || string(got) != first {
		t.Fatalf("Get after PutIfAbsent = %q, %v; want %q", got, err, first)
	}
}

func closeEndsWaits(t *testing.T, s store.Store) {
	ctx := ctxFor(t)
	errc := make(chan error, 1)
	started := make(chan struct{})
	go func() {
		close(started)
		_, err := s.Wait(ctx, at("kvtest/closed", "closed"), 0)
		errc <- err
	}()
	<-started
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := <-errc; err == nil {
		t.Fatalf("Wait returned no error after Close")
	}
}

func listByPrefix(t *testing.T, s store.Store) {
	ctx := ctxFor(t)
	got, err := s.List(ctx, "kvtest/list/")
	if err != nil || len(got) != 0 {
		t.Fatalf("List of an empty prefix: %v, %v; want nothing", got, err)
	}
	want := map[string]string{"kvtest/list/a": "1", "kvtest/list/b/c": "2"}
	for k, v := range want {
		if err := s.Register(ctx, k, []byte(v), 10*time.Second, nil); err != nil {
			t.Fatalf("Register %s: %v", k, err)
		}
	}
	if _, err := s.PutIfAbsent(ctx, "kvtest/listx", []byte("other")); err != nil {
		t.Fatal(err)
	}
	if _, err := publish(ctx, s, "kvtest/list/rec", rec("r", "n", 1)); err != nil {
		t.Fatal(err)
	}
	got, err = s.List(ctx, "kvtest/list/")
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	if len(got) != len(want) {
		t.Fatalf("List: got %d values %v, want %v (records and other prefixes are not values under the prefix)", len(got), got, want)
	}
	for k, v := range want {
		if string(got[k]) != v {
			t.Errorf("List[%q] = %q, want %q", k, got[k], v)
		}
	}
}

// dirSlot places name in directory dir of the suite, under its own key.
func dirSlot(dir, name string) store.Slot {
	return store.Slot{Key: "kvtest/k/" + dir + "/" + name, Dir: "kvtest/" + dir, Name: name}
}

func names(recs []store.Record) []string {
	var out []string
	for _, r := range recs {
		out = append(out, path.Base(r.Path))
	}
	return out
}

func listDir(t *testing.T, s store.Store) {
	ctx := ctxFor(t)
	// A directory, its subdirectory, and a sibling whose name extends it:
	// each index holds its own entries only.
	put := func(dir, name string, size int64) store.Record {
		t.Helper()
		out, err := s.Publish(ctx, dirSlot(dir, name), rec(dir+"/"+name, "nodeA", size))
		if err != nil {
			t.Fatalf("Publish %s/%s: %v", dir, name, err)
		}
		return out
	}
	put("d", "b", 1)
	c := put("d", "c", 2)
	put("d", "a", 3)
	put("d/sub", "x", 4)
	put("dx", "y", 5)
	put("d", "c", 6) // published again: one entry, the newer record
	got, err := s.ListDir(ctx, "kvtest/d", "", 0)
	if err != nil {
		t.Fatalf("ListDir: %v", err)
	}
	if fmt.Sprint(names(got)) != "[a b c]" {
		t.Fatalf("ListDir(d) = %v, want [a b c]", names(got))
	}
	if got[2].Size != 6 || got[2].Generation <= c.Generation {
		t.Fatalf("ListDir(d)[c] = %+v, want the second publish (size 6, generation above %d)", got[2], c.Generation)
	}
	lookup, err := s.Lookup(ctx, dirSlot("d", "c"))
	if err != nil || lookup != got[2] {
		t.Fatalf("Lookup of c = %+v, %v; ListDir has %+v: they must agree", lookup, err, got[2])
	}
	for dir, want := range map[string]string{"kvtest/d/sub": "[x]", "kvtest/dx": "[y]", "kvtest/none": "[]"} {
		got, err := s.ListDir(ctx, dir, "", 0)
		if err != nil || fmt.Sprint(names(got)) != want {
			t.Fatalf("ListDir(%s) = %v, %v; want %s", dir, names(got), err, want)
		}
	}
}

func listDirPages(t *testing.T, s store.Store) {
	ctx := ctxFor(t)
	const n = 25
	var want []string
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("f%03d", i)
		want = append(want, name)
		if _, err := s.Publish(ctx, dirSlot("pages", name), rec("pages/"+name, "nodeA", int64(i))); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	after := ""
	for pages := 0; ; pages++ {
		page, err := s.ListDir(ctx, "kvtest/pages", after, 10)
		if err != nil {
			t.Fatalf("ListDir after %q: %v", after, err)
		}
		got = append(got, names(page)...)
		if len(page) < 10 {
			if pages != 2 {
				t.Fatalf("%d entries came in %d pages of 10, want 3", n, pages+1)
			}
			break
		}
		after = path.Base(page[len(page)-1].Path)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("paged listing = %v, want %v", got, want)
	}
}

func listDirFollowsRemove(t *testing.T, s store.Store) {
	ctx := ctxFor(t)
	for _, name := range []string{"a", "b"} {
		if _, err := s.Publish(ctx, dirSlot("rm", name), rec("rm/"+name, "nodeA", 1)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Remove(ctx, dirSlot("rm", "a"), store.RemoveCond{Owner: "nodeB"}); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("Remove by another owner: got %v, want ErrConflict", err)
	}
	if _, err := s.Remove(ctx, dirSlot("rm", "a"), store.RemoveCond{}); err != nil {
		t.Fatal(err)
	}
	got, err := s.ListDir(ctx, "kvtest/rm", "", 0)
	if err != nil || fmt.Sprint(names(got)) != "[b]" {
		t.Fatalf("ListDir after Remove = %v, %v; want [b]", names(got), err)
	}
}

func recordFields(t *testing.T, s store.Store) {
	ctx := ctxFor(t)
	in := []store.Record{
		{Path: "f/dir", Owner: "nodeA", Mode: 0o40755, Uid: 7, Gid: 8, MtimeNs: 1},
		{Path: "f/link", Owner: "nodeA", Mode: 0o120777, Size: 6, Target: "../tgt", MtimeNs: 2},
		{Path: "f/file", Owner: "nodeB", Mode: 0o100600, Size: 9, Uid: 1001, Gid: 1002, MtimeNs: 3, Writing: true},
	}
	for _, r := range in {
		out, err := s.Publish(ctx, dirSlot("f", path.Base(r.Path)), r)
		if err != nil {
			t.Fatal(err)
		}
		r.Generation = out.Generation
		got, err := s.Lookup(ctx, dirSlot("f", path.Base(r.Path)))
		if err != nil || got != r {
			t.Fatalf("Lookup = %+v, %v; want %+v", got, err, r)
		}
	}
	got, err := s.ListDir(ctx, "kvtest/f", "", 0)
	if err != nil || len(got) != 3 || !got[0].IsDir() || !got[2].IsSymlink() || !got[1].IsRegular() || !got[1].Writing {
		t.Fatalf("ListDir = %+v, %v; want dir, file (writing), link", got, err)
	}
}

// healthCountsRecords: Health counts the records of the namespace asked
// for, and of no other.
func healthCountsRecords(t *testing.T, s store.Store) {
	ctx := ctxFor(t)
	for i := range 3 {
		if _, err := s.Publish(ctx, store.Slot{Key: fmt.Sprintf("kvh/k%d", i), Dir: "kvh/", Name: fmt.Sprint(i)}, rec(fmt.Sprint(i), "a", 1)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Publish(ctx, store.Slot{Key: "kvhx/k", Dir: "kvhx/", Name: "x"}, rec("x", "a", 1)); err != nil {
		t.Fatal(err)
	}
	h, err := s.Health(ctx, "kvh")
	if err != nil || h.Records != 3 {
		t.Fatalf("Health: %+v, %v; want 3 records", h, err)
	}
	if h.Bytes < 0 || len(h.Alarms) != 0 {
		t.Fatalf("Health of a store that takes writes: %+v", h)
	}
}

// forgetNamespace: Forget deletes every record, index entry and value of
// one namespace, page by page, telling its progress, and nothing of any
// other namespace (not even one whose name extends it).
func forgetNamespace(t *testing.T, s store.Store) {
	ctx := ctxFor(t)
	fill := func(ns string, n int) {
		t.Helper()
		for i := range n {
			slot := store.Slot{Key: fmt.Sprintf("%s/k/%d", ns, i), Dir: ns + "/d", Name: fmt.Sprint(i)}
			if _, err := s.Publish(ctx, slot, rec("d/"+fmt.Sprint(i), "a", int64(i))); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := s.PutIfAbsent(ctx, ns+"/secret", []byte("s")); err != nil {
			t.Fatal(err)
		}
	}
	fill("kvf", 25)
	fill("kvf2", 3)
	var pages []int
	n, err := s.Forget(ctx, "kvf", 10, func(done int) { pages = append(pages, done) })
	// 25 records and 1 value, each once or more (a backend may keep a
	// record under more than one key).
	if err != nil || n < 26 {
		t.Fatalf("Forget: %d keys, %v; want at least 26", n, err)
	}
	if len(pages) == 0 || pages[len(pages)-1] != n {
		t.Fatalf("progress %v does not end at %d", pages, n)
	}
	if _, err := s.Lookup(ctx, store.Slot{Key: "kvf/k/3", Dir: "kvf/d", Name: "3"}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a forgotten record: %v", err)
	}
	if recs, err := s.ListDir(ctx, "kvf/d", "", 0); err != nil || len(recs) != 0 {
		t.Fatalf("a forgotten directory lists %d entries, %v", len(recs), err)
	}
	if _, err := s.Get(ctx, "kvf/secret"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a forgotten value: %v", err)
	}
	// The other namespace is whole.
	if _, err := s.Lookup(ctx, store.Slot{Key: "kvf2/k/2", Dir: "kvf2/d", Name: "2"}); err != nil {
		t.Fatalf("a record of another namespace: %v", err)
	}
	if recs, err := s.ListDir(ctx, "kvf2/d", "", 0); err != nil || len(recs) != 3 {
		t.Fatalf("another namespace's directory lists %d entries, %v", len(recs), err)
	}
	if v, err := s.Get(ctx, "kvf2/secret"); err != nil || string(v) != "s" {
		t.Fatalf("another namespace's value: %q, %v", v, err)
	}
}
