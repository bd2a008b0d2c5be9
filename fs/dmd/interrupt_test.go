package dmd

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dyadfs/dyadfs/internal/poll"
)

// A detached wait ends when its request is interrupted, keeps its
// request's deadline, and leaves no watcher once every wait is done.
func TestDetachFollowsItsRequest(t *testing.T) {
	const n = 3*waitsPerWatcher + 1
	reqs := make([]context.CancelFunc, n)
	waits := make([]context.Context, n)
	ends := make([]context.CancelFunc, n)
	for i := range reqs {
		var req context.Context
		req, reqs[i] = context.WithCancel(context.WithValue(context.Background(), waitForKey{}, i))
		waits[i], ends[i] = detach(req)
		if waits[i].Value(waitForKey{}) != i {
			t.Fatal("the detached context lost its request's values")
		}
	}
	reqs[7]()
	select {
	case <-waits[7].Done():
	case <-time.After(10 * time.Second):
		t.Fatal("an interrupted request did not end its wait")
	}
	for i, w := range waits {
		if i != 7 && w.Err() != nil {
			t.Fatalf("wait %d ended with another's interruption", i)
		}
	}
	for i := range ends {
		ends[i]()
		reqs[i]()
	}
	// The watchers stop on their own.
	poll.Until(t, 10*time.Second, "no watcher left with no wait to watch", func() bool {
		requestInterrupts.mu.Lock()
		defer requestInterrupts.mu.Unlock()
		return len(requestInterrupts.watchers) == 0
	})

	req, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	w, end := detach(req)
	defer end()
	<-w.Done()
	if !errors.Is(w.Err(), context.DeadlineExceeded) {
		t.Fatalf("detached wait ended with %v, want its request's deadline", w.Err())
	}
}
