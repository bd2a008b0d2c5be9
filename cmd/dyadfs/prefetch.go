package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	dfs "github.com/dyadfs/dyadfs/fs"
	"github.com/dyadfs/dyadfs/fs/dmd"
	"github.com/dyadfs/dyadfs/internal/size"
)

const prefetchUsage = `Usage: dyadfs prefetch [--jobs N] [--wait] [--timeout DURATION] PATH...

Brings the files published under each PATH (a file, or a directory walked
through) onto this node ahead of the reads, N at a time: a later read of
them is local. A job that reads the same tree every epoch prefetches it
once, before the first:

  dyadfs prefetch --jobs 16 /mnt/dmd/dataset && python3 train.py

A PATH published nowhere is reported and skipped, or waited for with --wait.
On a terminal a progress line shows files, bytes and the rate; the summary
goes to stdout.

Flags:
`

// prefetchStats are the counts the progress line and the summary show.
type prefetchStats struct {
	files, bytes, failed atomic.Int64
	// here: files that were here already (counted in files too).
	here atomic.Int64
}

// wholeFilesEnv makes the daemon fetch whole files for this process (see
// caller.EnvRanges): a large file would otherwise only be opened in
// ranges, and nothing of it brought here.
const wholeFilesEnv = "DYADFS_RANGES=0"

