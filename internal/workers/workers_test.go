package workers

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/dyadfs/dyadfs/internal/poll"
)

// TestGoRunsEveryFunction: every function runs, on its own goroutine (one
// blocked does not hold back the others), whether a worker waits or not.
func TestGoRunsEveryFunction(t *testing.T) {
	const n = 100
	release := make(chan struct{})
	var started, ended atomic.Int32
	for range n {
		Go(func() {
			started.Add(1)
			<-release // all n block at once: each needs a goroutine
			ended.Add(1)
		})
	}
	poll.Until(t, 10*time.Second, "every function to start while the others block", func() bool { return started.Load() == n })
	close(release)
	poll.Until(t, 10*time.Second, "every function to end", func() bool { return ended.Load() == n })

	// The workers now wait for more; they take the next ones.
	var again atomic.Int32
	for range n {
		Go(func() { again.Add(1) })
	}
	poll.Until(t, 10*time.Second, "the functions handed to waiting workers", func() bool { return again.Load() == n })
}

// BenchmarkDeepCall: a function that needs a deep stack, run by the go
// statement against Go.
func BenchmarkDeepCall(b *testing.B) {
	run := func(b *testing.B, spawn func(func())) {
		done := make(chan struct{})
		for b.Loop() {
			spawn(func() { deep(40); done <- struct{}{} })
			<-done
		}
	}
	b.Run("go", func(b *testing.B) { run(b, func(f func()) { go f() }) })
	b.Run("workers", func(b *testing.B) { run(b, Go) })
}

//go:noinline
func deep(n int) int {
	var pad [64]byte
	pad[n%64] = byte(n)
	if n == 0 {
		return int(pad[0])
	}
	return deep(n-1) + int(pad[n%64])
}
