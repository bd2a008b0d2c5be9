package dmd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dyadfs/dyadfs/hfl"
)

// The namespace view: every node shows the job's whole namespace. The
// backing directory holds this node's own files (published or being
// written), copies of versions published elsewhere, and shadows of
// directories that exist elsewhere; every other name comes from the
// namespace (the locator), with its record's attributes, and its data is
// fetched when it is opened. A home's promise (see hfl's notices) keeps
// what this node shows current: a change elsewhere is told here
// (Invalidated), and a copy of an older version is dropped.

// copyInfo says what version of a path a copy in the backing directory
// is: a fetched file, or the shadow of a directory that exists elsewhere.
type copyInfo struct {
	owner string
	gen   uint64 // 0: fetched while its publish was being committed
	dir   bool
}

// solo reports whether this node's backing directory is the whole
// namespace: no other node uses the store, or every node shares the
// backing storage.
func (d *DMD) solo() bool { return d.loc.SingleNode() || d.cfg.SharedStorage }

// Solo reports whether nothing but the backing directory needs looking at.
func (d *DMD) Solo() bool { return d.solo() }

// Notifier tells the kernel of entries that changed unseen by it (a copy
// dropped, a name removed elsewhere), so that it forgets what it cached.
type Notifier interface {
	// EntryChanged: the entry of rel.
	EntryChanged(rel string)
	// ChildrenUnpromised: the entries of directory rel that are shown
	// from the namespace.
	ChildrenUnpromised(rel string)
}

// notifyWait bounds how long a change waits for the kernel to take its
// notice. The kernel takes it under the directory's lock, which a request
// may hold while it waits for another node (a rename told everywhere): a
// notice must not wait for it forever.
const notifyWait = 200 * time.Millisecond

// changedUnseen tells the kernel that rel changed, aside.
func (d *DMD) changedUnseen(rel string) {
	if d.notifier != nil {
		go d.notifier.EntryChanged(rel)
	}
}

// toldUnseen tells the kernel that rel changed elsewhere, before it
// returns if the kernel takes the notice within notifyWait, so that an
// open that starts after the change (and the notice that told it here)
// sees it. Never from a request: the kernel may hold the lock the notice
// needs.
func (d *DMD) toldUnseen(rel string) {
	f := d.notifier
	if f == nil {
		return
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.EntryChanged(rel)
	}()
	t := time.NewTimer(notifyWait)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}

