//go:build flux

package flux

/*
#include <flux/core.h>
#include <stdint.h>
#include <stdlib.h>

flux_msg_handler_t *dyadfs_request_handler(flux_t *h, const char *glob, uintptr_t arg);
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"runtime/cgo"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/dyadfs/dyadfs/internal/workers"
)

// Service is a service this handle registered with its broker: requests
// whose topic is "name.method" sent to this rank reach its handlers. It
// goes away with the handle (or its process): a request to it then fails
// with ENOSYS.
type Service struct {
	h    *Handle
	name string

	mu       sync.Mutex
	handlers map[string]func(Request)

	msgHandler
}

// Serve registers service name with the broker and returns it; its
// methods answer once Handle is called for them (an unknown method is
// answered ENOSYS). It fails with an error matching syscall.EEXIST if the
// broker has a service of that name already.
func (h *Handle) Serve(ctx context.Context, name string) (*Service, error) {
	s := &Service{h: h, name: name, handlers: make(map[string]func(Request))}
	_, err := call(ctx, h, func(done func(struct{}, error)) {
		s.glob = C.CString(name + ".*")
		s.self = cgo.NewHandle(s)
		mh, err := C.dyadfs_request_handler(h.h, s.glob, C.uintptr_t(s.self))
		if mh == nil {
			s.release()
			done(struct{}{}, &Error{Op: "msg handler " + name, Errno: errnoOf(err)})
			return
		}
		s.mh = mh
		h.handlers[s] = struct{}{}
		cname := C.CString(name)
		f, err := C.flux_service_register(h.h, cname)
		C.free(unsafe.Pointer(cname))
		if f == nil {
			s.release()
			done(struct{}{}, &Error{Op: "service register " + name, Errno: errnoOf(err)})
			return
		}
		h.confirm(f, "service register "+name, func() { C.flux_msg_handler_start(s.mh) }, s.release, done)
	})
	if err != nil {
		return nil, err
	}
	return s, nil
}

// release frees what Serve made, on the reactor thread.
func (s *Service) release() {
	delete(s.h.handlers, s)
	s.free()
}

// Name is the service's name.
func (s *Service) Name() string { return s.name }

// Handle makes fn answer method (topic name.method). fn runs on a
// goroutine of its own, and must answer the request.
func (s *Service) Handle(method string, fn func(Request)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.handlers[s.name+"."+method] = fn
}

// unregisterWait bounds how long Close waits for the broker to confirm
// that the service is gone.
const unregisterWait = 5 * time.Second

// Close unregisters the service. Its handlers keep answering until the
// broker confirms (or unregisterWait passes): a request the broker routed
// here meanwhile is answered, where a handle without a handler for it
// could leave its sender waiting for its timeout.
func (s *Service) Close() error {
	confirmed := make(chan struct{})
	var once sync.Once
	confirm := func() { once.Do(func() { close(confirmed) }) }
	err := s.h.do(func() {
		cname := C.CString(s.name)
		f := C.flux_service_unregister(s.h.h, cname)
		C.free(unsafe.Pointer(cname))
		if f == nil {
			confirm()
			return
		}
		if s.h.then(f, func(*C.flux_future_t) bool { confirm(); return false }, func(error) { confirm() }) != nil {
			confirm()
		}
	})
	if err != nil {
		return err
	}
	t := time.NewTimer(unregisterWait)
	defer t.Stop()
	select {
	case <-confirmed:
	case <-t.C:
	case <-s.h.done:
	}
	return s.h.do(s.release)
}

// request runs on the reactor thread for each request: the payload is
// copied, the message kept until it is answered, and the handler runs on
// a goroutine.
func (s *Service) request(msg *C.flux_msg_t) {
	var topic *C.char
	var data unsafe.Pointer
	var n C.size_t
	if rc, err := C.flux_request_decode_raw(msg, &topic, &data, &n); rc < 0 {
		C.flux_respond_error(s.h.h, msg, C.int(errnoOf(err)), nil)
		return
	}
	t := C.GoString(topic)
	s.mu.Lock()
	fn := s.handlers[t]
	s.mu.Unlock()
	if fn == nil {
		msgText := C.CString("no handler for " + t)
		C.flux_respond_error(s.h.h, msg, C.int(syscall.ENOSYS), msgText)
		C.free(unsafe.Pointer(msgText))
		return
	}
	var userid C.uint32_t
	C.flux_msg_get_userid(msg, &userid)
	r := &request{h: s.h, msg: C.flux_msg_incref(msg), topic: t, payload: C.GoBytes(data, C.int(n)), userid: uint32(userid)}
	workers.Go(func() { fn(r) })
}

// request is a Request; msg is held (incref) until it is answered.
type request struct {
	h       *Handle
	msg     *C.flux_msg_t
	topic   string
	payload []byte
	userid  uint32

	mu       sync.Mutex
	answered bool
}

func (r *request) Topic() string   { return r.topic }
func (r *request) Payload() []byte { return r.payload }
func (r *request) Userid() uint32  { return r.userid }

// respond sends one response on the reactor thread; last releases the
// message.
func (r *request) respond(last bool, send func(msg *C.flux_msg_t) (C.int, error)) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.answered {
		return errors.New("flux: request answered already")
	}
	r.answered = last
	var rc C.int
	var cerr error
	err := r.h.do(func() {
		rc, cerr = send(r.msg)
		if last {
			C.flux_msg_decref(r.msg)
		}
	})
	if err != nil {
		return err
	}
	if rc < 0 {
		return &Error{Op: "respond " + r.topic, Errno: errnoOf(cerr)}
	}
	return nil
}

func (r *request) send(data []byte, last bool) error {
	return r.respond(last, func(msg *C.flux_msg_t) (C.int, error) {
		var p unsafe.Pointer
		if len(data) > 0 {
			p = unsafe.Pointer(&data[0]) // Flux copies it into the message
		}
		rc, err := C.flux_respond_raw(r.h.h, msg, p, C.int(len(data)))
		return rc, err
	})
}

func (r *request) Respond(data []byte) error { return r.send(data, true) }
func (r *request) Stream(data []byte) error  { return r.send(data, false) }

func (r *request) RespondError(errno syscall.Errno, text string) error {
	return r.respond(true, func(msg *C.flux_msg_t) (C.int, error) {
		var ctext *C.char
		if text != "" {
			ctext = C.CString(text)
			defer C.free(unsafe.Pointer(ctext))
		}
		rc, err := C.flux_respond_error(r.h.h, msg, C.int(errno), ctext)
		return rc, err
	})
}

// RPC sends payload to topic at rank nodeid (NodeAny: the local broker's
// service) and returns the raw response, or fails with the responder's
// errno (ENOSYS: no service there; EHOSTUNREACH: no such rank, or its
// broker died). timeout bounds the wait (0: none but ctx).
func (h *Handle) RPC(ctx context.Context, topic string, nodeid uint32, payload []byte, timeout time.Duration) ([]byte, error) {
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	return call(ctx, h, func(done func([]byte, error)) {
		f := h.rpc(topic, nodeid, payload, 0, func(err error) { done(nil, err) })
		if f == nil {
			return
		}
		err := h.then(f, func(f *C.flux_future_t) bool {
			done(responseOf(topic, f))
			return false
		}, func(err error) { done(nil, err) })
		if err != nil {
			done(nil, err)
		}
	})
}

// rpc starts an RPC; on failure it calls fail and returns nil.
func (h *Handle) rpc(topic string, nodeid uint32, payload []byte, flags C.int, fail func(error)) *C.flux_future_t {
	ctopic := C.CString(topic)
	defer C.free(unsafe.Pointer(ctopic))
	var p unsafe.Pointer
	if len(payload) > 0 {
		p = unsafe.Pointer(&payload[0]) // copied into the request message
	}
	f, err := C.flux_rpc_raw(h.h, ctopic, p, C.size_t(len(payload)), C.uint32_t(nodeid), flags)
	if f == nil {
		fail(&Error{Op: "rpc " + topic, Errno: errnoOf(err)})
	}
	return f
}

// responseOf is a copy of an RPC future's raw response, or its error.
func responseOf(topic string, f *C.flux_future_t) ([]byte, error) {
	var data unsafe.Pointer
	var n C.size_t
	if rc, err := C.flux_rpc_get_raw(f, &data, &n); rc < 0 {
		e := &Error{Op: "rpc " + topic, Errno: errnoOf(err)}
		if C.flux_future_has_error(f) {
			e.Msg = C.GoString(C.flux_future_error_string(f))
		}
		return nil, e
	}
	return C.GoBytes(data, C.int(n)), nil
}

// Stream sends a streaming request to topic at rank nodeid and calls each
// with every response, in order, until the responder ends the stream
// (ENODATA: Stream returns nil) or fails it, or each fails, or ctx ends.
// Responses are queued for each without limit: a responder that sends
// more than the caller reads fills memory, so protocols bound what they
// ask for.
func (h *Handle) Stream(ctx context.Context, topic string, nodeid uint32, payload []byte, each func([]byte) error) error {
	type resp struct {
		data []byte
		err  error
	}
	var mu sync.Mutex
	var queue []resp
	more := make(chan struct{}, 1)
	push := func(r resp) {
		mu.Lock()
		queue = append(queue, r)
		mu.Unlock()
		select {
		case more <- struct{}{}:
		default:
		}
	}
	var p *pendingFuture
	_, err := call(ctx, h, func(done func(struct{}, error)) {
		f := h.rpc(topic, nodeid, payload, C.FLUX_RPC_STREAMING, func(err error) { done(struct{}{}, err) })
		if f == nil {
			return
		}
		var err error
		p, err = h.thenP(f, func(f *C.flux_future_t) bool {
			data, err := responseOf(topic, f)
			push(resp{data, err})
			return err == nil
		}, func(err error) { push(resp{err: err}) })
		done(struct{}{}, err)
	})
	if err != nil {
		return err
	}
	// However it ends, nothing more is read: the stream is dropped.
	defer h.abandon(p)
	for {
		mu.Lock()
		batch := queue
		queue = nil
		mu.Unlock()
		for _, r := range batch {
			if r.err != nil {
				if errors.Is(r.err, syscall.ENODATA) {
					return nil
				}
				return r.err
			}
			if err := each(r.data); err != nil {
				return err
			}
		}
		select {
		case <-more:
		case <-ctx.Done():
			return ctx.Err()
		case <-h.done:
			return ErrClosed
		}
	}
}

// String describes the handle for messages.
func (h *Handle) String() string { return fmt.Sprintf("flux handle of rank %d of %d", h.rank, h.size) }
