package fs

import (
	"context"
	"log/slog"
	"syscall"
	"testing"
	"time"
)

// TestFdGuardHoldsBackOpens: at the cap, an open waits for a release
// instead of failing; an interrupted one answers EINTR.
func TestFdGuardHoldsBackOpens(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	g := newFdGuard(log)
	if g.limit <= 0 || g.cap.Load() < 4 {
		t.Fatalf("guard %d of %d", g.cap.Load(), g.limit)
	}
	for g.handles.Load() < g.cap.Load() {
		g.opened()
	}
	g.refreshed.Store(time.Now().Add(time.Hour).UnixNano()) // keep the cap as it is
	admitted := make(chan syscall.Errno, 1)
	go func() { admitted <- g.admit(context.Background()) }()
	select {
	case errno := <-admitted:
		t.Fatalf("open at the cap admitted at once (%v)", errno)
	case <-time.After(100 * time.Millisecond):
	}
	g.released()
	select {
	case errno := <-admitted:
		if errno != 0 {
			t.Fatalf("open after a release: %v", errno)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a release did not let the waiting open in")
	}
	if g.status().OpensHeld != 1 {
		t.Fatalf("status %+v; want one open held back", g.status())
	}
	g.opened()
	ctx, cancel := context.WithCancel(context.Background())
	go func() { admitted <- g.admit(ctx) }()
	cancel()
	select {
	case errno := <-admitted:
		if errno != syscall.EINTR {
			t.Fatalf("interrupted open: %v; want EINTR", errno)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("an interrupted open kept waiting")
	}
}
