package notice

import (
	"context"
	"errors"
	"fmt"
	"github.com/dyadfs/dyadfs/hfl"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dyadfs/dyadfs/internal/poll"

	"github.com/dyadfs/dyadfs/hfl/store/embedded"
)

// recordingLocal is a LocalIndex that has nothing and notes what it is told.
type recordingLocal struct {
	mu   sync.Mutex
	told []string
}

func (r *recordingLocal) LocalRecord(ctx context.Context, path string) (hfl.Record, bool) {
	return hfl.Record{}, false
}

func (r *recordingLocal) Invalidated(path string, rec hfl.Record, exists bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case !exists:
		r.told = append(r.told, path+" gone")
	case rec.Writing:
		r.told = append(r.told, fmt.Sprintf("%s writing by %s", path, rec.Owner))
	default:
		r.told = append(r.told, fmt.Sprintf("%s gen %d by %s", path, rec.Generation, rec.Owner))
	}
}

func (r *recordingLocal) ListingDropped(dir string) {}

func (r *recordingLocal) heard(s string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, t := range r.told {
		if t == s {
			return true
		}
	}
	return false
}

// countingStore counts the calls that promises should spare.
type countingStore struct {
	hfl.Store
	lookups, lists atomic.Int64
	// hide drops members from listings of registrations.
	mu   sync.Mutex
	hide map[string]bool
	// lookupGate, if set, holds every Lookup until it is closed.
	lookupGate chan struct{}
	lookupIn   chan struct{}
	// publishGate, if set, holds every Publish until it is closed.
	publishGate chan struct{}
}

func (s *countingStore) Publish(ctx context.Context, slot hfl.Slot, rec hfl.Record) (hfl.Record, error) {
	if s.publishGate != nil {
		select {
		case <-s.publishGate:
		case <-ctx.Done():
			return hfl.Record{}, ctx.Err()
		}
	}
	return s.Store.Publish(ctx, slot, rec)
}

func (s *countingStore) Lookup(ctx context.Context, slot hfl.Slot) (hfl.Record, error) {
	s.lookups.Add(1)
	rec, err := s.Store.Lookup(ctx, slot)
	if s.lookupGate != nil {
		s.lookupIn <- struct{}{}
		<-s.lookupGate
	}
	return rec, err
}

func (s *countingStore) ListDir(ctx context.Context, dir, after string, limit int) ([]hfl.Record, error) {
	s.lists.Add(1)
	return s.Store.ListDir(ctx, dir, after, limit)
}

func (s *countingStore) List(ctx context.Context, prefix string) (map[string][]byte, error) {
	m, err := s.Store.List(ctx, prefix)
	s.mu.Lock()
	defer s.mu.Unlock()
	for k := range m {
		if s.hide[k[strings.LastIndexByte(k, '/')+1:]] {
			delete(m, k)
		}
	}
	return m, err
}

