package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"github.com/dyadfs/dyadfs/fs"
	"github.com/dyadfs/dyadfs/fs/dmd"
)

const unmountUsage = `Usage: dyadfs unmount [--lazy] [--timeout D] MOUNTPOINT

Unmounts a dyadfs mount. Opens that wait for a file to be published are
ended first (they fail with ENOTCONN), so that a waiting consumer does not
keep the mount busy, as it does for fusermount3 -u. If programs still have
files open under it, the command fails and says so; with --lazy the mount
is detached at once instead, and the daemon exits once those files are
closed (so it is, too, when only working directories keep it busy). A
mount whose daemon died is cleared.
`

func runUnmount(args []string, stdout io.Writer) error {
	flags := pflag.NewFlagSet("unmount", pflag.ContinueOnError)
	lazy := flags.BoolP("lazy", "z", false, "detach at once, even while files are open under the mount")
	timeout := flags.Duration("timeout", 30*time.Second, "how long to wait for the daemon to end its waits and unmount")
	flags.Usage = func() {}
	if err := flags.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			fmt.Fprint(stdout, unmountUsage)
			fmt.Fprint(stdout, "\nFlags:\n"+flags.FlagUsagesWrapped(helpWidth))
			return errHelp
		}
		return fail(exitUsage, err.Error()+" (see dyadfs help unmount)")
	}
	if flags.NArg() != 1 {
		return fail(exitUsage, "unmount takes exactly one MOUNTPOINT (see dyadfs help unmount)")
	}
	mp, err := filepath.Abs(flags.Arg(0))
	if err != nil {
		return fail(exitUsage, err.Error())
	}
	fstype, ok := mountedAt(mp)
	switch {
	case !ok:
		return fail(exitNotMounted, fmt.Sprintf("nothing is mounted at %s", mp))
	case fstype != "fuse.dyadfs":
		return fail(exitNotMounted, fmt.Sprintf("%s is a %s mount, not a dyadfs one", mp, fstype))
	}
	fusermount, err := findFusermount()
	if err != nil {
		return err
	}
	if *lazy {
		// The daemon sees the mount go and ends every wait itself.
		if out, err := exec.Command(fusermount, "-u", "-z", mp).CombinedOutput(); err != nil {
			return fail(exitMountFailed, fmt.Sprintf("%s -u -z %s: %s", filepath.Base(fusermount), mp, fusermountMessage(out, err)))
		}
		return nil
	}
	out, err := exec.Command(fusermount, "-u", mp).CombinedOutput()
	if err == nil {
		return nil
	}
	if !strings.Contains(string(out), "busy") {
		return fail(exitMountFailed, fmt.Sprintf("%s -u %s: %s", filepath.Base(fusermount), mp, fusermountMessage(out, err)))
	}
	// Busy: waiting opens (which the daemon ends), or open files.
	data, err := os.ReadFile(filepath.Join(mp, dmd.InternalDir, fs.StatusFile))
	if err != nil {
		return fail(exitMountFailed, fmt.Sprintf("%s is busy, and its status cannot be read (%v): close what is open under it, or dyadfs unmount --lazy %s", mp, err, mp))
	}
	var st fs.Status
	if err := json.Unmarshal(data, &st); err != nil || st.PID <= 0 {
		return fail(exitInternal, fmt.Sprintf("status of %s: no daemon pid (%v)", mp, err))
	}
	if open := st.Descriptors.Handles; open > 0 {
		return fail(exitMountFailed, fmt.Sprintf("%s is busy: %d files are open under it (fuser -vm %s lists who holds them); close them, or dyadfs unmount --lazy %s", mp, open, mp, mp))
	}
	if err := syscall.Kill(st.PID, syscall.SIGTERM); err != nil {
		return fail(exitInternal, fmt.Sprintf("cannot signal the daemon of %s (pid %d): %v", mp, st.PID, err))
	}
	deadline := time.Now().Add(*timeout)
	for {
		if _, ok := mountedAt(mp); !ok {
			fmt.Fprintf(stdout, "unmounted %s; %d waiting opens were ended (ENOTCONN)\n", mp, len(st.Waiters))
			return nil
		}
		if time.Now().After(deadline) {
			return fail(exitMountFailed, fmt.Sprintf("%s is still mounted %v after its daemon (pid %d) was told to unmount: see its log", mp, *timeout, st.PID))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// findFusermount finds fusermount3 (see fs.FusermountPath).
func findFusermount() (string, error) {
	if p, ok := fs.FusermountPath(); ok {
		return p, nil
	}
	return "", fail(exitNoFuse, "fusermount3 not found: install fuse3 (apt-get install fuse3, or run scripts/setup.sh)")
}

// fusermountMessage is what fusermount said, or how it ended if it said
// nothing.
func fusermountMessage(out []byte, err error) string {
	if msg := fs.FusermountSaid(out); msg != "" {
		return msg
	}
	return err.Error()
}
