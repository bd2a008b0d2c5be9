package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"
)

const waitUsage = `Usage: dyadfs wait [--timeout DURATION] PATH...

Waits until every PATH under a dyadfs mount can be opened, that is until each
file is published and complete on this node, then exits 0. For tools that
look at a file before opening it (cp and rsync stat their sources, and stat
of a missing file answers at once), run dyadfs wait first:

  dyadfs wait /mnt/dmd/run1/step7.dat && cp /mnt/dmd/run1/step7.dat /results/

Flags:
`

func runWait(args []string, stdout io.Writer) error {
	flags := pflag.NewFlagSet("wait", pflag.ContinueOnError)
	timeout := flags.Duration("timeout", 0, "give up after DURATION (0: wait as long as the mount's --wait-timeout allows)")
	if err := parseOperands(flags, args, waitUsage, "PATH", stdout); err != nil {
		return err
	}
	if *timeout < 0 {
		return fail(exitUsage, fmt.Sprintf("--timeout %v must not be negative", *timeout))
	}

	for _, p := range flags.Args() {
		if _, ok := dyadfsMountOf(p); !ok {
			return fail(exitNotMounted, fmt.Sprintf("%s is not in a dyadfs mount: nothing would publish it", p))
		}
	}
	type done struct {
		path string
		err  error
	}
	donec := make(chan done, flags.NArg())
	for _, p := range flags.Args() {
		go func() { donec <- done{p, openAndClose(p)} }()
	}
	var expired <-chan time.Time
	if *timeout > 0 {
		t := time.NewTimer(*timeout)
		defer t.Stop()
		expired = t.C
	}
	pending := make(map[string]bool, flags.NArg())
	for _, p := range flags.Args() {
		pending[p] = true
	}
	for range flags.NArg() {
		select {
		case d := <-donec:
			if d.err != nil {
				return fail(exitWait, d.err.Error())
			}
			delete(pending, d.path)
		case <-expired:
			var names []string
			for _, p := range flags.Args() {
				if pending[p] {
					names = append(names, p)
				}
			}
			return fail(exitWait, fmt.Sprintf("%d of %d files not published within %v: %s", len(names), flags.NArg(), *timeout, strings.Join(names, " ")))
		}
	}
	return nil
}

// openAndClose opens p for reading, which on a dyadfs mount waits until p
// is published and complete here.
func openAndClose(p string) error {
	fd, err := syscall.Open(p, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	for errors.Is(err, syscall.EINTR) {
		fd, err = syscall.Open(p, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	}
	if err != nil {
		return &os.PathError{Op: "wait for", Path: p, Err: err}
	}
	return syscall.Close(fd)
}