// promiseCluster is a notice cluster whose nodes note what they are told.
func promiseCluster(t *testing.T, n int) ([]*node, []*recordingLocal, *countingStore, *memNet) {
	t.Helper()
	store := &countingStore{Store: embedded.New(), hide: map[string]bool{}}
	locals := make([]*recordingLocal, n)
	locs, net := noticeClusterWith(t, n, store, func(i int) hfl.LocalIndex {
		locals[i] = &recordingLocal{}
		return locals[i]
	})
	return locs, locals, store, net
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// eventuallyTrue polls cond for up to five seconds.
func eventuallyTrue(t *testing.T, what string, cond func() bool) {
	t.Helper()
	poll.Until(t, 5*time.Second, what, cond)
}

// TestPromiseSparesTheStore: a node that asked once answers again from
// what it knows, present or missing, until a change is told.
func TestPromiseSparesTheStore(t *testing.T) {
	locs, _, store, _ := promiseCluster(t, 3)
	ctx := testContext(t)
	pub, err := locs[0].Publish(ctx, hfl.Record{Path: "p/a", Owner: "n0", Mode: 0o100644}, aside)
	if err != nil {
		t.Fatal(err)
	}
	// Present, and missing.
	for _, path := range []string{"p/a", "p/missing"} {
		first, _, err1 := locs[1].Record(ctx, path)
		before := store.lookups.Load()
		again, lv, err2 := locs[1].Record(ctx, path)
		if lv != hfl.LevelCache || store.lookups.Load() != before || !errors.Is(err1, err2) || first != again {
			t.Fatalf("%s asked again: %+v at %v, %v (first %+v, %v), %d store lookups; want it from the promise",
				path, again, lv, err2, first, err1, store.lookups.Load()-before)
		}
	}
	// A publish of the missing path is told to the node that asked.
	late, err := locs[2].Publish(ctx, hfl.Record{Path: "p/missing", Owner: "n2", Mode: 0o100644}, aside)
	if err != nil {
		t.Fatal(err)
	}
	eventuallyTrue(t, "the new path told", func() bool {
		rec, lv, err := locs[1].Record(ctx, "p/missing")
		return err == nil && lv == hfl.LevelCache && rec.Generation == late.Generation
	})
	if rec, _, err := locs[1].Record(ctx, "p/a"); err != nil || rec.Generation != pub.Generation {
		t.Fatalf("p/a = %+v, %v; want %+v", rec, err, pub)
	}
}

// TestClaimTellsHoldersBeforeItReturns: once Claim returns, every node
// that held the path knows it is being rewritten (close-to-open), the
// owner of the old version included; the publish that ends the claim is
// told too.
func TestClaimTellsHoldersBeforeItReturns(t *testing.T) {
	locs, locals, _, _ := promiseCluster(t, 4)
	ctx := testContext(t)
	for i := 0; i < 8; i++ {
		path := fmt.Sprintf("c%d/f", i) // homes spread over the nodes
		if _, err := locs[0].Publish(ctx, hfl.Record{Path: path, Owner: "n0", Size: 1, Mode: 0o100644}, aside); err != nil {
			t.Fatal(err)
		}
		// The owner holds its promise once its home took the publish.
		eventuallyTrue(t, "owner's promise", func() bool {
			_, lv, err := locs[0].Record(ctx, path)
			return err == nil && lv == hfl.LevelCache
		})
		for _, l := range locs[1:3] {
			if _, _, err := l.Record(ctx, path); err != nil {
				t.Fatal(err)
			}
		}
		claim, err := locs[3].Publish(ctx, hfl.Record{Path: path, Owner: "n3", Size: 1, Mode: 0o100644}, claiming)
		if err != nil {
			t.Fatal(err)
		}
		want := path + " writing by n3"
		for _, i := range []int{0, 1, 2} {
			if !locals[i].heard(want) {
				t.Fatalf("%s: n%d was not told %q before Claim returned: %v", path, i, want, locals[i].told)
			}
			rec, lv, err := locs[i].Record(ctx, path)
			if err != nil || lv != hfl.LevelCache || !rec.Writing || rec.Generation != claim.Generation {
				t.Fatalf("%s: n%d knows %+v at %v, %v; want the claim from its promise (notices %+v)", path, i, rec, lv, err, *locs[i].Stats().Notices)
			}
		}
		pub, err := locs[3].Publish(ctx, hfl.Record{Path: path, Owner: "n3", Size: 2, Mode: 0o100644}, aside)
		if err != nil {
			t.Fatal(err)
		}
		for _, i := range []int{0, 1, 2} {
			want := fmt.Sprintf("%s gen %d by n3", path, pub.Generation)
			eventuallyTrue(t, fmt.Sprintf("n%d told of the new version", i), func() bool { return locals[i].heard(want) })
		}
	}
}

// TestRemovalTellsHolders: an unlink on any node is told to the nodes that
// held the path before Unpublish returns.
func TestRemovalTellsHolders(t *testing.T) {
	locs, locals, _, _ := promiseCluster(t, 3)
	ctx := testContext(t)
	if _, err := locs[0].Publish(ctx, hfl.Record{Path: "r/f", Owner: "n0", Mode: 0o100644}, aside); err != nil {
		t.Fatal(err)
	}
	eventuallyTrue(t, "owner's promise", func() bool {
		_, lv, err := locs[0].Record(ctx, "r/f")
		return err == nil && lv == hfl.LevelCache
	})
	if _, _, err := locs[1].Record(ctx, "r/f"); err != nil {
		t.Fatal(err)
	}
	if err := locs[2].Unpublish(ctx, "r/f", hfl.RemoveCond{}, true); err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{0, 1} {
		if !locals[i].heard("r/f gone") {
			t.Fatalf("n%d not told of the removal before Unpublish returned: %v", i, locals[i].told)
		}
		if _, lv, err := locs[i].Record(ctx, "r/f"); !errors.Is(err, hfl.ErrNotFound) || lv != hfl.LevelCache {
			t.Fatalf("n%d after the removal: %v at %v; want ErrNotFound from its promise", i, err, lv)
		}
	}
}

// TestListingPromise: a listing read once is kept until a change in the
// directory, which the node is told of.
func TestListingPromise(t *testing.T) {
	locs, _, store, _ := promiseCluster(t, 2)
	ctx := testContext(t)
	// Told before they return: no notice of them comes after the listing.
	for _, name := range []string{"y", "x"} {
		if _, err := locs[0].Publish(ctx, hfl.Record{Path: "ls/" + name, Owner: "n0", Mode: 0o100644}, told); err != nil {
			t.Fatal(err)
		}
	}
	names := func() string {
		t.Helper()
		recs, err := locs[1].List(ctx, "ls", "", 0)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, r := range recs {
			out = append(out, r.Name())
		}
		return strings.Join(out, " ")
	}
	if got := names(); got != "x y" {
		t.Fatalf("listing %q, want x y", got)
	}
	before := store.lists.Load()
	if got := names(); got != "x y" || store.lists.Load() != before {
		t.Fatalf("listing again %q with %d store reads; want x y from the promise", got, store.lists.Load()-before)
	}
	// Lookups in the directory are answered from the listing too.
	if _, lv, err := locs[1].Record(ctx, "ls/none"); !errors.Is(err, hfl.ErrNotFound) || lv != hfl.LevelCache {
		t.Fatalf("lookup of a name the listing lacks: %v at %v", err, lv)
	}
	if _, err := locs[0].Publish(ctx, hfl.Record{Path: "ls/z", Owner: "n0", Mode: 0o100644}, aside); err != nil {
		t.Fatal(err)
	}
	eventuallyTrue(t, "the new name listed", func() bool { return names() == "x y z" })
	// The node's own changes keep its listing in step.
	if _, err := locs[1].Publish(ctx, hfl.Record{Path: "ls/w", Owner: "n1", Mode: 0o100644}, aside); err != nil {
		t.Fatal(err)
	}
	if got := names(); got != "w x y z" {
		t.Fatalf("listing after this node's publish %q, want w x y z", got)
	}
}

// TestListingHoldsItsPaths: a node that holds a directory's listing holds
// its paths: holding one asks the home nothing, and a change of it is
// told to the node (its copy is dropped). Without the listing, or for a
// promise of its own, holding a path asks its home.
func TestListingHoldsItsPaths(t *testing.T) {
	locs, locals, _, _ := promiseCluster(t, 2)
	ctx := testContext(t)
	// The holder is the node that is not the directory's home, so that
	// its questions cross the network and are counted.
	home, holder := locs[0], 1
	if locs[0].n.HomeOf("h/a") != "n0" {
		home, holder = locs[1], 0
	}
	owner := home.n.self.Node
	if _, err := home.Publish(ctx, hfl.Record{Path: "h/a", Owner: owner, Mode: 0o100644}, told); err != nil {
		t.Fatal(err)
	}
	h := locs[holder]
	if _, err := h.List(ctx, "h", "", 0); err != nil {
		t.Fatal(err)
	}
	asked := h.n.asked.Load()
	h.Hold(ctx, "h/a", false)
	if n := h.n.asked.Load() - asked; n != 0 {
		t.Fatalf("holding a path of a listing held asked the home %d times", n)
	}
	// A promise of its own (for a shadow directory) is asked for.
	h.Hold(ctx, "h/a", true)
	if n := h.n.asked.Load() - asked; n != 1 {
		t.Fatalf("holding a path of its own asked the home %d times, want 1", n)
	}
	pub, err := home.Publish(ctx, hfl.Record{Path: "h/a", Owner: owner, Mode: 0o100644}, told)
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("h/a gen %d by %s", pub.Generation, owner); !locals[holder].heard(want) {
		t.Fatalf("the holder of the listing was not told %q before the publish returned", want)
	}
	if st, ok := h.n.Known("h/a"); !ok || !st.Exists || st.Rec.Generation != pub.Generation {
		t.Fatalf("the holder knows %+v (%v), want generation %d", st, ok, pub.Generation)
	}
	// A path of a directory whose listing it does not hold: asked.
	dir := "g"
	for i := 0; home.n.HomeOf(dir+"/b") != owner; i++ {
		dir = fmt.Sprintf("g%d", i)
	}
	if _, err := home.Publish(ctx, hfl.Record{Path: dir + "/b", Owner: owner, Mode: 0o100644}, told); err != nil {
		t.Fatal(err)
	}
	asked = h.n.asked.Load()
	h.Hold(ctx, dir+"/b", false)
	if n := h.n.asked.Load() - asked; n != 1 {
		t.Fatalf("holding a path alone asked the home %d times, want 1", n)
	}
}

// homeAndOther returns, of two nodes, the home of p and the other one.
func homeAndOther(locs []*node, p string) (home, other *node) {
	if locs[0].n.HomeOf(p) == locs[0].n.self.Node {
		return locs[0], locs[1]
	}
	return locs[1], locs[0]
}

// TestListerWaitsWithoutAsking: a node that holds a directory's listing
// and waits for a name in it asks the home nothing, and is woken by the
// record its owner sends ahead of the store's commit: the home tells its
// listers of such records too, and a lister keeps them until the commit,
// for the waits that begin meanwhile.
func TestListerWaitsWithoutAsking(t *testing.T) {
	locs, _, store, _ := promiseCluster(t, 2)
	ctx := testContext(t)
	home, lister := homeAndOther(locs, "h/a")
	owner := home.n.self.Node
	if _, err := home.Publish(ctx, hfl.Record{Path: "h/x", Owner: owner, Mode: 0o100644}, told); err != nil {
		t.Fatal(err)
	}
	if _, err := lister.List(ctx, "h", "", 0); err != nil {
		t.Fatal(err)
	}
	asked := lister.n.asked.Load()
	got := make(chan hfl.Record, 1)
	go func() {
		rec, err := lister.WaitAhead(ctx, "h/a", 0)
		if err != nil {
			t.Error(err)
		}
		got <- rec
	}()
	store.publishGate = make(chan struct{})
	defer close(store.publishGate)
	// Until the waiter waits: a record sent ahead reaches only the
	// waits that are on when it comes. The publishes end when the gate
	// opens, at the end.
	for {
		go home.Publish(ctx, hfl.Record{Path: "h/a", Owner: owner, Mode: 0o100644, Size: 1}, closeTold)
		select {
		case rec := <-got:
			if !rec.Provisional || rec.Owner != owner {
				t.Fatalf("the lister got %+v, want the record sent ahead", rec)
			}
			if n := lister.n.asked.Load() - asked; n != 0 {
				t.Fatalf("the lister asked the home %d times while it waited", n)
			}
		case <-time.After(100 * time.Millisecond):
			continue
		case <-ctx.Done():
			t.Fatal("the lister was not told of the record sent ahead")
		}
		break
	}
	// A wait that begins once the record sent ahead was told takes it.
	go home.Publish(ctx, hfl.Record{Path: "h/b", Owner: owner, Mode: 0o100644, Size: 2}, closeTold)
	eventuallyTrue(t, "the lister told of h/b ahead", func() bool {
		_, ok := lister.n.holder.aheadOf("h/b")
		return ok
	})
	rec, err := lister.WaitAhead(ctx, "h/b", 0)
	if err != nil || !rec.Provisional || rec.Size != 2 {
		t.Fatalf("a wait begun after the record sent ahead got %+v, %v", rec, err)
	}
	if n := lister.n.asked.Load() - asked; n != 0 {
		t.Fatalf("the lister asked the home %d times while it waited", n)
	}
}

// listedByAll publishes p from its directory's home, which allows one
// lister, and has every other node (listers, by index) list the directory.
func listedByAll(t *testing.T, ctx context.Context, locs []*node, p string) (home *node, listers []int) {
	t.Helper()
	for i, l := range locs {
		if locs[0].n.HomeOf(p) == l.n.self.Node {
			home = l
		} else {
			listers = append(listers, i)
		}
	}
	home.n.home.mu.Lock()
	home.n.home.maxListers = 1
	home.n.home.mu.Unlock()
	if _, err := home.Publish(ctx, hfl.Record{Path: p, Owner: home.n.self.Node, Mode: 0o100644}, told); err != nil {
		t.Fatal(err)
	}
	dir, _ := hfl.SplitPath(p)
	for _, i := range listers {
		if _, err := locs[i].List(ctx, dir, "", 0); err != nil {
			t.Fatal(err)
		}
	}
	return home, listers
}

// TestEndedListingHearsLaterChanges: when a change ends the listings of
// too many listers, a later change of another path of the directory is
// still told to a lister the end has not reached yet, before its publish
// returns: that lister may hold the path through the listing alone (a
// copy made under it), and must not keep answering from it.
func TestEndedListingHearsLaterChanges(t *testing.T) {
	locs, locals, _, net := promiseCluster(t, 3)
	ctx := testContext(t)
	home, listers := listedByAll(t, ctx, locs, "d/q")
	owner := home.n.self.Node
	slow := listers[0]
	net.mu.Lock()
	net.slow = map[string]time.Duration{locs[slow].n.self.Node: 300 * time.Millisecond}
	net.mu.Unlock()
	// Ends both listings (two listers, one allowed), told slowly to one
	// of them: once the other heard it, the end is on its way to the slow
	// one, which does not know it yet.
	first := make(chan error, 1)
	go func() {
		_, err := home.Publish(ctx, hfl.Record{Path: "d/x", Owner: owner, Mode: 0o100644}, told)
		first <- err
	}()
	eventuallyTrue(t, "the fast lister told of the change that ends its listing", func() bool {
		r := locals[listers[1]]
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, s := range r.told {
			if strings.HasPrefix(s, "d/x gen ") {
				return true
			}
		}
		return false
	})
	pub, err := home.Publish(ctx, hfl.Record{Path: "d/q", Owner: owner, Mode: 0o100644}, told)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("d/q gen %d by %s", pub.Generation, owner); !locals[slow].heard(want) {
		t.Fatalf("a lister whose listing had just ended was not told %q before the publish returned", want)
	}
	if st, ok := locs[slow].n.Known("d/q"); ok && (!st.Exists || st.Rec.Generation != pub.Generation) {
		t.Fatalf("the lister answers %+v from what it was promised, after the publish of generation %d returned", st, pub.Generation)
	}
}

// TestEndedListerForgottenOnceTold: a lister whose listing ended, told so,
// is no longer told of the directory's changes as a lister, also when it
// holds the changed path itself.
func TestEndedListerForgottenOnceTold(t *testing.T) {
	locs, _, _, _ := promiseCluster(t, 3)
	ctx := testContext(t)
	home, listers := listedByAll(t, ctx, locs, "e/a")
	owner := home.n.self.Node
	for _, i := range listers {
		locs[i].Hold(ctx, "e/a", true)
	}
	if _, err := home.Publish(ctx, hfl.Record{Path: "e/a", Owner: owner, Mode: 0o100644}, told); err != nil {
		t.Fatal(err)
	}
	h := home.n.home
	h.mu.Lock()
	ending := len(h.dirs["e"].ending)
	h.mu.Unlock()
	if ending != 0 {
		t.Fatalf("%d listers still ending after the change that ended their listings was told to them", ending)
	}
}

// TestToldHolderRenewedAtHome: a holder told of a change renews its
// promise, and so does the home: it keeps telling the holder of changes
// for as long as the holder trusts the promise.
func TestToldHolderRenewedAtHome(t *testing.T) {
	locs, _, _, _ := promiseCluster(t, 2)
	ctx := testContext(t)
	home, holder := homeAndOther(locs, "r/p")
	owner, other := home.n.self.Node, holder.n.self.Node
	if _, err := home.Publish(ctx, hfl.Record{Path: "r/p", Owner: owner, Mode: 0o100644}, told); err != nil {
		t.Fatal(err)
	}
	holder.Hold(ctx, "r/p", true)
	h := home.n.home
	old := time.Now().Add(-50 * time.Second)
	h.mu.Lock()
	h.dirs["r"].entries["p"].holders[other] = old // granted 50 s ago
	h.mu.Unlock()
	if _, err := home.Publish(ctx, hfl.Record{Path: "r/p", Owner: owner, Mode: 0o100644}, told); err != nil {
		t.Fatal(err)
	}
	if !holder.n.holder.holds("r/p") {
		t.Fatal("the holder did not keep its promise when told of the change")
	}
	h.expire(time.Now().Add(20 * time.Second)) // 70 s after the first grant
	h.mu.Lock()
	_, kept := h.dirs["r"].entries["p"].holders[other]
	h.mu.Unlock()
	if !kept {
		t.Fatal("the home forgot a holder it renewed the promise of 20 s before")
	}
}

// TestChangeDuringQuestionIsNotKept: a change told while a node reads the
// store is newer than what the store said: the answer is used once, not
// kept under the promise.
func TestChangeDuringQuestionIsNotKept(t *testing.T) {
	locs, _, store, _ := promiseCluster(t, 2)
	ctx := testContext(t)
	store.lookupIn, store.lookupGate = make(chan struct{}, 100), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, _, err := locs[1].Record(ctx, "q/f")
		done <- err
	}()
	<-store.lookupIn // the store answered "missing"; the answer is on its way
	pub, err := locs[0].Publish(ctx, hfl.Record{Path: "q/f", Owner: "n0", Mode: 0o100644}, aside)
	if err != nil {
		t.Fatal(err)
	}
	eventuallyTrue(t, "the change told", func() bool { return locs[1].n.broken.Load() > 0 })
	close(store.lookupGate)
	if err := <-done; !errors.Is(err, hfl.ErrNotFound) {
		t.Fatalf("the question in flight: %v, want the store's ErrNotFound", err)
	}
	rec, _, err := locs[1].Record(ctx, "q/f")
	if err != nil || rec.Generation != pub.Generation {
		t.Fatalf("after the question: %+v, %v; want the published record, not the stale answer", rec, err)
	}
}

