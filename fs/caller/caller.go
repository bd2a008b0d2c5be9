// Package caller learns, from /proc, what the process behind a FUSE request
// is doing: which syscall it is blocked in, with which flags and path.
//
// dyadfs needs this in LOOKUP of a missing name: the kernel holds the parent
// directory's lock there and LOOKUP carries no open flags, so the filesystem
// cannot block; it must decide at once whether the caller is opening the path
// for reading (answer with a placeholder whose OPEN waits) or doing anything
// else (answer ENOENT). A FUSE request names the calling thread; while that
// thread is asleep waiting for the answer, /proc/<tid>/syscall shows its
// syscall number and arguments and /proc/<tid>/mem its path string.
//
// Everything here fails closed: when the syscall cannot be read (no
// permission, a 32-bit caller, io_uring, a kernel thread, an unknown
// syscall), the answer is Unknown and the caller gets ENOENT as on any
// filesystem.
package caller

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Intent is what a LOOKUP of a missing name is for.
type Intent int

const (
	// Unknown: the caller's syscall could not be read. Treat as no wait.
	Unknown Intent = iota
	// Other: a syscall that must not wait (stat, access, mkdir, creat,
	// open with O_CREAT or for writing, exec, ...).
	Other
	// OpenFile: the name is the last component of a read-only open.
	OpenFile
	// Traverse: the name is a directory component on the way to a
	// read-only open.
	Traverse
)

func (i Intent) String() string {
	switch i {
	case Other:
		return "other"
	case OpenFile:
		return "open-file"
	case Traverse:
		return "traverse"
	}
	return "unknown"
}

// Call is a decoded syscall of a blocked thread.
type Call struct {
	Nr    int64
	Args  [6]uint64
	Open  bool   // open, openat or openat2
	Dirfd int32  // for open: atFDCWD
	Path  string // pathname argument of an open
	Flags uint64 // open flags
}

const atFDCWD = -100

// The daemon can read a request before its caller has left the CPU;
// /proc then says "running". The caller is about to sleep, so yield a few
// times before sleeping, and give up after about a millisecond.
const (
	yieldRetries = 50
	sleepRetries = 40
	retryPause   = 25 * time.Microsecond
)

// Retries counts reads of /proc/<tid>/syscall that found the thread still
// running and had to look again.
var Retries atomic.Uint64

// errRunning means the thread was on a CPU every time we looked.
var errRunning = errors.New("thread still running")

// ReadCall decodes the syscall thread tid is blocked in. For read-only
// opens it also reads the path (and, for openat2, the flags) from the
// thread's memory.
func ReadCall(tid uint32) (Call, error) {
	if tid == 0 {
		return Call{}, errors.New("request from the kernel or another pid namespace")
	}
	var buf [256]byte
	var raw []byte
	for i := 0; ; i++ {
		n, err := procFiles.read(tid, "syscall", buf[:], 0)
		if err != nil {
			return Call{}, err
		}
		raw = buf[:n]
		if !bytes.HasPrefix(raw, []byte("running")) {
			break
		}
		Retries.Add(1)
		switch {
		case i < yieldRetries:
			runtime.Gosched()
			syscall.Syscall(syscall.SYS_SCHED_YIELD, 0, 0, 0)
		case i < yieldRetries+sleepRetries:
			time.Sleep(retryPause)
		default:
			return Call{}, errRunning
		}
	}
	c, err := parseSyscall(raw)
	if err != nil {
		return Call{}, err
	}
	if !c.Open {
		return c, nil
	}
	var pathAddr uint64
	switch c.Nr {
	case sysOpen:
		pathAddr, c.Flags, c.Dirfd = c.Args[0], c.Args[1], atFDCWD
	case sysOpenat:
		pathAddr, c.Flags, c.Dirfd = c.Args[1], c.Args[2], int32(c.Args[0])
	case sysOpenat2:
		pathAddr, c.Dirfd = c.Args[1], int32(c.Args[0])
		// struct open_how starts with the u64 flags.
		var how [8]byte
		if _, err := procFiles.read(tid, "mem", how[:], int64(c.Args[2])); err != nil {
			return Call{}, fmt.Errorf("read open_how: %w", err)
		}
		c.Flags = binary.LittleEndian.Uint64(how[:])
	}
	if !readOnlyFileOpen(c.Flags) {
		// Creating or writing: a missing component means ENOENT (or a
		// create) wherever it is in the path. No need to read the path.
		return c, nil
	}
	c.Path, err = readCString(tid, pathAddr)
	if err != nil {
		return Call{}, err
	}
	return c, nil
}

