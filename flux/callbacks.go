//go:build flux

package flux

/*
#include <flux/core.h>
#include <stdint.h>
*/
import "C"

import "runtime/cgo"

// The C side's callbacks (see handle.go). They run on the reactor thread,
// inside flux_reactor_run.

//export goFluxWake
func goFluxWake(h C.uintptr_t) {
	cgo.Handle(h).Value().(*Handle).wake()
}

//export goFluxFuture
func goFluxFuture(f *C.flux_future_t, arg C.uintptr_t) {
	p := cgo.Handle(arg).Value().(*pendingFuture)
	p.h.futureReady(p)
}

//export goFluxRequest
func goFluxRequest(msg *C.flux_msg_t, arg C.uintptr_t) {
	cgo.Handle(arg).Value().(*Service).request(msg)
}

//export goFluxEvent
func goFluxEvent(msg *C.flux_msg_t, arg C.uintptr_t) {
	cgo.Handle(arg).Value().(*subscription).event(msg)
}