// TestPromisesEndWithTheirHome: when the home of a directory changes (a
// node joins and scores higher), what was promised by the old home is asked
// again.
func TestPromisesEndWithTheirHome(t *testing.T) {
	locs, _, store, net := promiseCluster(t, 2)
	ctx := testContext(t)
	// A directory the joining node n2 will be home of.
	dir := ""
	for i := 0; ; i++ {
		d := fmt.Sprintf("h%d", i)
		key := locs[0].Key(d)
		if best, _ := rendezvous([]hfl.Member{{Node: "n0"}, {Node: "n1"}, {Node: "n2"}}, key, ""); best.Node == "n2" {
			dir = d
			break
		}
	}
	path := dir + "/f"
	if _, _, err := locs[1].Record(ctx, path); !errors.Is(err, hfl.ErrNotFound) {
		t.Fatal(err)
	}
	if _, lv, _ := locs[1].Record(ctx, path); lv != hfl.LevelCache {
		t.Fatalf("second lookup at %v, want the cache", lv)
	}
	joinNode(t, ctx, store, net, "n2", "10.0.0.3:7447")
	eventuallyTrue(t, "n1 knows n2", func() bool { return locs[1].Stats().Notices.Members == 3 })
	if _, lv, _ := locs[1].Record(ctx, path); lv == hfl.LevelCache {
		t.Fatalf("a promise of the old home was still trusted after the home changed")
	}
}

