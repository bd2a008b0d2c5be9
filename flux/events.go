//go:build flux

package flux

/*
#include <flux/core.h>
#include <stdint.h>
#include <stdlib.h>

flux_msg_handler_t *dyadfs_event_handler(flux_t *h, const char *glob, uintptr_t arg);
*/
import "C"

import (
	"context"
	"runtime/cgo"
	"sync/atomic"
	"unsafe"
)

// subscription is one Subscribe: its handler and the channel it feeds.
type subscription struct {
	h       *Handle
	topic   string
	events  chan Event
	dropped atomic.Uint64

	msgHandler
}

// Subscribe delivers the events whose topic begins with topic (Flux
// matches subscriptions by prefix) until ctx ends or the handle closes,
// then closes the channel. Events are broadcast to every broker; one
// that arrives while the channel's buffer of 64 is full is dropped, as
// Flux drops events for a client that does not keep up.
func (h *Handle) Subscribe(ctx context.Context, topic string) (<-chan Event, error) {
	s := &subscription{h: h, topic: topic, events: make(chan Event, 64)}
	_, err := call(ctx, h, func(done func(struct{}, error)) {
		s.glob = C.CString(topic + "*")
		s.self = cgo.NewHandle(s)
		mh, err := C.dyadfs_event_handler(h.h, s.glob, C.uintptr_t(s.self))
		if mh == nil {
			s.free()
			done(struct{}{}, &Error{Op: "event handler " + topic, Errno: errnoOf(err)})
			return
		}
		s.mh = mh
		h.handlers[s] = struct{}{}
		C.flux_msg_handler_start(mh)
		ctopic := C.CString(topic)
		f, err := C.flux_event_subscribe_ex(h.h, ctopic, 0)
		C.free(unsafe.Pointer(ctopic))
		if f == nil {
			s.release()
			done(struct{}{}, &Error{Op: "event subscribe " + topic, Errno: errnoOf(err)})
			return
		}
		h.confirm(f, "event subscribe "+topic, func() {}, s.release, done)
	})
	if err != nil {
		// A subscription that ctx abandoned while it was being made
		// ends with the handle.
		return nil, err
	}
	context.AfterFunc(ctx, func() {
		h.do(func() {
			if s.mh == nil {
				return // the handle closed first
			}
			ctopic := C.CString(topic)
			if f := C.flux_event_unsubscribe_ex(h.h, ctopic, 0); f != nil {
				C.flux_future_destroy(f) // the broker acts on the request alone
			}
			C.free(unsafe.Pointer(ctopic))
			s.release()
		})
	})
	return s.events, nil
}

// event runs on the reactor thread for each event that matches.
func (s *subscription) event(msg *C.flux_msg_t) {
	var topic *C.char
	var data unsafe.Pointer
	var n C.size_t
	if rc, _ := C.flux_event_decode_raw(msg, &topic, &data, &n); rc < 0 {
		s.dropped.Add(1)
		return
	}
	ev := Event{Topic: C.GoString(topic), Payload: C.GoBytes(data, C.int(n))}
	select {
	case s.events <- ev:
	default:
		s.dropped.Add(1)
	}
}

// release stops the handler and closes the channel, on the reactor thread.
func (s *subscription) release() {
	delete(s.h.handlers, s)
	s.free()
	close(s.events)
}

// Publish publishes an event with topic and payload to every broker of
// the instance; it returns once the broker has given it its sequence
// number.
func (h *Handle) Publish(ctx context.Context, topic string, payload []byte) error {
	return h.simple(ctx, "event publish "+topic, func() (*C.flux_future_t, error) {
		ctopic := C.CString(topic)
		defer C.free(unsafe.Pointer(ctopic))
		var p unsafe.Pointer
		if len(payload) > 0 {
			p = C.CBytes(payload)
			defer C.free(p)
		}
		f, err := C.flux_event_publish_raw(h.h, ctopic, 0, p, C.size_t(len(payload)))
		return f, err
	})
}
