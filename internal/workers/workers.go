// Package workers runs functions on goroutines that outlive them.
//
// A goroutine starts with a small stack and grows it by copying, doubling
// each time; one that makes a deep call (a gRPC call to the store, a
// message to another daemon, a transfer) grows it four or five times. The
// daemons started such a goroutine for every file, and growing stacks took
// a tenth of a producer's CPU in profiles. A worker that ran a function
// waits for the next one with the stack it grew. (A goroutine dump shows
// such a function under workers.worker, created by whichever call
// started that worker.)
package workers

import "sync/atomic"

// maxIdle bounds the workers that wait for work: past it, a worker whose
// function returned exits. (A timer to end idle workers instead made a
// lone writer's waiting close 5 to 10% slower.)
const maxIdle = 64

// work hands a function to a worker waiting for one; idle counts the
// workers waiting.
var (
	work = make(chan func())
	idle atomic.Int32
)

// Go runs f on a goroutine of its own, as the go statement does: a worker
// waiting for work if there is one, a new one otherwise. It never waits.
func Go(f func()) {
	select {
	case work <- f:
	default:
		go worker(f)
	}
}

// worker runs f, then whatever Go hands it, unless maxIdle others wait.
func worker(f func()) {
	for {
		f()
		if idle.Add(1) > maxIdle {
			idle.Add(-1)
			return
		}
		f = <-work
		idle.Add(-1)
	}
}
