package test

import (
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"syscall"
)

// The test binary doubles as a helper program when DYADFS_TEST_HELPER is
// set, for what shell tools cannot do (report the errno of an interrupted
// open, talk to a transport from inside a node's network namespace).
const helperEnv = "DYADFS_TEST_HELPER"

// helpers maps a helper's name to its code; it gets the command-line
// arguments after the program name and returns the exit code. Test files
// add their helpers in init.
var helpers = map[string]func(args []string) int{
	// open: open(2) the path with a SIGUSR1 handler installed and print
	// "ok" or the errno it failed with.
	"open": func(args []string) int {
		signal.Notify(make(chan os.Signal, 1), syscall.SIGUSR1)
		fmt.Println("ready")
		fd, err := syscall.Open(args[len(args)-1], syscall.O_RDONLY, 0)
		if err != nil {
			fmt.Println(err.(syscall.Errno).Error())
			return 0
		}
		syscall.Close(fd)
		fmt.Println("ok")
		return 0
	},
}

// A process-directed signal goes to a thread that does not block it,
// preferring the thread group leader. The helper's open must run on that
// thread to be interrupted; init runs there, and locking keeps main there.
func init() {
	if _, ok := os.LookupEnv(helperEnv); ok {
		runtime.LockOSThread()
	}
}

// runHelper runs the helper and exits if the binary was started as one.
func runHelper() bool {
	name, ok := os.LookupEnv(helperEnv)
	if !ok {
		return false
	}
	h, ok := helpers[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "unknown helper %q\n", name)
		os.Exit(2)
	}
	os.Exit(h(os.Args[1:]))
	return true
}
