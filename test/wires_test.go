package test

import (
	"testing"

	"github.com/dyadfs/dyadfs/dtl"
	"github.com/dyadfs/dyadfs/dtl/ucx"
)

// A wire is a data transport the multi-node tests run over: the mount
// flags that choose it and the environment its daemons need.
type wire struct {
	name  string
	flags []string
	env   []string
}

// tcpWire is the default transport.
var tcpWire = wire{name: "tcp"}

// ucxWire is UCX forced onto TCP: network namespaces do not separate
// shared memory, so between nodes on one machine UCX must not use it.
var ucxWire = wire{name: "ucx", flags: []string{"--dtl", "ucx"}, env: []string{"UCX_TLS=tcp"}}

// forEachWire runs test once per transport, as a subtest named after it.
// UCX's subtest skips, saying so, in a build without it.
func forEachWire(t *testing.T, test func(t *testing.T, w wire)) {
	for _, w := range []wire{tcpWire, ucxWire} {
		t.Run(w.name, func(t *testing.T) {
			if w.name == "ucx" && ucxTag == "" {
				t.Skip("skipping: built without UCX (install libucx-dev and test with -tags ucx, as scripts/test.sh does)")
			}
			test(t, w)
		})
	}
}

// newUCX makes a UCX transport (an error in a build without UCX).
func newUCX(cfg dtl.Config) (dtl.Transport, error) {
	t, err := ucx.New(cfg)
	if err != nil {
		return nil, err
	}
	return t, nil
}
