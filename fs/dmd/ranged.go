package dmd

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/zeebo/xxh3"
	"golang.org/x/sys/unix"

	"github.com/dyadfs/dyadfs/dtl"
	"github.com/dyadfs/dyadfs/hfl"
	"github.com/dyadfs/dyadfs/internal/digest"
)

// A large file of another node can be read in ranges: its open returns
// once the record is known, and reads fetch the blocks they touch (with
// read-ahead when the reads are sequential). Until every block is here the
// file lives apart from the backing directory, in the ranged directory
// (.dyadfs/ranged-NODE): data file, a description of the version, and one
// byte per block saying which blocks arrived verified. Nothing else of
// dyadfs sees it, so a file that is partly here is never served, shown or
// fetched as whole. Once every block is here it is installed as any
// fetched copy is, and later opens pass through to it.

// RangeConfig says which files are read in ranges.
type RangeConfig struct {
	// Threshold: files of at least this many bytes are read in ranges;
	// 0: none.
	Threshold int64
	// ReadAhead bounds how far ahead of sequential reads blocks are
	// fetched.
	ReadAhead int64
	// Fill fetches the rest of a file read in ranges in the background.
	Fill bool
}

// DefaultRangeConfig returns the defaults.
func DefaultRangeConfig() RangeConfig {
	return RangeConfig{Threshold: 256 << 20, ReadAhead: 8 << 20}
}

// Block states, one byte each in the map file.
const (
	blockMissing = 0
	blockHere    = 1 // arrived and verified (checked again after a restart)
)

// rangedMeta is what the description file holds.
type rangedMeta struct {
	Path    string     `json:"path"`
	Owner   string     `json:"owner"`
	Gen     uint64     `json:"generation"`
	Size    int64      `json:"size"`
	Mode    uint32     `json:"mode"`
	Uid     uint32     `json:"uid"`
	Gid     uint32     `json:"gid"`
	MtimeNs int64      `json:"mtime_ns"`
	Sum     digest.Sum `json:"sum"`
	Ino     uint64     `json:"ino"`
	Blocks  []uint64   `json:"blocks"`
}

// RangedFile is a file of another node read in ranges.
type RangedFile struct {
	d      *DMD
	key    string
	meta   rangedMeta
	data   *os.File
	have   *os.File
	rec    hfl.Record
	unroom func() // gives back the room reserved for it

	mu       sync.Mutex
	state    []byte // per block: blockMissing, blockHere
	checked  []bool // verified since this daemon started
	inflight map[int64]chan struct{}
	here     int64
	opens    int
	fetching int  // fetches and an install using its files
	filling  bool // the rest is being fetched aside
	gone     bool // replaced or dropped: its files go once nothing uses them
	whole    bool // being installed, or installed, at its path
	removed  bool // its files are gone (or, whole, installed)
	// failed: the owner no longer has this version.
	failed error
}

// busyLocked reports whether anything still uses the file's files.
func (f *RangedFile) busyLocked() bool { return f.opens > 0 || f.fetching > 0 || f.filling }

// lastLocked reports whether the files should go now.
func (f *RangedFile) lastLocked() bool { return f.gone && !f.busyLocked() && !f.removed }

// rangedFiles are the files read in ranges, by path.
type rangedFiles struct {
	mu sync.Mutex
	m  map[string]*RangedFile
	// creating holds the paths whose file an open is making: other opens
	// of the path wait for it.
	creating map[string]chan struct{}
	// wg counts the goroutines that fetch or install aside; closed says
	// none may start (the managed directory is closing).
	wg     sync.WaitGroup
	closed bool
	// counters
	opened, installed, corrupt atomic.Uint64
}

// goAside runs fn on its own goroutine, unless the managed directory is
// closing; it reports whether it did.
func (d *DMD) goAside(fn func()) bool {
	rs := &d.ranged
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.closed {
		return false
	}
	rs.wg.Add(1)
	go func() {
		defer rs.wg.Done()
		fn()
	}()
	return true
}

// closeRanged waits for the fetches aside and closes the files read in
// ranges (their blocks stay, for the next daemon).
func (d *DMD) closeRanged() {
	rs := &d.ranged
	rs.mu.Lock()
	rs.closed = true
	rs.mu.Unlock()
	rs.wg.Wait()
	rs.mu.Lock()
	defer rs.mu.Unlock()
	for _, f := range rs.m {
		f.data.Close()
		f.have.Close()
	}
}

