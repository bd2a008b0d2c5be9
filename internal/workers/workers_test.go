package workers

import (
	"sync"
	"testing"
	"time"
)

// TestGoRunsEveryFunction: every function runs, on its own goroutine (one
// blocked does not hold back the others), whether a worker waits or not.
func TestGoRunsEveryFunction(t *testing.T) {
	const n = 100
	release := make(chan struct{})
	var started, ended sync.WaitGroup
	started.Add(n)
	ended.Add(n)
	for range n {
		Go(func() {
			started.Done()
			<-release // all n block at once: each needs a goroutine
			ended.Done()
		})
	}
	waitFor(t, &started, "every function to start while the others block")
	close(release)
	waitFor(t, &ended, "every function to end")

	// The workers now wait for more; they take the next ones.
	var again sync.WaitGroup
	again.Add(n)
	for range n {
		Go(again.Done)
	}
	waitFor(t, &again, "the functions handed to waiting workers")
}

func waitFor(t *testing.T, wg *sync.WaitGroup, what string) {
	t.Helper()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("gave up waiting for %s", what)
	}
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