// TestRemovalWaitsForAnUnreachableHome: a removal whose home cannot be
// reached returns only once that home has left the members and the others
// had time to read the members again (their promises from it are void).
func TestRemovalWaitsForAnUnreachableHome(t *testing.T) {
	for _, v := range []*time.Duration{&membersRefresh, &membersRetry} {
		old := *v
		t.Cleanup(func() { *v = old })
	}
	membersRefresh, membersRetry = 300*time.Millisecond, 20*time.Millisecond
	locs, _, store, net := promiseCluster(t, 3)
	ctx := testContext(t)
	dir := ""
	for i := 0; ; i++ {
		d := fmt.Sprintf("w%d", i)
		if h, _, _ := locs[0].n.homeOf(d); h.Node == "n1" {
			dir = d
			break
		}
	}
	path := dir + "/f"
	if _, err := locs[0].Publish(ctx, hfl.Record{Path: path, Owner: "n0", Mode: 0o100644}, aside); err != nil {
		t.Fatal(err)
	}
	net.mu.Lock()
	net.down["n1"] = true
	net.mu.Unlock()
	start := time.Now()
	gone := make(chan time.Time, 1)
	go func() {
		time.Sleep(500 * time.Millisecond) // lets time pass: the removal waits for n1 meanwhile
		store.mu.Lock()
		store.hide["n1"] = true
		store.mu.Unlock()
		gone <- time.Now()
	}()
	if err := locs[2].Unpublish(ctx, path, hfl.RemoveCond{}, true); err != nil {
		t.Fatal(err)
	}
	left := <-gone
	if took := time.Since(start); time.Since(left) < membersRefresh {
		t.Fatalf("the removal returned %v after it started, %v after the home left: want at least %v after", took, time.Since(left), membersRefresh)
	}
	if st := locs[2].Stats().Notices; st.HomeWaits == 0 {
		t.Errorf("the wait for the dead home was not counted: %+v", st)
	}
}

