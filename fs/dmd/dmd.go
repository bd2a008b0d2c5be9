// Package dmd is the managed directory: the logic of dyadfs without the FUSE
// layer. It tracks which files are being written on this node, publishes a
// file's record when its last writer lets go, makes readers wait until a file
// is complete, and finds missing files through the locator.
//
// Files are identified by their backing inode (FileID) while they are being
// written, so that renames and hard links during a write change nothing; they
// are identified by path when someone waits for a name that does not exist.
package dmd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dyadfs/dyadfs/dtl"
	"github.com/dyadfs/dyadfs/fs/backing"
	"github.com/dyadfs/dyadfs/hfl"
	"github.com/dyadfs/dyadfs/hfl/notice"
)

// InternalDir is the directory at the top of the backing store that holds
// dyadfs's own state. It is hidden from the mount.
const InternalDir = ".dyadfs"

// Config is the managed directory's configuration.
type Config struct {
	// Backing is the absolute path of the node-local backing directory.
	Backing string
	// Node is this node's id; it is the owner of every record published here.
	Node string
	// WaitTimeout bounds every wait for a file; zero waits forever.
	WaitTimeout time.Duration
	// WaitLogAfter is how long an open waits before the log says so.
	WaitLogAfter time.Duration
	// FsyncOnPublish makes the data durable before a file is published.
	FsyncOnPublish bool
	// SharedStorage says that every node sees the same backing storage, so
	// a record from another node means the file is already here.
	SharedStorage bool
	// CloseWait makes a writer's close publish the file and report the
	// store's verdict (see Writer.Close), waiting up to this long while
	// the store does not answer; 0: the file is published after the close
	// returns, and a failure is only logged and retried.
	CloseWait time.Duration
	// Cache bounds the space copies of other nodes' files take here.
	Cache CacheConfig
	// Origin is a directory (of a parallel file system) that a read-only
	// open of a path published nowhere reads from instead of waiting;
	// with OriginPublish, the first node to read a file there publishes
	// it for the others (see origin.go).
	Origin        string
	OriginPublish bool
	// Ranges says which files of other nodes are read in ranges.
	Ranges RangeConfig
}

// DefaultConfig returns the defaults; Backing and Node must still be set.
func DefaultConfig() Config {
	return Config{WaitLogAfter: 10 * time.Second, Cache: DefaultCacheConfig(), Ranges: DefaultRangeConfig()}
}

// Validate checks the configuration.
func (c Config) Validate() error {
	if c.Backing == "" || !filepath.IsAbs(c.Backing) {
		return fmt.Errorf("backing directory %q must be an absolute path", c.Backing)
	}
	if c.Node == "" {
		return errors.New("node id must not be empty")
	}
	if c.Origin != "" && !filepath.IsAbs(c.Origin) {
		return fmt.Errorf("origin %q must be an absolute path", c.Origin)
	}
	if c.WaitTimeout < 0 {
		return fmt.Errorf("wait timeout %v must not be negative", c.WaitTimeout)
	}
	if c.CloseWait < 0 {
		return fmt.Errorf("publish wait %v must not be negative", c.CloseWait)
	}
	return c.Cache.Validate()
}

// Errors a waiting open can end with; the FUSE layer maps them to errno.
var (
	// ErrWaitTimeout: the wait outlasted Config.WaitTimeout (ETIMEDOUT).
	ErrWaitTimeout = errors.New("timed out waiting for the file to be published")
	// ErrShutdown: the filesystem is being unmounted (ENOTCONN).
	ErrShutdown = errors.New("filesystem is shutting down")
	// ErrNotRegular: the waited-for path exists but is not a regular file.
	ErrNotRegular = errors.New("not a regular file")
	// ErrNoTransport: the file lives on another node and no data transport
	// is configured.
	ErrNoTransport = errors.New("file is on another node and no data transport is configured")
	// ErrFetch: the file could not be brought from its owner: EIO, or,
	// when this node's storage refused it, that errno (see
	// dtl.ReaderErrno).
	ErrFetch = errors.New("transfer from the owner failed")
	// ErrPublish: a writer's close could not publish the file: the store
	// refused it (ENOSPC for a full store, EACCES for a denied write), or
	// did not answer within Config.CloseWait (EIO). The file stays here
	// and its publish is retried.
	ErrPublish = errors.New("the file could not be published")
)

