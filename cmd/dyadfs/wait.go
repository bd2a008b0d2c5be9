package main

import (
	"errors"
	"fmt"
	"io"
	"os"
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

	errc := make(chan error, flags.NArg())
	for _, p := range flags.Args() {
		go func() { errc <- openAndClose(p) }()
	}
	var expired <-chan time.Time
	if *timeout > 0 {
		t := time.NewTimer(*timeout)
		defer t.Stop()
		expired = t.C
	}
	for range flags.NArg() {
		select {
		case err := <-errc:
			if err != nil {
				return fail(exitWait, err.Error())
			}
		case <-expired:
			return fail(exitWait, fmt.Sprintf("not every file was published within %v", *timeout))
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
