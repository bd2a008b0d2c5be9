package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	iofs "io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/pflag"

	"github.com/dyadfs/dyadfs/fs"
	"github.com/dyadfs/dyadfs/fs/dmd"
	"github.com/dyadfs/dyadfs/internal/size"
)

const statusUsage = `Usage: dyadfs status [--json] PATH

Shows the settings and counters of the dyadfs mount PATH is (its
mountpoint, or any path in it): opens that waited and for how long,
publishes, lookups answered at each locator level, FUSE operations and
the errnos they ended with. The same data is in MOUNTPOINT/.dyadfs/status.
`

func runStatus(args []string, stdout io.Writer) error {
	flags := pflag.NewFlagSet("status", pflag.ContinueOnError)
	asJSON := flags.Bool("json", false, "print the raw JSON")
	flags.Usage = func() {}
	if err := flags.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			fmt.Fprint(stdout, statusUsage+"\nFlags:\n"+flags.FlagUsagesWrapped(helpWidth))
			return errHelp
		}
		return fail(exitUsage, err.Error()+" (see dyadfs help status)")
	}
	if flags.NArg() != 1 {
		return fail(exitUsage, "status takes exactly one PATH: the mountpoint, or a path in the mount (see dyadfs help status)")
	}
	arg := flags.Arg(0)
	mnt, ok := dyadfsMountOf(arg)
	if !ok {
		return fail(exitNotMounted, fmt.Sprintf("%s is not a dyadfs mount, nor inside one", arg))
	}
	// Reached from the path given, upwards (a user may search the mount
	// but not the directories above it): x/y/.. is taken as x, without
	// looking at y.
	root := mnt
	if abs, err := filepath.Abs(arg); err == nil {
		if up, err := filepath.Rel(abs, mnt); err == nil {
			root = filepath.Join(arg, up)
		}
	}
	data, err := os.ReadFile(filepath.Join(root, dmd.InternalDir, fs.StatusFile))
	if errors.Is(err, iofs.ErrNotExist) || errors.Is(err, iofs.ErrPermission) {
		return fail(exitNotMounted, fmt.Sprintf("%s is not a dyadfs mount", mnt))
	}
	if errors.Is(err, syscall.ENOTCONN) {
		return fail(exitNotMounted, fmt.Sprintf("the dyadfs daemon of %s is not running (it died; its log says why): clear the mount with dyadfs unmount %s (or fusermount3 -u %s), then mount again", mnt, mnt, mnt))
	}
	if err != nil {
		return fail(exitNotMounted, fmt.Sprintf("%s: %v", mnt, err))
	}
	if *asJSON {
		_, err := stdout.Write(data)
		return err
	}
	var st fs.Status
	if err := json.Unmarshal(data, &st); err != nil {
		return fail(exitInternal, fmt.Sprintf("status of %s: %v", mnt, err))
	}
	printStatus(stdout, &st)
	return nil
}

