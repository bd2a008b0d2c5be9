package dmd

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"syscall"
)

// scanWorkers bounds the concurrent publishes of the start-up scan (they
// are round trips when the store is remote).
const scanWorkers = 16

// ScanResult says what the start-up scan found.
type ScanResult struct {
	Published  int `json:"published"`
	Incomplete int `json:"incomplete"`
	// Dropped are copies fetched before an unclean stop, removed.
	Dropped int `json:"dropped"`
}

// Scan walks the backing store once, before the filesystem serves requests.
// Complete files are published again, so that a restarted daemon loses
// nothing; copies fetched from other nodes are not (their owners publish
// them). Files still carrying a crash marker were being written when the
// previous daemon died: they stay unpublished and readers wait until they are
// written again. With shared storage every daemon sees the same files and
// the store keeps their records, so nothing is republished.
func (d *DMD) Scan(ctx context.Context) (ScanResult, error) {
	var res ScanResult
	if d.cfg.SharedStorage {
		// Other nodes write here too: what a file's record says is what
		// counts, and the store keeps records.
		return res, nil
	}
	var mu sync.Mutex
	work := make(chan string)
	var wg sync.WaitGroup
	for i := 0; i < scanWorkers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for rel := range work {
				st, ok := d.completeHere(rel)
				if !ok || (!d.markers && d.copyOfOthers(ctx, rel, st)) {
					continue
				}
				rec := recordOf(rel, d.cfg.Node, st)
				if d.publish(ctx, rec) == nil {
					mu.Lock()
					res.Published++
					mu.Unlock()
				}
			}
		}()
	}

	err := filepath.WalkDir(d.cfg.Backing, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			d.log.Warn("scan: cannot read", "path", p, "err", err)
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		rel, _ := filepath.Rel(d.cfg.Backing, p)
		if e.IsDir() && rel == InternalDir {
			return filepath.SkipDir
		}
		if !e.Type().IsRegular() {
			return nil
		}
		rel = filepath.ToSlash(rel)
		if d.markers && isReplica(p) {
			// A copy fetched from its owner: the owner publishes it.
			// After an unclean stop it may not have reached the disk
			// whole: drop it, the next open fetches it again.
			if d.uncleanStart {
				os.Remove(p)
				res.Dropped++
			}
			return nil
		}
		if d.markers && hasMarker(p) {
			var st syscall.Stat_t
			if err := syscall.Lstat(p, &st); err == nil {
				d.holdIncomplete(IDOf(&st))
				res.Incomplete++
				d.log.Warn("file was being written when dyadfs stopped: not published until it is written again", "path", rel)
			}
			return nil
		}
		if !d.cfg.SharedStorage {
			work <- rel
		}
		return nil
	})
	close(work)
	wg.Wait()
	d.stats.scanPublished.Add(uint64(res.Published))
	d.stats.scanIncomplete.Add(uint64(res.Incomplete))
	return res, err
}

// copyOfOthers tells, without replica marks, a copy of another node's file:
// the store's record of rel names another owner and describes the file.
func (d *DMD) copyOfOthers(ctx context.Context, rel string, st *syscall.Stat_t) bool {
	rec, err := d.loc.Published(ctx, rel)
	return err == nil && rec.Owner != d.cfg.Node && rec.Size == st.Size && rec.MtimeNs == st.Mtim.Nano()
}

// holdIncomplete makes readers of id wait until it is written again.
func (d *DMD) holdIncomplete(id FileID) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.busy[id] == nil {
		ws := newWriteState()
		ws.incomplete, ws.marked = true, true
		d.busy[id] = ws
	}
}