// Mine reports whether rel in the backing directory is this node's own
// file or directory (not a copy, not set aside).
func (d *DMD) Mine(rel string) bool {
	if !d.existsHere(rel) {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	_, aside := d.superseded[rel]
	_, isCopy := d.copies.get(rel)
	return !isCopy && !aside
}

// ListingDropped implements hfl.LocalIndex: the kernel forgets the entries
// of dir shown from the namespace, and looks them up again (which asks).
func (d *DMD) ListingDropped(dir string) {
	if d.notifier != nil {
		go d.notifier.ChildrenUnpromised(dir)
	}
}

// copyOf returns what version the copy at rel is, if it is one.
func (d *DMD) copyOf(rel string) (copyInfo, bool) { return d.copies.get(rel) }

// IsCopy reports whether rel in the backing directory is a copy of another
// node's file or the shadow of its directory.
func (d *DMD) IsCopy(rel string) bool {
	_, ok := d.copyOf(rel)
	return ok
}

// noteCopy records that rel is a copy of version c; st is a file's
// attributes (nil for a directory or a symbolic link).
func (d *DMD) noteCopy(rel string, c copyInfo, st *syscall.Stat_t) {
	d.copies.note(rel, c, st, time.Time{})
}

// forgetCopy records that rel is no copy (any more).
func (d *DMD) forgetCopy(rel string) { d.copies.forget(rel) }

// RenameBeneath renames oldRel to newRel in the backing directory, for a
// rename through the mount (flags as renameat2's), and moves what dyadfs
// knows of copies with the names, at once (see namesMu): what was at newRel
// is gone, copies at and under oldRel are there now.
func (d *DMD) RenameBeneath(oldRel, newRel string, flags uint) error {
	d.namesMu.Lock()
	defer d.namesMu.Unlock()
	if err := d.back.Rename(oldRel, newRel, flags); err != nil {
		return err
	}
	if d.solo() {
		return nil
	}
	d.mu.Lock()
	under := func(p, dir string) bool { return p == dir || strings.HasPrefix(p, dir+"/") }
	exchange := flags&unix.RENAME_EXCHANGE != 0
	d.copies.renamed(oldRel, newRel, exchange)
	if exchange {
		swap := func(p string) string {
			switch {
			case under(p, oldRel):
				return newRel + p[len(oldRel):]
			case under(p, newRel):
				return oldRel + p[len(newRel):]
			}
			return p
		}
		superseded := make(map[string]uint64, len(d.superseded))
		for p, g := range d.superseded {
			superseded[swap(p)] = g
		}
		d.superseded = superseded
		d.mu.Unlock()
		return nil
	}
	for p := range d.superseded {
		if under(p, newRel) && !under(p, oldRel) {
			delete(d.superseded, p)
		}
	}
	d.mu.Unlock()
	d.moveCopies(oldRel, newRel)
	return nil
}

// moveCopies follows a rename of oldRel to newRel: copies at and under
// oldRel move with it.
func (d *DMD) moveCopies(oldRel, newRel string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.copies.moved(oldRel, newRel)
	for p, g := range d.superseded {
		if p == oldRel || strings.HasPrefix(p, oldRel+"/") {
			delete(d.superseded, p)
			d.superseded[newRel+p[len(oldRel):]] = g
		}
	}
}

// Entry returns the namespace's record of rel, a path the backing directory
// has no current entry for, and whether there is one. With creating, the
// caller is about to create rel: the listing of its directory is kept, so
// that the creates that follow are answered here.
func (d *DMD) Entry(ctx context.Context, rel string, creating bool) (hfl.Record, bool, error) {
	if d.solo() {
		return hfl.Record{}, false, nil
	}
	if creating {
		dir, _ := path.Split(rel)
		d.loc.HoldListing(ctx, strings.TrimSuffix(dir, "/")) // a failure only costs a question
	}
	rec, _, err := d.loc.Record(ctx, rel)
	if errors.Is(err, hfl.ErrNotFound) {
		return hfl.Record{}, false, nil
	}
	if err != nil {
		return hfl.Record{}, false, fmt.Errorf("look up %s: %w", rel, err)
	}
	return rec, true, nil
}

// CommitComing reports whether this node was told that a publish of rel
// is being committed, and not yet that it was (its record was sent
// ahead): a read-only open that waits can take that record.
func (d *DMD) CommitComing(rel string) bool {
	if d.solo() {
		return false
	}
	_, ok := d.loc.Ahead(rel)
	return ok
}

// KnownEntry is Entry when this node knows, without asking anyone, that
// the namespace has rel: ok is false when Entry would have to ask.
func (d *DMD) KnownEntry(rel string) (rec hfl.Record, ok bool) {
	if d.solo() {
		return hfl.Record{}, false
	}
	return d.loc.Known(rel)
}

// List returns up to limit entries of the namespace's directory rel ("" for
// the top) after after, in name order (fewer than limit: the end). On a
// node alone, it returns none: the backing directory has everything.
func (d *DMD) List(ctx context.Context, rel, after string, limit int) ([]hfl.Record, error) {
	if d.solo() {
		return nil, nil
	}
	return d.loc.List(ctx, rel, after, limit)
}

// CurrentHere reports whether the regular file at rel in the backing
// directory, complete or not, is what the namespace has at rel: this
// node's own file that nobody replaced, or a copy of the version published
// now. A copy of an older version is removed (unless it is being written
// here, which makes it this node's own).
func (d *DMD) CurrentHere(ctx context.Context, rel string) bool {
	if d.solo() {
		return true
	}
	var st syscall.Stat_t
	if err := d.back.Lstat(rel, &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return true // nothing to judge
	}
	return d.currentHere(ctx, rel, &st)
}

func (d *DMD) currentHere(ctx context.Context, rel string, st *syscall.Stat_t) bool {
	if d.solo() {
		return true
	}
	d.mu.Lock()
	busy := d.busy[IDOf(st)] != nil
	_, publishing := d.publishing[rel]
	ending := d.releasing[rel] > 0 || publishing
	_, superseded := d.superseded[rel]
	c, isCopy := d.copies.get(rel)
	d.mu.Unlock()
	if busy {
		return true // its writers here decide
	}
	if ending && !isCopy {
		// This node publishes its version now: whether a change told
		// meanwhile wins is known once it is done (see publishDone).
		return true
	}
	if superseded {
		return false
	}
	if isCopy && c.gen == 0 {
		// Fetched ahead of its publish's commit, and that commit is
		// still coming: it is that version (asking would only read the
		// store, since the path's promises are held back meanwhile).
		if rec, ok := d.loc.Ahead(rel); ok && copyIsOf(c, rec, st) {
			return true
		}
	}
	ns, err := d.loc.State(ctx, rel)
	if err != nil {
		// The namespace cannot be asked: what is here is what there is.
		d.log.Warn("cannot check a file against the namespace; using the one here", "path", rel, "err", err)
		return true
	}
	rec := ns.Rec
	switch {
	case !ns.Exists && isCopy:
		// Removed elsewhere, unless what this node knows is older than
		// the copy: a copy fetched ahead of the publish's commit (gen
		// 0), or before the change was told here. The store's own
		// answer is never older.
		if c.gen != 0 && (ns.Gen >= c.gen || ns.Level == hfl.LevelGlobal) {
			d.dropStale(rel, st, rec)
			return false
		}
		return true
	case !ns.Exists:
		return true // this node's own file, not published yet
	case isCopy:
		if copyIsOf(c, rec, st) || rec.Generation < c.gen {
			return true
		}
		d.dropStale(rel, st, rec)
		return false
	case rec.Owner == d.cfg.Node:
		return true
	}
	if d.ownNewer(rel, rec) {
		return true // what this node knows is older than its own publish
	}
	d.supersede(rel, rec, st)
	return false
}

// copyIsOf reports whether the copy c, with attributes st, is the version
// rec describes.
func copyIsOf(c copyInfo, rec hfl.Record, st *syscall.Stat_t) bool {
	return !rec.Writing && !c.dir && rec.Owner == c.owner && (c.gen == 0 || c.gen == rec.Generation) &&
		rec.Size == st.Size && rec.MtimeNs == st.Mtim.Nano()
}

// supersede records that this node's own file at rel was replaced or is
// being rewritten elsewhere (rec): it is not shown or served any more. A
// file being rewritten stays on disk (the only complete copy, should the
// writer fail) until a newer version is published; then it is removed.
func (d *DMD) supersede(rel string, rec hfl.Record, st *syscall.Stat_t) {
	d.namesMu.Lock()
	var now syscall.Stat_t
	if st != nil && (d.back.Lstat(rel, &now) != nil || IDOf(&now) != IDOf(st)) {
		d.namesMu.Unlock()
		return // another file took the name since it was looked at
	}
	d.mu.Lock()
	d.superseded[rel] = rec.Generation
	d.mu.Unlock()
	if rec.Writing {
		d.log.Info("file is being rewritten on another node; the version here is set aside", "path", rel, "writer", rec.Owner)
	} else {
		d.log.Warn("file was replaced by another node's version; the version here is removed", "path", rel, "by", rec.Owner, "gen", rec.Generation)
		d.stats.replaced.Add(1)
		d.removeBeneathLocked(rel, false, st)
	}
	d.namesMu.Unlock()
	d.changedUnseen(rel)
}

// dropStale removes the copy at rel, stale now that the namespace has rec.
func (d *DMD) dropStale(rel string, st *syscall.Stat_t, rec hfl.Record) {
	d.log.Debug("dropping a stale copy", "path", rel, "now", rec.Generation, "writing", rec.Writing)
	d.stats.staleCopies.Add(1)
	d.namesMu.Lock()
	_, still := d.copies.get(rel)
	if still { // not made this node's own since (written, renamed onto)
		d.removeBeneathLocked(rel, false, st)
	}
	d.namesMu.Unlock()
	d.changedUnseen(rel)
}

// removeBeneath removes rel from the backing directory (a directory only
// if empty), unless it is being written here, and forgets what dyadfs knew
// of it. With want, only if rel is still the file want describes: what was
// decided about it must not remove another file a rename put there since.
func (d *DMD) removeBeneath(rel string, dir bool, want *syscall.Stat_t) {
	// What is looked at is what is removed: no rename through the mount
	// comes in between (see namesMu).
	d.namesMu.Lock()
	defer d.namesMu.Unlock()
	d.removeBeneathLocked(rel, dir, want)
}

// removeBeneathLocked is removeBeneath; d.namesMu must be held. It
// reports whether it removed rel.
func (d *DMD) removeBeneathLocked(rel string, dir bool, want *syscall.Stat_t) bool {
	parent, base := path.Split(rel)
	dirfd, err := d.openDir(strings.TrimSuffix(parent, "/"))
	if err != nil {
		return false
	}
	defer unix.Close(dirfd)
	var st unix.Stat_t
	if unix.Fstatat(dirfd, base, &st, unix.AT_SYMLINK_NOFOLLOW) != nil {
		return false
	}
	if want != nil && (uint64(st.Dev) != uint64(want.Dev) || st.Ino != want.Ino) {
		return false // another file took the name
	}
	flags := 0
	if st.Mode&syscall.S_IFMT == syscall.S_IFDIR {
		if !dir {
			return false
		}
		flags = unix.AT_REMOVEDIR
	}
	d.mu.Lock()
	if d.busy[FileID{Dev: uint64(st.Dev), Ino: st.Ino}] != nil || (flags == 0 && d.creating[rel] > 0) {
		// Written here, or a writer is opening the name now (its file
		// may be this one, truncated and not registered yet).
		d.mu.Unlock()
		return false
	}
	// Unlinked under d.mu: a writer that opens the file registers under
	// it first (and the file stays), or finds it gone.
	if flags == unix.AT_REMOVEDIR {
		done := d.back.DirsChange()
		err = unix.Unlinkat(dirfd, base, flags)
		done()
	} else {
		err = unix.Unlinkat(dirfd, base, flags)
	}
	failed := err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.ENOTEMPTY)
	if !failed {
		d.copies.forget(rel)
		delete(d.superseded, rel)
	}
	d.mu.Unlock()
	switch {
	case failed:
		d.log.Warn("cannot remove a stale entry", "path", rel, "err", err)
	case err == nil && (st.Nlink <= 1 || flags == unix.AT_REMOVEDIR):
		d.gone(FileID{Dev: uint64(st.Dev), Ino: st.Ino})
	}
	return err == nil
}