func printStatus(out io.Writer, st *fs.Status) {
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	row := func(k string, v any) { fmt.Fprintf(w, "%s\t%v\n", k, v) }
	row("mountpoint", st.Mountpoint)
	row("backing", st.Backing)
	row("node", st.Node)
	row("daemon pid", st.PID)
	for _, k := range sortedKeys(st.Info) {
		row(strings.ReplaceAll(k, "_", " "), st.Info[k])
	}
	row("uptime", fmt.Sprintf("%.0fs", st.Uptime))
	row("passthrough", st.Passthrough)
	row("file marks", onOff(st.FileMarks))
	fd := st.Descriptors
	row("descriptors", fmt.Sprintf("%d open of %d; file handles %d (at most %d; opens held back %d, now %d)",
		fd.Open, fd.Limit, fd.Handles, fd.HandlesMax, fd.OpensHeld, fd.OpensWaiting))
	row("heap", fmt.Sprintf("%.1f MiB live; %d allocations (%.1f MiB) since start",
		float64(st.Heap.LiveBytes)/(1<<20), st.Heap.Allocs, float64(st.Heap.AllocBytes)/(1<<20)))
	w.Flush()

	fmt.Fprintln(out, "\nmanaged directory")
	d := st.DMD
	w = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	row("  opens waited", d.OpensWaited)
	row("  wait time of finished waits", fmt.Sprintf("%.3fs (max %.3fs)", d.WaitSeconds, d.WaitMaxSeconds))
	row("  waits timed out", d.WaitTimeouts)
	row("  waits interrupted", d.WaitInterrupts)
	row("  waiting now (paths)", d.Waiting)
	row("  files being written", d.BusyFiles)
	row("  write opens", d.WriteOpens)
	row("  publishes", fmt.Sprintf("%d (errors %d, at start %d)", d.Publishes, d.PublishErrors, d.ScanPublished))
	if cl := d.Closes; cl.Count > 0 {
		mean := func(s float64) string { return fmt.Sprintf("%.0f", 1e6*s/float64(cl.Count)) }
		row("  closes that waited for the store", fmt.Sprintf("%d, mean %s µs: last-close check %s, record %s, commit %s, nodes told %s",
			cl.Count, mean(cl.TotalSeconds), mean(cl.CheckSeconds), mean(cl.RecordSeconds), mean(cl.CommitSeconds), mean(cl.TellSeconds)))
	}
	row("  fsyncs before publish", d.Fsyncs)
	row("  unpublishes", d.Unpublishes)
	row("  incomplete at start", d.ScanIncomplete)
	row("  fetches", fmt.Sprintf("%d (errors %d)", d.Fetches, d.FetchErrors))
	row("  rewrites claimed", fmt.Sprintf("%d (errors %d)", d.Claims, d.ClaimErrors))
	row("  copies here / stale copies dropped", fmt.Sprintf("%d / %d", d.Copies, d.StaleCopies))
	row("  files replaced by other nodes", d.Replaced)
	row("  files set aside (rewritten elsewhere)", d.Superseded)
	if d.OriginReads > 0 {
		row("  origin reads / published", fmt.Sprintf("%d / %d", d.OriginReads, d.OriginPublished))
	}
	c := d.Cache
	if c.CapacityBytes > 0 {
		row("  copies held / capacity", fmt.Sprintf("%s / %s (%d files, %d open; %s being fetched)",
			size.Format(c.HeldBytes), size.Format(c.CapacityBytes), c.Copies, c.PinnedByOpen, size.Format(c.ReservedBytes)))
		row("  evictions / refetches / refused (no room)", fmt.Sprintf("%d (%s) / %d / %d", c.Evictions, size.Format(int64(c.EvictedBytes)), c.Refetches, c.NoRoom))
	} else {
		row("  copies held", fmt.Sprintf("%s (%d files; no capacity: --cache-capacity)", size.Format(c.HeldBytes), c.Copies))
	}
	if r := d.Ranged; r.Opened > 0 || r.Open > 0 {
		row("  files read in ranges (now / opened / completed)", fmt.Sprintf("%d (%s here) / %d / %d", r.Open, size.Format(r.HereBytes), r.Opened, r.Installed))
		row("  ranges fetched", fmt.Sprintf("%d (%s; failed %d, corrupt blocks %d)", r.Fetches, size.Format(int64(r.Bytes)), r.Failed, r.Corrupt))
	}
	w.Flush()

	fmt.Fprintf(out, "\nwaiting opens (%d)\n", len(st.Waiters))
	if len(st.Waiters) > 0 {
		w = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
		fmt.Fprintln(w, "  waited\tpid\tcommand\tfor\tpath")
		for _, wt := range st.Waiters {
			fmt.Fprintf(w, "  %.1fs\t%d\t%s\t%s\t%s\n", wt.Seconds, wt.Pid, wt.Command, wt.For, wt.Path)
		}
		w.Flush()
	}

	fmt.Fprintln(out, "\nlocator")
	w = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	for _, lv := range []string{"local", "cache", "home", "global"} {
		row("  hits "+lv, st.Locator.Hits[lv])
	}
	row("  misses", st.Locator.Misses)
	row("  cached records", st.Locator.Cached)
	if n := st.Locator.Notices; n != nil {
		row("  members", n.Members)
		row("  messages sent / notices received", fmt.Sprintf("%d / %d (failed %d)", n.Sent, n.Received, n.Failed))
		row("  notices sent together with others", n.Batched)
		row("  changes passed on / told here", fmt.Sprintf("%d / %d", n.Breaks, n.Broken))
		row("  questions asked of another node's home", n.Asked)
		row("  promises kept as home / held", fmt.Sprintf("%d / %d", n.Holders, n.Promises))
		row("  waits woken by a notice", n.WokenBy)
		row("  waits that also watched the store", n.StoreWaits)
		row("  waits for a dead home", n.HomeWaits)
		row("  lookups held back for a commit / in vain", fmt.Sprintf("%d / %d", n.HeldLookups, n.HeldRunOut))
		row("  holders taken for cut off / promises revoked here", fmt.Sprintf("%d / %d", n.SilentHolders, n.Revoked))
	}
	for _, k := range sortedKeys(st.Intent) {
		row("  missing-name lookups: "+strings.ReplaceAll(k, "_", " "), st.Intent[k])
	}
	w.Flush()

	for _, name := range []string{"store", "transport"} {
		if m, ok := st.Extra[name].(map[string]any); ok {
			printSection(out, name, m)
		}
	}
	if len(st.Unpublished) > 0 {
		fmt.Fprintf(out, "\nunpublished files (%d listed, oldest first)\n", len(st.Unpublished))
		w = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
		fmt.Fprintln(w, "  pending\top\tpath\treason")
		for _, p := range st.Unpublished {
			fmt.Fprintf(w, "  %.1fs\t%s\t%s\t%s\n", p.Seconds, p.Op, p.Path, p.Reason)
		}
		w.Flush()
	}

	fmt.Fprintln(out, "\nFUSE operations")
	w = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "  op\tcount\terrors\tmean")
	for _, k := range sortedKeys(st.Ops) {
		o := st.Ops[k]
		fmt.Fprintf(w, "  %s\t%d\t%d\t%.1fus\n", k, o.Count, o.Errors, o.MeanMicro)
	}
	w.Flush()
	if len(st.Errnos) > 0 {
		fmt.Fprintln(out, "\nerrors by errno")
		w = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
		for _, k := range sortedKeys(st.Errnos) {
			row("  "+k, st.Errnos[k])
		}
		w.Flush()
	}
}

