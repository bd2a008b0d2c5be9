package hfl_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/dyadfs/dyadfs/hfl"
	"github.com/dyadfs/dyadfs/hfl/store"
	"github.com/dyadfs/dyadfs/hfl/store/embedded"
)

// deferringStore is a store that groups its commits: it counts the
// publishes it was told nobody waits for.
type deferringStore struct {
	store.Store
	deferred atomic.Int64
}

func (s *deferringStore) PublishDeferred(ctx context.Context, slot store.Slot, rec store.Record) (store.Record, error) {
	s.deferred.Add(1)
	return s.Store.Publish(ctx, slot, rec)
}

// TestDeferrablePublishes: a publish that nothing waits for reaches a
// store that groups its commits as such, and lands; one a caller waits
// for goes as a plain publish.
func TestDeferrablePublishes(t *testing.T) {
	s := &deferringStore{Store: embedded.New()}
	defer s.Close()
	loc, err := hfl.NewLocator(hfl.DefaultLocatorConfig(), s, nil, hfl.SingleNode)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	rec := hfl.Record{Path: "run/a.dat", Owner: "n1", Size: 3}
	if _, err := loc.Publish(ctx, rec, hfl.PublishOptions{Deferrable: true}); err != nil {
		t.Fatal(err)
	}
	if got := s.deferred.Load(); got != 1 {
		t.Fatalf("a deferrable publish reached the store as deferred %d times; want 1", got)
	}
	rec.Path = "run/b.dat"
	if _, err := loc.Publish(ctx, rec, hfl.PublishOptions{Tell: hfl.TellOnce}); err != nil {
		t.Fatal(err)
	}
	if got := s.deferred.Load(); got != 1 {
		t.Fatalf("after a waited-for publish, %d publishes reached the store as deferred; want 1", got)
	}
	for _, p := range []string{"run/a.dat", "run/b.dat"} {
		if got, _, err := loc.Record(ctx, p); err != nil || got.Owner != "n1" {
			t.Fatalf("record of %s: %+v, %v; want it published", p, got, err)
		}
	}
}
