package etcd

import (
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