func (d *DMD) rangedDir() string { return filepath.Join(d.internalPath(), "ranged-"+d.cfg.Node) }

// readsInRanges reports whether rec's file is read in ranges here.
func (d *DMD) readsInRanges(rec hfl.Record) bool {
	c := d.cfg.Ranges
	// A sparse file is fetched whole: its holes are not sent, and read
	// here they would all pass through the daemon, not the kernel.
	return c.Threshold > 0 && rec.Size >= c.Threshold && !rec.Sum.IsZero() && rec.Inline == nil && rec.Alloc == 0 &&
		rec.Mode&syscall.S_IFMT == syscall.S_IFREG && d.fetcher != nil && d.fetcher.FetchesRanges() &&
		!d.cfg.SharedStorage && rec.Owner != d.cfg.Node && !rec.Writing && rec.Generation > 0
}

// rangedSlot, in a wait's context, receives the file the wait opened in
// ranges, for an open that can read it so; allow, if not nil, says
// whether the opener takes ranges (asked only of files that qualify).
type rangedSlot struct {
	f     *RangedFile
	allow func() bool
}

type rangedSlotKey struct{}

// WaitOpen is WaitPath for an open that reads: a large file of another
// node is not fetched but opened in ranges, and returned (to be released
// with Release); otherwise the backing path of the file, complete here.
func (d *DMD) WaitOpen(ctx context.Context, rel string, tid uint32, allow func() bool) (string, *RangedFile, error) {
	slot := &rangedSlot{allow: allow}
	p, err := d.WaitPath(context.WithValue(ctx, rangedSlotKey{}, slot), rel, tid)
	if err != nil {
		if slot.f != nil {
			slot.f.Release()
		}
		return "", nil, err
	}
	return p, slot.f, nil
}