// printSection prints a section of the status given as a map, by key;
// counters by name (errnos) go on one line: "ENOSPC 2, EIO 1".
func printSection(out io.Writer, title string, m map[string]any) {
	fmt.Fprintln(out, "\n"+title)
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	for _, k := range sortedKeys(m) {
		v := m[k]
		switch x := v.(type) {
		case map[string]any:
			parts := make([]string, 0, len(x))
			for _, mk := range sortedKeys(x) {
				parts = append(parts, fmt.Sprintf("%s %v", mk, x[mk]))
			}
			v = strings.Join(parts, ", ")
			if len(parts) == 0 {
				v = "none"
			}
		case []any:
			parts := make([]string, 0, len(x))
			for _, e := range x {
				parts = append(parts, fmt.Sprint(e))
			}
			v = strings.Join(parts, ", ")
			if len(parts) == 0 {
				v = "none"
			}
		case nil:
			v = "none"
		case float64:
			if strings.HasSuffix(k, "_timestamp_seconds") {
				// A time (as metrics want it): shown as an age.
				v = fmt.Sprintf("%.1fs ago", float64(time.Now().UnixNano())/1e9-x)
				break
			}
			if x != float64(int64(x)) {
				v = fmt.Sprintf("%.1f", x)
			} else {
				v = int64(x)
			}
		}
		fmt.Fprintf(w, "  %s\t%v\n", strings.ReplaceAll(k, "_", " "), v)
	}
	w.Flush()
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off (no user xattrs in the backing filesystem: a restart tells copies by the store's records)"
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
