// Package kvtest is the conformance suite every hfl.Store backend must pass.
// A backend's test calls Run with a factory that returns a fresh, empty store
// (or a store scoped so that the keys used here are unseen).
package kvtest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/dyadfs/dyadfs/hfl"
)

// Factory returns a store for one subtest. The suite closes it.
type Factory func(t *testing.T) hfl.Store

// bound caps every call in the suite so that a broken backend fails instead of
// hanging the test binary.
const bound = 30 * time.Second

// Run runs the whole suite against the stores newStore returns.
func Run(t *testing.T, newStore Factory) {
	tests := []struct {
		name string
		fn   func(*testing.T, hfl.Store)
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

func rec(path, owner string, size int64) hfl.Record {
	return hfl.Record{Path: path, Owner: owner, Size: size, Mode: 0o100644, MtimeNs: 1700000000123456789}
}

func lookupMissing(t *testing.T, s hfl.Store) {
	_, err := s.Lookup(ctxFor(t), "kvtest/missing")
	if !errors.Is(err, hfl.ErrNotFound) {
		t.Fatalf("Lookup of a missing key: got %v, want ErrNotFound", err)
	}
}

func publishLookup(t *testing.T, s hfl.Store) {
	ctx := ctxFor(t)
	in := rec("run1/step7.dat", "nodeA", 4096)
	out, err := s.Publish(ctx, "kvtest/a", in)
	if err != nil {
		t.Fatalf("Publish: %v", err)
	}
	if out.Generation == 0 {
		t.Fatalf("Publish returned generation 0")
	}
	got, err := s.Lookup(ctx, "kvtest/a")
	if err != nil {
		t.Fatalf("Lookup: %v", err)
	}
	in.Generation = out.Generation
	if got != in {
		t.Fatalf("Lookup = %+v, want %+v", got, in)
	}
}

func generationsGrow(t *testing.T, s hfl.Store) {
	ctx := ctxFor(t)
	var last uint64
	for i := 0; i < 5; i++ {
		out, err := s.Publish(ctx, "kvtest/g", rec("g", "nodeA", int64(i)))
		if err != nil {
			t.Fatalf("Publish %d: %v", i, err)
		}
		if out.Generation <= last {
			t.Fatalf("publish %d: generation %d not above %d", i, out.Generation, last)
		}
		last = out.Generation
	}
	got, err := s.Lookup(ctx, "kvtest/g")
	if err != nil || got.Size != 4 || got.Generation != last {
		t.Fatalf("Lookup after 5 publishes = %+v, %v; want size 4 generation %d", got, err, last)
	}
}

func waitExisting(t *testing.T, s hfl.Store) {
	ctx := ctxFor(t)
	out, err := s.Publish(ctx, "kvtest/w", rec("w", "nodeA", 1))
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.Wait(ctx, "kvtest/w", 0)
	if err != nil || got.Generation != out.Generation {
		t.Fatalf("Wait on an existing key = %+v, %v; want generation %d", got, err, out.Generation)
	}
}

func waitForPublish(t *testing.T, s hfl.Store) {
	ctx := ctxFor(t)
	type result struct {
		rec hfl.Record
		err error
	}
	done := make(chan result, 1)
	go func() {
		r, err := s.Wait(ctx, "kvtest/later", 0)
		done <- result{r, err}
	}()
	out, err := s.Publish(ctx, "kvtest/later", rec("later", "nodeB", 7))
	if err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || r.rec.Generation != out.Generation || r.rec.Owner != "nodeB" {
		t.Fatalf("Wait = %+v, %v; want the published record %+v", r.rec, r.err, out)
	}
}

func waitNewer(t *testing.T, s hfl.Store) {
	ctx := ctxFor(t)
	first, err := s.Publish(ctx, "kvtest/n", rec("n", "nodeA", 1))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan hfl.Record, 1)
	errc := make(chan error, 1)
	go func() {
		r, err := s.Wait(ctx, "kvtest/n", first.Generation)
		if err != nil {
			errc <- err
			return
		}
		done <- r
	}()
	second, err := s.Publish(ctx, "kvtest/n", rec("n", "nodeA", 2))
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

func waitCanceled(t *testing.T, s hfl.Store) {
	ctx, cancel := context.WithCancel(ctxFor(t))
	errc := make(chan error, 1)
	go func() {
		_, err := s.Wait(ctx, "kvtest/never", 0)
		errc <- err
	}()
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait after cancel: got %v, want context.Canceled", err)
	}
}

func waitDeadline(t *testing.T, s hfl.Store) {
	ctx, cancel := context.WithTimeout(ctxFor(t), 50*time.Millisecond)
	defer cancel()
	_, err := s.Wait(ctx, "kvtest/never", 0)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait past its deadline: got %v, want context.DeadlineExceeded", err)
	}
}