// TestOvertakenPublishLearnsWinner: two nodes publish one path at once and
// the older publish reaches the home last. Its node, which held no promise
// for the path, hears the newer state in the home's answer (its own
// version lost), and neither its listing nor what it knows of the path
// goes back to its own older record.
func TestOvertakenPublishLearnsWinner(t *testing.T) {
	locs, locals, store, _ := promiseCluster(t, 3)
	ctx := testContext(t)
	const p = "w/f"
	older, err := store.Publish(ctx, locs[1].Slot(p), hfl.Record{Path: p, Owner: "n1", Mode: 0o100644, Size: 1})
	if err != nil {
		t.Fatal(err)
	}
	newer, err := locs[2].Publish(ctx, hfl.Record{Path: p, Owner: "n2", Mode: 0o100644, Size: 2}, told)
	if err != nil {
		t.Fatal(err)
	}
	if newer.Generation <= older.Generation {
		t.Fatalf("generations %d then %d", older.Generation, newer.Generation)
	}
	if len(locals[1].told) != 0 {
		t.Fatalf("n1 held nothing, and was told %v", locals[1].told)
	}
	n := locs[1].n
	// What Publish does once the store took n1's record, late.
	n.holder.madeHere(p, older, true, older.Generation)
	n.tellHomeSync(ctx, notice{Kind: kindPublished, Rec: &older}, p, older, true)
	want := fmt.Sprintf("%s gen %d by n2", p, newer.Generation)
	eventuallyTrue(t, "the overtaken node told "+want, func() bool { return locals[1].heard(want) })
	if rec, exists, ok := locs[1].Told(p); !ok || !exists || rec.Owner != "n2" || rec.Generation != newer.Generation {
		t.Fatalf("Told: %+v %v %v; want n2's generation %d", rec, exists, ok, newer.Generation)
	}
	// A listing held keeps the newer record too.
	if _, err := locs[1].List(ctx, "w", "", 0); err != nil {
		t.Fatal(err)
	}
	n.holder.madeHere(p, older, true, older.Generation)
	recs, err := locs[1].List(ctx, "w", "", 0)
	if err != nil || len(recs) != 1 || recs[0].Owner != "n2" {
		t.Fatalf("listing after the late publish: %+v %v; want n2's record", recs, err)
	}
}

