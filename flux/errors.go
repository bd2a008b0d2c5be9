// Package flux is dyadfs's only door to libflux-core: a Flux handle driven
// by one goroutine locked to its OS thread, which runs the handle's
// reactor; the rest of dyadfs calls it through Go methods that carry no C
// type, and their calls reach that goroutine over a channel. It offers what
// dyadfs needs of Flux: the broker's rank and size, KVS transactions,
// lookups and watches, services with request handlers, RPCs to a rank
// (one response, or a stream of raw responses ended by ENODATA).
//
// The package is compiled with libflux-core when built with the "flux"
// tag (scripts/setup.sh adds it when pkg-config finds flux-core);
// otherwise Open answers ErrNotBuilt and nothing else can be reached.
package flux

import (
	"errors"
	"fmt"
	"syscall"
)

// ErrNotBuilt is returned by Open in a build without Flux.
var ErrNotBuilt = errors.New("dyadfs was built without Flux (build with -tags flux where pkg-config finds flux-core: scripts/setup.sh does)")

// Error is a failure reported by libflux-core: the operation, its errno
// and the message Flux gave with it.
type Error struct {
	Op    string
	Errno syscall.Errno
	Msg   string
}

func (e *Error) Error() string {
	if e.Msg != "" && e.Msg != e.Errno.Error() {
		return fmt.Sprintf("flux: %s: %s (%v)", e.Op, e.Msg, e.Errno)
	}
	return fmt.Sprintf("flux: %s: %v", e.Op, e.Errno)
}

// Unwrap makes errors.Is(err, syscall.ENOENT) and the like work.
func (e *Error) Unwrap() error { return e.Errno }

// ErrClosed is returned by calls on a closed handle.
var ErrClosed = errors.New("flux: handle closed")

// Op is one operation of a KVS transaction.
type Op struct {
	Key   string
	Value []byte // nil with Unlink
	// Unlink removes Key (a value or a whole directory).
	Unlink bool
}

// Put is an Op that sets key to value.
func Put(key string, value []byte) Op { return Op{Key: key, Value: value} }

// Unlink is an Op that removes key.
func Unlink(key string) Op { return Op{Key: key, Unlink: true} }

// Request is a request a service received. Respond, RespondError and
// Stream answer it; exactly one of Respond or RespondError must be called
// once (for a stream, after its last Stream), which releases it.
type Request interface {
	// Topic is the request's topic ("service.method").
	Topic() string
	// Payload is the request's raw payload, valid until the request is
	// answered.
	Payload() []byte
	// Userid is the Flux user the request came from.
	Userid() uint32
	// Respond answers with a raw payload (the last response).
	Respond(data []byte) error
	// Stream sends one response of a streaming request.
	Stream(data []byte) error
	// RespondError answers with an error (ENODATA ends a stream).
	RespondError(errno syscall.Errno, msg string) error
}

// Event is one event published in the instance.
type Event struct {
	Topic   string
	Payload []byte
}
