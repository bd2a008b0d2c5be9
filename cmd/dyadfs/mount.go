package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	iofs "io/fs"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"

	"github.com/dyadfs/dyadfs/dtl"
	"github.com/dyadfs/dyadfs/fs"
	"github.com/dyadfs/dyadfs/fs/dmd"

	"github.com/dyadfs/dyadfs/metrics"
)

// readyFDEnv names the descriptor on which a daemon started by `dyadfs
// mount` reports "ok" or its error to the command that started it.
const readyFDEnv = "DYADFS_READY_FD"

func runMount(args []string) (err error) {
	// A daemon started by `dyadfs mount` reports how its start ended, so
	// that the command exits as the daemon would have.
	ready := readyReporter()
	defer func() { ready(err) }()
	c, err := defaultMountConfig()
	if err != nil {
		return fail(exitUsage, err.Error())
	}
	flags, vals := mountFlags(&c)
	if err := flags.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			runHelp([]string{"mount"}, os.Stdout)
			return errHelp
		}
		return fail(exitUsage, err.Error()+" (see dyadfs help mount)")
	}
	if err := vals.finish(&c, flags.Args()); err != nil {
		return err
	}
	if err := preflight(&c); err != nil {
		return err
	}
	if !c.Foreground && !isDaemon() {
		return daemonize(&c, args)
	}
	return serve(&c, ready)
}

// preflight checks what a user can get wrong before anything is started.
func preflight(c *mountConfig) error {
	if c.defaultBacking {
		if err := makeDefaultBacking(c.DMD.Backing); err != nil {
			return fail(exitBacking, fmt.Sprintf("backing directory %s (the default): %v: pass --backing DIR on node-local storage", c.DMD.Backing, err))
		}
	}
	st, err := os.Stat(c.DMD.Backing)
	switch {
	case errors.Is(err, iofs.ErrNotExist):
		return fail(exitBacking, fmt.Sprintf("backing directory %s does not exist: create it (mkdir -p %s) or pass another --backing", c.DMD.Backing, c.DMD.Backing))
	case err != nil:
		return fail(exitBacking, fmt.Sprintf("backing directory %s: %v", c.DMD.Backing, err))
	case !st.IsDir():
		return fail(exitBacking, fmt.Sprintf("backing directory %s is not a directory", c.DMD.Backing))
	}
	if err := unix.Access(c.DMD.Backing, unix.W_OK|unix.X_OK); err != nil {
		return fail(exitBacking, fmt.Sprintf("backing directory %s is not writable (%v): pass a writable --backing", c.DMD.Backing, err))
	}
	if c.DMD.Backing, err = filepath.EvalSymlinks(c.DMD.Backing); err != nil {
		return fail(exitBacking, fmt.Sprintf("backing directory: %v", err))
	}

	st, err = os.Stat(c.Mountpoint)
	switch {
	case errors.Is(err, iofs.ErrNotExist):
		return fail(exitMountpoint, fmt.Sprintf("mountpoint %s does not exist: create it (mkdir -p %s)", c.Mountpoint, c.Mountpoint))
	case errors.Is(err, syscall.ENOTCONN):
		return fail(exitMountpoint, fmt.Sprintf("mountpoint %s is still mounted, but its daemon is not running (it died): clear it with dyadfs unmount %s (or fusermount3 -u %s), then mount again", c.Mountpoint, c.Mountpoint, c.Mountpoint))
	case err != nil:
		return fail(exitMountpoint, fmt.Sprintf("mountpoint %s: %v", c.Mountpoint, err))
	case !st.IsDir():
		return fail(exitMountpoint, fmt.Sprintf("mountpoint %s is not a directory", c.Mountpoint))
	}
	if c.Mountpoint, err = filepath.EvalSymlinks(c.Mountpoint); err != nil {
		return fail(exitMountpoint, fmt.Sprintf("mountpoint: %v", err))
	}
	if fstype, ok := mountedAt(c.Mountpoint); ok {
		var sfs unix.Statfs_t
		if strings.HasPrefix(fstype, "fuse") && errors.Is(unix.Statfs(c.Mountpoint, &sfs), unix.ENOTCONN) {
			return fail(exitMountpoint, fmt.Sprintf("mountpoint %s is still mounted, but its daemon is not running (it died): clear it with dyadfs unmount %s (or fusermount3 -u %s), then mount again", c.Mountpoint, c.Mountpoint, c.Mountpoint))
		}
		return fail(exitMountpoint, fmt.Sprintf("%s is already mounted (%s): unmount it first (fusermount3 -u %s)", c.Mountpoint, fstype, c.Mountpoint))
	}
	if within(c.DMD.Backing, c.Mountpoint) {
		return fail(exitBacking, fmt.Sprintf("backing directory %s is inside the mountpoint %s: choose a backing directory outside the mount", c.DMD.Backing, c.Mountpoint))
	}
	if within(c.Mountpoint, c.DMD.Backing) {
		return fail(exitBacking, fmt.Sprintf("mountpoint %s is inside the backing directory %s: choose a mountpoint outside it", c.Mountpoint, c.DMD.Backing))
	}

	if fs := networkFS(c.DMD.Backing); fs != "" && !c.DMD.SharedStorage && !isDaemon() {
		fmt.Fprintf(os.Stderr, "dyadfs: warning: backing directory %s is on %s, which other machines share: pass --shared-storage if every node mounts it, or use node-local storage\n", c.DMD.Backing, fs)
	}
	// Another daemon on this backing directory: say so before mounting.
	l, err := lockBacking(c.DMD.Backing, c.DMD.Node, c.DMD.SharedStorage)
	if err != nil {
		return fail(exitBacking, err.Error())
	}
	l.release()

	if _, err := os.Stat("/dev/fuse"); err != nil {
		return fail(exitNoFuse, "/dev/fuse is missing: load the fuse module (modprobe fuse) or run where FUSE is available")
	}
	if _, err := findFusermount(); err != nil {
		return err
	}
	return nil
}