// TestSilentHolderLosesPromises: a holder that does not answer does not
// hold up a change: the home takes it for cut off within holderSilence,
// drops its promises and goes on; once it answers again it is told, and
// asks afresh (it sees the change instead of what it was promised).
func TestSilentHolderLosesPromises(t *testing.T) {
	locs, _, _, net := promiseCluster(t, 3)
	ctx := testContext(t)
	dir := ""
	for i := 0; dir == ""; i++ {
		d := fmt.Sprintf("s%d", i)
		if best, _ := rendezvous([]hfl.Member{{Node: "n0"}, {Node: "n1"}, {Node: "n2"}}, locs[0].Key(d), ""); best.Node == "n2" {
			dir = d
		}
	}
	p := dir + "/f"
	rec, err := locs[0].Publish(ctx, hfl.Record{Path: p, Owner: "n0", Mode: 0o100644, Size: 1}, told)
	if err != nil {
		t.Fatal(err)
	}
	locs[1].Record(ctx, p) // n1 holds p
	if _, lv, _ := locs[1].Record(ctx, p); lv != hfl.LevelCache {
		t.Fatalf("n1 does not hold p: %v", lv)
	}
	net.mu.Lock()
	net.down["n1"] = true
	net.mu.Unlock()
	start := time.Now()
	claim := rec
	if _, err := locs[0].Publish(ctx, claim, claiming); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 2*holderSilence {
		t.Fatalf("a rewrite waited %v for a holder that does not answer; want about %v", took, holderSilence)
	}
	if n := locs[2].Stats().Notices.SilentHolders; n != 1 {
		t.Fatalf("the home took %d holders for cut off, want 1", n)
	}
	net.mu.Lock()
	net.down["n1"] = false
	net.mu.Unlock()
	eventuallyTrue(t, "n1 told its promises are void", func() bool { return locs[1].Stats().Notices.Revoked == 1 })
	got, lv, err := locs[1].Record(ctx, p)
	if err != nil || lv == hfl.LevelCache || !got.Writing {
		t.Fatalf("n1 after it came back: %+v at %v, %v; want the claim, asked afresh", got, lv, err)
	}
}

// TestPublishAndTellBeforeItReturns: a node that knew a name missing,
// under a promise, knows the new file once PublishAndTell returned (a
// writer's close that reports its publish: close-to-open for new names).
func TestPublishAndTellBeforeItReturns(t *testing.T) {
	locs, _, _, _ := promiseCluster(t, 3)
	ctx := testContext(t)
	for i := 0; i < 8; i++ {
		p := fmt.Sprintf("n%d/new", i) // homes spread over the nodes
		locs[1].Record(ctx, p)
		if _, lv, err := locs[1].Record(ctx, p); !errors.Is(err, hfl.ErrNotFound) || lv != hfl.LevelCache {
			t.Fatalf("%s: %v at %v; want missing, from a promise", p, err, lv)
		}
		pub, err := locs[0].Publish(ctx, hfl.Record{Path: p, Owner: "n0", Mode: 0o100644, Size: 3}, closeTold)
		if err != nil {
			t.Fatal(err)
		}
		if rec, lv, err := locs[1].Record(ctx, p); err != nil || rec.Generation != pub.Generation || lv != hfl.LevelCache {
			t.Fatalf("%s right after the publish returned: %+v at %v, %v; want generation %d from the promise", p, rec, lv, err, pub.Generation)
		}
	}
}

