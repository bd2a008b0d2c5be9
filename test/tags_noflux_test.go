//go:build !flux

package test

const fluxTag = ""