// openRanged opens rec's file in ranges for a wait whose context asks for
// it; errNoRanges if it does not, or the owner cannot give block hashes.
// One open makes the file; the others of the path wait for it.
func (d *DMD) openRanged(ctx context.Context, rel string, rec hfl.Record) (*RangedFile, error) {
	slot, ok := ctx.Value(rangedSlotKey{}).(*rangedSlot)
	if !ok || !d.readsInRanges(rec) || (slot.allow != nil && !slot.allow()) {
		return nil, errNoRanges
	}
	rs := &d.ranged
	for {
		rs.mu.Lock()
		if f := rs.m[rel]; f != nil {
			if f.meta.Owner == rec.Owner && f.meta.Gen == rec.Generation {
				f.mu.Lock()
				ok := !f.gone && f.failed == nil
				if ok {
					f.opens++
				}
				f.mu.Unlock()
				if ok {
					rs.mu.Unlock()
					slot.f = f
					return f, nil
				}
			}
			delete(rs.m, rel)
			rs.mu.Unlock()
			f.drop()
			continue
		}
		if ch := rs.creating[rel]; ch != nil {
			rs.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		if rs.creating == nil {
			rs.creating = make(map[string]chan struct{})
		}
		ch := make(chan struct{})
		rs.creating[rel] = ch
		rs.mu.Unlock()
		f, err := d.newRanged(ctx, rel, rec)
		rs.mu.Lock()
		delete(rs.creating, rel)
		close(ch)
		if err == nil {
			if rs.m == nil {
				rs.m = make(map[string]*RangedFile)
			}
			rs.m[rel] = f
		}
		rs.mu.Unlock()
		if err != nil {
			return nil, err
		}
		rs.opened.Add(1)
		slot.f = f
		d.log.Debug("opened in ranges", "path", rel, "owner", rec.Owner, "size", rec.Size)
		return f, nil
	}
}

// newRanged makes the files of a file read in ranges, with one open.
func (d *DMD) newRanged(ctx context.Context, rel string, rec hfl.Record) (*RangedFile, error) {
	v := versionOf(rec)
	blocks, err := d.fetchBlockList(ctx, v)
	switch {
	case errors.Is(err, dtl.ErrStale), errors.Is(err, dtl.ErrNotPublished), errors.Is(err, dtl.ErrNotFound), errors.Is(err, dtl.ErrBusy):
		return nil, fmt.Errorf("%w: %w", dtl.ErrStale, err)
	case errors.Is(err, dtl.ErrCorrupt):
		return nil, err
	case err != nil:
		if ctx.Err() != nil {
			return nil, err
		}
		d.log.Info("cannot read in ranges; fetching whole", "path", rel, "owner", rec.Owner, "err", err)
		return nil, errNoRanges
	}
	unroom, err := d.makeRoom(ctx, rel, rec.Size)
	if err != nil {
		return nil, err
	}
	meta := rangedMeta{Path: rel, Owner: rec.Owner, Gen: rec.Generation, Size: rec.Size, Mode: rec.Mode, Uid: rec.Uid, Gid: rec.Gid,
		MtimeNs: rec.MtimeNs, Sum: rec.Sum, Ino: rec.InodeNumber(), Blocks: blocks}
	if dir := path.Dir(rel); dir != "." {
		// Made as an install makes them: the caller's permission to
		// search them is checked at open.
		if fd, err := d.dirBeneath(dir, rec.Uid, rec.Gid); err == nil {
			unix.Close(fd)
		}
	}
	f, err := d.createRanged(meta)
	if err != nil {
		unroom()
		return nil, fmt.Errorf("%s: %w", rel, err)
	}
	f.unroom, f.rec, f.opens = unroom, rec, 1
	return f, nil
}

// rangedKey names the files of one version read in ranges: the path's
// hash and the generation, and a random part, so that the files of a
// version dropped while still open are never another's.
func rangedKey(rel string, gen uint64) string {
	var r [4]byte
	rand.Read(r[:])
	return rangedKeyPrefix(rel, gen) + hex.EncodeToString(r[:])
}

func rangedKeyPrefix(rel string, gen uint64) string {
	return fmt.Sprintf("%016x-%d-", xxh3.HashString(rel), gen)
}

// createRanged makes the three files of meta's version.
func (d *DMD) createRanged(meta rangedMeta) (*RangedFile, error) {
	dir := d.rangedDir()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	key := rangedKey(meta.Path, meta.Gen)
	base := filepath.Join(dir, key)
	data, err := os.OpenFile(base, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	f := &RangedFile{d: d, key: key, meta: meta, data: data, unroom: func() {}}
	fail := func(err error) (*RangedFile, error) {
		f.removeFiles()
		return nil, err
	}
	if err := data.Truncate(meta.Size); err != nil {
		return fail(err)
	}
	// The owner's attributes, so that the caller's permission to read
	// is checked against them, and the copy installed keeps them.
	if os.Geteuid() == 0 {
		if err := data.Chown(int(meta.Uid), int(meta.Gid)); err != nil {
			return fail(err)
		}
	}
	if err := syscall.Fchmod(int(data.Fd()), meta.Mode&0o1777); err != nil {
		return fail(err)
	}
	n := digest.NumBlocks(meta.Size)
	if f.have, err = os.OpenFile(base+".map", os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600); err != nil {
		return fail(err)
	}
	if err := f.have.Truncate(n); err != nil {
		return fail(err)
	}
	js, err := json.Marshal(meta)
	if err != nil {
		return fail(err)
	}
	// The description last: a version without one is not taken up
	// again after a restart.
	if err := os.WriteFile(base+".json.tmp", js, 0o600); err != nil {
		return fail(err)
	}
	if err := os.Rename(base+".json.tmp", base+".json"); err != nil {
		return fail(err)
	}
	f.state, f.checked = make([]byte, n), make([]bool, n)
	f.inflight = make(map[int64]chan struct{})
	return f, nil
}

// loadRanged takes up, at start, the files read in ranges when the last
// daemon stopped: the blocks here are kept (and checked again before
// they are read or installed), for the next open of the same version.
// With a cache capacity, blocks are kept only while their file is open:
// they go.
func (d *DMD) loadRanged() {
	dir := d.rangedDir()
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	d.ranged.mu.Lock()
	defer d.ranged.mu.Unlock()
	if d.ranged.m == nil {
		d.ranged.m = make(map[string]*RangedFile)
	}
	if !d.copies.bounded() {
		for _, e := range ents {
			key, ok := strings.CutSuffix(e.Name(), ".json")
			if !ok {
				continue
			}
			f, err := d.loadOneRanged(dir, key)
			if err != nil {
				d.log.Warn("dropping a file read in ranges that cannot be taken up again", "file", e.Name(), "err", err)
				continue
			}
			if old := d.ranged.m[f.meta.Path]; old != nil && old.meta.Gen > f.meta.Gen {
				f.data.Close()
				f.have.Close()
				continue
			} else if old != nil {
				old.data.Close()
				old.have.Close()
			}
			d.ranged.m[f.meta.Path] = f
		}
	}
	// What no file taken up owns: versions replaced, or left by a daemon
	// that died making one.
	keep := make(map[string]bool)
	for _, f := range d.ranged.m {
		keep[f.key] = true
	}
	for _, e := range ents {
		key := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(e.Name(), ".tmp"), ".json"), ".map")
		if !keep[key] {
			os.Remove(filepath.Join(dir, e.Name()))
		}
	}
}