// within reports whether p is dir or below it.
func within(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, strings.TrimSuffix(dir, "/")+"/")
}

// mountedAt reports whether something is mounted exactly at dir in this
// mount namespace, and its type.
func mountedAt(dir string) (string, bool) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "", false
	}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 10 || unescapeMountinfo(f[4]) != dir {
			continue
		}
		// Fields after the optional ones: " - fstype source options".
		for i, x := range f {
			if x == "-" && i+1 < len(f) {
				return f[i+1], true
			}
		}
		return "unknown type", true
	}
	return "", false
}

// dyadfsMountOf returns the dyadfs mount that p is in (p itself, or a
// directory under it), from /proc/self/mountinfo: a path inside the mount
// is never opened to find it (a name published nowhere would make the
// open wait).
func dyadfsMountOf(p string) (string, bool) {
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", false
	}
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "", false
	}
	best, bestType := "", ""
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 10 {
			continue
		}
		dir := unescapeMountinfo(f[4])
		if !within(abs, dir) || len(dir) < len(best) {
			continue
		}
		best, bestType = dir, ""
		for i, x := range f {
			if x == "-" && i+1 < len(f) {
				bestType = f[i+1]
				break
			}
		}
	}
	return best, bestType == "fuse.dyadfs"
}

// unescapeMountinfo undoes the octal escapes (\040 for space) of mountinfo.
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// daemonize starts this program again as a background daemon and returns
// once it reports that the mount is ready, or with its error.
func daemonize(c *mountConfig, args []string) error {
	self, err := os.Executable()
	if err != nil {
		return fail(exitInternal, fmt.Sprintf("cannot find the dyadfs executable: %v", err))
	}
	logf, err := os.OpenFile(c.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fail(exitUsage, fmt.Sprintf("log file %s: %v (pass a writable --log-file)", c.LogFile, err))
	}
	defer logf.Close()
	r, w, err := os.Pipe()
	if err != nil {
		return fail(exitInternal, fmt.Sprintf("start the dyadfs daemon: %v", err))
	}
	defer r.Close()

	// The daemon's own flags go first: a "--" among the user's arguments
	// would turn anything after it into a mountpoint.
	child := exec.Command(self, append([]string{"mount", "--foreground", "--log-file", c.LogFile}, args...)...)
	child.Env = append(os.Environ(), readyFDEnv+"=3")
	child.ExtraFiles = []*os.File{w}
	child.Stdout, child.Stderr = logf, logf
	child.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := child.Start(); err != nil {
		w.Close()
		return fail(exitInternal, fmt.Sprintf("start the dyadfs daemon: %v", err))
	}
	w.Close()

	line, _ := bufio.NewReader(r).ReadString('\n')
	line = strings.TrimSpace(line)
	if line == "ok" {
		child.Process.Release()
		return nil
	}
	if code, msg, ok := strings.Cut(line, " "); ok {
		if n, err := strconv.Atoi(code); err == nil {
			child.Wait()
			return fail(n, msg)
		}
	}
	state, _ := child.Process.Wait()
	return fail(exitDaemon, fmt.Sprintf("the dyadfs daemon exited before the mount was ready (%v): see %s", state, c.LogFile))
}

