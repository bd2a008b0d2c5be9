//go:build ucx

package ucx

// This file holds the Go functions UCX calls back (through shim.c). A file
// with //export may only declare in its preamble, so the C definitions
// live in shim.c. Every callback runs on the worker's thread, inside a
// libucp call the worker made (ucp_worker_progress mostly), where calling
// libucp again is not allowed: each one only finds its Go object through
// its cgo.Handle and queues the work for the worker's loop (worker.later).

/*
#include <stdint.h>
#include <ucp/api/ucp.h>
*/
import "C"

import (
	"runtime/cgo"
	"unsafe"
)

// goSendDone completes a send or an endpoint close. Its handle names a
// *request and dies here: UCX calls a request back once.
//
//export goSendDone
func goSendDone(h C.uintptr_t, status C.ucs_status_t) {
	r := cgo.Handle(h).Value().(*request)
	cgo.Handle(h).Delete()
	r.w.callbackDone(r, status, r.length)
}

// goRecvDone completes a rendezvous receive (ucp_am_recv_data_nbx).
//
//export goRecvDone
func goRecvDone(h C.uintptr_t, status C.ucs_status_t, length C.size_t) {
	r := cgo.Handle(h).Value().(*request)
	cgo.Handle(h).Delete()
	r.w.callbackDone(r, status, int64(length))
}

// goEpError reports an endpoint's failure. Its handle names the
// *endpoint and lives until the endpoint's close has completed.
//
//export goEpError
func goEpError(h C.uintptr_t, status C.ucs_status_t) {
	e := cgo.Handle(h).Value().(*endpoint)
	e.w.later = append(e.w.later, func() { e.w.epFailed(e, status) })
}

// goConnRequest hands the listener's connection request to the worker,
// which accepts or rejects it after the progress call returns.
//
//export goConnRequest
func goConnRequest(h C.uintptr_t, req C.ucp_conn_request_h) {
	w := cgo.Handle(h).Value().(*worker)
	w.later = append(w.later, func() { w.accept(req) })
}

// goAmRecv receives every active message. It returns what UCX is to do
// with the data: UCS_OK (done with it), UCS_INPROGRESS (a rendezvous
// descriptor kept for ucp_am_recv_data_nbx), or an error, with which UCX
// drops a rendezvous message and completes its sender's request.
//
//export goAmRecv
func goAmRecv(h C.uintptr_t, header unsafe.Pointer, hlen C.size_t, data unsafe.Pointer, length C.size_t, attr C.uint64_t, replyEP C.ucp_ep_h) C.ucs_status_t {
	w := cgo.Handle(h).Value().(*worker)
	return w.onAM(header, int(hlen), data, int64(length), attr, replyEP)
}
