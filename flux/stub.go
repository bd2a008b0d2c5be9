//go:build !flux

package flux

import (
	"context"
	"syscall"
	"time"
)

// Built tells whether this binary was built with Flux (the flux build tag).
const Built = false

// NodeAny addresses an RPC to whichever broker routes it.
const NodeAny = ^uint32(0)

// ErrNotFound is what a lookup of a key that is not there fails with.
var ErrNotFound = syscall.ENOENT

// Handle is a connection to a Flux broker; without Flux, none can be made.
type Handle struct{}

// Service is a registered service; without Flux, none.
type Service struct{}

// WatchEvent is one value of a watched key.
type WatchEvent struct {
	Value []byte
	Err   error
}

// Open answers ErrNotBuilt: this binary has no Flux in it.
func Open(uri string) (*Handle, error) { return nil, ErrNotBuilt }

// The methods below exist so that the packages built over this one
// compile without Flux; no Handle can exist to call them on.

func (h *Handle) Rank() uint32   { return 0 }
func (h *Handle) Size() uint32   { return 0 }
func (h *Handle) Close() error   { return ErrNotBuilt }
func (h *Handle) String() string { return "no flux" }
func (h *Handle) Commit(ctx context.Context, ns string, ops []Op) (int, error) {
	return 0, ErrNotBuilt
}
func (h *Handle) Lookup(ctx context.Context, ns, key string) ([]byte, error) { return nil, ErrNotBuilt }
func (h *Handle) ListDir(ctx context.Context, ns, dir string) ([]string, error) {
	return nil, ErrNotBuilt
}
func (h *Handle) Watch(ctx context.Context, ns, key string) (<-chan WatchEvent, error) {
	return nil, ErrNotBuilt
}
func (h *Handle) CreateNamespace(ctx context.Context, ns string, userid uint32) error {
	return ErrNotBuilt
}
func (h *Handle) RemoveNamespace(ctx context.Context, ns string) error { return ErrNotBuilt }
func (h *Handle) WaitVersion(ctx context.Context, ns string, version int) error {
	return ErrNotBuilt
}
func (h *Handle) RootSeq(ctx context.Context, ns string, rank uint32) (int, error) {
	return 0, ErrNotBuilt
}
func (h *Handle) Serve(ctx context.Context, name string) (*Service, error) { return nil, ErrNotBuilt }
func (h *Handle) RPC(ctx context.Context, topic string, nodeid uint32, payload []byte, timeout time.Duration) ([]byte, error) {
	return nil, ErrNotBuilt
}
func (h *Handle) Stream(ctx context.Context, topic string, nodeid uint32, payload []byte, each func([]byte) error) error {
	return ErrNotBuilt
}
func (h *Handle) Subscribe(ctx context.Context, topic string) (<-chan Event, error) {
	return nil, ErrNotBuilt
}
func (h *Handle) Publish(ctx context.Context, topic string, payload []byte) error {
	return ErrNotBuilt
}
func (s *Service) Name() string                           { return "" }
func (s *Service) Handle(method string, fn func(Request)) {}
func (s *Service) Close() error                           { return ErrNotBuilt }
