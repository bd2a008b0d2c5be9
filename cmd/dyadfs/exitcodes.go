package main

// Exit codes of the dyadfs command. Scripts can tell failures apart by them.
const (
	exitOK          = 0
	exitInternal    = 1  // an unexpected failure; the message says what
	exitUsage       = 2  // unknown command or flag, bad flag value
	exitBacking     = 3  // backing directory missing, not a directory, not writable, inside the mount, in use
	exitMountpoint  = 4  // mountpoint missing, not a directory, already mounted
	exitNoFuse      = 5  // /dev/fuse or fusermount3 missing
	exitMountFailed = 6  // the kernel refused the mount
	exitStore       = 7  // the metadata store cannot be opened
	exitNotMounted  = 8  // the path is not a dyadfs mount (status)
	exitDaemon      = 9  // the background daemon died before the mount was ready
	exitWait        = 10 // wait: a file could not be opened, or the timeout passed
	exitTransport   = 11 // the data transport could not listen
	exitNodeInUse   = 12 // another running daemon of the namespace has this node id
	exitJobRunning  = 13 // forget: daemons of the namespace are running
	exitPrefetch    = 14 // prefetch: a path could not be brought here, or the timeout passed
	exitMetrics     = 15 // mount: the metrics address could not be listened on
	exitSecret      = 16 // mount: this node's job secret is not the one the job's nodes use
	exitNothing     = 17 // forget: the namespace has nothing in the store
)

// exitError is an error with the exit code it ends the command with.
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

func fail(code int, msg string) error { return &exitError{code: code, msg: msg} }