func (d *DMD) loadOneRanged(dir, key string) (*RangedFile, error) {
	base := filepath.Join(dir, key)
	js, err := os.ReadFile(base + ".json")
	if err != nil {
		return nil, err
	}
	var meta rangedMeta
	if err := json.Unmarshal(js, &meta); err != nil {
		return nil, err
	}
	n := digest.NumBlocks(meta.Size)
	if int64(len(meta.Blocks)) != n || digest.Combine(meta.Blocks) != meta.Sum || !strings.HasPrefix(key, rangedKeyPrefix(meta.Path, meta.Gen)) {
		return nil, errors.New("its description does not hold together")
	}
	f := &RangedFile{d: d, key: key, meta: meta, inflight: make(map[int64]chan struct{}), checked: make([]bool, n), unroom: func() {}}
	if f.data, err = os.OpenFile(base, os.O_RDWR, 0); err != nil {
		return nil, err
	}
	if f.have, err = os.OpenFile(base+".map", os.O_RDWR, 0); err != nil {
		f.data.Close()
		return nil, err
	}
	f.state = make([]byte, n)
	if _, err := io.ReadFull(f.have, f.state); err != nil {
		f.data.Close()
		f.have.Close()
		return nil, fmt.Errorf("block map: %w", err)
	}
	for _, s := range f.state {
		if s == blockHere {
			f.here++
		}
	}
	f.rec = hfl.Record{Path: meta.Path, Owner: meta.Owner, Generation: meta.Gen, Size: meta.Size, Mode: meta.Mode,
		Uid: meta.Uid, Gid: meta.Gid, MtimeNs: meta.MtimeNs, Sum: meta.Sum, Ino: meta.Ino}
	return f, nil
}

// Record is the record of the version read.
func (f *RangedFile) Record() hfl.Record { return f.rec }

// Data is the file the blocks are in, for permission checks and stat.
func (f *RangedFile) Data() *os.File { return f.data }

// Opened is called once the caller may read the file: with --range-fill,
// the rest is fetched aside.
func (f *RangedFile) Opened() {
	if f.d.cfg.Ranges.Fill {
		f.fillAside()
	}
}

// Release ends one open of the file. With a cache capacity, the blocks of
// a file that is not whole are kept only while it is open: they go with
// the last release, and give back the room they held.
func (f *RangedFile) Release() {
	d := f.d
	f.mu.Lock()
	f.opens--
	drop := f.opens == 0 && d.copies.bounded() && !f.whole
	f.mu.Unlock()
	if drop {
		d.ranged.mu.Lock()
		if d.ranged.m[f.meta.Path] == f {
			delete(d.ranged.m, f.meta.Path)
		}
		d.ranged.mu.Unlock()
	}
	f.update(func() {
		if drop {
			f.gone = true
		}
	})
}

// drop takes the file out of use: a newer version replaced it, or it was
// installed. Its files go once nothing uses them.
func (f *RangedFile) drop() { f.update(func() { f.gone = true }) }

// update applies change under the file's lock, and removes its files if
// nothing uses them any more.
func (f *RangedFile) update(change func()) {
	f.mu.Lock()
	change()
	last := f.lastLocked()
	f.mu.Unlock()
	if last {
		f.removeFiles()
	}
}

// endUse ends a fetch's or an install's use of the files.
func (f *RangedFile) endUse() { f.update(func() { f.fetching-- }) }

// removeFiles removes the files of a version no longer read (the data
// file too, unless it was installed), once.
func (f *RangedFile) removeFiles() {
	base := filepath.Join(f.d.rangedDir(), f.key)
	f.mu.Lock()
	whole, removed := f.whole, f.removed
	f.removed = true
	f.mu.Unlock()
	if removed {
		return
	}
	if !whole && f.data != nil {
		os.Remove(base)
	}
	os.Remove(base + ".map")
	os.Remove(base + ".json")
	if f.data != nil {
		f.data.Close()
	}
	if f.have != nil {
		f.have.Close()
	}
	if f.unroom != nil {
		f.unroom()
	}
}

// ReadCursor is what one handle's reads looked like, for read-ahead.
type ReadCursor struct {
	next   int64 // the block after the last one read
	streak int   // blocks reached in order in a row
	window int64 // blocks kept fetched ahead while the reads go on in order
}

