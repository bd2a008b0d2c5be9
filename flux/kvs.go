//go:build flux

package flux

/*
#include <flux/core.h>
#include <stdlib.h>
*/
import "C"

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"syscall"
	"unsafe"
)

// cstr is a C copy of s, or NULL for "" (the default namespace); the caller
// frees it with freeC.
func cstr(s string) *C.char {
	if s == "" {
		return nil
	}
	return C.CString(s)
}

func freeC(p *C.char) {
	if p != nil {
		C.free(unsafe.Pointer(p))
	}
}

// Commit applies ops in one KVS transaction in namespace ns ("": the
// default one) and returns the root sequence number of the commit, which
// grows with every commit of the namespace.
func (h *Handle) Commit(ctx context.Context, ns string, ops []Op) (int, error) {
	return call(ctx, h, func(done func(int, error)) {
		txn := C.flux_kvs_txn_create()
		if txn == nil {
			done(0, &Error{Op: "kvs txn create", Errno: syscall.ENOMEM})
			return
		}
		defer C.flux_kvs_txn_destroy(txn)
		for _, op := range ops {
			key := C.CString(op.Key)
			var rc C.int
			var err error
			if op.Unlink {
				rc, err = C.flux_kvs_txn_unlink(txn, 0, key)
			} else {
				var data unsafe.Pointer
				if len(op.Value) > 0 {
					data = C.CBytes(op.Value)
				}
				rc, err = C.flux_kvs_txn_put_raw(txn, 0, key, data, C.size_t(len(op.Value)))
				if data != nil {
					C.free(data)
				}
			}
			C.free(unsafe.Pointer(key))
			if rc < 0 {
				done(0, &Error{Op: "kvs txn " + op.Key, Errno: errnoOf(err)})
				return
			}
		}
		cns := cstr(ns)
		f, err := C.flux_kvs_commit(h.h, cns, 0, txn)
		freeC(cns)
		if f == nil {
			done(0, &Error{Op: "kvs commit", Errno: errnoOf(err)})
			return
		}
		err = h.then(f, func(f *C.flux_future_t) bool {
			var seq C.int
			if rc, err := C.flux_kvs_commit_get_sequence(f, &seq); rc < 0 {
				done(0, kvsErr("kvs commit", f, err))
				return false
			}
			done(int(seq), nil)
			return false
		}, func(err error) { done(0, err) })
		if err != nil {
			done(0, err)
		}
	})
}

// kvsErr is the error of a failed KVS future.
func kvsErr(op string, f *C.flux_future_t, err error) error {
	e := &Error{Op: op, Errno: errnoOf(err)}
	if C.flux_future_has_error(f) {
		e.Msg = C.GoString(C.flux_future_error_string(f))
	}
	return e
}

// ErrNotFound is what a lookup of a key that is not there fails with
// (it also matches syscall.ENOENT).
var ErrNotFound = syscall.ENOENT

// Lookup returns the raw value of key in namespace ns; a missing key fails
// with an error matching ErrNotFound.
func (h *Handle) Lookup(ctx context.Context, ns, key string) ([]byte, error) {
	return call(ctx, h, func(done func([]byte, error)) {
		f := h.lookup(ns, key, 0, done)
		if f == nil {
			return
		}
		err := h.then(f, func(f *C.flux_future_t) bool {
			v, err := rawValue(f)
			done(v, err)
			return false
		}, func(err error) { done(nil, err) })
		if err != nil {
			done(nil, err)
		}
	})
}

// lookup starts a lookup of key with flags; on failure it calls done and
// returns nil.
func (h *Handle) lookup(ns, key string, flags C.int, done func([]byte, error)) *C.flux_future_t {
	cns, ckey := cstr(ns), C.CString(key)
	f, err := C.flux_kvs_lookup(h.h, cns, flags, ckey)
	freeC(cns)
	C.free(unsafe.Pointer(ckey))
	if f == nil {
		done(nil, &Error{Op: "kvs lookup " + key, Errno: errnoOf(err)})
	}
	return f
}

