// Package poll is the one polling helper of dyadfs's tests: it waits for a
// condition that no event announces (another process's progress, a
// goroutine that ends on its own), within a bound, so that a test fails
// instead of hanging.
package poll

import (
	"testing"
	"time"
)

// Until calls cond until it holds, and fails tb if it does not within
// limit. It looks often at first and then less (from 1 ms up to 20 ms).
func Until(tb testing.TB, limit time.Duration, what string, cond func() bool) {
	tb.Helper()
	if !Within(limit, cond) {
		tb.Fatalf("%s: not within %v", what, limit)
	}
}

// Within calls cond until it holds or limit passes, and reports whether
// it held.
func Within(limit time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(limit)
	pause := time.Millisecond
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(pause)
		pause = min(2*pause, 20*time.Millisecond)
	}
	return true
}
