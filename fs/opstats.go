package fs

import (
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// The FUSE operations counted per operation.
const (
	opLookup = iota
	opGetAttr
	opSetAttr
	opMknod
	opMkdir
	opUnlink
	opRmdir
	opRename
	opLink
	opSymlink
	opReadlink
	opAccess
	opGetXAttr
	opListXAttr
	opSetXAttr
	opRemoveXAttr
	opCreate
	opTmpfile
	opOpen
	opRead
	opLseek
	opGetLk
	opSetLk
	opSetLkw
	opRelease
	opWrite
	opCopyFileRange
	opIoctl
	opFlush
	opFsync
	opFallocate
	opOpenDir
	opReadDir
	opReadDirPlus
	opReleaseDir
	opFsyncDir
	opStatFs
	opStatx
	numOps
)

var opNames = [numOps]string{
	"lookup", "getattr", "setattr", "mknod", "mkdir", "unlink", "rmdir", "rename", "link", "symlink",
	"readlink", "access", "getxattr", "listxattr", "setxattr", "removexattr", "create", "tmpfile", "open", "read",
	"lseek", "getlk", "setlk", "setlkw", "release", "write", "copy_file_range", "ioctl", "flush", "fsync",
	"fallocate", "opendir", "readdir", "readdirplus", "releasedir", "fsyncdir", "statfs", "statx",
}

// maxErrno bounds the errno table; larger codes are counted as EIO.
const maxErrno = 256

// opStats counts requests, their latency and the errnos they end with.
type opStats struct {
	count  [numOps]atomic.Uint64
	errs   [numOps]atomic.Uint64
	nanos  [numOps]atomic.Uint64
	errnos [maxErrno]atomic.Uint64
}

func newOpStats() *opStats { return &opStats{} }

func (s *opStats) record(op int, start time.Time, st fuse.Status) {
	s.count[op].Add(1)
	s.nanos[op].Add(uint64(time.Since(start)))
	if st != fuse.OK {
		s.errs[op].Add(1)
		code := int(st)
		if code <= 0 || code >= maxErrno {
			code = int(syscall.EIO)
		}
		s.errnos[code].Add(1)
	}
}

// OpStat is one operation's counters in the status file.
type OpStat struct {
	Count     uint64  `json:"count"`
	Errors    uint64  `json:"errors"`
	MeanMicro float64 `json:"mean_us"`
}

func (s *opStats) snapshot() (map[string]OpStat, map[string]uint64) {
	ops := make(map[string]OpStat)
	for i := 0; i < numOps; i++ {
		n := s.count[i].Load()
		if n == 0 {
			continue
		}
		ops[opNames[i]] = OpStat{
			Count:     n,
			Errors:    s.errs[i].Load(),
			MeanMicro: float64(s.nanos[i].Load()) / float64(n) / 1e3,
		}
	}
	errnos := make(map[string]uint64)
	for code := 1; code < maxErrno; code++ {
		if n := s.errnos[code].Load(); n > 0 {
			errnos[errnoName(syscall.Errno(code))] = n
		}
	}
	return ops, errnos
}

// errnoName is the symbolic name of an errno ("ENOENT"), or its number.
func errnoName(e syscall.Errno) string {
	if name, ok := errnoNames[e]; ok {
		return name
	}
	return "errno" + strconv.Itoa(int(e))
}

var errnoNames = map[syscall.Errno]string{
	syscall.EPERM: "EPERM", syscall.ENOENT: "ENOENT", syscall.EINTR: "EINTR", syscall.EIO: "EIO",
	syscall.EBADF: "EBADF", syscall.EAGAIN: "EAGAIN", syscall.ENOMEM: "ENOMEM", syscall.EACCES: "EACCES",
	syscall.EBUSY: "EBUSY", syscall.EEXIST: "EEXIST", syscall.EXDEV: "EXDEV", syscall.ENOTDIR: "ENOTDIR",
	syscall.EISDIR: "EISDIR", syscall.EINVAL: "EINVAL", syscall.ENOSPC: "ENOSPC", syscall.EROFS: "EROFS",
	syscall.ERANGE: "ERANGE", syscall.ENAMETOOLONG: "ENAMETOOLONG", syscall.ENOSYS: "ENOSYS",
	syscall.ENOTEMPTY: "ENOTEMPTY", syscall.ELOOP: "ELOOP", syscall.ENODATA: "ENODATA",
	syscall.EOPNOTSUPP: "EOPNOTSUPP", syscall.ENOTCONN: "ENOTCONN", syscall.ETIMEDOUT: "ETIMEDOUT",
	syscall.EDQUOT: "EDQUOT", syscall.EFBIG: "EFBIG", syscall.EMFILE: "EMFILE", syscall.ENFILE: "ENFILE",
}

// countingFS wraps the node filesystem and counts every request: the one
// place that sees every operation and the errno it ends with.
type countingFS struct {
	fuse.RawFileSystem
	s *opStats
}

func newCountingFS(inner fuse.RawFileSystem, s *opStats) *countingFS {
	return &countingFS{RawFileSystem: inner, s: s}
}

func (c *countingFS) Lookup(cancel <-chan struct{}, h *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	t := time.Now()
	st := c.RawFileSystem.Lookup(cancel, h, name, out)
	c.s.record(opLookup, t, st)
	return st
}

func (c *countingFS) GetAttr(cancel <-chan struct{}, in *fuse.GetAttrIn, out *fuse.AttrOut) fuse.Status {
	t := time.Now()
	st := c.RawFileSystem.GetAttr(cancel, in, out)
	c.s.record(opGetAttr, t, st)
	return st
}

func (c *countingFS) SetAttr(cancel <-chan struct{}, in *fuse.SetAttrIn, out *fuse.AttrOut) fuse.Status {
	t := time.Now()
	st := c.RawFileSystem.SetAttr(cancel, in, out)
	c.s.record(opSetAttr, t, st)
	return st
}

func (c *countingFS) Mknod(cancel <-chan struct{}, in *fuse.MknodIn, name string, out *fuse.EntryOut) fuse.Status {
	t := time.Now()
	st := c.RawFileSystem.Mknod(cancel, in, name, out)
	c.s.record(opMknod, t, st)
	return st
}

func (c *countingFS) Mkdir(cancel <-chan struct{}, in *fuse.MkdirIn, name string, out *fuse.EntryOut) fuse.Status {
	t := time.Now()
	st := c.RawFileSystem.Mkdir(cancel, in, name, out)
	c.s.record(opMkdir, t, st)
	return st
}

func (c *countingFS) Unlink(cancel <-chan struct{}, h *fuse.InHeader, name string) fuse.Status {
	t := time.Now()
	st := c.RawFileSystem.Unlink(cancel, h, name)
	c.s.record(opUnlink, t, st)
	return st
}

func (c *countingFS) Rmdir(cancel <-chan struct{}, h *fuse.InHeader, name string) fuse.Status {
	t := time.Now()
	st := c.RawFileSystem.Rmdir(cancel, h, name)
	c.s.record(opRmdir, t, st)
	return st
}

func (c *countingFS) Rename(cancel <-chan struct{}, in *fuse.RenameIn, oldName, newName string) fuse.Status {
	t := time.Now()
	st := c.RawFileSystem.Rename(cancel, in, oldName, newName)
	c.s.record(opRename, t, st)
	return st
}

func (c *countingFS) Link(cancel <-chan struct{}, in *fuse.LinkIn, name string, out *fuse.EntryOut) fuse.Status {
	t := time.Now()
	st := c.RawFileSystem.Link(cancel, in, name, out)
	c.s.record(opLink, t, st)
	return st
}

func (c *countingFS) Symlink(cancel <-chan struct{}, h *fuse.InHeader, target, name string, out *fuse.EntryOut) fuse.Status {
	t := time.Now()
	st := c.RawFileSystem.Symlink(cancel, h, target, name, out)
	c.s.record(opSymlink, t, st)
	return st
}

func (c *countingFS) Readlink(cancel <-chan struct{}, h *fuse.InHeader) ([]byte, fuse.Status) {
	t := time.Now()
	out, st := c.RawFileSystem.Readlink(cancel, h)
	c.s.record(opReadlink, t, st)
	return out, st
}

func (c *countingFS) Access(cancel <-chan struct{}, in *fuse.AccessIn) fuse.Status {
	t := time.Now()
	st := c.RawFileSystem.Access(cancel, in)
	c.s.record(opAccess, t, st)
	return st
}

func (c *countingFS) GetXAttr(cancel <-chan struct{}, h *fuse.InHeader, attr string, dest []byte) (uint32, fuse.Status) {
	t := time.Now()
	n, st := c.RawFileSystem.GetXAttr(cancel, h, attr, dest)
	c.s.record(opGetXAttr, t, st)
	return n, st
}

func (c *countingFS) ListXAttr(cancel <-chan struct{}, h *fuse.InHeader, dest []byte) (uint32, fuse.Status) {
	t := time.Now()
	n, st := c.RawFileSystem.ListXAttr(cancel, h, dest)
	c.s.record(opListXAttr, t, st)
	return n, st
}

func (c *countingFS) SetXAttr(cancel <-chan struct{}, in *fuse.SetXAttrIn, attr string, data []byte) fuse.Status {
	t := time.Now()
	st := c.RawFileSystem.SetXAttr(cancel, in, attr, data)
	c.s.record(opSetXAttr, t, st)
	return st
}

func (c *countingFS) RemoveXAttr(cancel <-chan struct{}, h *fuse.InHeader, attr string) fuse.Status {
	t := time.Now()
	st := c.RawFileSystem.RemoveXAttr(cancel, h, attr)
	c.s.record(opRemoveXAttr, t, st)
	return st
}

func (c *countingFS) Create(cancel <-chan struct{}, in *fuse.CreateIn, name string, out *fuse.CreateOut) fuse.Status {
	t := time.Now()
	st := c.RawFileSystem.Create(cancel, in, name, out)
	c.s.record(opCreate, t, st)
	return st
}

func (c *countingFS) Tmpfile(cancel <-chan struct{}, in *fuse.CreateIn, out *fuse.CreateOut) fuse.Status {
	t := time.Now()
	st := c.RawFileSystem.Tmpfile(cancel, in, out)
	c.s.record(opTmpfile, t, st)
	return st
}

func (c *countingFS) Open(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	t := time.Now()
	st := c.RawFileSystem.Open(cancel, in, out)
	c.s.record(opOpen, t, st)
	return st
}

func (c *countingFS) Read(cancel <-chan struct{}, in *fuse.ReadIn, buf []byte) (fuse.ReadResult, fuse.Status) {
	t := time.Now()
	r, st := c.RawFileSystem.Read(cancel, in, buf)
	c.s.record(opRead, t, st)
	return r, st
}

func (c *countingFS) Lseek(cancel <-chan struct{}, in *fuse.LseekIn, out *fuse.LseekOut) fuse.Status {
	t := time.Now()
	st := c.RawFileSystem.Lseek(cancel, in, out)
	c.s.record(opLseek, t, st)
	return st
}

func (c *countingFS) GetLk(cancel <-chan struct{}, in *fuse.LkIn, out *fuse.LkOut) fuse.Status {
	t := time.Now()
	st := c.RawFileSystem.GetLk(cancel, in, out)
	c.s.record(opGetLk, t, st)
	return st
}

func (c *countingFS) SetLk(cancel <-chan struct{}, in *fuse.LkIn) fuse.Status {
	t := time.Now()
	st := c.RawFileSystem.SetLk(cancel, in)
	c.s.record(opSetLk, t, st)
	return st
}

func (c *countingFS) SetLkw(cancel <-chan struct{}, in *fuse.LkIn) fuse.Status {
	t := time.Now()
	st := c.RawFileSystem.SetLkw(cancel, in)
	c.s.record(opSetLkw, t, st)
	return st
}

func (c *countingFS) Release(cancel <-chan struct{}, in *fuse.ReleaseIn) {
	t := time.Now()
	c.RawFileSystem.Release(cancel, in)
	c.s.record(opRelease, t, fuse.OK)
}

func (c *countingFS) Write(cancel <-chan struct{}, in *fuse.WriteIn, data []byte) (uint32, fuse.Status) {
	t := time.Now()
	n, st := c.RawFileSystem.Write(cancel, in, data)
	c.s.record(opWrite, t, st)
	return n, st
}

func (c *countingFS) Writev(cancel <-chan struct{}, in *fuse.WriteIn, data [][]byte) (uint32, fuse.Status) {
	t := time.Now()
	n, st := c.RawFileSystem.Writev(cancel, in, data)
	c.s.record(opWrite, t, st)
	return n, st
}

func (c *countingFS) CopyFileRange(cancel <-chan struct{}, in *fuse.CopyFileRangeIn) (uint32, fuse.Status) {
	t := time.Now()
	n, st := c.RawFileSystem.CopyFileRange(cancel, in)
	c.s.record(opCopyFileRange, t, st)
	return n, st
}

func (c *countingFS) Ioctl(cancel <-chan struct{}, in *fuse.IoctlIn, inbuf []byte, out *fuse.IoctlOut, outbuf []byte) fuse.Status {
	t := time.Now()
	st := c.RawFileSystem.Ioctl(cancel, in, inbuf, out, outbuf)
	c.s.record(opIoctl, t, st)
	return st
}

func (c *countingFS) Flush(cancel <-chan struct{}, in *fuse.FlushIn) fuse.Status {
	t := time.Now()
	st := c.RawFileSystem.Flush(cancel, in)
	c.s.record(opFlush, t, st)
	return st
}

func (c *countingFS) Fsync(cancel <-chan struct{}, in *fuse.FsyncIn) fuse.Status {
	t := time.Now()
	st := c.RawFileSystem.Fsync(cancel, in)
	c.s.record(opFsync, t, st)
	return st
}

func (c *countingFS) Fallocate(cancel <-chan struct{}, in *fuse.FallocateIn) fuse.Status {
	t := time.Now()
	st := c.RawFileSystem.Fallocate(cancel, in)
	c.s.record(opFallocate, t, st)
	return st
}

func (c *countingFS) OpenDir(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	t := time.Now()
	st := c.RawFileSystem.OpenDir(cancel, in, out)
	c.s.record(opOpenDir, t, st)
	return st
}

func (c *countingFS) ReadDir(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	t := time.Now()
	st := c.RawFileSystem.ReadDir(cancel, in, out)
	c.s.record(opReadDir, t, st)
	return st
}

func (c *countingFS) ReadDirPlus(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	t := time.Now()
	st := c.RawFileSystem.ReadDirPlus(cancel, in, out)
	c.s.record(opReadDirPlus, t, st)
	return st
}

func (c *countingFS) ReleaseDir(in *fuse.ReleaseIn) {
	t := time.Now()
	c.RawFileSystem.ReleaseDir(in)
	c.s.record(opReleaseDir, t, fuse.OK)
}

func (c *countingFS) FsyncDir(cancel <-chan struct{}, in *fuse.FsyncIn) fuse.Status {
	t := time.Now()
	st := c.RawFileSystem.FsyncDir(cancel, in)
	c.s.record(opFsyncDir, t, st)
	return st
}

func (c *countingFS) StatFs(cancel <-chan struct{}, h *fuse.InHeader, out *fuse.StatfsOut) fuse.Status {
	t := time.Now()
	st := c.RawFileSystem.StatFs(cancel, h, out)
	c.s.record(opStatFs, t, st)
	return st
}

func (c *countingFS) Statx(cancel <-chan struct{}, in *fuse.StatxIn, out *fuse.StatxOut) fuse.Status {
	t := time.Now()
	st := c.RawFileSystem.Statx(cancel, in, out)
	c.s.record(opStatx, t, st)
	return st
}