// advance notes a read of blocks first..last and returns how many blocks
// to keep fetched ahead of it. Reads go ahead only once the reads reached
// two new blocks in order: a read at random, and the kernel's read-ahead
// past it, fetch only what they touch.
func (cur *ReadCursor) advance(first, last, most int64) int64 {
	switch {
	case first+1 == cur.next && last < cur.next:
		// Within the block read last: as far ahead as before.
		if cur.streak < 2 {
			return 0
		}
		return cur.window
	case first == cur.next || first+1 == cur.next:
		cur.streak++
	default:
		cur.streak, cur.window = 0, 0
	}
	cur.next = last + 1
	if cur.streak < 2 {
		return 0
	}
	cur.window = min(max(2, 2*cur.window), max(1, most))
	return cur.window
}

// ReadAt reads p at off, fetching the blocks it touches that are not here
// yet. The wait, of thread tid, is bounded and listed as any wait is, and
// ends with the caller's context. A block that does not match its hash is
// an I/O error, and is not kept.
func (f *RangedFile) ReadAt(ctx context.Context, p []byte, off int64, tid uint32, cur *ReadCursor) (int, error) {
	size := f.meta.Size
	if off >= size || len(p) == 0 {
		return 0, nil
	}
	end := min(off+int64(len(p)), size)
	first, last := off/digest.BlockSize, (end-1)/digest.BlockSize
	ahead := int64(0)
	if cur != nil {
		ahead = cur.advance(first, last, f.d.cfg.Ranges.ReadAhead/digest.BlockSize)
	}
	if err := f.ensure(ctx, first, last, ahead, tid); err != nil {
		return 0, err
	}
	n, err := f.data.ReadAt(p[:end-off], off)
	if err == io.EOF {
		err = nil
	}
	return n, err
}

// ensure makes blocks first..last here and verified, fetching those that
// are missing (and, ahead of last, up to ahead more, aside).
func (f *RangedFile) ensure(ctx context.Context, first, last, ahead int64, tid uint32) error {
	var endWait func()
	defer func() {
		if endWait != nil {
			endWait()
		}
	}()
	for attempt := 0; ; attempt++ {
		f.mu.Lock()
		var waitFor []chan struct{}
		var runs [][2]int64
		var recheck []int64
		for i := first; i <= last; i++ {
			switch {
			case f.inflight[i] != nil:
				waitFor = append(waitFor, f.inflight[i])
			case f.state[i] == blockHere && !f.checked[i]:
				recheck = append(recheck, i)
			case f.state[i] != blockHere:
				if n := len(runs); n > 0 && runs[n-1][1] == i {
					runs[n-1][1] = i + 1
				} else {
					runs = append(runs, [2]int64{i, i + 1})
				}
			}
		}
		if len(runs) > 0 && (f.failed != nil || attempt > 3) {
			// Blocks that are here still read; those that are not
			// cannot be fetched.
			err := f.failed
			f.mu.Unlock()
			if err == nil {
				err = fmt.Errorf("%w: %s: blocks %d to %d could not be fetched", ErrFetch, f.meta.Path, first, last)
			}
			return err
		}
		for _, r := range runs {
			f.claimLocked(r[0], r[1])
		}
		aheadRun := [2]int64{}
		if f.failed == nil {
			aheadRun = f.claimAheadLocked(last+1, ahead)
		}
		f.mu.Unlock()
		if aheadRun[1] > aheadRun[0] && !f.d.goAside(func() { f.fetchRun(f.d.life, aheadRun[0], aheadRun[1]) }) {
			f.unclaim(aheadRun[0], aheadRun[1], nil)
		}
		if len(runs) == 0 && len(waitFor) == 0 && len(recheck) == 0 {
			return nil
		}
		if endWait == nil && (len(runs) > 0 || len(waitFor) > 0) {
			wctx, cancel := f.d.waitContext(ctx)
			done, _ := f.d.startWait(f.meta.Path, tid, "range")
			ctx = wctx
			endWait = func() { done(); cancel() }
		}
		var err error
		for i, r := range runs {
			if err = f.fetchRun(ctx, r[0], r[1]); err != nil {
				for _, r := range runs[i+1:] {
					f.unclaim(r[0], r[1], nil)
				}
				break
			}
		}
		if err != nil {
			return err
		}
		for _, i := range recheck {
			if err := f.recheck(i); err != nil {
				return err
			}
		}
		for _, ch := range waitFor {
			select {
			case <-ch:
			case <-ctx.Done():
				return f.d.waitErr(ctx)
			}
		}
	}
}

