//go:build ucx

package ucx

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"sync/atomic"
	"unsafe"
)

// pool is a set of equal slots of memory registered with UCX (one mmap
// and one ucp_mem_map of them all), each with room for one message
// header, and a ring of the free ones. Any goroutine takes a slot from the ring and
// gives it back; only the worker maps and unmaps the memory, once, after
// every goroutine that could touch it has returned (Transport.Close).
//
// A slot leaves the ring for one tenant, a chunk, and returns only when
// that chunk is done with it: the one UCX request that read or filled it
// has completed and, on the receiving side, the chunk has been written to
// its file (invariant I2). put panics if a slot comes back twice.
type pool struct {
	memh C.ucp_mem_h
	base unsafe.Pointer // size*n bytes, registered
	hdrs unsafe.Pointer // hdrLen*n bytes (malloc): the header sent with each slot's chunk
	size int
	n    int
	free chan int
	// inRing says which slots are in the ring (checks put).
	inRing []atomic.Bool
}

func newPool(uctx C.ucp_context_h, size, n int) (*pool, error) {
	p := &pool{size: size, n: n, free: make(chan int, n), inRing: make([]atomic.Bool, n)}
	if st := C.shim_mem_map(uctx, C.size_t(size*n), &p.memh, &p.base); st != C.UCS_OK {
		return nil, statusErr(fmt.Sprintf("ucp_mem_map of %d bytes", size*n), st)
	}
	p.hdrs = C.calloc(C.size_t(n), hdrLen)
	for i := range n {
		p.inRing[i].Store(true)
		p.free <- i
	}
	return p, nil
}

// destroy unmaps the memory. No slot may be in use.
func (p *pool) destroy(uctx C.ucp_context_h) {
	C.shim_mem_unmap(uctx, p.memh, p.base, C.size_t(p.size*p.n))
	C.free(p.hdrs)
	p.base, p.hdrs = nil, nil
}

// take records that slot i, received from the ring, is in use.
func (p *pool) take(i int) int {
	p.inRing[i].Store(false)
	return i
}

// tryGet takes a free slot if there is one.
func (p *pool) tryGet() (int, bool) {
	select {
	case i := <-p.free:
		return p.take(i), true
	default:
		return 0, false
	}
}

// put returns slot i to the ring. It never blocks: the ring holds every
// slot.
func (p *pool) put(i int) {
	if p.inRing[i].Swap(true) {
		panic(fmt.Sprintf("ucx transport: buffer slot %d released twice", i))
	}
	p.free <- i
}

// ptr is slot i's memory; buf the same as a byte slice.
func (p *pool) ptr(i int) unsafe.Pointer { return unsafe.Add(p.base, i*p.size) }

func (p *pool) buf(i int) []byte { return unsafe.Slice((*byte)(p.ptr(i)), p.size) }

// hdr is slot i's header memory.
func (p *pool) hdr(i int) unsafe.Pointer { return unsafe.Add(p.hdrs, i*hdrLen) }

// freeSlots is how many slots are in the ring now.
func (p *pool) freeSlots() int { return len(p.free) }
