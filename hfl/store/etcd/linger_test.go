package etcd

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestLingerFor: a transaction waits for more publishes only when nobody
// waits for the ones queued and publishes overlap, for about as long as a
// commit takes, within bounds.
func TestLingerFor(t *testing.T) {
	ms := time.Millisecond
	for _, c := range []struct {
		what                        string
		queued, urgent, limit, last int
		took                        time.Duration
		want                        time.Duration
		ok                          bool
	}{
		{"a lone publish", 1, 0, 128, 1, 2 * ms, 0, false},
		{"a lone publish after overlap", 1, 0, 128, 5, 2 * ms, 2 * ms, true},
		{"two queued", 2, 0, 128, 1, 3 * ms, 3 * ms, true},
		{"one a close waits for", 5, 1, 128, 5, 2 * ms, 0, false},
		{"a transaction's worth", 128, 0, 128, 5, 2 * ms, 0, false},
		{"nothing queued", 0, 0, 128, 5, 2 * ms, 0, false},
		{"a quick commit", 3, 0, 128, 3, 10 * time.Microsecond, minLinger, true},
		{"a slow commit", 3, 0, 128, 3, time.Second, maxLinger, true},
	} {
		got, ok := lingerFor(c.queued, c.urgent, c.limit, c.last, c.took)
		if got != c.want || ok != c.ok {
			t.Errorf("%s: lingerFor = %v, %v; want %v, %v", c.what, got, ok, c.want, c.ok)
		}
	}
}

// fakeCommitter is a committer whose transactions are recorded, not sent,
// each once the test lets it through, and whose lingers last until
// something ends them: what ends one is then seen without timing it.
type fakeCommitter struct {
	*committer
	batches chan []string // each transaction's keys
	through chan struct{} // a send lets one transaction through
}

func newFakeCommitter(t *testing.T, limit int) *fakeCommitter {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	f := &fakeCommitter{batches: make(chan []string, 100), through: make(chan struct{})}
	f.committer = &committer{s: &Store{ctx: ctx}, max: limit, longest: time.Hour}
	f.do = func(batch []*publishReq) {
		select {
		case <-f.through:
		case <-ctx.Done():
		}
		keys := make([]string, len(batch))
		for i, req := range batch {
			keys[i] = req.key
			close(req.done)
		}
		f.batches <- keys
	}
	return f
}

func (f *fakeCommitter) submit(key string, deferrable bool) *publishReq {
	req := &publishReq{key: key, deferrable: deferrable, done: make(chan struct{})}
	f.committer.submit(req)
	return req
}

// commit lets the transaction in flight through and returns its keys.
func (f *fakeCommitter) commit(t *testing.T, what string) string {
	t.Helper()
	select {
	case f.through <- struct{}{}:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: no transaction in flight within 10 s", what)
	}
	return strings.Join(<-f.batches, " ")
}

// await waits until cond holds of the committer (read under its lock).
func (f *fakeCommitter) await(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		f.mu.Lock()
		ok := cond()
		f.mu.Unlock()
		if ok {
			return
		}
	}
	t.Fatalf("not within 10 s: %s", what)
}

// TestLingerEnds: deferrable publishes that overlap linger until a
// publish that a caller waits for comes, or a transaction's worth is
// queued; the publishes then go in one transaction. A waited-for publish
// whose caller gave up no longer stops a linger.
func TestLingerEnds(t *testing.T) {
	f := newFakeCommitter(t, 4)
	lingering := func() bool { return f.lingering }
	f.submit("a", true)
	f.await(t, "a in flight", func() bool { return f.running && len(f.queue) == 0 })
	f.submit("b", true)
	f.submit("c", true)
	if got := f.commit(t, "a"); got != "a" {
		t.Fatalf("first transaction [%s]; want [a]", got)
	}
	f.await(t, "b and c linger", lingering)
	f.submit("urgent", false)
	if got := f.commit(t, "after a waited-for publish"); got != "b c urgent" {
		t.Fatalf("transaction [%s]; want [b c urgent]", got)
	}

	f.submit("y", false) // waited for: no linger
	f.await(t, "y in flight", func() bool { return f.running && len(f.queue) == 0 })
	gone := f.submit("gone", false)
	f.abandon(gone) // its caller stopped waiting
	f.submit("d", true)
	f.submit("e", true)
	if got := f.commit(t, "y"); got != "y" {
		t.Fatalf("transaction [%s]; want [y]", got)
	}
	f.await(t, "d and e linger", lingering)
	f.submit("f", true) // with the abandoned one, a transaction's worth queued
	if got := f.commit(t, "a full queue"); got != "d e f" {
		t.Fatalf("transaction [%s]; want [d e f]", got)
	}
}
