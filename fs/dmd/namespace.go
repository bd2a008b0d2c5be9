package dmd

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"strings"
	"syscall"

	"github.com/dyadfs/dyadfs/fs/backing"
	"github.com/dyadfs/dyadfs/hfl"
)

// Changes of names: unlink, rename, mkdir and the like, made here through
// the mount, are made in the job's namespace too, and every node that held
// the name is told before the call returns (close-to-open for names). On a
// node alone only its own records change.

// Removed is called after rel was unlinked here. Its record is removed; if
// the inode id has no name left, a half-written state it had is forgotten.
func (d *DMD) Removed(ctx context.Context, rel string, id FileID, lastName bool) {
	d.mu.Lock()
	if ws := d.busy[id]; ws != nil {
		delete(ws.names, rel)
		if lastName && ws.writers == 0 && !ws.ending {
			d.finishLocked(id, ws)
		}
	}
	d.copies.forget(rel)
	delete(d.superseded, rel)
	d.mu.Unlock()
	if lastName {
		d.gone(id)
	}
	d.remove(ctx, rel)
}

// remove takes rel out of the namespace: on a node alone, this node's own
// record; with other nodes, whatever is published at rel, and every node
// holding it is told before remove returns. A removal the store refuses
// now is retried, without removing a newer publish.
func (d *DMD) remove(ctx context.Context, rel string) {
	if d.solo() {
		d.withdraw(ctx, rel)
		return
	}
	known, _, kerr := d.loc.Record(ctx, rel)
	err := d.loc.Unpublish(ctx, rel, hfl.RemoveCond{}, true)
	if err != nil {
		cond := hfl.RemoveCond{Owner: d.cfg.Node}
		if kerr == nil {
			cond = hfl.RemoveCond{MaxGeneration: known.Generation}
		}
		d.log.Warn("unpublish failed; will retry", "path", rel, "err", err)
		d.retryLater(rel, retryOp{remove: true, cond: cond}, err)
		return
	}
	d.stats.unpublishes.Add(1)
}

// withdraw removes this node's own record of rel (a record another node
// published since stays), retried if the store refuses it now.
func (d *DMD) withdraw(ctx context.Context, rel string) {
	d.withdrawIf(ctx, rel, hfl.RemoveCond{Owner: d.cfg.Node})
}

// withdrawIf is withdraw of a record that matches cond.
func (d *DMD) withdrawIf(ctx context.Context, rel string, cond hfl.RemoveCond) {
	err := d.loc.Unpublish(ctx, rel, cond, false)
	switch {
	case errors.Is(err, hfl.ErrConflict):
	case err != nil:
		d.log.Warn("unpublish failed; will retry", "path", rel, "err", err)
		d.retryLater(rel, retryOp{remove: true, cond: cond}, err)
	default:
		d.stats.unpublishes.Add(1)
	}
}

// RemoveName removes rel, a name published elsewhere that this node has
// nothing of, from the namespace: the unlink of a file another node
// published. It fails with fs.ErrNotExist if nothing is published at rel.
func (d *DMD) RemoveName(ctx context.Context, rel string) error {
	if _, ok, err := d.Entry(ctx, rel, false); err != nil {
		return err
	} else if !ok {
		return fmt.Errorf("%s: %w", rel, fs.ErrNotExist)
	}
	if err := d.loc.Unpublish(ctx, rel, hfl.RemoveCond{}, true); err != nil {
		return err
	}
	d.dropRanged(rel)
	d.stats.unpublishes.Add(1)
	return nil
}

// DirEmptyElsewhere reports whether the namespace has no entry in directory
// rel (the backing directory's own entries the caller's rmdir checks).
func (d *DMD) DirEmptyElsewhere(ctx context.Context, rel string) (bool, error) {
	recs, err := d.List(ctx, rel, "", 1)
	return len(recs) == 0, err
}

// RemovedDir is called after directory rel was removed here.
func (d *DMD) RemovedDir(ctx context.Context, rel string) {
	d.forgetCopy(rel)
	if d.solo() {
		return
	}
	d.remove(ctx, rel)
}

// Replaced is called when a rename replaced file id (the old target): a
// half-written state it had ends with its last name.
func (d *DMD) Replaced(id FileID, lastName bool) {
	if !lastName {
		return
	}
	d.gone(id)
	d.mu.Lock()
	if ws := d.busy[id]; ws != nil && ws.writers == 0 && !ws.ending {
		d.finishLocked(id, ws)
	}
	d.mu.Unlock()
}

