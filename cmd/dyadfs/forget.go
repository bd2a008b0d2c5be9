package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"

	"github.com/dyadfs/dyadfs/hfl"
	"github.com/dyadfs/dyadfs/hfl/store"
)

const forgetUsage = `Usage: dyadfs forget --store URL --namespace JOB [--dry-run] [--force]
                     [--page N]

Deletes everything a finished job (namespace) keeps in the metadata store:
its records, the directory index, its daemons' registrations and its job
secret, a page of keys at a time. It refuses while a daemon of the job is
running, unless --force; --dry-run only says what it would delete. A
namespace that had nothing in the store (a typo?) is an error (exit code
17). The files themselves stay in each node's backing directory. To give
the space back to etcd afterwards, compact and defragment it (etcdctl
compact REV; etcdctl defrag).

Flags:
`

func runForget(args []string, stdout io.Writer) error {
	flags := pflag.NewFlagSet("forget", pflag.ContinueOnError)
	flags.Usage = func() {}
	url := flags.String("store", lookupEnvOr("DYADFS_STORE", ""), "metadata store `URL`: etcd://host:port[,host:port...], https://... for etcd over TLS (DYADFS_STORE)")
	ns := flags.String("namespace", lookupEnvOr("DYAD_KVS_NAMESPACE", ""), "the job's `NAME` (DYAD_KVS_NAMESPACE)")
	force := flags.Bool("force", false, "forget even while daemons of the job are registered")
	dryRun := flags.BoolP("dry-run", "n", false, "say what would be deleted, and delete nothing")
	page := flags.Int("page", store.DefaultForgetPage, "keys deleted per request")
	var access etcdAccess
	if err := access.fromEnv(); err != nil {
		return fail(exitUsage, err.Error())
	}
	access.flags(flags, false)
	if err := flags.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			fmt.Fprint(stdout, forgetUsage+flags.FlagUsagesWrapped(helpWidth))
			return errHelp
		}
		return fail(exitUsage, err.Error()+" (see dyadfs help forget)")
	}
	switch {
	case flags.NArg() != 0:
		return fail(exitUsage, "forget takes no arguments (see dyadfs help forget)")
	case *url == "" || *ns == "":
		return fail(exitUsage, "forget needs --store and --namespace: which job to forget, where (see dyadfs help forget)")
	case *page <= 0:
		return fail(exitUsage, fmt.Sprintf("--page %d: want a positive number of keys", *page))
	}
	if singleNode(*url) {
		return fail(exitUsage, "the embedded store forgets everything when its daemon unmounts: nothing to do")
	}
	ctx := context.Background()
	var fx fluxConn
	defer fx.Close()
	s, err := openStore(ctx, *url, *ns, &fx, true, access)
	if err != nil {
		return storeFailed(err)
	}
	defer s.Close()
	live, err := hfl.LiveMembers(ctx, s, *ns)
	if err != nil {
		return fail(exitStore, err.Error())
	}
	if len(live) > 0 && !*force {
		nodes := make([]string, len(live))
		for i, m := range live {
			nodes[i] = m.Node
		}
		return fail(exitJobRunning, fmt.Sprintf("namespace %s has %d running daemon(s) (%s): unmount them first, or pass --force", *ns, len(live), strings.Join(nodes, ", ")))
	}
	h, err := s.Health(ctx, *ns)
	if err != nil {
		return storeFailed(err)
	}
	if *dryRun {
		fmt.Fprintf(stdout, "would forget namespace %s: %d records and their directory index, %d registered daemons, and its other keys (job secret, values); nothing deleted (dry run)\n", *ns, h.Records, len(live))
		return nil
	}
	bar := newProgress(os.Stderr, 2*h.Records) // a record and its index entry
	start := time.Now()
	n, err := s.Forget(ctx, *ns, *page, bar.update)
	bar.done()
	if err != nil {
		return fail(exitStore, fmt.Sprintf("forget %s: %v (after %d keys; run it again to go on)", *ns, err, n))
	}
	if n == 0 {
		return fail(exitNothing, fmt.Sprintf("namespace %s has no keys in the store at %s: nothing was forgotten (a typo in --namespace?)", *ns, *url))
	}
	fmt.Fprintf(stdout, "forgot namespace %s: %d keys in %v\n", *ns, n, time.Since(start).Round(time.Millisecond))
	return nil
}

// lookupEnvOr is the environment variable name, or def.
func lookupEnvOr(name, def string) string {
	if v, ok := lookupEnv(name); ok {
		return v
	}
	return def
}

// progress draws a progress bar on a terminal, and nothing elsewhere.
type progress struct {
	out   *os.File
	total int64
	tty   bool
	last  time.Time
}

func newProgress(out *os.File, total int64) *progress {
	_, err := unix.IoctlGetTermios(int(out.Fd()), unix.TCGETS)
	return &progress{out: out, total: total, tty: err == nil}
}

func (p *progress) update(done int) {
	if !p.tty || time.Since(p.last) < 100*time.Millisecond {
		return
	}
	p.last = time.Now()
	const width = 40
	frac := 1.0
	if p.total > 0 {
		frac = min(float64(done)/float64(p.total), 1)
	}
	fill := int(frac * width)
	fmt.Fprintf(p.out, "\r[%s%s] %3.0f%% %d keys", strings.Repeat("=", fill), strings.Repeat(" ", width-fill), 100*frac, done)
}

// show draws a line of text in place, at most ten times a second.
func (p *progress) show(line string) {
	if !p.tty || time.Since(p.last) < 100*time.Millisecond {
		return
	}
	p.last = time.Now()
	fmt.Fprint(p.out, "\r\033[K"+line)
}

func (p *progress) done() {
	if p.tty && !p.last.IsZero() {
		fmt.Fprint(p.out, "\r\033[K")
	}
}