func removeByOwner(t *testing.T, s hfl.Store) {
	ctx := ctxFor(t)
	if _, err := s.Publish(ctx, "kvtest/r", rec("r", "nodeA", 1)); err != nil {
		t.Fatal(err)
	}
	if err := s.Remove(ctx, "kvtest/r", "nodeB"); err != nil {
		t.Fatalf("Remove by another owner: %v", err)
	}
	if _, err := s.Lookup(ctx, "kvtest/r"); err != nil {
		t.Fatalf("record gone after Remove by another owner: %v", err)
	}
	if err := s.Remove(ctx, "kvtest/r", "nodeA"); err != nil {
		t.Fatalf("Remove by owner: %v", err)
	}
	if _, err := s.Lookup(ctx, "kvtest/r"); !errors.Is(err, hfl.ErrNotFound) {
		t.Fatalf("Lookup after Remove: got %v, want ErrNotFound", err)
	}
	if _, err := s.Publish(ctx, "kvtest/r2", rec("r2", "nodeA", 1)); err != nil {
		t.Fatal(err)
	}
	if err := s.Remove(ctx, "kvtest/r2", ""); err != nil {
		t.Fatalf("Remove with any owner: %v", err)
	}
	if _, err := s.Lookup(ctx, "kvtest/r2"); !errors.Is(err, hfl.ErrNotFound) {
		t.Fatalf("Lookup after unconditional Remove: got %v, want ErrNotFound", err)
	}
}

func removeMissing(t *testing.T, s hfl.Store) {
	if err := s.Remove(ctxFor(t), "kvtest/none", ""); !errors.Is(err, hfl.ErrNotFound) {
		t.Fatalf("Remove of a missing key: got %v, want ErrNotFound", err)
	}
}

func generationNotReused(t *testing.T, s hfl.Store) {
	ctx := ctxFor(t)
	first, err := s.Publish(ctx, "kvtest/re", rec("re", "nodeA", 1))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Remove(ctx, "kvtest/re", ""); err != nil {
		t.Fatal(err)
	}
	second, err := s.Publish(ctx, "kvtest/re", rec("re", "nodeA", 2))
	if err != nil {
		t.Fatal(err)
	}
	if second.Generation <= first.Generation {
		t.Fatalf("generation after remove and republish %d, not above %d", second.Generation, first.Generation)
	}
	// A waiter that saw the first generation must see the second.
	got, err := s.Wait(ctx, "kvtest/re", first.Generation)
	if err != nil || got.Generation != second.Generation {
		t.Fatalf("Wait(after first) = %+v, %v; want generation %d", got, err, second.Generation)
	}
}

func oddKeys(t *testing.T, s hfl.Store) {
	ctx := ctxFor(t)
	keys := []string{"kvtest/with space", "kvtest/ünïcödé/ファイル", "kvtest/a.b.c/d", "kvtest/x%2F..y"}
	for i, k := range keys {
		if _, err := s.Publish(ctx, k, rec(fmt.Sprint(i), "nodeA", int64(i))); err != nil {
			t.Fatalf("Publish %q: %v", k, err)
		}
	}
	for i, k := range keys {
		got, err := s.Lookup(ctx, k)
		if err != nil || got.Size != int64(i) {
			t.Fatalf("Lookup %q = %+v, %v; want size %d", k, got, err, i)
		}
	}
}

func manyWaiters(t *testing.T, s hfl.Store) {
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
				r, err := s.Wait(ctx, key, 0)
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
		if _, err := s.Publish(ctx, key, rec(key, "nodeA", 1)); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func registerGet(t *testing.T, s hfl.Store) {
	ctx := ctxFor(t)
	if _, err := s.Get(ctx, "kvtest/nodes/a"); !errors.Is(err, hfl.ErrNotFound) {
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
	if _, err := s.Lookup(ctx, "kvtest/nodes/a"); !errors.Is(err, hfl.ErrNotFound) {
		t.Fatalf("Lookup of a registered value: %v, want ErrNotFound", err)
	}
}

// registerClaimOneWins: of many registrations of one key at once, each
// refusing any value already there, exactly one succeeds, and each refused
// one was shown the winner's value.
func registerClaimOneWins(t *testing.T, s hfl.Store) {
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

func putIfAbsentFirstWins(t *testing.T, s hfl.Store) {
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

func closeEndsWaits(t *testing.T, s hfl.Store) {
	ctx := ctxFor(t)
	errc := make(chan error, 1)
	started := make(chan struct{})
	go func() {
		close(started)
		_, err := s.Wait(ctx, "kvtest/closed", 0)
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

func listByPrefix(t *testing.T, s hfl.Store) {
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
	if _, err := s.Publish(ctx, "kvtest/list/rec", rec("r", "n", 1)); err != nil {
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
