package ucxperf

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"time"
)

// Run is one ucx_perftest measurement between a server and a client,
// each started under a command prefix (ip netns exec NAME, or nothing).
type Run struct {
	ServerEnter, ClientEnter []string
	// IP is the server's address as the client reaches it.
	IP string
	// TLS is UCX_TLS; Devices are UCX_NET_DEVICES of the client and of
	// the server.
	TLS     string
	Devices [2]string
	Test    string // ucp_am_bw, ucp_put_bw, ucp_am_lat, ...
	Size    int
	Iters   int
	// Flags go to both ends ("-e" for endpoints that handle peer
	// errors, as dyadfs's do).
	Flags []string
}

// Measure runs r and returns its figure (see Result). A server serves one
// run, so each try starts one on a port of its own; the client retries
// while the server is not listening yet. ctx bounds everything.
func Measure(ctx context.Context, r Run) (float64, error) {
	var last error
	for range 5 {
		v, err := r.once(ctx)
		if err == nil {
			return v, nil
		}
		last = err
		if ctx.Err() != nil {
			break
		}
	}
	return 0, fmt.Errorf("ucx_perftest %s: %w", r.Test, last)
}

func (r Run) once(ctx context.Context) (float64, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	port := Port()
	argv := func(enter []string, dev string, args ...string) []string {
		a := append(append([]string{}, enter...), "env", "UCX_TLS="+r.TLS, "UCX_NET_DEVICES="+dev, "ucx_perftest", "-p", port)
		return append(append(a, r.Flags...), args...)
	}
	sv := argv(r.ServerEnter, r.Devices[1])
	server := exec.CommandContext(ctx, sv[0], sv[1:]...)
	if err := server.Start(); err != nil {
		return 0, err
	}
	exited := make(chan struct{})
	go func() { server.Wait(); close(exited) }()
	defer func() { cancel(); <-exited }()
	cv := argv(r.ClientEnter, r.Devices[0], r.IP, "-t", r.Test, "-s", strconv.Itoa(r.Size), "-n", strconv.Itoa(r.Iters))
	for {
		// Bounded by ctx: a client whose server went away spins.
		out, err := exec.CommandContext(ctx, cv[0], cv[1:]...).CombinedOutput()
		if err == nil {
			if v, ok := Result(r.Test, string(out)); ok {
				return v, nil
			}
			return 0, fmt.Errorf("no result in\n%s", out)
		}
		select {
		case <-exited:
			return 0, fmt.Errorf("%v\n%s\nserver: %v", err, out, server.ProcessState)
		case <-ctx.Done():
			return 0, errors.Join(ctx.Err(), err)
		case <-time.After(200 * time.Millisecond): // not listening yet
		}
	}
}