// TestCommitToldAsideKeepsCloseToOpen: a waiting close returns once the
// store committed and the path's home told every holder, and every lister
// of its directory, that the commit is coming; the commit itself reaches
// the home aside. Until it does, no node answers from what it knew before
// (a promise that the name is missing, a listing without it), the home
// included: they wait a moment for the commit's notice, then read the
// store. Once it comes, they answer from their promises again.
func TestCommitToldAsideKeepsCloseToOpen(t *testing.T) {
	locs, store, net, ctx, p := heldPathCluster(t, 3)
	dir, _ := hfl.SplitPath(p)
	reader, home := locs[1], locs[2]
	for _, l := range []*node{reader, home} {
		l.Record(ctx, p)
		if _, lv, err := l.Record(ctx, p); !errors.Is(err, hfl.ErrNotFound) || lv != hfl.LevelCache {
			t.Fatalf("%s: %v at %v; want missing, from a promise", p, err, lv)
		}
	}
	if _, err := reader.List(ctx, dir, "", 0); err != nil {
		t.Fatal(err)
	}
	lists := store.lists.Load()
	if recs, err := reader.List(ctx, dir, "", 0); err != nil || len(recs) != 0 || store.lists.Load() != lists {
		t.Fatalf("listing %s again: %v, %v, %d store reads; want it empty, from the promise", dir, recs, err, store.lists.Load()-lists)
	}
	// Only the record sent ahead with Sync reaches a node from the
	// writer: the commit's notice is lost until the test lets it go.
	release := loseAllButHolds(net, "n0")
	pub, err := locs[0].Publish(ctx, hfl.Record{Path: p, Owner: "n0", Mode: 0o100644, Size: 3}, closeTold)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for _, l := range []*node{reader, home} {
		if rec, lv, err := l.Record(ctx, p); err != nil || rec.Generation != pub.Generation {
			t.Fatalf("%s on %s while the commit's notice is lost: %+v at %v, %v; want generation %d", p, l.n.self.Node, rec, lv, err, pub.Generation)
		}
	}
	if recs, err := reader.List(ctx, dir, "", 0); err != nil || len(recs) != 1 || recs[0].Generation != pub.Generation {
		t.Fatalf("listing %s while the commit's notice is lost: %+v, %v; want %s at generation %d", dir, recs, err, p, pub.Generation)
	}
	if took := time.Since(start); took > 3*settleWait+2*time.Second {
		t.Fatalf("three lookups took %v while the commit's notice was lost; want each to wait at most %v", took, settleWait)
	}
	if st := reader.Stats().Notices; st.HeldLookups == 0 || st.HeldRunOut == 0 {
		t.Fatalf("the reader's status counts %d lookups held back, %d in vain; want both counted", st.HeldLookups, st.HeldRunOut)
	}
	release()
	eventuallyTrue(t, "the commit told, and the reader's promise back", func() bool {
		rec, lv, err := reader.Record(ctx, p)
		return err == nil && rec.Generation == pub.Generation && lv == hfl.LevelCache
	})
}

// TestHoldEndsOnlyWithItsCommit: a node that holds a path back for one
// publish does not take the notice of another (an older rewrite's,
// arriving late) for its end, and answers what the close that returned
// committed.
func TestHoldEndsOnlyWithItsCommit(t *testing.T) {
	locs, _, net, ctx, p := heldPathCluster(t, 3)
	writer, reader := locs[0], locs[1]
	first, err := writer.Publish(ctx, hfl.Record{Path: p, Owner: "n0", Mode: 0o100644, Size: 1}, closeTold)
	if err != nil {
		t.Fatal(err)
	}
	firstPublish := writer.n.publish.Load()
	eventuallyTrue(t, "the reader holds the first version", func() bool {
		rec, lv, err := reader.Record(ctx, p)
		return err == nil && rec.Generation == first.Generation && lv == hfl.LevelCache
	})
	release := loseAllButHolds(net, "n0")
	second, err := writer.Publish(ctx, hfl.Record{Path: p, Owner: "n0", Mode: 0o100644, Size: 2}, closeTold)
	if err != nil {
		t.Fatal(err)
	}
	// The first version's notice, late, with the promise renewed.
	late := first
	reader.n.holder.broken("n2", notice{Kind: kindBreak, Path: p, Rec: &late, Publish: firstPublish, Held: true})
	if rec, lv, err := reader.Record(ctx, p); err != nil || rec.Generation != second.Generation {
		t.Fatalf("after a late notice of the first version: %+v at %v, %v; want generation %d", rec, lv, err, second.Generation)
	}
	release()
}

// TestHoldEndsWithAFailedCommit: a commit that fails after its home held
// the path back ends the hold at once (nothing changed), instead of
// leaving the nodes told to wait for it until the hold runs out.
func TestHoldEndsWithAFailedCommit(t *testing.T) {
	locs, store, _, ctx, p := heldPathCluster(t, 3)
	reader := locs[1]
	reader.Record(ctx, p)
	store.publishGate = make(chan struct{})
	defer close(store.publishGate)
	pctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	_, err := locs[0].Publish(pctx, hfl.Record{Path: p, Owner: "n0", Mode: 0o100644, Size: 3}, closeTold)
	cancel()
	if err == nil {
		t.Fatal("a publish the store never took succeeded")
	}
	poll.Until(t, settleWait/2, "the reader no longer holds the path back", func() bool {
		reader.n.holder.mu.Lock()
		defer reader.n.holder.mu.Unlock()
		return len(reader.n.holder.marks) == 0
	})
	if _, lv, err := reader.Record(ctx, p); !errors.Is(err, hfl.ErrNotFound) {
		t.Fatalf("after the failed publish: %v at %v; want missing", err, lv)
	}
}

// loseAllButHolds makes net lose every message node from sends but the
// records it sends ahead with Sync (a hold's: see reply.Pending), until
// release is called.
func loseAllButHolds(net *memNet, from string) (release func()) {
	var lost atomic.Bool
	lost.Store(true)
	net.mu.Lock()
	net.lose = func(sender, _ string, msg []byte) bool {
		if sender != from || !lost.Load() {
			return false
		}
		in, err := decodeNotice(msg)
		return err != nil || in.Kind != kindPublished || in.Rec == nil || !in.Rec.Provisional || !in.Sync
	}
	net.mu.Unlock()
	return func() { lost.Store(false) }
}