// isDaemon reports whether this process is a daemon started by `dyadfs
// mount`: it never starts another.
func isDaemon() bool {
	_, ok := os.LookupEnv(readyFDEnv)
	return ok
}

// readyReporter returns the function a daemon calls (the first call counts)
// with nil when the mount is ready or with the error that stopped it.
func readyReporter() func(error) {
	fdStr, ok := os.LookupEnv(readyFDEnv)
	if !ok {
		return func(error) {}
	}
	fd, err := strconv.Atoi(fdStr)
	if err != nil {
		return func(error) {}
	}
	f := os.NewFile(uintptr(fd), "ready")
	return func(err error) {
		if f == nil {
			return
		}
		if err == nil {
			fmt.Fprintln(f, "ok")
		} else {
			code := exitInternal
			var ee *exitError
			if errors.As(err, &ee) {
				code = ee.code
			}
			fmt.Fprintf(f, "%d %s\n", code, strings.ReplaceAll(err.Error(), "\n", " "))
		}
		f.Close()
		f = nil
	}
}

// serve runs the daemon: it opens the store, scans the backing directory,
// mounts, reports readiness, and serves until unmounted or signalled.
func serve(c *mountConfig, ready func(error)) (err error) {
	// Files and directories made for callers take exactly the mode the
	// kernel passes, which has the caller's umask applied already.
	syscall.Umask(0)
	// Most of the daemon's heap is what it keeps per file, which stays;
	// the default GOGC (100) lets the heap grow to twice that before a
	// collection. 40% of it as headroom takes about a fifth off the
	// daemon's memory, for one or two percent more of its CPU (the
	// collector's share of it: 3% at 50, 5% at 40; docs/performance.md).
	// GOGC in the environment still decides.
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(40)
	}
	// Signals that arrive while the mount is being set up unmount it as
	// soon as it exists.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	log, closeLog, err := openLog(c)
	if err != nil {
		return err
	}
	defer closeLog()
	log.Info("starting", "mountpoint", c.Mountpoint, "backing", c.DMD.Backing, "store", c.StoreURL, "namespace", c.Locator.Namespace)
	if fs := networkFS(c.DMD.Backing); fs != "" && !c.DMD.SharedStorage {
		log.Warn("the backing directory is on a filesystem other machines share; pass --shared-storage if every node mounts it", "filesystem", fs)
	}

	// The daemon, built top to bottom: the store, the transport (when
	// files move between nodes), the managed directory with its locator
	// and fetcher over them, the scan of what the backing directory
	// holds, then serving peers, joining the job and mounting.
	ctx := context.Background()
	var fx fluxConn
	defer fx.Close()
	if c.nodeFromRank {
		// In a Flux instance, a node is its broker's rank.
		h, err := fx.handle()
		if err != nil {
			return fail(exitStore, err.Error())
		}
		c.DMD.Node = strconv.FormatUint(uint64(h.Rank()), 10)
		c.Transport.Node = c.DMD.Node
	}
	// One daemon per backing directory (and node, with shared storage).
	lock, err := lockBacking(c.DMD.Backing, c.DMD.Node, c.DMD.SharedStorage)
	if err != nil {
		return fail(exitBacking, err.Error())
	}
	defer lock.release()
	lock.say(fmt.Sprintf("the dyadfs daemon (pid %d) mounted at %s", os.Getpid(), c.Mountpoint))
	store, err := openStore(ctx, c.StoreURL, c.Locator.Namespace, &fx, false, c.Etcd)
	if err != nil {
		return storeFailed(err)
	}
	defer store.Close()
	var transport dtl.Transport
	if sharesFiles(c) {
		if transport, err = openTransport(ctx, c, store, &fx, log); err != nil {
			return err
		}
	} else if c.DMD.SharedStorage {
		log.Info("shared storage: files are not transferred")
	}
	kernel := fs.NewKernelNotifier()
	d, err := dmd.New(c.DMD, dmd.Parts{
		Store:         store,
		Locator:       c.Locator,
		Transport:     transport,
		TransportName: c.DTL,
		FetchTimeout:  c.FetchTimeout,
		Notifier:      kernel,
		Log:           log,
	})
	if err != nil {
		if transport != nil {
			transport.Close()
		}
		return fail(exitBacking, err.Error())
	}
	defer d.Close()
	if transport != nil {
		// Before the DMD closes: nothing is served from it afterwards.
		defer transport.Close()
	}
	res, err := d.Scan(ctx)
	if err != nil {
		return fail(exitBacking, fmt.Sprintf("scan %s: %v", c.DMD.Backing, err))
	}
	log.Info("backing directory scanned", "published", res.Published, "incomplete", res.Incomplete, "dropped_copies", res.Dropped)
	if transport != nil {
		stop, err := joinJob(ctx, c, transport, d, log)
		if err != nil {
			return err
		}
		defer stop()
	}

	c.FS.Mountpoint = c.Mountpoint
	c.FS.Info = map[string]string{
		"version":      versionString(),
		"store":        c.StoreURL,
		"namespace":    c.Locator.Namespace,
		"log_file":     c.LogFile,
		"wait_timeout": durationOrZero(c.DMD.WaitTimeout),
	}
	mctx, stopMonitor := context.WithCancel(ctx)
	defer stopMonitor()
	monitor := watchStore(mctx, store, c.StoreURL, c.Locator.Namespace)
	var transportSection func() map[string]any
	if transport != nil {
		c.FS.Info["transport"] = c.DTL + " " + transport.Addr()
		transportSection = transportStatus(c.DTL, transport, d)
	}
	c.FS.Extra = func() map[string]any {
		extra := map[string]any{"store": monitor.section(d)}
		if transportSection != nil {
			extra["transport"] = transportSection()
		}
		return extra
	}
	// Metrics listen before the mount, so that a bad address fails it;
	// scrapes before the mount is up see no status counters.
	var mounted atomic.Pointer[fs.FS]
	if c.Metrics != "" {
		ms, err := metrics.Serve(c.Metrics, func() any {
			if f := mounted.Load(); f != nil {
				return f.Status()
			}
			return nil
		})
		if err != nil {
			return fail(exitMetrics, fmt.Sprintf("--metrics %s: %v", c.Metrics, err))
		}
		defer ms.Close()
		c.FS.Info["metrics"] = "http://" + ms.Addr() + "/metrics"
		log.Info("serving metrics", "addr", ms.Addr())
	}
	fsys, err := fs.Mount(c.FS, d, kernel, log)
	if err != nil {
		return fail(exitMountFailed, err.Error())
	}
	mounted.Store(fsys)
	os.Unsetenv(readyFDEnv)
	ready(nil)
	notifySystemd("READY=1\nSTATUS=mounted at " + c.Mountpoint)
	if c.CPUProfile != "" {
		if f, err := os.Create(c.CPUProfile); err == nil {
			pprof.StartCPUProfile(f)
			defer f.Close()
			defer pprof.StopCPUProfile()
		}
	}
	if c.AllocProfile != "" {
		defer func() {
			if f, err := os.Create(c.AllocProfile); err == nil {
				pprof.Lookup("allocs").WriteTo(f, 0)
				f.Close()
			}
		}()
	}

	go func() {
		s, ok := <-sigs
		if !ok {
			return
		}
		log.Info("signal received; unmounting", "signal", s.String())
		if err := fsys.Unmount(); err != nil {
			log.Error("unmount", "err", err)
		}
	}()
	fsys.Wait()
	log.Info("unmounted; exiting", "mountpoint", c.Mountpoint)
	return nil
}

func openLog(c *mountConfig) (*slog.Logger, func(), error) {
	w, closer := os.Stderr, func() {}
	if c.LogFile != "" {
		f, err := os.OpenFile(c.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return nil, nil, fail(exitUsage, fmt.Sprintf("log file %s: %v (pass a writable --log-file)", c.LogFile, err))
		}
		w, closer = f, func() { f.Close() }
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: c.LogLevel})), closer, nil
}
