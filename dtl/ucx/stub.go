//go:build !ucx

package ucx

import (
	"context"

	"github.com/dyadfs/dyadfs/dtl"
)

// Built tells whether this binary was built with UCX (the ucx build tag).
const Built = false

// Transport stands in for the UCX transport in a build without UCX; New
// never returns one.
type Transport struct{}

var (
	_ dtl.Transport = (*Transport)(nil)
	_ dtl.Messenger = (*Transport)(nil)
)

// New fails: this build has no UCX.
func New(cfg dtl.Config) (*Transport, error) { return nil, ErrNotBuilt }

func (*Transport) Serve(dtl.Source) error { return ErrNotBuilt }
func (*Transport) Addr() string           { return "" }
func (*Transport) Fetch(context.Context, string, dtl.Request, *dtl.Sink) (dtl.FileInfo, error) {
	return dtl.FileInfo{}, ErrNotBuilt
}
func (*Transport) Message(context.Context, string, string, []byte) ([]byte, error) {
	return nil, ErrNotBuilt
}
func (*Transport) Close() error { return nil }
func (*Transport) Stats() Stats { return Stats{} }