// FileID names a backing inode.
type FileID struct{ Dev, Ino uint64 }

// IDOf returns the FileID of a stat result.
func IDOf(st *syscall.Stat_t) FileID { return FileID{Dev: uint64(st.Dev), Ino: st.Ino} }

// DMD is the managed directory of one node.
type DMD struct {
	cfg     Config
	loc     *hfl.Locator
	log     *slog.Logger
	markers bool         // the backing store takes user xattrs (dyadfs's file marks)
	fetcher *dtl.Fetcher // nil without a transport
	stats   counters
	sums    sumCache
	// blockLists keeps the block hashes of large files published here;
	// ranged, the files of other nodes read here in ranges.
	blockLists blockLists
	ranged     rangedFiles
	ids        identities // inherited inode numbers (see identity.go)

	// shutdown is closed, and life canceled, when the filesystem goes
	// away; they end all waits.
	shutdown     chan struct{}
	shutdownOnce sync.Once
	life         context.Context
	endLife      context.CancelFunc

	// names serializes the changes of names in the backing directory
	// that dyadfs's bookkeeping of copies follows: a copy installed (and
	// noted), a stale copy removed, a rename through the mount (and the
	// copies moved). Otherwise a rename onto a copy's name could come
	// between a look at the name and what follows it, and the file the
	// rename put there, this node's own, be taken for the copy.
	namesMu sync.Mutex

	mu sync.Mutex
	// busy holds the files that readers must not see yet: being written,
	// or left half-written by a daemon that died.
	busy map[FileID]*writeState
	// creating counts creates in progress per path, from before the file
	// exists until its writer is registered.
	creating map[string]int
	// writeOpens counts writers' opens, by file and by name (see
	// checksum).
	writeOpens writeOpens
	// publishing holds the records being published: sent ahead to waiting
	// consumers (see hfl's notices) while the store commits them, so they
	// are served already.
	publishing map[string]hfl.Record
	// retries holds paths whose publish failed; retrying says whether the
	// retry loop runs.
	retries  map[string]*pending
	retrying bool
	// copies holds what the copies of other nodes' files, and the
	// shadows of their directories, in the backing directory are: they
	// are not this node's to publish, and they go when a newer version
	// is published (see view.go).
	copies copyRegistry
	// releasing counts, per path, last writers between letting readers in
	// and publishing.
	releasing map[string]int
	// releaseBase is, per path releasing, the generation of the path's
	// newest record this node knew when the release began: a record
	// newer than it, of this node, is the version released (see
	// committed).
	releaseBase map[string]uint64
	// toldWhilePublishing holds paths whose change elsewhere was told
	// while this node published its own version (releasing or
	// publishing): looked at again once the publish is done, when it is
	// known which one won.
	toldWhilePublishing map[string]struct{}
	// superseded holds this node's own files that another node replaced
	// or is rewriting: not shown or served, removed once a newer version
	// is published.
	superseded map[string]uint64
	// notifier tells the kernel of entries that changed unseen; set
	// when the DMD is built, never changed.
	notifier Notifier
	// waiters lists the opens that wait, for the status.
	waiters waiters
	// storeID names the store this node publishes in (see publishedXattr).
	storeID string
	// back is the backing directory, addressed beneath its descriptor;
	// tempFd is the temporary one, opened once.
	back   *backing.Dir
	tempFd int
	// marks are this node's being-written marks (see writingMarks);
	// marksLeft, those found at start, until Scan.
	marks     *writingMarks
	marksLeft map[uint64][]int
	// origin is Config.Origin, opened; nil without one.
	origin *originDir
	// uncleanStart says the previous daemon did not stop cleanly: copies
	// fetched then may not have reached the disk whole.
	uncleanStart bool
}

// fileStamp is what tells whether a file changed under a write handle.
type fileStamp struct {
	size         int64
	mtime, ctime syscall.Timespec
}

