package fs

import (
	"context"
	"encoding/json"
	"net/url"
	"os"
	"runtime"
	"runtime/metrics"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/dyadfs/dyadfs/fs/caller"
	"github.com/dyadfs/dyadfs/fs/dmd"
	"github.com/dyadfs/dyadfs/hfl"
)

// StatusFile is the name of the status file in the control directory
// (MOUNTPOINT/.dyadfs/status). It is JSON; `dyadfs status` formats it.
const StatusFile = "status"

// LocateDir is the control directory's view of the locator: reading
// MOUNTPOINT/.dyadfs/locate/<path, escaped with url.PathEscape> returns, as
// JSON, where the locator finds that path and what the global store holds
// for it, without waiting. A path found nowhere is ENOENT.
const LocateDir = "locate"

// Located is what a file in LocateDir holds.
type Located struct {
	// Level is where the locator found the file first: local, cache or
	// global; Record is what it found there.
	Level  string     `json:"level"`
	Record hfl.Record `json:"record"`
	// Published is the global store's record, which other nodes see; nil
	// when the path is not published.
	Published *hfl.Record `json:"published,omitempty"`
	// Home is the node every change of the path goes through, in this
	// node's view of the members (none on a node alone).
	Home string `json:"home,omitempty"`
}

// Status is what the status file holds.
type Status struct {
	Info map[string]string `json:"info"`
	PID  int               `json:"pid" metric:"-"`
	// Goroutines is how many the daemon runs: a waiting open parks one.
	Goroutines int `json:"goroutines" metric:"-"`
	// Descriptors are the daemon's open descriptors and its limit.
	Descriptors Descriptors `json:"descriptors"`
	// Heap is the Go heap's: what was allocated since the start, what
	// is live.
	Heap        Heap    `json:"heap" metric:"-"`
	Mountpoint  string  `json:"mountpoint"`
	Backing     string  `json:"backing"`
	Node        string  `json:"node"`
	Uptime      float64 `json:"uptime_seconds" metric:"-"`
	Passthrough string  `json:"passthrough"`
	// FileMarks says whether the backing files carry dyadfs's marks
	// (user xattrs): which are copies, and which were published.
	FileMarks   bool    `json:"file_marks" metric:"-"`
	WaitTimeout float64 `json:"wait_timeout_seconds" metric:"-"`
	// ReadReleases counts closed read handles of managed files (the
	// write handles are counted by DMD.WriteReleases).
	ReadReleases uint64 `json:"read_releases" help:"Read handles of managed files closed."`
	// Panics counts bugs: handlers that panicked (and answered EIO).
	Panics uint64 `json:"panics" help:"FUSE handlers that panicked (a bug) and answered EIO."`
	// Intent counts how lookups of missing names were classified.
	Intent map[string]uint64 `json:"lookup_intent" help:"Lookups of missing names, by what the caller meant to do (read: it may wait; create, probe: it does not)."`
	DMD    dmd.Stats         `json:"dmd" metric:"inline"`
	// Waiters lists the opens that wait now, longest first.
	Waiters []dmd.Waiter `json:"waiting_opens"`
	// Unpublished lists the files whose publish (or removal) has not
	// landed in the store, oldest first, with the reason.
	Unpublished []dmd.Pending     `json:"unpublished,omitempty"`
	Locator     hfl.LocatorStats  `json:"locator"`
	Ops         map[string]OpStat `json:"ops" help:"FUSE requests answered, by operation."`
	Errnos      map[string]uint64 `json:"errors_by_errno" help:"FUSE requests answered with an error, by errno."`
	// Extra holds sections added by the daemon (the transport's counters).
	Extra map[string]any `json:"extra,omitempty" metric:"inline"`
}

// Status returns the daemon's current status.
func (fsys *FS) Status() Status {
	cfg := fsys.dmd.Config()
	ops, errnos := fsys.ops.snapshot()
	var extra map[string]any
	if fsys.cfg.Extra != nil {
		extra = fsys.cfg.Extra()
	}
	return Status{
		Info:         fsys.cfg.Info,
		PID:          os.Getpid(),
		Goroutines:   runtime.NumGoroutine(),
		Descriptors:  fsys.fds.status(),
		Heap:         heapNow(),
		Mountpoint:   fsys.cfg.Mountpoint,
		Backing:      cfg.Backing,
		Node:         cfg.Node,
		Uptime:       time.Since(fsys.started).Seconds(),
		Passthrough:  fsys.passthrough,
		FileMarks:    fsys.dmd.FileMarks(),
		WaitTimeout:  cfg.WaitTimeout.Seconds(),
		ReadReleases: fsys.readReleases.Load(),
		Panics:       fsys.panics.Load(),
		Intent: map[string]uint64{
			"open_file": fsys.intent.openFile.Load(),
			"traverse":  fsys.intent.traverse.Load(),
			"other":     fsys.intent.other.Load(),
			"unknown":   fsys.intent.unknown.Load(),
			// Opens of missing paths whose process said it does not wait.
			"no_wait": fsys.intent.noWait.Load(),
			// Times /proc said the caller was still running.
			"proc_retries": caller.Retries.Load(),
		},
		DMD:         fsys.dmd.Stats(),
		Waiters:     fsys.dmd.Waiters(),
		Unpublished: fsys.dmd.PendingList(),
		Locator:     fsys.dmd.Locator().Stats(),
		Ops:         ops,
		Errnos:      errnos,
		Extra:       extra,
	}
}

