package etcd_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/dyadfs/dyadfs/hfl/store"
	"github.com/dyadfs/dyadfs/hfl/store/etcd"
	"github.com/dyadfs/dyadfs/hfl/store/etcd/etcdtest"
)

// publishAll publishes n records at once, record i under key prefix+i, and
// returns each one's result.
func publishAll(s *etcd.Store, t *testing.T, prefix string, n int) ([]store.Record, []error) {
	return publishEach(s, t, prefix, n, 0, func(int) bool { return false })
}

// publishEach publishes n records, record i under key prefix+i, starting
// one every gap (0: all at once), through PublishDeferred where deferred(i)
// says so, and returns each one's result.
func publishEach(s *etcd.Store, t *testing.T, prefix string, n int, gap time.Duration, deferred func(i int) bool) ([]store.Record, []error) {
	ctx := testCtx(t)
	out := make([]store.Record, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		if gap > 0 && i > 0 {
			time.Sleep(gap)
		}
		wg.Go(func() {
			key := fmt.Sprintf("%s%d", prefix, i)
			if deferred(i) {
				out[i], errs[i] = s.PublishDeferred(ctx, eslot(key), record(key, "n1"))
			} else {
				out[i], errs[i] = s.Publish(ctx, eslot(key), record(key, "n1"))
			}
		})
	}
	wg.Wait()
	return out, errs
}

// TestEtcdGroupCommit: publishes that come at once share transactions;
// each caller gets its own record's generation, and every record and
// index entry is there. A lone publish is one transaction of its own.
func TestEtcdGroupCommit(t *testing.T) {
	srv := etcdtest.Start(t)
	ctx := testCtx(t)
	s := openEtcd(t, srv.Endpoints(), etcd.DefaultPrefix, nil)

	txns0, pubs0 := s.Commits()
	if _, err := s.Publish(ctx, eslot("job/alone"), record("alone", "n1")); err != nil {
		t.Fatal(err)
	}
	if txns, pubs := s.Commits(); txns != txns0+1 || pubs != pubs0+1 {
		t.Fatalf("a lone publish: %d transactions of %d publishes after %d of %d; want one of one", txns, pubs, txns0, pubs0)
	}

	const n = 300
	txns0, _ = s.Commits()
	recs, errs := publishAll(s, t, "job/many", n)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
		key := fmt.Sprintf("job/many%d", i)
		got, err := s.Lookup(ctx, eslot(key))
		if err != nil || got.Path != key || got.Generation != recs[i].Generation {
			t.Fatalf("lookup %s: %+v, %v; want generation %d", key, got, err, recs[i].Generation)
		}
	}
	listed, err := s.ListDir(ctx, "job/etcdtest", "job/many", 2*n)
	if err != nil || len(listed) != n {
		t.Fatalf("index: %d entries, %v; want %d", len(listed), err, n)
	}
	txns, _ := s.Commits()
	txns -= txns0
	if txns >= n {
		t.Fatalf("%d publishes at once took %d transactions; want them shared", n, txns)
	}
	t.Logf("%d publishes at once: %d transactions", n, txns)
}

// TestEtcdGroupCommitSameKey: publishes of one key at once land one after
// the other, each with its own generation, and the last generation holds
// its record.
func TestEtcdGroupCommitSameKey(t *testing.T) {
	srv := etcdtest.Start(t)
	ctx := testCtx(t)
	s := openEtcd(t, srv.Endpoints(), etcd.DefaultPrefix, nil)
	const n = 50
	gens := make([]uint64, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			rec := record("job/same", fmt.Sprintf("n%d", i))
			out, err := s.Publish(ctx, eslot("job/same"), rec)
			if err != nil {
				t.Errorf("publish %d: %v", i, err)
			}
			gens[i] = out.Generation
		})
	}
	wg.Wait()
	seen := make(map[uint64]bool)
	last, owner := uint64(0), ""
	for i, g := range gens {
		if seen[g] {
			t.Fatalf("two publishes of one key share generation %d", g)
		}
		seen[g] = true
		if g > last {
			last, owner = g, fmt.Sprintf("n%d", i)
		}
	}
	got, err := s.Lookup(ctx, eslot("job/same"))
	if err != nil || got.Generation != last || got.Owner != owner {
		t.Fatalf("lookup: %+v, %v; want the last publish (%s at %d)", got, err, owner, last)
	}
}

