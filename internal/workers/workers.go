// Package workers runs functions on goroutines that outlive them.
//
// A goroutine starts with a small stack and grows it by copying, doubling
// each time; one that makes a deep call (a gRPC call to the store, a
// message to another daemon, a transfer) grows it four or five times. The
// daemons started such a goroutine for every file, and growing stacks took
// a tenth of a producer's CPU in profiles. A worker that ran a function
// waits for the next one with the stack it grew, and exits after a while
// without work.
package workers

import "time"

// idleFor is how long a worker waits for another function before it exits.
const idleFor = 10 * time.Second

// work hands a function to a worker waiting for one.
var work = make(chan func())

// Go runs f on a goroutine of its own, as the go statement does: a worker
// waiting for work if there is one, a new one otherwise. It never waits.
func Go(f func()) {
	select {
	case work <- f:
	default:
		go worker(f)
	}
}

// worker runs f, then whatever Go hands it, until it waited idleFor
// without work.
func worker(f func()) {
	f()
	idle := time.NewTimer(idleFor)
	defer idle.Stop()
	for {
		select {
		case f := <-work:
			f()
			idle.Reset(idleFor)
		case <-idle.C:
			return
		}
	}
}
