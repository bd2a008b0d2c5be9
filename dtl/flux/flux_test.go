//go:build flux

package flux_test

import (
	"crypto/rand"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/dyadfs/dyadfs/dtl"
	"github.com/dyadfs/dyadfs/dtl/dtltest"
	fluxdtl "github.com/dyadfs/dyadfs/dtl/flux"
	"github.com/dyadfs/dyadfs/flux"
	"github.com/dyadfs/dyadfs/flux/fluxtest"
)

// TestConformance runs the transport conformance suite over Flux RPC: the
// server on rank 1, the client on rank 0, each pair with its own service
// and job secret.
func TestConformance(t *testing.T) {
	in := fluxtest.Start(t, 2)
	var n atomic.Int64
	dtltest.Run(t, func(t *testing.T) (dtl.Transport, dtl.Transport) {
		secret := make([]byte, 32)
		rand.Read(secret)
		name := fmt.Sprintf("dtlt%d", n.Add(1))
		mk := func(uri, node string) dtl.Transport {
			h, err := flux.Open(uri)
			if err != nil {
				t.Fatal(err)
			}
			cfg := dtl.DefaultConfig()
			cfg.Node, cfg.Secret = node, secret
			tr, err := fluxdtl.New(h, name, cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { tr.Close(); h.Close() })
			return tr
		}
		return mk(in.URIs[1], "server-"+name), mk(in.URIs[0], "client-"+name)
	})
}
