package dmd

import (
	"context"
	"errors"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dyadfs/dyadfs/fs/backing"
	"github.com/dyadfs/dyadfs/hfl"
)

// scanWorkers bounds the concurrent store calls of the start-up scan (they
// are round trips when the store is remote).
const scanWorkers = 16

// ScanResult says what the start-up scan found.
type ScanResult struct {
	Published  int `json:"published"`
	Incomplete int `json:"incomplete"`
	// Dropped are copies fetched before an unclean stop, removed.
	Dropped int `json:"dropped"`
	// Removed are this node's files that were unlinked or replaced on
	// another node while it was down; Superseded, those being rewritten
	// elsewhere (kept, not shown, until the new version is published).
	Removed    int `json:"removed"`
	Superseded int `json:"superseded"`
}

// Scan walks the backing store once, before the filesystem serves requests.
//
// On a node alone, complete files are published again, so that a
// restarted daemon loses nothing. With other nodes, the store kept the
// job's namespace meanwhile: this node's files are checked against it. A
// file published from here and still this node's in the store stays as it
// is; one never published (or published in a store that is gone) is
// published; one whose path was removed or replaced elsewhere meanwhile
// is removed (it does not come back), and one being rewritten elsewhere
// is set aside. Copies of other nodes' files are kept (they are checked
// against the namespace when opened); after an unclean stop they are
// dropped, as they may not have reached the disk whole.
//
// Files still marked as being written (see writingMarks) were being
// written when the previous daemon died: they stay unpublished and readers
// wait until they are written again. With shared storage every daemon sees the same files and
// the store keeps their records, so nothing is republished.
func (d *DMD) Scan(ctx context.Context) (ScanResult, error) {
	var res ScanResult
	held := make(map[int]bool)
	defer func() {
		d.marks.keep(held)
		d.marksLeft = nil
	}()
	if d.cfg.SharedStorage {
		return res, nil
	}
	if !d.solo() {
		id, err := d.loc.StoreID(ctx)
		if err != nil {
			return res, err
		}
		d.storeID = id
	}
	var mu sync.Mutex
	count := func(n *int) {
		mu.Lock()
		*n++
		mu.Unlock()
	}
	work := make(chan string)
	var wg sync.WaitGroup
	for i := 0; i < scanWorkers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for rel := range work {
				d.scanOwn(ctx, rel, &res, count)
			}
		}()
	}
	var dirs []string
	err := d.back.Walk("", func(rel string, e backing.DirEntry) error {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if e.IsDir() && rel == InternalDir {
			return backing.SkipDir
		}
		switch {
		case e.IsDir():
			if owner, gen, ok := d.replicaMark(rel); d.markers && ok {
				d.noteCopy(rel, copyInfo{owner: owner, gen: gen, dir: true}, nil)
				d.loadIno(rel)
			} else if !d.solo() {
				dirs = append(dirs, rel)
			}
			return nil
		case e.Type == unix.DT_LNK:
			if !d.solo() {
				d.Made(ctx, rel)
			}
			return nil
		case e.Type != unix.DT_REG:
			return nil
		}
		if owner, gen, ok := d.replicaMark(rel); d.markers && ok {
			// A copy fetched from its owner: the owner publishes it.
			// After an unclean stop it may not have reached the disk
			// whole: drop it, the next open fetches it again.
			if d.uncleanStart {
				d.back.Unlink(rel)
				res.Dropped++
				return nil
			}
			d.scannedCopy(rel, copyInfo{owner: owner, gen: gen}, nil)
			d.loadIno(rel)
			return nil
		}
		if d.wasBeingWritten(rel, held) {
			res.Incomplete++
			d.log.Warn("file was being written when dyadfs stopped: not published until it is written again", "path", rel)
			return nil
		}
		d.loadIno(rel)
		work <- rel
		return nil
	})
	close(work)
	wg.Wait()
	if err != nil && ctx.Err() == nil {
		// A directory it could not read: the rest is scanned.
		d.log.Warn("scan: cannot read", "err", err)
		err = nil
	}
	// Directories last, deepest first: one removed elsewhere goes once
	// its files have gone.
	for i := len(dirs) - 1; i >= 0; i-- {
		d.scanOwnDir(ctx, dirs[i], &res)
	}
	if !d.solo() {
		d.pruneRanged(ctx)
	}
	d.stats.scanPublished.Add(uint64(res.Published))
	d.stats.scanIncomplete.Add(uint64(res.Incomplete))
	return res, err
}