// heldPathCluster is promiseCluster with a test's context and a path p
// whose home is n2.
func heldPathCluster(t *testing.T, n int) ([]*node, *countingStore, *memNet, context.Context, string) {
	locs, _, store, net := promiseCluster(t, n)
	return locs, store, net, testContext(t), homeDirFor(locs, "n2") + "/f"
}

// homeDirFor returns a directory whose home is node want.
func homeDirFor(locs []*node, want string) string {
	dir := "d"
	for i := 0; locs[0].n.HomeOf(dir+"/f") != want; i++ {
		dir = fmt.Sprintf("d%d", i)
	}
	return dir
}

// marksOf counts the paths node l holds back.
func marksOf(l *node) int {
	l.n.holder.mu.Lock()
	defer l.n.holder.mu.Unlock()
	return len(l.n.holder.marks)
}

// TestEndedListerHoldsNothingBack: a lister whose listing the hold's break
// ends (too many listers) has no promise left to hold back, and is not
// told the commit as a lister: it does not hold the path back, and its
// lookups do not wait for a notice that is not coming.
func TestEndedListerHoldsNothingBack(t *testing.T) {
	locs, _, _, ctx, p := heldPathCluster(t, 3)
	dir, _ := hfl.SplitPath(p)
	reader, home := locs[1], locs[2]
	if _, err := reader.List(ctx, dir, "", 0); err != nil {
		t.Fatal(err)
	}
	home.n.home.mu.Lock()
	home.n.home.maxListers = 0
	home.n.home.mu.Unlock()
	pub, err := locs[0].Publish(ctx, hfl.Record{Path: p, Owner: "n0", Mode: 0o100644, Size: 3}, closeTold)
	if err != nil {
		t.Fatal(err)
	}
	if n := marksOf(reader); n != 0 {
		t.Fatalf("the ended lister holds %d paths back", n)
	}
	if rec, lv, err := reader.Record(ctx, p); err != nil || rec.Generation != pub.Generation {
		t.Fatalf("the ended lister finds %+v at %v, %v; want generation %d", rec, lv, err, pub.Generation)
	}
}

// TestHoldKeptThroughAnotherChangeInFlight: a node whose question finds
// the path held back for one publish, while another writer's older change
// is told to it, still holds the path back, and answers what the close
// that returned committed.
func TestHoldKeptThroughAnotherChangeInFlight(t *testing.T) {
	locs, store, net, ctx, p := heldPathCluster(t, 4)
	reader, home := locs[1], locs[2]
	// B (n3) commits first; its notice comes late.
	outB, err := store.Publish(ctx, locs[3].Slot(p), hfl.Record{Path: p, Owner: "n3", Mode: 0o100644, Size: 9})
	if err != nil {
		t.Fatal(err)
	}
	release := loseAllButHolds(net, "n0")
	defer release()
	pubA, err := locs[0].Publish(ctx, hfl.Record{Path: p, Owner: "n0", Mode: 0o100644, Size: 3}, closeTold)
	if err != nil {
		t.Fatal(err)
	}
	// A's close returned. The reader's question, step by step, with B's
	// notice reaching the home (and the reader) while the answer flies.
	h := reader.n.holder
	h.startFlight(p)
	r := home.n.home.ask("n1", p, 0, false)
	home.n.home.published(ctx, "n3", outB, 1, true, false, false)
	if !r.Pending {
		t.Fatal("the home does not hold the path back")
	}
	h.markAsked(p, r.PendingOwner, r.PendingPublish, hfl.Record{})
	h.endFlight(p)
	if rec, lv, err := reader.Record(ctx, p); err != nil || rec.Generation != pubA.Generation {
		t.Fatalf("the reader finds %+v at %v, %v after A's close returned; want A's generation %d (B's is %d)", rec, lv, err, pubA.Generation, outB.Generation)
	}
}

// TestLateAnswerKeepsNewerHold: an answer that the path is held back for
// one publish, reaching a node after the break that holds it back for the
// writer's next one, does not replace that hold; the first commit's notice
// does not end it, and the node answers what the second close committed.
func TestLateAnswerKeepsNewerHold(t *testing.T) {
	locs, _, net, ctx, p := heldPathCluster(t, 3)
	writer, reader, home := locs[0], locs[1], locs[2]
	reader.Record(ctx, p)
	release := loseAllButHolds(net, "n0")
	defer release()
	first, err := writer.Publish(ctx, hfl.Record{Path: p, Owner: "n0", Mode: 0o100644, Size: 1}, closeTold)
	if err != nil {
		t.Fatal(err)
	}
	firstPublish := writer.n.publish.Load()
	// The reader's question, step by step: answered during the first
	// hold, taken after the second one's break.
	h := reader.n.holder
	h.startFlight(p)
	r := home.n.home.ask("n1", p, 0, false)
	if !r.Pending || r.PendingPublish != firstPublish {
		t.Fatalf("the home answers %+v; want the first publish held back", r)
	}
	second, err := writer.Publish(ctx, hfl.Record{Path: p, Owner: "n0", Mode: 0o100644, Size: 2}, closeTold)
	if err != nil {
		t.Fatal(err)
	}
	h.markAsked(p, r.PendingOwner, r.PendingPublish, hfl.Record{})
	h.endFlight(p)
	home.n.home.published(ctx, "n0", first, firstPublish, false, false, false) // the first commit's notice, late
	if rec, lv, err := reader.Record(ctx, p); err != nil || rec.Generation != second.Generation {
		t.Fatalf("after the second close returned: %+v at %v, %v; want generation %d (the first is %d)", rec, lv, err, second.Generation, first.Generation)
	}
}
