//go:build flux

package test

// fluxTag is in the tags the dyadfs binary under test is built with when
// the test binary has it.
const fluxTag = "flux"