// parseSyscall decodes the text of /proc/<tid>/syscall:
// "nr arg1 ... arg6 sp pc", numbers after nr in hex.
func parseSyscall(raw []byte) (Call, error) {
	f := strings.Fields(string(raw))
	if len(f) < 7 {
		return Call{}, fmt.Errorf("syscall line %q: too short", bytes.TrimSpace(raw))
	}
	nr, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		return Call{}, fmt.Errorf("syscall number %q: %w", f[0], err)
	}
	c := Call{Nr: nr}
	for i := 0; i < 6; i++ {
		v, err := strconv.ParseUint(strings.TrimPrefix(f[1+i], "0x"), 16, 64)
		if err != nil {
			return Call{}, fmt.Errorf("syscall argument %q: %w", f[1+i], err)
		}
		c.Args[i] = v
	}
	c.Open = nr == sysOpen || nr == sysOpenat || nr == sysOpenat2
	return c, nil
}

// readCString reads a NUL-terminated string of at most PATH_MAX bytes at
// addr in thread tid's memory. A read that runs into an unmapped page
// returns what came before it.
func readCString(tid uint32, addr uint64) (string, error) {
	buf := make([]byte, syscall.PathMax)
	n, err := procFiles.read(tid, "mem", buf, int64(addr))
	if n == 0 && err != nil {
		return "", fmt.Errorf("read path at %#x: %w", addr, err)
	}
	i := bytes.IndexByte(buf[:n], 0)
	if i < 0 {
		return "", fmt.Errorf("path at %#x: no terminating NUL in %d bytes", addr, n)
	}
	return string(buf[:i]), nil
}

// Classify says what a LOOKUP of rel (a clean path relative to the mount,
// the missing name being its last element) is for, given the caller's
// syscall and the directory the filesystem is mounted on.
func Classify(c Call, tid uint32, mountpoint, rel string) Intent {
	if !c.Open || !readOnlyFileOpen(c.Flags) {
		// Only read-only opens wait. A create or write open of a path
		// with a missing directory fails with ENOENT anyway.
		return Other
	}
	target := c.Path
	if !filepath.IsAbs(target) {
		base, err := baseDir(tid, c.Dirfd)
		if err != nil {
			return Unknown
		}
		target = filepath.Join(base, target)
	}
	target = filepath.Clean(target)
	trailingSlash := strings.HasSuffix(c.Path, "/")

	role := roleOf(target, mountpoint, rel)
	if role == OpenFile && trailingSlash {
		return Other
	}
	return role
}

// roleOf places rel within the caller's target path: its last component
// (OpenFile), a directory on the way (Traverse) or neither (Other).
func roleOf(target, mountpoint, rel string) Intent {
	if inside, ok := strings.CutPrefix(target, mountpoint+"/"); ok {
		if inside == rel {
			return OpenFile
		}
		if strings.HasPrefix(inside, rel+"/") {
			return Traverse
		}
	}
	// The path reached us some other way (a symlink, a bind mount, a
	// chroot). Fall back on the name alone: the last component of the
	// target is the file, an earlier one a directory.
	name := rel[strings.LastIndexByte(rel, '/')+1:]
	parts := strings.Split(strings.Trim(target, "/"), "/")
	if parts[len(parts)-1] == name {
		return OpenFile
	}
	for _, p := range parts[:len(parts)-1] {
		if p == name {
			return Traverse
		}
	}
	return Other
}

// readOnlyFileOpen reports whether open flags ask to read an existing regular
// file: no write access, no creation or truncation, not a directory or path
// handle.
func readOnlyFileOpen(flags uint64) bool {
	if flags&syscall.O_ACCMODE != syscall.O_RDONLY {
		return false
	}
	const refuse = syscall.O_CREAT | syscall.O_TRUNC | syscall.O_DIRECTORY | oPath | oTmpfile
	return flags&refuse == 0
}

const (
	oPath    = 0x200000
	oTmpfile = 0x400000 | syscall.O_DIRECTORY
)

// baseDir is the directory a relative open path starts from.
func baseDir(tid uint32, dirfd int32) (string, error) {
	proc := "/proc/" + strconv.FormatUint(uint64(tid), 10)
	if dirfd == atFDCWD {
		return os.Readlink(proc + "/cwd")
	}
	if dirfd < 0 {
		return "", fmt.Errorf("bad dirfd %d", dirfd)
	}
	return os.Readlink(proc + "/fd/" + strconv.Itoa(int(dirfd)))
}

// Tgid returns the process (thread group) id of thread tid.
func Tgid(tid uint32) (uint32, error) {
	if tgid, ok := tgids.get(tid); ok && inGroup(tgid, tid) {
		return tgid, nil
	}
	tgid, _, err := status(tid)
	if err == nil {
		tgids.put(tid, tgid)
	}
	return tgid, err
}

