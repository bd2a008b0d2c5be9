package test

import (
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"syscall"
)

// The test binary doubles as a helper program when DYADFS_TEST_HELPER is
// set, for what shell tools cannot show (the errno of an interrupted open).
const helperEnv = "DYADFS_TEST_HELPER"

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
	mode, ok := os.LookupEnv(helperEnv)
	if !ok {
		return false
	}
	switch mode {
	case "open":
		// open(2) the path with a SIGUSR1 handler installed and print
		// "ok" or the errno it failed with.
		signal.Notify(make(chan os.Signal, 1), syscall.SIGUSR1)
		fmt.Println("ready")
		fd, err := syscall.Open(os.Args[len(os.Args)-1], syscall.O_RDONLY, 0)
		if err != nil {
			fmt.Println(err.(syscall.Errno).Error())
			os.Exit(0)
		}
		syscall.Close(fd)
		fmt.Println("ok")
	default:
		fmt.Fprintf(os.Stderr, "unknown helper %q\n", mode)
		os.Exit(2)
	}
	os.Exit(0)
	return true
}