// rawValue is the value a lookup future carries.
func rawValue(f *C.flux_future_t) ([]byte, error) {
	var data unsafe.Pointer
	var n C.size_t
	if rc, err := C.flux_kvs_lookup_get_raw(f, &data, &n); rc < 0 {
		key := C.GoString(C.flux_kvs_lookup_get_key(f))
		return nil, kvsErr("kvs lookup "+key, f, err)
	}
	return C.GoBytes(data, C.int(n)), nil
}

// ListDir returns the names in KVS directory dir of namespace ns; a missing
// directory fails with an error matching ErrNotFound.
func (h *Handle) ListDir(ctx context.Context, ns, dir string) ([]string, error) {
	return call(ctx, h, func(done func([]string, error)) {
		f := h.lookup(ns, dir, C.FLUX_KVS_READDIR, func(_ []byte, err error) { done(nil, err) })
		if f == nil {
			return
		}
		err := h.then(f, func(f *C.flux_future_t) bool {
			var d *C.flux_kvsdir_t
			if rc, err := C.flux_kvs_lookup_get_dir(f, &d); rc < 0 {
				done(nil, kvsErr("kvs readdir "+dir, f, err))
				return false
			}
			itr, err := C.flux_kvsitr_create(d)
			if itr == nil {
				done(nil, &Error{Op: "kvs readdir " + dir, Errno: errnoOf(err)})
				return false
			}
			defer C.flux_kvsitr_destroy(itr)
			var names []string
			for name := C.flux_kvsitr_next(itr); name != nil; name = C.flux_kvsitr_next(itr) {
				names = append(names, C.GoString(name))
			}
			done(names, nil)
			return false
		}, func(err error) { done(nil, err) })
		if err != nil {
			done(nil, err)
		}
	})
}

// Watch follows key in namespace ns: each value it holds (the current
// one, once it exists, then each new one) arrives on the returned
// channel, until ctx ends or the key is removed (then the channel closes
// after an event whose Err matches ErrNotFound). Events that the reader
// does not take in time are dropped but for the newest.
//
// The namespace must exist: flux-core 0.88's kvs-watch module aborts its
// broker when several watches wait for a namespace that does not exist
// yet.
func (h *Handle) Watch(ctx context.Context, ns, key string) (<-chan WatchEvent, error) {
	events := make(chan WatchEvent, 1)
	var p *pendingFuture
	_, err := call(ctx, h, func(done func(struct{}, error)) {
		f := h.lookup(ns, key, C.FLUX_KVS_WATCH|C.FLUX_KVS_WAITCREATE|C.FLUX_KVS_WATCH_UNIQ, func(_ []byte, err error) { done(struct{}{}, err) })
		if f == nil {
			return
		}
		deliver := func(ev WatchEvent) {
			select {
			case events <- ev:
			default: // keep the newest: drop the one waiting
				select {
				case <-events:
				default:
				}
				events <- ev
			}
		}
		var err error
		p, err = h.thenP(f, func(f *C.flux_future_t) bool {
			v, err := rawValue(f)
			if err != nil {
				if !errors.Is(err, syscall.ENODATA) {
					deliver(WatchEvent{Err: err})
				}
				close(events)
				return false
			}
			deliver(WatchEvent{Value: v})
			return true
		}, func(err error) {
			deliver(WatchEvent{Err: err})
			close(events)
		})
		done(struct{}{}, err)
	})
	if err != nil {
		return nil, err
	}
	// Cancel when ctx ends: the stream then ends with ENODATA.
	context.AfterFunc(ctx, func() {
		h.whilePending(p, func(f *C.flux_future_t) { C.flux_kvs_lookup_cancel(f) })
	})
	return events, nil
}