// controlDir returns the control directory inode, made on first use.
func (fsys *FS) controlDir(ctx context.Context) *gofs.Inode {
	fsys.controlOnce.Do(func() {
		dir := fsys.root.NewPersistentInode(ctx, &controlDirNode{}, gofs.StableAttr{Mode: syscall.S_IFDIR})
		status := fsys.root.NewPersistentInode(ctx, &jsonFile{fsys: fsys, render: func() any { return fsys.Status() }}, gofs.StableAttr{Mode: syscall.S_IFREG})
		dir.AddChild(StatusFile, status, false)
		locate := fsys.root.NewPersistentInode(ctx, &locateDir{fsys: fsys}, gofs.StableAttr{Mode: syscall.S_IFDIR})
		dir.AddChild(LocateDir, locate, false)
		fsys.control = dir
	})
	return fsys.control
}

// controlDirNode is a directory of the control tree, open to everyone.
type controlDirNode struct{ gofs.Inode }

// Getattr implements gofs.NodeGetattrer.
func (c *controlDirNode) Getattr(ctx context.Context, f gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	return readOnlyAttr(out, readOnlyDir)
}

// The modes of the directories and files dyadfs makes up: the control
// tree's, and the placeholders of what is not here yet.
const (
	readOnlyDir  = syscall.S_IFDIR | 0o555
	readOnlyFile = syscall.S_IFREG | 0o444
)

// readOnlyAttr gives out the attributes of a directory or file dyadfs
// makes up, of mode readOnlyDir or readOnlyFile. The kernel must not
// cache them: what such a node stands for changes.
func readOnlyAttr(out *fuse.AttrOut, mode uint32) syscall.Errno {
	out.Mode = mode
	out.Nlink = 1
	if mode&syscall.S_IFMT == syscall.S_IFDIR {
		out.Nlink = 2
	}
	out.SetTimeout(zero)
	return 0
}

// jsonFile is a read-only control file whose content, JSON, is rendered at
// open time.
type jsonFile struct {
	gofs.Inode
	fsys   *FS
	render func() any
}

// Getattr implements gofs.NodeGetattrer.
func (j *jsonFile) Getattr(ctx context.Context, f gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	return readOnlyAttr(out, readOnlyFile)
}

// Open implements gofs.NodeOpener.
func (j *jsonFile) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	if flags&syscall.O_ACCMODE != syscall.O_RDONLY {
		return nil, 0, syscall.EACCES
	}
	data, err := json.MarshalIndent(j.render(), "", "  ")
	if err != nil {
		return nil, 0, j.fsys.errno("control file", "", err)
	}
	return &bytesHandle{data: append(data, '\n')}, fuse.FOPEN_DIRECT_IO, 0
}

// locateDir answers lookups of escaped paths with their records.
type locateDir struct {
	controlDirNode
	fsys *FS
}

// Lookup implements gofs.NodeLookuper.
func (l *locateDir) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	p, err := url.PathUnescape(name)
	if err != nil {
		return nil, syscall.ENOENT
	}
	rel, err := hfl.CleanPath(p)
	if err != nil {
		return nil, syscall.ENOENT
	}
	loc := l.fsys.dmd.Locator()
	rec, level, err := loc.Locate(ctx, rel)
	if err != nil {
		return nil, l.fsys.errno("locate", rel, err)
	}
	located := Located{Level: level.String(), Record: rec, Home: loc.HomeOf(rel)}
	if pub, err := loc.Published(ctx, rel); err == nil {
		located.Published = &pub
	}
	out.Mode = readOnlyFile
	out.Nlink = 1
	out.SetEntryTimeout(zero)
	out.SetAttrTimeout(zero)
	return l.NewInode(ctx, &jsonFile{fsys: l.fsys, render: func() any { return located }}, gofs.StableAttr{Mode: syscall.S_IFREG}), 0
}

// bytesHandle reads a snapshot taken at open.
type bytesHandle struct{ data []byte }

var _ gofs.FileReader = (*bytesHandle)(nil)

func (b *bytesHandle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	if off >= int64(len(b.data)) {
		return fuse.ReadResultData(nil), 0
	}
	end := min(off+int64(len(dest)), int64(len(b.data)))
	return fuse.ReadResultData(b.data[off:end]), 0
}

// Heap is what the daemon's Go heap allocated since it started (objects
// and bytes: the cost of its work) and holds now.
type Heap struct {
	Allocs     uint64 `json:"allocs"`
	AllocBytes uint64 `json:"alloc_bytes"`
	LiveBytes  uint64 `json:"live_bytes"`
}

// heapSamples are the runtime's counters Heap reads (runtime/metrics:
// no stop of the world, unlike ReadMemStats).
var heapSamples = []string{"/gc/heap/allocs:objects", "/gc/heap/allocs:bytes", "/memory/classes/heap/objects:bytes"}

func heapNow() Heap {
	s := make([]metrics.Sample, len(heapSamples))
	for i, name := range heapSamples {
		s[i].Name = name
	}
	metrics.Read(s)
	v := func(i int) uint64 {
		if s[i].Value.Kind() != metrics.KindUint64 {
			return 0
		}
		return s[i].Value.Uint64()
	}
	return Heap{Allocs: v(0), AllocBytes: v(1), LiveBytes: v(2)}
}
