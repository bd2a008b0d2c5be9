//go:build !ucx

package test

const ucxTag = ""