// WatchEvent is one value of a watched key, or the error that ended the
// watch.
type WatchEvent struct {
	Value []byte
	Err   error
}

// CreateNamespace makes KVS namespace ns, owned by userid (0: the
// instance owner). It fails with an error matching syscall.EEXIST if it
// exists.
func (h *Handle) CreateNamespace(ctx context.Context, ns string, userid uint32) error {
	_, err := call(ctx, h, func(done func(struct{}, error)) {
		cns := C.CString(ns)
		f, err := C.flux_kvs_namespace_create(h.h, cns, C.uint32_t(userid), 0)
		C.free(unsafe.Pointer(cns))
		if f == nil {
			done(struct{}{}, &Error{Op: "kvs namespace create " + ns, Errno: errnoOf(err)})
			return
		}
		err = h.then(f, func(f *C.flux_future_t) bool {
			done(struct{}{}, futureErr("kvs namespace create "+ns, f))
			return false
		}, func(err error) { done(struct{}{}, err) })
		if err != nil {
			done(struct{}{}, err)
		}
	})
	return err
}

// RemoveNamespace removes KVS namespace ns and everything in it.
func (h *Handle) RemoveNamespace(ctx context.Context, ns string) error {
	return h.simple(ctx, "kvs namespace remove "+ns, func() (*C.flux_future_t, error) {
		cns := C.CString(ns)
		defer C.free(unsafe.Pointer(cns))
		f, err := C.flux_kvs_namespace_remove(h.h, cns)
		return f, err
	})
}

// WaitVersion waits until this rank's broker has applied root sequence
// version of namespace ns (read-your-writes for a commit made elsewhere).
func (h *Handle) WaitVersion(ctx context.Context, ns string, version int) error {
	// flux_kvs_wait_version blocks; its request, sent with a
	// continuation, does not hold up the reactor.
	if ns == "" {
		ns = "primary"
	}
	payload := fmt.Sprintf(`{"rootseq":%d,"namespace":%q}`, version, ns)
	return h.simple(ctx, "kvs wait version", func() (*C.flux_future_t, error) {
		topic, cp := C.CString("kvs.wait-version"), C.CString(payload)
		defer C.free(unsafe.Pointer(topic))
		defer C.free(unsafe.Pointer(cp))
		f, err := C.flux_rpc(h.h, topic, cp, C.FLUX_NODEID_ANY, 0)
		return f, err
	})
}

// RootSeq returns the root sequence of namespace ns as the broker of rank
// sees it (NodeAny: this rank's broker). Asking this rank's broker about a
// namespace it does not know yet makes it load the namespace's root and
// subscribe to its changes.
func (h *Handle) RootSeq(ctx context.Context, ns string, rank uint32) (int, error) {
	if ns == "" {
		ns = "primary"
	}
	payload := fmt.Sprintf(`{"namespace":%q,"flags":0}`, ns)
	raw, err := h.RPC(ctx, "kvs.getroot", rank, append([]byte(payload), 0), 0)
	if err != nil {
		return 0, err
	}
	var ans struct {
		Seq int `json:"rootseq"`
	}
	if err := json.Unmarshal(bytes.TrimRight(raw, "\x00"), &ans); err != nil {
		return 0, fmt.Errorf("kvs getroot %s: %w", ns, err)
	}
	return ans.Seq, nil
}

// simple runs an operation whose future carries no result but success.
func (h *Handle) simple(ctx context.Context, op string, start func() (*C.flux_future_t, error)) error {
	_, err := call(ctx, h, func(done func(struct{}, error)) {
		f, err := start()
		if f == nil {
			done(struct{}{}, &Error{Op: op, Errno: errnoOf(err)})
			return
		}
		err = h.then(f, func(f *C.flux_future_t) bool {
			done(struct{}{}, futureErr(op, f))
			return false
		}, func(err error) { done(struct{}{}, err) })
		if err != nil {
			done(struct{}{}, err)
		}
	})
	return err
}
