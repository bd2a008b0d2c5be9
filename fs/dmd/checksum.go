package dmd

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dyadfs/dyadfs/hfl"
	"github.com/dyadfs/dyadfs/internal/digest"
)

// sumCache remembers the checksums computed to publish files, by file and
// stamp (size, mtime, ctime), so that a second name of a file, or a
// publish that is retried, does not read the file again. A change of
// content changes the stamp, except one that leaves no trace (a bit
// flipped on the disk), which keeps the checksum of what was published:
// what consumers must check against. A file written through the mount is
// always hashed again (timestamps are coarse: two writes can leave the
// same).
type sumCache struct {
	mu sync.Mutex
	m  map[FileID]cachedSum
}

type cachedSum struct {
	stamp fileStamp
	sum   digest.Sum
}

// sumCacheMax bounds the cache; past it, it starts again empty.
const sumCacheMax = 1 << 16

func (c *sumCache) get(st *syscall.Stat_t) (digest.Sum, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[IDOf(st)]
	if !ok || e.stamp != stampOf(st) {
		return digest.Sum{}, false
	}
	return e.sum, true
}

func (c *sumCache) put(st *syscall.Stat_t, sum digest.Sum) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m) >= sumCacheMax {
		c.m = make(map[FileID]cachedSum)
	}
	c.m[IDOf(st)] = cachedSum{stamp: stampOf(st), sum: sum}
}

// fileRecord is the record that publishes the file at rel, whose lstat is
// st, with its checksum. fd, if not negative, is a descriptor of the file
// (read through /proc, so a write-only one does); otherwise the file is
// opened at rel. inline, if not nil, is its content, read already. With
// written, the file was just written here: no checksum of its is reused.
//
// Nothing is published unverified because of a race: a file that changes
// while it is hashed is hashed again as it is then (st is updated), up to
// a few times; one that still changes fails (errChanged), and one that
// went fails with errGone (unlinked, or, when it is opened by its path,
// renamed away: the rename publishes its new name); the caller does not
// publish it now. A file
// that cannot be read (an I/O error, permissions) is published without a
// checksum, as before: its readers then fail on reading it, not waiting.
func (d *DMD) fileRecord(rel string, fd int, st *syscall.Stat_t, inline *hfl.Inline, written bool) (hfl.Record, error) {
	for attempt := 0; ; attempt++ {
		rec, err := d.fileRecordOnce(rel, fd, st, inline, written)
		if err == nil || attempt == 2 {
			return rec, err
		}
		inline, written = nil, true
		var now syscall.Stat_t
		if fd >= 0 {
			err = syscall.Fstat(fd, &now)
		} else {
			err = d.back.Lstat(rel, &now)
		}
		if errors.Is(err, syscall.ENOENT) || (err == nil && (IDOf(&now) != IDOf(st) || now.Nlink == 0)) {
			return hfl.Record{}, fmt.Errorf("%s: %w", rel, errGone)
		}
		if err != nil {
			return hfl.Record{}, err
		}
		*st = now
	}
}

// errGone: the file is no longer at the path being published; errChanged:
// it changed while it was hashed.
var (
	errGone    = errors.New("the file went from its path")
	errChanged = errors.New("changed while it was hashed")
)

func (d *DMD) fileRecordOnce(rel string, fd int, st *syscall.Stat_t, inline *hfl.Inline, written bool) (hfl.Record, error) {
	rec := recordOf(rel, d.cfg.Node, st)
	rec.Ino = d.inoOf(rel, fd, st)
	rec.Inline = inline
	if st.Mode&syscall.S_IFMT != syscall.S_IFREG || d.solo() {
		return rec, nil // nothing is ever fetched
	}
	if sum, ok := d.sums.get(st); ok && !written {
		rec.Sum = sum
		return rec, nil
	}
	sum, err := d.checksum(rel, fd, st, inline)
	if err != nil && (errors.Is(err, errChanged) || errors.Is(err, syscall.ENOENT)) {
		return hfl.Record{}, fmt.Errorf("checksum %s: %w", rel, err)
	}
	if err != nil {
		// Consumers install it unverified (counted), which beats not
		// publishing a file that is there.
		d.log.Warn("cannot checksum file; publishing it without", "path", rel, "err", err)
		return rec, nil
	}
	d.sums.put(st, sum)
	rec.Sum = sum
	return rec, nil
}

// checksum hashes the file (see fileRecord), and fails if it changed
// while it was read.
func (d *DMD) checksum(rel string, fd int, st *syscall.Stat_t, inline *hfl.Inline) (digest.Sum, error) {
	start := time.Now()
	var sum digest.Sum
	if inline != nil && int64(len(inline.Data)) == st.Size {
		sum = digest.Bytes(inline.Data) // inlineOf checked it is st's content
	} else {
		var f *os.File
		var err error
		if fd >= 0 {
			f, err = os.Open(fmt.Sprintf("/proc/self/fd/%d", fd))
		} else {
			f, err = d.OpenBeneath(rel, unix.O_RDONLY|unix.O_NOCTTY|unix.O_NONBLOCK)
		}
		if err != nil {
			return sum, err
		}
		defer f.Close()
		if sum, err = digest.File(f, st.Size); err != nil {
			return sum, err
		}
		var after syscall.Stat_t
		if err := syscall.Fstat(int(f.Fd()), &after); err != nil {
			return sum, err
		}
		if IDOf(&after) != IDOf(st) || after.Size != st.Size || after.Mtim != st.Mtim {
			return digest.Sum{}, fmt.Errorf("%s: %w", rel, errChanged)
		}
	}
	d.stats.checksums.Add(1)
	d.stats.checksumBytes.Add(uint64(st.Size))
	d.stats.checksumNanos.Add(uint64(time.Since(start)))
	return sum, nil
}