// Invalidated implements hfl.LocalIndex: rel changed on another node; it is
// now rec, or gone. A copy of another version is dropped; this node's own
// file is set aside (being rewritten elsewhere) or removed (replaced, or
// unlinked elsewhere), unless it is being written here: then its writer's
// publish comes later and wins. A shadow of a directory removed elsewhere
// goes if empty.
func (d *DMD) Invalidated(rel string, rec hfl.Record, exists bool) {
	if d.solo() {
		return
	}
	if rec.Provisional {
		// A new version is coming (its record sent ahead of its
		// commit): the kernel forgets what it cached of the old one;
		// copies are checked once the commit is told.
		d.toldUnseen(rel)
		return
	}
	d.rangedChanged(rel, rec, exists)
	var st syscall.Stat_t
	if err := d.back.Lstat(rel, &st); err != nil {
		d.toldUnseen(rel) // shown from the namespace: its attributes changed
		return
	}
	switch st.Mode & syscall.S_IFMT {
	case syscall.S_IFDIR:
		if !exists {
			// Removed elsewhere (it was empty there): gone here too,
			// unless something of this node's is in it.
			d.removeBeneath(rel, true, &st)
		}
		d.toldUnseen(rel)
		return
	case syscall.S_IFREG:
	default:
		if !exists {
			if _, ok := d.copyOf(rel); ok {
				d.removeBeneath(rel, false, &st)
			}
		}
		d.toldUnseen(rel)
		return
	}
	d.mu.Lock()
	_, publishing := d.publishing[rel]
	ending := d.releasing[rel] > 0 || publishing
	busy := d.busy[IDOf(&st)] != nil || d.creating[rel] > 0 || ending
	if ending {
		// This node is publishing its own version: whichever
		// generation is newer wins, which is known once the publish
		// is done (see publishDone).
		d.toldWhilePublishing[rel] = struct{}{}
	}
	c, isCopy := d.copies.get(rel)
	d.mu.Unlock()
	switch {
	case busy:
		return
	case !isCopy && exists && rec.Owner != d.cfg.Node && d.ownNewer(rel, rec):
		return // told late: this node's own version is newer
	case isCopy && exists && rec.Generation < c.gen:
		return // told late: the copy is newer
	case isCopy && exists && copyIsOf(c, rec, &st):
		if c.gen == 0 && rec.Generation != 0 {
			// Fetched while its publish was being committed: it is
			// that version. (Its mark on disk keeps generation 0,
			// which a restarted daemon checks by owner, size and
			// mtime.)
			d.copies.setGen(rel, c, rec.Generation) // unless renamed over meanwhile
		}
		return
	case isCopy:
		d.dropStale(rel, &st, rec)
	case !exists:
		d.log.Info("file was removed on another node", "path", rel)
		d.removeBeneath(rel, false, &st)
	case rec.Owner == d.cfg.Node && !rec.Writing:
		d.mu.Lock()
		delete(d.superseded, rel)
		d.mu.Unlock()
		return
	default:
		d.supersede(rel, rec, &st)
	}
	d.toldUnseen(rel)
	d.loc.Changed(rel)
}

