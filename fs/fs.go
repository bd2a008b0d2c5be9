// Package fs is the FUSE face of dyadfs: a go-fuse loopback over the
// node-local backing store whose Open, Create, Release and namespace
// operations call into the managed directory (package dmd), which holds the
// logic of waiting, publishing and fetching.
package fs

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/dyadfs/dyadfs/fs/dmd"
)

// Config is the FUSE layer's configuration.
type Config struct {
	// Mountpoint is the absolute, symlink-free path of the mount.
	Mountpoint string
	// CacheTTL is how long the kernel may cache entries and attributes of
	// files and directories that exist. Only dyadfs changes them, and it
	// tells the kernel when it does; missing names and files being waited
	// for are never cached.
	CacheTTL time.Duration
	// Passthrough lets the kernel read and write backing files directly
	// (FUSE passthrough) where the kernel and privileges allow.
	Passthrough bool
	// Xattrs serves extended attributes. Off, xattr calls fail with
	// EOPNOTSUPP and every write saves a round trip.
	Xattrs bool
	// AllowOther lets users other than the mounter use the mount.
	AllowOther bool
	// WaitMissing is what a read-only open of a path published nowhere
	// does when its process says nothing (see caller.RoleOf): wait for
	// the path (true), or fail with ENOENT.
	WaitMissing bool
	// NeverWait are base-name patterns (path.Match) that a read-only open
	// never waits for, whatever the process says: configuration files that
	// libraries probe in the working directory when a program starts (UCX
	// reads ./ucx.conf), which no producer publishes. Without them, an MPI
	// program started in the mount would hang before main.
	NeverWait []string
	// Options are extra mount options (-o).
	Options []string
	// Debug logs every FUSE request.
	Debug bool
	// Info is static information shown in the status file (version, store,
	// log file, ...).
	Info map[string]string
	// Extra, if set, adds sections to the status file (the transport's
	// counters).
	Extra func() map[string]any
}

// DefaultConfig returns the defaults; Mountpoint must still be set.
func DefaultConfig() Config {
	return Config{CacheTTL: time.Hour, Passthrough: true, WaitMissing: true, NeverWait: []string{"ucx.conf"}}
}

// Validate checks the configuration.
func (c Config) Validate() error {
	if c.Mountpoint == "" || !filepath.IsAbs(c.Mountpoint) {
		return fmt.Errorf("mountpoint %q must be an absolute path", c.Mountpoint)
	}
	if c.CacheTTL < 0 {
		return fmt.Errorf("cache ttl %v must not be negative", c.CacheTTL)
	}
	return nil
}

// FS is a mounted dyadfs.
type FS struct {
	cfg    Config
	dmd    *dmd.DMD
	log    *slog.Logger
	server *fuse.Server
	root   *node
	lost   lostNames
	ops    *opStats
	intent intentStats
	// readReleases counts released read handles of managed files.
	readReleases atomic.Uint64

	started     time.Time
	passthrough string // "on", or "off: why"
	panics      atomic.Uint64

	controlOnce sync.Once
	control     *gofs.Inode

	// fds bounds the open handles below the descriptor limit.
	fds *fdGuard
}

// Mount mounts the managed directory d at cfg.Mountpoint and starts serving.
// It returns once the kernel has acknowledged the mount. kernel, the
// notifier d was built with (nil if none), starts passing changes on.
func Mount(cfg Config, d *dmd.DMD, kernel *KernelNotifier, log *slog.Logger) (*FS, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	fsys := &FS{cfg: cfg, dmd: d, log: log, ops: newOpStats(), started: time.Now(), fds: newFdGuard(log)}
	root, err := fsys.newRoot()
	if err != nil {
		return nil, err
	}
	fsys.root = root

	opts := fsys.mountOptions()
	raw := newCountingFS(gofs.NewNodeFS(root, opts), fsys.ops)
	var server *fuse.Server
	said := captureStderr(func() {
		server, err = fuse.NewServer(raw, cfg.Mountpoint, &opts.MountOptions)
	})
	if err != nil {
		// fusermount3 says why on its stderr (an unknown option, no
		// access to /dev/fuse); go-fuse only gives its exit code.
		if msg := FusermountSaid(said); msg != "" {
			return nil, fmt.Errorf("mount %s: %s", cfg.Mountpoint, msg)
		}
		return nil, fmt.Errorf("mount %s: %w", cfg.Mountpoint, err)
	}
	go server.Serve()
	if err := server.WaitMount(); err != nil {
		server.Unmount()
		return nil, fmt.Errorf("mount %s: %w", cfg.Mountpoint, err)
	}
	fsys.server = server
	if kernel != nil {
		kernel.fsys.Store(fsys)
	}
	fsys.passthrough = fsys.probePassthrough()
	log.Info("mounted", "mountpoint", cfg.Mountpoint, "backing", d.Config().Backing, "passthrough", fsys.passthrough)
	go fsys.watchDetach()
	return fsys, nil
}

