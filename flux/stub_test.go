//go:build !flux

package flux_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/dyadfs/dyadfs/flux"
)

// TestNotBuilt: without the flux tag, Open says so and how to fix it.
func TestNotBuilt(t *testing.T) {
	_, err := flux.Open("")
	if !errors.Is(err, flux.ErrNotBuilt) || !strings.Contains(err.Error(), "built without Flux") {
		t.Fatalf("Open in a build without Flux: %v", err)
	}
}