// publishDone looks again at a change of rel told while this node
// published its own version of rel, once no publish of rel is in progress
// here: if the change is newer than what this node published, this
// node's version lost (two nodes wrote one path at once) and goes, as
// Invalidated would have done, aside (it may tell the kernel, which a
// request must not wait for). d.mu must not be held.
func (d *DMD) publishDone(rel string) {
	d.mu.Lock()
	_, publishing := d.publishing[rel]
	_, told := d.toldWhilePublishing[rel]
	if !told || publishing || d.releasing[rel] > 0 {
		d.mu.Unlock()
		return
	}
	delete(d.toldWhilePublishing, rel)
	d.mu.Unlock()
	go func() {
		// What is known then: a change made here meanwhile is newer.
		if rec, exists, ok := d.loc.Told(rel); ok {
			d.Invalidated(rel, rec, exists)
		}
	}()
}

// ownNewer reports whether this node's own file at rel was published at a
// generation newer than rec's (its mark says so).
func (d *DMD) ownNewer(rel string, rec hfl.Record) bool {
	_, gen, ok := d.publishedMark(rel)
	return ok && rec.Generation < gen
}

// ShadowDir makes, in the backing directory, the directory rel that the
// namespace has (rec) and this node lacks, with rec's attributes, marked
// as a shadow: it is shown here, files can be made in it, and it is not
// this node's to publish.
func (d *DMD) ShadowDir(ctx context.Context, rel string, rec hfl.Record) error {
	d.loc.Hold(ctx, rel, true)
	parent, base := path.Split(rel)
	dirfd, err := d.dirBeneath(strings.TrimSuffix(parent, "/"), rec.Uid, rec.Gid)
	if err != nil {
		return fmt.Errorf("make %s here: %w", rel, err)
	}
	defer unix.Close(dirfd)
	err = unix.Mkdirat(dirfd, base, rec.Mode&0o7777)
	if errors.Is(err, unix.EEXIST) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("make %s here: %w", rel, err)
	}
	d.noteCopy(rel, copyInfo{owner: rec.Owner, gen: rec.Generation, dir: true}, nil)
	fd, err := unix.Openat(dirfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil // made; its attributes stay the daemon's
	}
	defer unix.Close(fd)
	d.inherit(fd, rec.InodeNumber())
	if os.Geteuid() == 0 {
		unix.Fchown(fd, int(rec.Uid), int(rec.Gid))
	}
	unix.Fchmod(fd, rec.Mode&0o7777) // the daemon's umask does not apply
	ts := []unix.Timespec{unix.NsecToTimespec(rec.MtimeNs), unix.NsecToTimespec(rec.MtimeNs)}
	unix.UtimesNanoAt(fd, "", ts, unix.AT_EMPTY_PATH) // futimens
	if d.markers {
		unix.Fsetxattr(fd, replicaXattr, []byte(rec.Owner+"@"+fmt.Sprint(rec.Generation)), 0)
	}
	return nil
}

// openDir opens directory rel of the backing directory (O_PATH) without
// following symbolic links.
func (d *DMD) openDir(rel string) (int, error) { return d.back.OpenDirPath(rel) }