// tgids remembers the processes of threads seen lately: the kernel formats
// the whole of /proc/<tid>/status for one line of it, at every create and
// close, and that cost more than the rest of their work here.
var tgids = tgidCache{m: make(map[uint32]tgidEntry)}

// maxTgids bounds the threads remembered; past it they are forgotten all
// at once (they are read again). tgidLifetime bounds how long one is
// trusted: the check in inGroup holds unless both ids were reused, as
// threads of one process, meanwhile.
const (
	maxTgids     = 4096
	tgidLifetime = 2 * time.Second
)

type tgidCache struct {
	mu sync.Mutex
	m  map[uint32]tgidEntry
}

type tgidEntry struct {
	tgid uint32
	seen time.Time
}

func (c *tgidCache) get(tid uint32) (uint32, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[tid]
	if !ok || time.Since(e.seen) > tgidLifetime {
		return 0, false
	}
	return e.tgid, true
}

func (c *tgidCache) put(tid, tgid uint32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.m) >= maxTgids {
		clear(c.m)
	}
	c.m[tid] = tgidEntry{tgid: tgid, seen: time.Now()}
}

// inGroup reports whether thread tid belongs to the group of tgid now. A
// thread id is reused only once its thread ended, and then for a thread of
// another process (whose group /proc does not list it under tgid) or for
// a new process of that id (whose group is itself); only if tgid was
// reused too, in the same group, is the answer wrong (see tgidLifetime).
func inGroup(tgid, tid uint32) bool {
	// Signal 0 sends nothing: the kernel only finds thread tid in
	// process tgid (ESRCH if it is not there), then checks that the
	// daemon may signal it (EPERM: it is there). One system call, where
	// a stat of /proc/<tgid>/task/<tid> walks procfs.
	err := unix.Tgkill(int(tgid), int(tid), 0)
	return err == nil || err == unix.EPERM
}

// Groups returns the supplementary group ids of thread tid.
func Groups(tid uint32) ([]uint32, error) {
	_, groups, err := status(tid)
	return groups, err
}

// status reads the process id and the supplementary groups of thread tid
// from /proc/<tid>/status.
func status(tid uint32) (tgid uint32, groups []uint32, err error) {
	var buf [4096]byte
	n, err := procFiles.read(tid, "status", buf[:], 0)
	if err != nil {
		return 0, nil, err
	}
	haveTgid := false
	for _, line := range strings.Split(string(buf[:n]), "\n") {
		if v, ok := strings.CutPrefix(line, "Tgid:"); ok {
			t, err := strconv.ParseUint(strings.TrimSpace(v), 10, 32)
			if err != nil {
				return 0, nil, fmt.Errorf("tgid %q: %w", v, err)
			}
			tgid, haveTgid = uint32(t), true
		} else if v, ok := strings.CutPrefix(line, "Groups:"); ok {
			for _, g := range strings.Fields(v) {
				id, err := strconv.ParseUint(g, 10, 32)
				if err != nil {
					return 0, nil, fmt.Errorf("group %q: %w", g, err)
				}
				groups = append(groups, uint32(id))
			}
			break
		}
	}
	if !haveTgid {
		return 0, nil, errors.New("no Tgid line in /proc/<tid>/status")
	}
	return tgid, groups, nil
}

// HoldsPath reports whether process pid has a descriptor open on path
// (as /proc/<pid>/fd shows it: the path through which it was opened, as
// the daemon sees it, with " (deleted)" after it once the kernel dropped
// the name: unlinked, or forgotten when dyadfs told it the entry changed).
// A process that is exiting, or that the daemon cannot see, holds nothing.
func HoldsPath(pid uint32, path string) bool {
	// Raw system calls: an os.File would also ask the poller to take the
	// directory (refused) and read its flags, at every writer's close.
	dirfd, err := unix.Open("/proc/"+strconv.FormatUint(uint64(pid), 10)+"/fd", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(dirfd)
	const gone = " (deleted)"
	link := make([]byte, len(path)+len(gone)+1)
	var ents [4096]byte
	var names []string
	for {
		n, err := unix.Getdents(dirfd, ents[:])
		if err != nil {
			return false
		}
		if n <= 0 {
			break
		}
		_, _, names = unix.ParseDirent(ents[:n], -1, names[:0])
		for _, name := range names {
			// A longer target fills link, which is one byte longer
			// than any target that matches. Relative to the open
			// directory, each readlink skips the walk down /proc.
			k, err := unix.Readlinkat(dirfd, name, link)
			if err != nil || k == len(link) {
				continue
			}
			if t := string(link[:k]); t == path || t == path+gone {
				return true
			}
		}
	}
	return false
}
