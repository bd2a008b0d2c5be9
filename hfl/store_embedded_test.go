package hfl_test

import (
	"context"
	"testing"
	"time"

	"github.com/dyadfs/dyadfs/hfl"
	"github.com/dyadfs/dyadfs/hfl/kvtest"
)

func TestEmbeddedStoreConformance(t *testing.T) {
	kvtest.Run(t, func(t *testing.T) hfl.Store { return hfl.NewEmbeddedStore() })
}

func TestOpenStoreURLs(t *testing.T) {
	for _, u := range []string{"", "embedded", "embedded://", "EMBEDDED://"} {
		s, err := hfl.OpenStore(context.Background(), u)
		if err != nil {
			t.Errorf("OpenStore(%q): %v", u, err)
			continue
		}
		s.Close()
	}
	for _, u := range []string{"embedded://host:1", "bogus://x", "redis://h:1"} {
		if err := hfl.ValidateStoreURL(u); err == nil {
			t.Errorf("ValidateStoreURL(%q) accepted a bad URL", u)
		}
	}
}

func TestEmbeddedAbandonedWaitsLeaveNothing(t *testing.T) {
	s := hfl.NewEmbeddedStore()
	defer s.Close()
	for i := 0; i < 100; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
		s.Wait(ctx, "never", 0)
		cancel()
	}
	if n := hfl.EmbeddedWaiters(s); n != 0 {
		t.Fatalf("%d keys still have waiters after every wait gave up", n)
	}
}
