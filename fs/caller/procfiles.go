package caller

import (
	"container/list"
	"errors"
	"strconv"
	"sync"
	"syscall"
)

// procFiles keeps /proc/<tid>/{syscall,mem} open for recently seen threads:
// the kernel renders /proc/<tid>/syscall at every read, so a pread at
// offset 0 of a kept descriptor is one syscall instead of three. A kept
// descriptor pins the thread (or, for mem, the address space) it was opened
// for: once that is gone, reads fail with ESRCH or return nothing, and the
// descriptor is replaced, so a reused thread id is never read through a
// stale descriptor.
var procFiles = newFdCache(DefaultKeptFiles)

// DefaultKeptFiles is how many /proc files are kept open at most, unless
// SetKeptFiles says otherwise.
const DefaultKeptFiles = 256

// KeptFiles returns how many /proc files are open now, and at most.
func KeptFiles() (open, most int) {
	c := procFiles
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.fds), c.max
}

// SetKeptFiles bounds the /proc files kept open to n (at least 1): a
// daemon with few descriptors keeps fewer.
func SetKeptFiles(n int) {
	c := procFiles
	c.mu.Lock()
	defer c.mu.Unlock()
	c.max = max(n, 1)
	for c.order.Len() > c.max {
		c.evictLocked(c.order.Back().Value.(fdKey))
	}
}

type fdKey struct {
	tid  uint32
	file string
}

type fdCache struct {
	mu    sync.Mutex
	max   int
	order *list.List // of fdKey, front most recent
	fds   map[fdKey]*fdEntry
}

type fdEntry struct {
	fd   int
	elem *list.Element
	refs int  // reads in progress
	dead bool // evicted: close when refs drops to zero
}

func newFdCache(max int) *fdCache {
	return &fdCache{max: max, order: list.New(), fds: make(map[fdKey]*fdEntry)}
}

// read preads /proc/<tid>/<file> at off into buf.
func (c *fdCache) read(tid uint32, file string, buf []byte, off int64) (int, error) {
	for attempt := 0; ; attempt++ {
		e, err := c.get(fdKey{tid, file})
		if err != nil {
			return 0, err
		}
		n, err := syscall.Pread(e.fd, buf, off)
		c.put(e)
		stale := errors.Is(err, syscall.ESRCH) || (err == nil && n == 0 && len(buf) > 0)
		if !stale || attempt > 0 {
			return n, err
		}
		// The thread this descriptor was opened for is gone; the id may
		// name a new thread now. Open it afresh once.
		c.evict(fdKey{tid, file})
	}
}

func (c *fdCache) get(k fdKey) (*fdEntry, error) {
	c.mu.Lock()
	if e, ok := c.fds[k]; ok {
		e.refs++
		c.order.MoveToFront(e.elem)
		c.mu.Unlock()
		return e, nil
	}
	c.mu.Unlock()
	fd, err := syscall.Open("/proc/"+strconv.FormatUint(uint64(k.tid), 10)+"/"+k.file, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.fds[k]; ok {
		// Another reader opened it meanwhile; use theirs.
		syscall.Close(fd)
		old.refs++
		return old, nil
	}
	e := &fdEntry{fd: fd, refs: 1}
	e.elem = c.order.PushFront(k)
	c.fds[k] = e
	for c.order.Len() > c.max {
		c.evictLocked(c.order.Back().Value.(fdKey))
	}
	return e, nil
}

func (c *fdCache) put(e *fdEntry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e.refs--
	if e.dead && e.refs == 0 {
		syscall.Close(e.fd)
	}
}

func (c *fdCache) evict(k fdKey) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.evictLocked(k)
}

func (c *fdCache) evictLocked(k fdKey) {
	e, ok := c.fds[k]
	if !ok {
		return
	}
	delete(c.fds, k)
	c.order.Remove(e.elem)
	e.dead = true
	if e.refs == 0 {
		syscall.Close(e.fd)
	}
}