// claimLocked marks blocks [a, b) as being fetched.
func (f *RangedFile) claimLocked(a, b int64) {
	ch := make(chan struct{})
	for i := a; i < b; i++ {
		f.inflight[i] = ch
	}
}

// claimAheadLocked keeps up to n blocks from a on here or being fetched:
// once fewer than half of them are, it claims the missing ones, in one
// run, and returns it.
func (f *RangedFile) claimAheadLocked(a, n int64) [2]int64 {
	end := min(a+n, int64(len(f.state)))
	covered := int64(0)
	for i := a; i < end; i++ {
		if f.state[i] == blockHere || f.inflight[i] != nil {
			covered++
		}
	}
	if n == 0 || covered >= (end-a+1)/2 && covered > 0 {
		return [2]int64{a, a}
	}
	return f.claimRunLocked(a, end)
}

// claimRunLocked claims the first run of missing blocks in [a, end).
func (f *RangedFile) claimRunLocked(a, end int64) [2]int64 {
	for a < end && (f.state[a] == blockHere || f.inflight[a] != nil) {
		a++
	}
	b := a
	for b < end && f.state[b] != blockHere && f.inflight[b] == nil {
		b++
	}
	if b > a {
		f.claimLocked(a, b)
	}
	return [2]int64{a, b}
}

// unclaim ends the fetch of blocks [a, b); ok says which arrived,
// verified. The one that completes the file installs it, aside.
func (f *RangedFile) unclaim(a, b int64, ok []bool) {
	f.mu.Lock()
	ch := f.inflight[a]
	for i := a; i < b; i++ {
		delete(f.inflight, i)
		if ok != nil && ok[i-a] && f.state[i] != blockHere {
			f.state[i], f.checked[i] = blockHere, true
			f.here++
		}
	}
	whole := f.here == int64(len(f.state)) && !f.whole && !f.gone && !f.removed
	if whole {
		f.fetching++ // the install uses the files
	}
	f.mu.Unlock()
	if ch != nil {
		close(ch)
	}
	if whole && !f.d.goAside(f.install) {
		f.endUse()
	}
}

// fetchRun fetches blocks [a, b), claimed, and keeps those that match
// their hashes.
func (f *RangedFile) fetchRun(ctx context.Context, a, b int64) error {
	f.mu.Lock()
	if f.removed {
		f.mu.Unlock()
		f.unclaim(a, b, nil)
		return fmt.Errorf("%w: %s was dropped while it was read", ErrFetch, f.meta.Path)
	}
	f.fetching++ // its files stay open until the fetch ends
	f.mu.Unlock()
	defer f.endUse()
	size := f.meta.Size
	off, end := a*digest.BlockSize, min(b*digest.BlockSize, size)
	v := versionOf(f.rec)
	// A descriptor of its own: a transport writes at the file's offset
	// (splice), and other runs are fetched at the same time.
	dst, err := os.OpenFile(fmt.Sprintf("/proc/self/fd/%d", f.data.Fd()), os.O_RDWR, 0)
	if err != nil {
		f.unclaim(a, b, nil)
		return fmt.Errorf("%w: %s: %w", ErrFetch, f.meta.Path, err)
	}
	info, err := f.d.fetcher.FetchRange(ctx, v, off, end-off, dst)
	dst.Close()
	if err == nil && (info.Generation != f.meta.Gen || info.Size != size || info.Checksum != f.meta.Sum) {
		err = fmt.Errorf("%s: its owner has generation %d now, not %d: %w", f.meta.Path, info.Generation, f.meta.Gen, dtl.ErrStale)
	}
	if err != nil {
		stale := errors.Is(err, dtl.ErrStale) || errors.Is(err, dtl.ErrNotFound) || errors.Is(err, dtl.ErrNotPublished)
		if stale {
			f.mu.Lock()
			f.failed = fmt.Errorf("%w: %s was replaced on %s while it was read here in ranges; open it again", ErrFetch, f.meta.Path, f.meta.Owner)
			f.mu.Unlock()
			f.d.loc.Forget(f.meta.Path) // the next open looks for the new version
		}
		f.punch(off, end-off)
		f.unclaim(a, b, nil)
		if ctx.Err() != nil {
			return f.d.waitErr(ctx)
		}
		f.d.log.Warn("range fetch failed", "path", f.meta.Path, "owner", f.meta.Owner, "off", off, "len", end-off, "err", err)
		if stale {
			return f.failed
		}
		return fmt.Errorf("%w: %s from %s: %w", ErrFetch, f.meta.Path, f.meta.Owner, err)
	}
	ok := make([]bool, b-a)
	buf := make([]byte, digest.BlockSize)
	var bad error
	for i := a; i < b; i++ {
		l := digest.BlockLen(i, size)
		if _, err := f.data.ReadAt(buf[:l], i*digest.BlockSize); err != nil && err != io.EOF {
			bad = fmt.Errorf("%w: %s: read back block %d: %w", ErrFetch, f.meta.Path, i, err)
			break
		}
		if digest.Block(buf[:l]) != f.meta.Blocks[i] {
			f.d.ranged.corrupt.Add(1)
			f.d.fetcher.Stats().Corrupt.Add(1)
			f.d.log.Error("block does not match its published hash; not kept", "path", f.meta.Path, "owner", f.meta.Owner,
				"node", f.d.cfg.Node, "block", i, "off", i*digest.BlockSize)
			f.punch(i*digest.BlockSize, l)
			bad = fmt.Errorf("%w: %s block %d from %s: %w", ErrFetch, f.meta.Path, i, f.meta.Owner, dtl.ErrCorrupt)
			continue
		}
		ok[i-a] = true
	}
	for i := a; i < b; i++ {
		if ok[i-a] {
			f.have.WriteAt([]byte{blockHere}, i)
		}
	}
	f.unclaim(a, b, ok)
	return bad
}