// Renamed is called after oldRel was renamed to newRel. The records follow
// the files: everything at and under the new name is published there (this
// node's own now, copies included) and removed from the old one. A file
// still being written is published under its new name by its last writer.
func (d *DMD) Renamed(ctx context.Context, oldRel, newRel string) {
	d.moveCopies(oldRel, newRel)
	d.dropRanged(oldRel)
	d.dropRanged(newRel)
	type entry struct {
		sub  string
		mode uint32
	}
	var moved []entry
	d.eachEntry(newRel, func(sub string, mode uint32) { moved = append(moved, entry{sub, mode}) })
	// New names first, parents before children; then the old names go,
	// children before parents (a directory is removed once empty).
	for _, e := range moved {
		newp := path.Join(newRel, e.sub)
		switch {
		case d.solo() && e.mode&syscall.S_IFMT != syscall.S_IFREG:
		case e.mode&syscall.S_IFMT == syscall.S_IFREG:
			d.Adopt(newp)
			d.Changed(ctx, newp)
		default:
			d.Adopt(newp)
			d.Made(ctx, newp)
		}
	}
	for i := len(moved) - 1; i >= 0; i-- {
		e := moved[i]
		oldp := path.Join(oldRel, e.sub)
		switch {
		case d.solo() && e.mode&syscall.S_IFMT == syscall.S_IFREG:
			d.withdraw(ctx, oldp)
		case !d.solo():
			d.remove(ctx, oldp)
		}
	}
}

// Republish publishes everything at or under rel, for example after two
// names were exchanged.
func (d *DMD) Republish(ctx context.Context, rel string) {
	d.eachEntry(rel, func(sub string, mode uint32) {
		p := path.Join(rel, sub)
		if mode&syscall.S_IFMT == syscall.S_IFREG {
			d.Changed(ctx, p)
		} else if !d.solo() {
			d.Adopt(p)
			d.Made(ctx, p)
		}
	})
}

// eachEntry calls fn with the path, relative to rel, of every entry at or
// under rel in the backing store ("" for rel itself), parents first.
func (d *DMD) eachEntry(rel string, fn func(sub string, mode uint32)) {
	var st syscall.Stat_t
	if d.back.Lstat(rel, &st) != nil {
		return
	}
	fn("", st.Mode&syscall.S_IFMT)
	if st.Mode&syscall.S_IFMT != syscall.S_IFDIR {
		return
	}
	d.back.Walk(rel, func(p string, e backing.DirEntry) error {
		sub := strings.TrimPrefix(strings.TrimPrefix(p, rel), "/")
		if e.IsDir() && rel == "" && sub == InternalDir {
			return backing.SkipDir
		}
		// DT_* are the S_IF* type bits shifted down.
		fn(sub, uint32(e.Type)<<12)
		return nil
	})
}

// Changed is called when rel became complete or changed without a write
// handle (a rename or link onto it, a chmod, a truncate by path). If the
// file is complete it is published again, and waiters for rel look again.
func (d *DMD) Changed(ctx context.Context, rel string) {
	d.noteName(rel)
	st, ok := d.completeHere(rel)
	d.loc.Changed(rel)
	if _, isCopy := d.copyOf(rel); !ok || isCopy {
		// Being written (its last writer publishes it), or a copy of
		// another node's file (its owner publishes it).
		return
	}
	d.beginRelease(rel)
	defer d.released(rel)
	rec, err := d.fileRecord(rel, -1, st, nil, false)
	if err != nil {
		d.notHashed(rel, err)
		return
	}
	d.publish(ctx, rec, publishTold)
}

// Made is called when a directory, a symbolic link or another non-regular
// file was made at rel here: with other nodes, its record is published, so
// that they show it too.
func (d *DMD) Made(ctx context.Context, rel string) {
	if d.solo() {
		return
	}
	var st syscall.Stat_t
	if err := d.back.Lstat(rel, &st); err != nil {
		return
	}
	if _, isCopy := d.copyOf(rel); isCopy || st.Mode&syscall.S_IFMT == syscall.S_IFREG {
		return
	}
	rec := recordOf(rel, d.cfg.Node, &st)
	rec.Ino = d.inoOf(rel, -1, &st)
	if st.Mode&syscall.S_IFMT == syscall.S_IFLNK {
		target, err := d.back.Readlink(rel)
		if err != nil {
			return
		}
		rec.Target = target
	}
	d.publish(ctx, rec, publishTold)
}

// Adopt makes the copy at rel, of a file or directory another node
// published, this node's own: it is about to change here (a chmod, a
// truncate, a rename), and will be published as this node's.
func (d *DMD) Adopt(rel string) {
	if _, ok := d.copyOf(rel); !ok {
		return
	}
	d.forgetCopy(rel)
	if d.markers {
		d.back.Removexattr(rel, replicaXattr)
	}
}