// TestEtcdGroupCommitRefused: when etcd refuses a batch (over its quota),
// every publish in it hears the refusal and none of them lands.
func TestEtcdGroupCommitRefused(t *testing.T) {
	srv := etcdtest.StartWith(t, "--quota-backend-bytes", "8388608")
	ctx := testCtx(t)
	s := openEtcd(t, srv.Endpoints(), etcd.DefaultPrefix, nil)
	if n, err := etcdtest.Fill(ctx, srv.Endpoints(), etcd.DefaultPrefix+"val/junk/"); err != nil || n == 0 {
		t.Fatalf("fill: %d values, %v", n, err)
	}
	const n = 100
	_, errs := publishAll(s, t, "job/full", n)
	for i, err := range errs {
		if !errors.Is(err, store.ErrNoSpace) {
			t.Fatalf("publish %d into a full etcd: %v; want store.ErrNoSpace", i, err)
		}
	}
	h, err := s.Health(ctx, "job")
	if err != nil || h.Records != 0 {
		t.Fatalf("records after refused publishes: %+v, %v; want none", h, err)
	}
}

// TestEtcdGroupCommitSplits: a server that takes fewer operations per
// transaction than a batch holds still gets every publish, in smaller
// transactions.
func TestEtcdGroupCommitSplits(t *testing.T) {
	srv := etcdtest.StartWith(t, "--max-txn-ops", "6")
	ctx := testCtx(t)
	s := openEtcd(t, srv.Endpoints(), etcd.DefaultPrefix, nil)
	const n = 100
	_, errs := publishAll(s, t, "job/split", n)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	if h, err := s.Health(ctx, "job"); err != nil || h.Records != n {
		t.Fatalf("records: %+v, %v; want %d", h, err, n)
	}
}

// TestEtcdDeferredPublishes: publishes that nobody waits for, coming one
// after another while others are in flight (a busy node's releases), and
// among them some that callers wait for, all land, each with the
// generation it was told, in fewer transactions than publishes; refused,
// each hears the refusal and none lands. (What ends a linger is in
// TestLingerEnds.)
func TestEtcdDeferredPublishes(t *testing.T) {
	srv := etcdtest.Start(t)
	ctx := testCtx(t)
	s := openEtcd(t, srv.Endpoints(), etcd.DefaultPrefix, nil)
	const n = 200
	txns0, pubs0 := s.Commits()
	recs, errs := publishEach(s, t, "job/stream", n, 200*time.Microsecond, func(i int) bool { return i%10 != 9 })
	for i, err := range errs {
		if err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
		key := fmt.Sprintf("job/stream%d", i)
		if got, err := s.Lookup(ctx, eslot(key)); err != nil || got.Generation != recs[i].Generation {
			t.Fatalf("lookup %s: %+v, %v; want generation %d", key, got, err, recs[i].Generation)
		}
	}
	txns, pubs := s.Commits()
	if pubs-pubs0 != n || txns-txns0 >= n {
		t.Fatalf("%d publishes in %d transactions; want all of them, shared", pubs-pubs0, txns-txns0)
	}
	t.Logf("%d publishes, one every 200 µs, 9 in 10 deferred: %d transactions", n, txns-txns0)

	full := etcdtest.StartWith(t, "--quota-backend-bytes", "8388608")
	fs := openEtcd(t, full.Endpoints(), etcd.DefaultPrefix, nil)
	if k, err := etcdtest.Fill(ctx, full.Endpoints(), etcd.DefaultPrefix+"val/junk/"); err != nil || k == 0 {
		t.Fatalf("fill: %d values, %v", k, err)
	}
	_, errs = publishEach(fs, t, "job/full", 50, 100*time.Microsecond, func(int) bool { return true })
	for i, err := range errs {
		if !errors.Is(err, store.ErrNoSpace) {
			t.Fatalf("deferred publish %d into a full etcd: %v; want store.ErrNoSpace", i, err)
		}
	}
	if h, err := fs.Health(ctx, "job"); err != nil || h.Records != 0 {
		t.Fatalf("records after refused publishes: %+v, %v; want none", h, err)
	}
}