func stampOf(st *syscall.Stat_t) fileStamp {
	return fileStamp{size: st.Size, mtime: st.Mtim, ctime: st.Ctim}
}

// sameBytes reports whether s and o tell of the same bytes: what a write
// changes, not what a link or a chmod does.
func (s fileStamp) sameBytes(o fileStamp) bool { return s.size == o.size && s.mtime == o.mtime }

// Parts are what a managed directory is built with: the backends cmd/dyadfs
// chose, seen here only through their interfaces.
type Parts struct {
	// Store is the global metadata store. The DMD builds its locator over
	// it, with itself as the locator's first level.
	Store   hfl.Store
	Locator hfl.LocatorConfig
	// Transport brings files published elsewhere and, once serving (see
	// dtl.Transport.Serve), gives this node's to peers. Nil when no other
	// node can ask (a single node, shared storage): files published
	// elsewhere cannot be read here then (ErrNoTransport).
	Transport dtl.Transport
	// TransportName is the backend's name, as members register it.
	TransportName string
	// FetchTimeout bounds how long a failing transfer is retried.
	FetchTimeout time.Duration
	// Notifier tells the kernel of entries that changed unseen; nil:
	// nothing to tell.
	Notifier Notifier
	Log      *slog.Logger
}

// New opens the managed directory over cfg.Backing, with its locator and,
// given a transport, its fetcher.
func New(cfg Config, p Parts) (*DMD, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if p.Store == nil {
		return nil, errors.New("managed directory: no metadata store")
	}
	log := p.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	d := &DMD{
		cfg:        cfg,
		log:        log,
		notifier:   p.Notifier,
		shutdown:   make(chan struct{}),
		busy:       make(map[FileID]*writeState),
		creating:   make(map[string]int),
		publishing: make(map[string]hfl.Record),
		releasing:  make(map[string]int),
		superseded: make(map[string]uint64),

		releaseBase:         make(map[string]uint64),
		toldWhilePublishing: make(map[string]struct{}),
	}
	d.copies.init(cfg.Cache)
	d.life, d.endLife = context.WithCancel(context.Background())
	_, err := os.Stat(d.internalPath())
	fresh := errors.Is(err, os.ErrNotExist)
	if err := os.MkdirAll(d.internalPath(), 0o700); err != nil {
		return nil, fmt.Errorf("create %s: %w", d.internalPath(), err)
	}
	_, err = os.Stat(d.cleanMarker())
	d.uncleanStart = !fresh && err != nil
	os.Remove(d.cleanMarker())
	// Transfers interrupted by a crash leave temporary files: remove them.
	// Each node has its own directory: with shared storage, several
	// daemons share the backing directory.
	os.RemoveAll(d.TempDir())
	if err := os.Mkdir(d.TempDir(), 0o700); err != nil {
		return nil, fmt.Errorf("create %s: %w", d.TempDir(), err)
	}
	if d.back, err = backing.Open(cfg.Backing); err != nil {
		return nil, err
	}
	if !cfg.SharedStorage {
		d.back.CacheDirs() // nothing but this daemon changes the directory
	}
	if d.tempFd, err = unix.Open(d.TempDir(), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err != nil {
		d.back.Close()
		return nil, fmt.Errorf("open %s: %w", d.TempDir(), err)
	}
	if d.origin, err = openOrigin(cfg.Origin); err != nil {
		d.closeFds()
		return nil, err
	}
	d.marks = openWritingMarks(d.internalPath(), cfg.Node)
	d.marksLeft = d.marks.left()
	d.markers = probeMarkers(d.internalPath())
	if !d.markers {
		log.Warn("backing store does not support user xattrs: after a restart, fetched copies are told from this node's files by the store's records", "backing", cfg.Backing)
	}
	// Notices travel as the transport's messages, where it carries them.
	notices := hfl.SingleNode
	if m, ok := p.Transport.(dtl.Messenger); ok {
		notices = notice.Over(d.life, m, log)
	}
	d.loc, err = hfl.NewLocator(p.Locator, p.Store, d, notices)
	if err != nil {
		d.closeFds()
		return nil, err
	}
	if p.Transport != nil {
		d.fetcher, err = dtl.NewFetcher(dtl.FetcherConfig{
			Transport:     p.Transport,
			TransportName: p.TransportName,
			Owners:        owners{d.loc},
			Dest:          d,
			TempDir:       d.TempDir(),
			Timeout:       p.FetchTimeout,
			Node:          cfg.Node,
			Log:           log,
		})
		if err != nil {
			d.closeFds()
			return nil, err
		}
		d.loadRanged()
	}
	return d, nil
}

func (d *DMD) closeFds() {
	unix.Close(d.tempFd)
	if d.marks != nil {
		d.marks.close()
	}
	d.back.Close()
	d.origin.close()
}

// Config returns the configuration.
func (d *DMD) Config() Config { return d.cfg }

// CloseWaits reports whether a writer's close publishes the file and
// reports the store's verdict (see Writer.Close).
func (d *DMD) CloseWaits() bool { return d.cfg.CloseWait > 0 && !d.solo() }

// Locator returns the locator.
func (d *DMD) Locator() *hfl.Locator { return d.loc }

// FileMarks reports whether backing files carry dyadfs's marks (user
// xattrs): a restart without them tells copies by the store's records.
func (d *DMD) FileMarks() bool { return d.markers }

func (d *DMD) internalPath() string { return filepath.Join(d.cfg.Backing, InternalDir) }

// TempDir is where transfers write files before renaming them into place:
// in the backing store, so that the rename is atomic, and hidden.
func (d *DMD) TempDir() string { return filepath.Join(d.internalPath(), "tmp-"+d.cfg.Node) }

// cleanMarker exists while no daemon of this node runs on the backing
// directory and the last one stopped cleanly.
func (d *DMD) cleanMarker() string { return filepath.Join(d.internalPath(), "clean-"+d.cfg.Node) }

// BackingPath returns the backing path of a clean relative path, for
// messages: operations address it beneath the backing directory's
// descriptor (see Backing), since it may be longer than a path can be.
func (d *DMD) BackingPath(rel string) string { return filepath.Join(d.cfg.Backing, rel) }

// Backing is the backing directory.
func (d *DMD) Backing() *backing.Dir { return d.back }

// Shutdown ends every wait with ErrShutdown and refuses new ones.
func (d *DMD) Shutdown() {
	d.shutdownOnce.Do(func() {
		close(d.shutdown)
		d.endLife()
	})
}

// Close ends every wait, releases the backing directory and records a clean
// stop. Nothing may use the DMD afterwards (stop the transport first).
func (d *DMD) Close() error {
	d.Shutdown()
	if n := d.PendingPublishes(); n > 0 {
		d.log.Warn("stopping with publishes not done; the next start publishes these files again", "files", n)
	}
	if d.fetcher != nil {
		d.fetcher.Close()
	}
	d.closeRanged()
	syscall.Sync()
	os.WriteFile(d.cleanMarker(), nil, 0o600)
	d.closeFds()
	return nil
}

// waitContext applies the configured wait timeout, and ends with the
// filesystem. The wait is detached from ctx (see detach): it parks no
// goroutine but its caller's.
func (d *DMD) waitContext(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, release := detach(ctx)
	var cancel context.CancelFunc
	if d.cfg.WaitTimeout > 0 {
		ctx, cancel = context.WithTimeoutCause(ctx, d.cfg.WaitTimeout, ErrWaitTimeout)
	} else {
		ctx, cancel = context.WithCancel(ctx)
	}
	stop := context.AfterFunc(d.life, cancel)
	return ctx, func() {
		stop()
		cancel()
		release()
	}
}

// waitErr turns the end of a wait into the error the caller reports.
func (d *DMD) waitErr(ctx context.Context) error {
	select {
	case <-d.shutdown:
		return ErrShutdown
	default:
	}
	if errors.Is(context.Cause(ctx), ErrWaitTimeout) {
		d.stats.waitTimeouts.Add(1)
		return ErrWaitTimeout
	}
	d.stats.waitInterrupts.Add(1)
	return ctx.Err()
}
