//go:build flux

package test

// buildTags are the tags the dyadfs binary under test is built with: the
// test binary's own.
const buildTags = "flux"
