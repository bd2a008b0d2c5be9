//go:build ucx

package test

// ucxTag is in the tags the dyadfs binary under test is built with when
// the test binary has it.
const ucxTag = "ucx"