// asksWholeFiles makes sure this process's environment, as the daemon
// reads it (/proc/PID/environ: what the process started with), asks for
// whole files: if not, it starts itself again with it.
func asksWholeFiles() error {
	if os.Getenv("DYADFS_RANGES") == "0" {
		return nil
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	return syscall.Exec(self, os.Args, append(os.Environ(), wholeFilesEnv))
}

// alreadyHere reports whether the file at p, in the dyadfs mount mnt, is
// here in its current version (the mount's locate view says local),
// without opening it.
func alreadyHere(mnt, p string) bool {
	abs, err := filepath.Abs(p)
	if err != nil {
		return false
	}
	rel, err := filepath.Rel(mnt, abs)
	if err != nil || rel == "." || strings.HasPrefix(rel, "..") {
		return false
	}
	data, err := os.ReadFile(filepath.Join(mnt, dmd.InternalDir, dfs.LocateDir, url.PathEscape(rel)))
	if err != nil {
		return false
	}
	var l dfs.Located
	return json.Unmarshal(data, &l) == nil && l.Level == "local"
}

func runPrefetch(args []string, stdout io.Writer) error {
	flags := pflag.NewFlagSet("prefetch", pflag.ContinueOnError)
	jobs := flags.IntP("jobs", "j", 8, "files brought here at once")
	wait := flags.Bool("wait", false, "wait for each PATH published nowhere yet, instead of skipping it")
	timeout := flags.Duration("timeout", 0, "give up after DURATION (0: never)")
	if err := parseOperands(flags, args, prefetchUsage, "PATH", stdout); err != nil {
		return err
	}
	if *jobs < 1 || *jobs > 1024 {
		return fail(exitUsage, fmt.Sprintf("--jobs %d: want 1 to 1024", *jobs))
	}
	if *timeout < 0 {
		return fail(exitUsage, fmt.Sprintf("--timeout %v must not be negative", *timeout))
	}
	mounts := make(map[string]string, flags.NArg())
	for _, p := range flags.Args() {
		mnt, ok := dyadfsMountOf(p)
		if !ok {
			return fail(exitNotMounted, fmt.Sprintf("%s is not in a dyadfs mount: nothing to bring here", p))
		}
		mounts[p] = mnt
	}
	if err := asksWholeFiles(); err != nil {
		return fail(exitInternal, fmt.Sprintf("cannot start again asking for whole files: %v", err))
	}
	mountOf := func(p string) string {
		for root, mnt := range mounts {
			if within(filepath.Clean(p), filepath.Clean(root)) {
				return mnt
			}
		}
		m, _ := dyadfsMountOf(p)
		return m
	}

	var st prefetchStats
	line := newProgress(os.Stderr, 0)
	wipe := ""
	if line.tty {
		wipe = "\r\033[K" // the progress line's place
	}
	report := func(p string, err error) {
		st.failed.Add(1)
		fmt.Fprintf(os.Stderr, "%sdyadfs prefetch: %s: %v\n", wipe, p, err)
	}
	files := make(chan string, 4**jobs)
	// Walkers feed files to the workers: one per PATH, and one per PATH
	// that turned out to be a directory once waited for.
	var walkers sync.WaitGroup
	walk := func(root string) {
		defer walkers.Done()
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				report(p, err)
				return nil
			}
			if d.Type().IsRegular() {
				files <- p
			}
			return nil
		})
		if err != nil {
			report(root, err)
		}
	}
	var waits []string
	for _, p := range flags.Args() {
		info, err := os.Stat(p)
		switch {
		case err == nil && info.IsDir():
			walkers.Add(1)
			go walk(p)
		case err == nil:
			walkers.Add(1)
			go func() { defer walkers.Done(); files <- p }()
		case errors.Is(err, fs.ErrNotExist) && *wait:
			waits = append(waits, p)
		case errors.Is(err, fs.ErrNotExist):
			report(p, errors.New("published nowhere (pass --wait to wait for it)"))
		default:
			report(p, err)
		}
	}
	// A PATH waited for is opened by a walker of its own, which counts it
	// once it is here, or walks it if a directory took the name.
	for _, p := range waits {
		walkers.Add(1)
		go func() {
			n, err := bringHere(p)
			switch {
			case errors.Is(err, syscall.EISDIR):
				walk(p) // calls walkers.Done
				return
			case err != nil:
				report(p, err)
			default:
				st.files.Add(1)
				st.bytes.Add(n)
			}
			walkers.Done()
		}()
	}
	go func() { walkers.Wait(); close(files) }()

	start := time.Now()
	var workers sync.WaitGroup
	for range *jobs {
		workers.Add(1)
		go func() {
			defer workers.Done()
			for p := range files {
				if alreadyHere(mountOf(p), p) {
					st.here.Add(1)
				}
				n, err := bringHere(p)
				if err != nil {
					report(p, err)
					continue
				}
				st.files.Add(1)
				st.bytes.Add(n)
			}
		}()
	}
	finished := make(chan struct{})
	go func() { workers.Wait(); close(finished) }()

	ctx := context.Background()
	if *timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *timeout)
		defer cancel()
	}
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for done := false; !done; {
		select {
		case <-finished:
			done = true
		case <-tick.C:
			line.show(st.summary(time.Since(start)))
		case <-ctx.Done():
			line.done()
			return fail(exitPrefetch, fmt.Sprintf("not done within %v: %s", *timeout, st.summary(time.Since(start))))
		}
	}
	line.done()
	fmt.Fprintln(stdout, "prefetched "+st.summary(time.Since(start)))
	if n := st.failed.Load(); n > 0 {
		return fail(exitPrefetch, fmt.Sprintf("%d path(s) could not be brought here (see above)", n))
	}
	return nil
}

// bringHere opens p for reading, which on a dyadfs mount brings its file
// here (waiting for it if it is published nowhere yet), and returns its
// size.
func bringHere(p string) (int64, error) {
	fd, err := syscall.Open(p, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	for errors.Is(err, syscall.EINTR) {
		fd, err = syscall.Open(p, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	}
	if err != nil {
		return 0, err
	}
	defer syscall.Close(fd)
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return 0, err
	}
	return st.Size, nil
}

func (s *prefetchStats) summary(took time.Duration) string {
	files, bytes := s.files.Load(), s.bytes.Load()
	secs := max(took.Seconds(), 1e-3)
	here := s.here.Load()
	return fmt.Sprintf("%d files (%d here already, %d fetched), %s in %v (%.0f files/s, %s/s), %d failed",
		files, here, files-here, size.Format(bytes), took.Round(time.Millisecond), float64(files)/secs, size.Format(int64(float64(bytes)/secs)), s.failed.Load())
}
