//go:build !ucx

package ucx

import (
	"errors"
	"strings"
	"testing"

	"github.com/dyadfs/dyadfs/dtl"
)

// TestBuiltWithout: without the ucx build tag, New says how to get UCX.
func TestBuiltWithout(t *testing.T) {
	cfg := dtl.DefaultConfig()
	cfg.Node, cfg.Listen, cfg.Secret = "n", ":0", make([]byte, 32)
	if Built {
		t.Error("Built is true in a build without UCX")
	}
	tr, err := New(cfg)
	if tr != nil || !errors.Is(err, ErrNotBuilt) {
		t.Fatalf("New: %v, %v", tr, err)
	}
	for _, want := range []string{"without UCX", "-tags ucx", "libucx-dev"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not say %q", err, want)
		}
	}
}
