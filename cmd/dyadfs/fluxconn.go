package main

import (
	"fmt"
	"strings"
	"sync"

	"github.com/dyadfs/dyadfs/flux"
)

// fluxConn is the daemon's one connection to its Flux broker, opened when
// the store or the transport first needs it, shared by both.
type fluxConn struct {
	once sync.Once
	h    *flux.Handle
	err  error
}

func (f *fluxConn) handle() (*flux.Handle, error) {
	f.once.Do(func() {
		f.h, f.err = flux.Open("")
		if f.err != nil {
			f.err = fmt.Errorf("connect to the Flux broker (FLUX_URI): %w", f.err)
		}
	})
	return f.h, f.err
}

// Close closes the connection, if it was opened.
func (f *fluxConn) Close() {
	if f.h != nil {
		f.h.Close()
	}
}

// fluxService is the name of a job's service on each broker: "dyadfs-"
// and the job's namespace, in the letters a service name may have.
func fluxService(namespace, suffix string) string {
	var b strings.Builder
	b.WriteString("dyadfs-")
	for _, c := range namespace {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_':
			b.WriteRune(c)
		default:
			fmt.Fprintf(&b, "_%x", c)
		}
	}
	return b.String() + suffix
}
