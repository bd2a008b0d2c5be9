package dmd

import (
	"context"
	"io/fs"
	"path"
	"path/filepath"
)

// Removed is called after rel was unlinked. Its record is withdrawn; if the
// inode id has no name left, a half-written state it had is forgotten.
func (d *DMD) Removed(ctx context.Context, rel string, id FileID, lastName bool) {
	d.mu.Lock()
	if ws := d.busy[id]; ws != nil {
		delete(ws.names, rel)
		if lastName && ws.writers == 0 && !ws.ending {
			d.finishLocked(id, ws)
		}
	}
	d.mu.Unlock()
	d.unpublish(ctx, rel)
}

// Replaced is called when a rename replaced file id (the old target): a
// half-written state it had ends with its last name.
func (d *DMD) Replaced(id FileID, lastName bool) {
	if !lastName {
		return
	}
	d.mu.Lock()
	if ws := d.busy[id]; ws != nil && ws.writers == 0 && !ws.ending {
		d.finishLocked(id, ws)
	}
	d.mu.Unlock()
}

// Renamed is called after oldRel was renamed to newRel. The records follow
// the files: every complete file under the new name is published there and
// withdrawn from the old one. A file still being written is published under
// its new name by its last writer.
func (d *DMD) Renamed(ctx context.Context, oldRel, newRel string) {
	d.eachFile(newRel, func(sub string) {
		d.unpublish(ctx, path.Join(oldRel, sub))
		d.Changed(ctx, path.Join(newRel, sub))
	})
}

// Republish publishes every complete file at or under rel, for example after
// two names were exchanged.
func (d *DMD) Republish(ctx context.Context, rel string) {
	d.eachFile(rel, func(sub string) { d.Changed(ctx, path.Join(rel, sub)) })
}

// eachFile calls fn with the path, relative to rel, of every regular file at
// or under rel in the backing store ("" when rel itself is the file).
func (d *DMD) eachFile(rel string, fn func(sub string)) {
	root := d.BackingPath(rel)
	filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
		if err != nil || !e.Type().IsRegular() {
			return nil
		}
		sub, err := filepath.Rel(root, p)
		if err != nil {
			return nil
		}
		if sub == "." {
			sub = ""
		}
		fn(filepath.ToSlash(sub))
		return nil
	})
}

// Changed is called when rel became complete or changed without a write
// handle (a rename or link onto it, a chmod, a truncate by path). If the
// file is complete it is published again, and waiters for rel look again.
func (d *DMD) Changed(ctx context.Context, rel string) {
	d.noteName(rel)
	st, ok := d.completeHere(rel)
	d.notify(rel)
	if !ok || (d.markers && isReplica(d.BackingPath(rel))) {
		// Being written (its last writer publishes it), or a copy of
		// another node's file (its owner publishes it).
		return
	}
	d.publish(ctx, recordOf(rel, d.cfg.Node, st))
}

func (d *DMD) unpublish(ctx context.Context, rel string) {
	if err := d.loc.Unpublish(ctx, rel, d.cfg.Node); err != nil {
		d.log.Warn("unpublish failed; will retry", "path", rel, "err", err)
		d.retryLater(rel)
		return
	}
	d.stats.unpublishes.Add(1)
}