// recheck verifies block i, here since before this daemon started: its
// bytes may not have reached the disk before a crash. A block that lost
// them is fetched again.
func (f *RangedFile) recheck(i int64) error {
	l := digest.BlockLen(i, f.meta.Size)
	buf := make([]byte, l)
	_, err := f.data.ReadAt(buf, i*digest.BlockSize)
	if err != nil && err != io.EOF {
		return err
	}
	good := digest.Block(buf) == f.meta.Blocks[i]
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.state[i] != blockHere || f.checked[i] || f.inflight[i] != nil {
		return nil // another reader looked first
	}
	if good {
		f.checked[i] = true
		return nil
	}
	f.state[i] = blockMissing
	f.here--
	f.have.WriteAt([]byte{blockMissing}, i)
	f.punch(i*digest.BlockSize, l)
	return nil
}

// punch gives back the space of bytes that are not kept (and makes them
// zeros: an owner sends no holes).
func (f *RangedFile) punch(off, n int64) {
	unix.Fallocate(int(f.data.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n)
}

// fillAside fetches the blocks still missing, in order, aside.
func (f *RangedFile) fillAside() {
	f.mu.Lock()
	if f.filling || f.gone || f.removed {
		f.mu.Unlock()
		return
	}
	f.filling = true
	f.mu.Unlock()
	started := f.d.goAside(func() {
		window := max(1, f.d.cfg.Ranges.ReadAhead/digest.BlockSize)
		for i := int64(0); i < int64(len(f.state)); {
			f.mu.Lock()
			stop := f.gone || f.failed != nil
			var run [2]int64
			if !stop {
				run = f.claimRunLocked(i, min(i+window, int64(len(f.state))))
			}
			f.mu.Unlock()
			if stop || f.d.life.Err() != nil {
				break
			}
			if run[1] > run[0] {
				if err := f.fetchRun(f.d.life, run[0], run[1]); err != nil {
					break
				}
				i = run[1]
			} else {
				i += window // here, or being fetched for a reader
			}
		}
		f.endFill()
	})
	if !started {
		f.endFill()
	}
}

func (f *RangedFile) endFill() { f.update(func() { f.filling = false }) }

// install puts the file, every block here, at its path as a copy: each
// block not checked since this daemon started is checked first, and the
// version must still be the path's.
func (f *RangedFile) install() {
	defer f.endUse()
	d := f.d
	f.mu.Lock()
	if f.whole || f.gone || f.removed {
		f.mu.Unlock()
		return
	}
	f.whole = true
	var unchecked []int64
	for i, c := range f.checked {
		if !c {
			unchecked = append(unchecked, int64(i))
		}
	}
	f.mu.Unlock()
	for _, i := range unchecked {
		f.recheck(i)
	}
	f.mu.Lock()
	complete := f.here == int64(len(f.state))
	if !complete {
		f.whole = false // blocks lost in a crash: the next reads fetch them
	}
	f.mu.Unlock()
	if !complete {
		return
	}
	var err error
	if rec, exists, ok := d.loc.Told(f.meta.Path); ok && (!exists || rec.Owner != f.meta.Owner || rec.Generation != f.meta.Gen) {
		err = fmt.Errorf("the path is generation %d of %s now: %w", rec.Generation, rec.Owner, os.ErrExist)
	}
	if err == nil {
		var fd int
		fd, err = unix.Open(d.rangedDir(), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err == nil {
			ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, unix.NsecToTimespec(f.meta.MtimeNs)}
			unix.UtimesNanoAt(int(f.data.Fd()), "", ts, unix.AT_EMPTY_PATH) // futimens
			err = d.installFrom(fd, f.data, versionOf(f.rec))
			unix.Close(fd)
		}
	}
	if err != nil {
		f.mu.Lock()
		f.whole = false
		f.mu.Unlock()
		d.log.Info("file read in ranges is whole but cannot be installed; dropped", "path", f.meta.Path, "err", err)
	} else {
		d.ranged.installed.Add(1)
		d.loc.Changed(f.meta.Path)
		d.changedUnseen(f.meta.Path) // later opens pass through to the copy
		d.log.Debug("file read in ranges is whole; installed", "path", f.meta.Path)
	}
	d.ranged.mu.Lock()
	if d.ranged.m[f.meta.Path] == f {
		delete(d.ranged.m, f.meta.Path)
	}
	d.ranged.mu.Unlock()
	f.drop()
}

// pruneRanged drops, at start, the files read in ranges whose version the
// namespace no longer has: replaced or removed while this daemon was
// down, no open would ever read their blocks again. A file whose record
// the store cannot give now is kept.
func (d *DMD) pruneRanged(ctx context.Context) {
	d.ranged.mu.Lock()
	taken := make([]*RangedFile, 0, len(d.ranged.m))
	for _, f := range d.ranged.m {
		taken = append(taken, f)
	}
	d.ranged.mu.Unlock()
	for _, f := range taken {
		rec, err := d.loc.Published(ctx, f.meta.Path)
		gone := errors.Is(err, hfl.ErrNotFound)
		if !gone && (err != nil || (rec.Generation == f.meta.Gen && rec.Owner == f.meta.Owner)) {
			continue
		}
		d.dropRanged(f.meta.Path)
		d.log.Info("dropped the blocks of a file read in ranges: its version was replaced or removed meanwhile", "path", f.meta.Path)
	}
}

// dropRanged drops the file read in ranges at rel, if any: the path
// changed (a newer version, a removal, a rename).
func (d *DMD) dropRanged(rel string) {
	d.ranged.mu.Lock()
	f := d.ranged.m[rel]
	delete(d.ranged.m, rel)
	d.ranged.mu.Unlock()
	if f != nil {
		f.drop()
	}
}

// rangedChanged drops the file read in ranges at rel if rel is now
// another version than the one read, or gone.
func (d *DMD) rangedChanged(rel string, rec hfl.Record, exists bool) {
	d.ranged.mu.Lock()
	f := d.ranged.m[rel]
	if f != nil && (!exists || rec.Generation > f.meta.Gen) {
		delete(d.ranged.m, rel)
	} else {
		f = nil
	}
	d.ranged.mu.Unlock()
	if f != nil {
		f.drop()
	}
}

// RangedStats counts the files read in ranges.
type RangedStats struct {
	Open      int    `json:"files"`
	HereBytes int64  `json:"bytes_here"`
	Opened    uint64 `json:"opened"`
	Installed uint64 `json:"completed"`
	Corrupt   uint64 `json:"corrupt_blocks"`
	Fetches   uint64 `json:"range_fetches"`
	Bytes     uint64 `json:"range_bytes"`
	Failed    uint64 `json:"range_failures"`
}

func (d *DMD) rangedStats() RangedStats {
	rs := &d.ranged
	s := RangedStats{Opened: rs.opened.Load(), Installed: rs.installed.Load(), Corrupt: rs.corrupt.Load()}
	rs.mu.Lock()
	s.Open = len(rs.m)
	for _, f := range rs.m {
		f.mu.Lock()
		s.HereBytes += min(f.here*digest.BlockSize, f.meta.Size)
		f.mu.Unlock()
	}
	rs.mu.Unlock()
	if d.fetcher != nil {
		r := d.fetcher.Ranges()
		s.Fetches, s.Bytes, s.Failed = r.Fetches.Load(), r.Bytes.Load(), r.Failed.Load()
	}
	return s
}
