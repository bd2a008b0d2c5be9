package backing

import (
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// dirCache keeps the descriptors of the directories lately used as
// parents: most operations land in a few directories, and opening the
// parent again for each was a tenth of the daemon's CPU per created file.
// An entry is good only while no directory was renamed or removed since
// it was opened (changes counts them, once before and once after each), as
// its descriptor would follow a directory renamed away. Changes made to
// the backing directory by anything but this Dir (another daemon sharing
// the storage) cannot be counted: the cache is off unless CacheDirs.
type dirCache struct {
	on      bool
	changes atomic.Uint64
	mu      sync.Mutex
	m       map[string]*cachedDir
}

type cachedDir struct {
	fd    int
	stamp uint64 // changes when it was opened
	refs  int
	dead  bool // out of the cache: closed at its last release
}

// maxCachedDirs bounds the descriptors the cache holds.
const maxCachedDirs = 64

// CacheDirs turns on the cache of parent directories; only for a backing
// directory that nothing else changes.
func (d *Dir) CacheDirs() {
	d.dirs.mu.Lock()
	d.dirs.on = true
	d.dirs.m = make(map[string]*cachedDir)
	d.dirs.mu.Unlock()
}

// DirsChange is called around a change that may rename or remove a
// directory (before it, and the function it returns after it): cached
// parents opened before it are not used again.
func (d *Dir) DirsChange() func() {
	d.dirs.changes.Add(1)
	return func() { d.dirs.changes.Add(1) }
}

// parent returns an open descriptor of directory dir, and the function
// that releases it.
func (d *Dir) parent(dir string) (int, func(), error) {
	if dir == "" {
		return d.fd, func() {}, nil
	}
	c := &d.dirs
	stamp := c.changes.Load()
	c.mu.Lock()
	if !c.on {
		c.mu.Unlock()
		fd, err := d.OpenDirPath(dir)
		return fd, func() { unix.Close(fd) }, err
	}
	if e := c.m[dir]; e != nil && e.stamp == stamp {
		e.refs++
		c.mu.Unlock()
		return e.fd, func() { c.release(e) }, nil
	}
	c.mu.Unlock()
	fd, err := d.OpenDirPath(dir)
	if err != nil {
		return -1, nil, err
	}
	e := &cachedDir{fd: fd, stamp: stamp, refs: 1}
	c.mu.Lock()
	if old := c.m[dir]; old != nil {
		c.dropLocked(dir, old)
	}
	if len(c.m) >= maxCachedDirs {
		for name, old := range c.m {
			c.dropLocked(name, old)
		}
	}
	c.m[dir] = e
	c.mu.Unlock()
	return fd, func() { c.release(e) }, nil
}

// dropLocked takes e out of the cache; its descriptor closes once unused.
func (c *dirCache) dropLocked(name string, e *cachedDir) {
	delete(c.m, name)
	e.dead = true
	if e.refs == 0 {
		unix.Close(e.fd)
	}
}

func (c *dirCache) release(e *cachedDir) {
	c.mu.Lock()
	if e.refs--; e.refs == 0 && e.dead {
		unix.Close(e.fd)
	}
	c.mu.Unlock()
}

// closeAll closes the cached descriptors (at Close).
func (c *dirCache) closeAll() {
	c.mu.Lock()
	for name, e := range c.m {
		c.dropLocked(name, e)
	}
	c.mu.Unlock()
}
