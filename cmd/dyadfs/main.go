// Command dyadfs mounts a DYAD managed directory as a FUSE filesystem:
// producers write files into node-local storage through the mount, and
// consumers anywhere open the same paths, waiting until each file is
// published.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
)

var errHelp = errors.New("help requested")

const usage = `dyadfs: a FUSE filesystem for DYAD-style producer/consumer file sharing

Usage:
  dyadfs mount [flags] MOUNTPOINT    mount the managed directory (a daemon)
  dyadfs unmount [--lazy] MOUNTPOINT end the waiting opens and unmount
  dyadfs status [--json] PATH        a mount's settings and counters
  dyadfs wait [--timeout D] PATH...  wait until files are published and here
  dyadfs prefetch [--jobs N] [--wait] PATH...
                                     bring the files under PATHs here
  dyadfs forget --store URL --namespace JOB [--dry-run]
                                     delete what a finished job keeps in
                                     the store
  dyadfs key [--key-depth D] [--key-bins B] RELPATH...
                                     print each path's metadata key (as
                                     DYAD computes it)
  dyadfs version, dyadfs --version   print the version
  dyadfs help [COMMAND]              show help

Unmount with dyadfs unmount MOUNTPOINT: it ends the opens that wait,
which make fusermount3 -u fail (busy); or send SIGTERM to the daemon.
`

func main() {
	err := run(os.Args[1:], os.Stdout)
	if err == nil || errors.Is(err, errHelp) {
		os.Exit(exitOK)
	}
	fmt.Fprintf(os.Stderr, "dyadfs: %s\n", strings.TrimSpace(err.Error()))
	var ee *exitError
	if errors.As(err, &ee) {
		os.Exit(ee.code)
	}
	os.Exit(exitInternal)
}

func run(args []string, stdout io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, usage)
		return fail(exitUsage, "no command given")
	}
	switch cmd, rest := args[0], args[1:]; cmd {
	case "mount":
		return runMount(rest)
	case "status":
		return runStatus(rest, stdout)
	case "unmount", "umount":
		return runUnmount(rest, stdout)
	case "wait":
		return runWait(rest, stdout)
	case "prefetch":
		return runPrefetch(rest, stdout)
	case "key":
		return runKey(rest, stdout)
	case "forget":
		return runForget(rest, stdout)
	case "version", "--version":
		fmt.Fprintln(stdout, versionString())
		return nil
	case "help", "-h", "--help":
		return runHelp(rest, stdout)
	default:
		if isMount8Form(args) {
			margs, err := mount8Args(args)
			if err != nil {
				return fail(exitUsage, err.Error())
			}
			return runMount(margs)
		}
		return fail(exitUsage, fmt.Sprintf("unknown command %q (see dyadfs help)", cmd))
	}
}

// helpWidth is the width help text fits in.
const helpWidth = 80

const mountUsage = `Usage: dyadfs mount [flags] MOUNTPOINT

Mounts the managed directory at MOUNTPOINT over the node-local --backing
directory and returns once the mount is ready; the daemon runs on.

Examples:
  # one node
  mkdir -p /var/tmp/dmd /mnt/dmd
  dyadfs mount --backing /var/tmp/dmd /mnt/dmd

  # a node of a job sharing files through etcd
  dyadfs mount --store etcd://10.0.0.1:2379 --namespace job42 \
    --secret-file ~/.job42.secret --backing /local/dmd /mnt/dmd

  # as mount(8) and /etc/fstab call it
  mount -t fuse.dyadfs dyadfs /mnt/dmd -o backing=/local/dmd,allow_other
`

// wrapHelp wraps one help line at helpWidth, indenting the lines after
// the first by indent spaces, and ends it with a newline.
func wrapHelp(line string, indent int) string {
	var b strings.Builder
	for len(line) > helpWidth {
		cut := strings.LastIndexByte(line[:helpWidth], ' ')
		if cut <= indent {
			break
		}
		b.WriteString(line[:cut] + "\n")
		line = strings.Repeat(" ", indent) + strings.TrimLeft(line[cut:], " ")
	}
	b.WriteString(line + "\n")
	return b.String()
}

func runHelp(args []string, stdout io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stdout, usage)
		return nil
	}
	switch args[0] {
	case "mount":
		c, _ := defaultMountConfig()
		flags, _ := mountFlags(&c)
		fmt.Fprintf(stdout, "%s\nFlags:\n%s\nEnvironment (flags win over it):\n", mountUsage, flags.FlagUsagesWrapped(helpWidth))
		for _, e := range envVars {
			fmt.Fprint(stdout, wrapHelp(fmt.Sprintf("  %-20s %s", e.name, e.help), 23))
		}
		return nil
	case "status":
		return runStatus([]string{"--help"}, stdout)
	case "unmount", "umount":
		return runUnmount([]string{"--help"}, stdout)
	case "wait":
		return runWait([]string{"--help"}, stdout)
	case "prefetch":
		return runPrefetch([]string{"--help"}, stdout)
	case "key":
		return runKey([]string{"--help"}, stdout)
	case "forget":
		return runForget([]string{"--help"}, stdout)
	}
	return fail(exitUsage, fmt.Sprintf("no help for %q (see dyadfs help)", args[0]))
}
