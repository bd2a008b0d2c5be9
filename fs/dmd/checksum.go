package dmd

import (
	"errors"
	"fmt"
	"hash/maphash"
	"os"
	"sync"
	"sync/atomic"
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
// renamed away: the rename publishes its new name), and one that a writer
// opened again with errRewritten (its release publishes it); the caller
// does not publish it now. A file
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
		if !d.completeAs(rel, &now) {
			// A writer opened it again (a truncating open, say): what
			// is there now is half written, and that writer's release
			// publishes what it writes.
			return hfl.Record{}, fmt.Errorf("%s: %w", rel, errRewritten)
		}
		*st = now
	}
}

// errGone: the file is no longer at the path being published; errChanged:
// it changed while it was hashed; errRewritten: it changed because a
// writer opened it again.
var (
	errGone      = errors.New("the file went from its path")
	errChanged   = errors.New("changed while it was hashed")
	errRewritten = errors.New("opened for writing again while it was hashed")
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
		opens := d.writeOpens.of(rel, IDOf(st))
		blocks, err := digest.FileBlocks(f, st.Size)
		if err != nil {
			return sum, err
		}
		sum = digest.Combine(blocks)
		var after syscall.Stat_t
		if err := syscall.Fstat(int(f.Fd()), &after); err != nil {
			return sum, err
		}
		// Size and mtime miss a rewrite within one tick of the clock
		// that mtimes take: a writer's open since the hash began says
		// it may have been.
		if IDOf(&after) != IDOf(st) || after.Size != st.Size || after.Mtim != st.Mtim ||
			d.writeOpens.of(rel, IDOf(st)) != opens || !d.completeAs(rel, &after) {
			return digest.Sum{}, fmt.Errorf("%s: %w", rel, errChanged)
		}
		if st.Size >= blockListsMin {
			d.blockLists.put(blocks) // for readers in ranges
		}
	}
	d.stats.checksums.Add(1)
	d.stats.checksumBytes.Add(uint64(st.Size))
	d.stats.checksumNanos.Add(uint64(time.Since(start)))
	return sum, nil
}

// writeOpens counts the opens of writers in a few stripes, by file and by
// name, so that a hash can tell whether a writer came in while it read.
// Stripes are shared: another file's writer at the wrong moment costs a
// second hash, never a wrong one.
type writeOpens struct {
	seedOnce sync.Once
	seed     maphash.Seed
	stripes  [64]atomic.Uint64
}

func (w *writeOpens) byName(rel string) *atomic.Uint64 {
	w.seedOnce.Do(func() { w.seed = maphash.MakeSeed() })
	return &w.stripes[maphash.String(w.seed, rel)%uint64(len(w.stripes))]
}

func (w *writeOpens) byFile(id FileID) *atomic.Uint64 {
	return &w.stripes[(id.Ino*0x9e3779b97f4a7c15^id.Dev)%uint64(len(w.stripes))]
}

// name counts a create at rel; file a writer's open of file id.
func (w *writeOpens) name(rel string) { w.byName(rel).Add(1) }
func (w *writeOpens) file(id FileID)  { w.byFile(id).Add(1) }

// of sums the counts of rel's stripe and id's: either's change changes it.
func (w *writeOpens) of(rel string, id FileID) uint64 {
	return w.byName(rel).Load() + w.byFile(id).Load()
}