// scanOwn checks one of this node's files at start (see Scan).
func (d *DMD) scanOwn(ctx context.Context, rel string, res *ScanResult, count func(*int)) {
	st, ok := d.completeHere(rel)
	if !ok {
		return
	}
	if d.solo() {
		if d.publishFile(ctx, rel, st) == nil {
			count(&res.Published)
		}
		return
	}
	rec, err := d.loc.Published(ctx, rel)
	store, _, marked := d.publishedMark(rel)
	marked = marked && store == d.storeID
	switch {
	case errors.Is(err, hfl.ErrNotFound) && marked:
		d.log.Info("file was removed on another node while this one was down; removing it here", "path", rel)
		d.removeBeneath(rel, false, nil)
		count(&res.Removed)
		return
	case err == nil && rec.Owner != d.cfg.Node && !d.markers && rec.Size == st.Size && rec.MtimeNs == st.Mtim.Nano():
		// Without marks, a copy is told by the store's record.
		d.scannedCopy(rel, copyInfo{owner: rec.Owner, gen: rec.Generation}, st)
		return
	case err == nil && rec.Owner != d.cfg.Node:
		d.supersede(rel, rec, st)
		if rec.Writing {
			count(&res.Superseded)
		} else {
			count(&res.Removed)
		}
		return
	case err == nil && !rec.Writing && rec.Size == st.Size && rec.MtimeNs == st.Mtim.Nano() && rec.Mode == st.Mode:
		return // published as it is
	}
	if d.publishFile(ctx, rel, st) == nil {
		count(&res.Published)
	}
}

// scanOwnDir checks one of this node's directories at start: published if
// it is not, removed (if empty) if it was removed elsewhere meanwhile.
func (d *DMD) scanOwnDir(ctx context.Context, rel string, res *ScanResult) {
	_, err := d.loc.Published(ctx, rel)
	store, _, marked := d.publishedMark(rel)
	switch {
	case errors.Is(err, hfl.ErrNotFound) && marked && store == d.storeID:
		if d.back.Rmdir(rel) == nil {
			d.log.Info("directory was removed on another node while this one was down; removed here", "path", rel)
			res.Removed++
		}
	case errors.Is(err, hfl.ErrNotFound):
		d.Made(ctx, rel)
	}
}

// wasBeingWritten reports whether the file at rel was being written when
// the previous daemon died (its inode is among the marks found at start,
// or, after an unclean stop, it carries an earlier release's marker
// attribute); if so, its readers wait until it is written again, and its
// mark's slot goes into held. A start after a clean stop with no marks
// left stats nothing.
func (d *DMD) wasBeingWritten(rel string, held map[int]bool) bool {
	legacy := d.uncleanStart && d.markers
	if len(d.marksLeft) == 0 && !legacy {
		return false
	}
	var st syscall.Stat_t
	if d.back.Lstat(rel, &st) != nil {
		return false
	}
	slot := 0
	if slots := d.marksLeft[st.Ino]; len(slots) > 0 {
		slot = slots[0]
		held[slot] = true
	} else if !legacy || !d.hasMarker(rel) {
		return false
	}
	d.holdIncomplete(IDOf(&st), slot)
	return true
}

// holdIncomplete makes readers of id wait until it is written again;
// slot is its being-written mark (0: none).
func (d *DMD) holdIncomplete(id FileID, slot int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.busy[id] == nil {
		ws := newWriteState()
		ws.incomplete, ws.mark = true, slot
		d.busy[id] = ws
	}
}

// scannedCopy registers the copy c found at rel at start (st: its
// attributes, nil: look), as fetched when it was installed (its change
// time), so that eviction's order survives a restart.
func (d *DMD) scannedCopy(rel string, c copyInfo, st *syscall.Stat_t) {
	if st == nil {
		var got syscall.Stat_t
		if d.back.Lstat(rel, &got) != nil {
			return
		}
		st = &got
	}
	d.copies.note(rel, c, st, time.Unix(st.Ctim.Unix()))
}
