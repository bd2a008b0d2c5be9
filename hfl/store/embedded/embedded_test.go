package embedded

import (
	"context"
	"testing"
	"time"

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