// Wait blocks until the filesystem is unmounted.
func (fsys *FS) Wait() { fsys.server.Wait() }

// Unmount ends every wait and unmounts. When files are still open it
// detaches the mount lazily: it disappears at once and the daemon keeps
// serving open files until they are closed.
func (fsys *FS) Unmount() error {
	fsys.dmd.Shutdown()
	err := fsys.server.Unmount()
	if err == nil {
		return nil
	}
	fsys.log.Info("mount busy; detaching lazily", "err", err)
	if lerr := lazyUnmount(fsys.cfg.Mountpoint); lerr != nil {
		return errors.Join(err, lerr)
	}
	return nil
}

// probePassthrough tells whether the kernel accepts backing files for
// passthrough, and if not, why.
func (fsys *FS) probePassthrough() string {
	if !fsys.cfg.Passthrough {
		return "off: disabled by --passthrough=false"
	}
	if fsys.server.KernelSettings().Flags64()&fuse.CAP_PASSTHROUGH == 0 {
		return "off: the kernel does not offer FUSE passthrough (Linux 6.9 or later needed)"
	}
	f, err := os.CreateTemp(filepath.Join(fsys.dmd.Config().Backing, dmd.InternalDir), "passthrough-probe-*")
	if err != nil {
		return fmt.Sprintf("off: cannot create a probe file: %v", err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	id, errno := fsys.server.RegisterBackingFd(&fuse.BackingMap{Fd: int32(f.Fd())})
	if errno != 0 {
		if errno == syscall.EPERM {
			return "off: registering backing files needs CAP_SYS_ADMIN (run dyadfs as root)"
		}
		return fmt.Sprintf("off: the kernel refused a backing file: %v", errno)
	}
	fsys.server.UnregisterBackingFd(id)
	return "on"
}

func (fsys *FS) mountOptions() *gofs.Options {
	opts := &gofs.Options{
		// No default timeouts: existing entries get CacheTTL explicitly;
		// missing names and pending files must stay uncached.
		NullPermissions: true,
		// go-fuse's own diagnostics (orphaned inode paths and the like)
		// are expected under unlink-while-open; keep them at debug.
		Logger: slog.NewLogLogger(fsys.log.Handler(), slog.LevelDebug),
	}
	var options []string
	if fsys.cfg.AllowOther {
		// Other users reach files the daemon opens as root: let the
		// kernel check permissions against the files' modes. It costs a
		// GETATTR of the directory after each create, so it is only on
		// when other users can use the mount at all.
		options = append(options, "default_permissions")
	}
	opts.MountOptions = fuse.MountOptions{
		FsName:     "dyadfs",
		Name:       "dyadfs",
		AllowOther: fsys.cfg.AllowOther,
		Options:    append(options, fsys.cfg.Options...),
		Debug:      fsys.cfg.Debug,
		Logger:     slog.NewLogLogger(fsys.log.Handler(), slog.LevelDebug),
		MaxWrite:   1 << 20,
		// A RELEASE is a background request, and its handler publishes
		// (with --publish-wait 0, it waits for the commit): at the
		// kernel's default of 12 in flight, later releases, and the
		// readahead of readers on this node, queue behind commits.
		MaxBackground: 64,
		// O_TRUNC reaches OPEN, where the writer is registered before the
		// truncation, instead of arriving as a SETATTR after it.
		// Files read in ranges are opened for direct I/O (see
		// rangedHandle): mappings of them must still work.
		ExtraCapabilities: fuse.CAP_ATOMIC_O_TRUNC | fuse.CAP_DIRECT_IO_ALLOW_MMAP,
		// A bug must not pass unnoticed: log it, count it, answer EIO.
		PanicHandler: func(v any) fuse.Status {
			fsys.panics.Add(1)
			fsys.log.Error("panic in a FUSE handler; answered EIO", "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
			return fuse.EIO
		},
		// Without extended attributes the kernel stops asking for
		// security.capability before every write (and ls -l for ACLs):
		// one round trip less per small-file write.
		DisableXAttrs: !fsys.cfg.Xattrs,
	}
	if !fsys.cfg.Passthrough {
		opts.MountOptions.DisabledCapabilities |= fuse.CAP_PASSTHROUGH
	}
	return opts
}

func (fsys *FS) newRoot() (*node, error) {
	var st syscall.Stat_t
	if err := fsys.back().Lstat("", &st); err != nil {
		return nil, fmt.Errorf("backing directory: %w", err)
	}
	return &node{fsys: fsys, id: dmd.IDOf(&st)}, nil
}
