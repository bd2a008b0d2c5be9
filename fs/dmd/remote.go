package dmd

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/dyadfs/dyadfs/fs/backing"
	"github.com/dyadfs/dyadfs/hfl"
)

// Writes to paths published elsewhere. One version per path: a write open
// of a file another node published first brings its current version here
// (unless it truncates), and the writer's node owns the next version. A
// writer that changed a published file tells the job before its close
// returns (Claim): every copy elsewhere is dropped, and opens that start
// afterwards wait for the new version.

// ErrRemoteTree means a rename of a directory that holds files published
// elsewhere: they would have to move here first (EXDEV: mv copies them).
var ErrRemoteTree = errors.New("directory holds files of other nodes")

// PublishedAs returns the namespace's record of rel, if it has one: the
// version a write to rel replaces, which the writer claims before its
// close returns. On a node alone there is none to claim.
func (d *DMD) PublishedAs(ctx context.Context, rel string) (hfl.Record, bool) {
	if d.solo() {
		return hfl.Record{}, false
	}
	rec, _, err := d.loc.Record(ctx, rel)
	if err != nil {
		return hfl.Record{}, false
	}
	return rec, true
}

// OpenForWrite opens rel for writing with flags (the open's, O_CREAT and
// O_EXCL aside) for thread tid: rel is published elsewhere and what this
// node has of it, if anything, is not its current version. Without
// O_TRUNC the current version is brought here first, so that appends and
// in-place edits keep the data (waiting while it is being rewritten
// elsewhere); with O_TRUNC nothing needs to move. It returns the writer,
// the open file and the record of the version the write replaces.
func (d *DMD) OpenForWrite(ctx context.Context, rel string, flags int, tid uint32) (*Writer, *os.File, hfl.Record, error) {
	rec, ok, err := d.Entry(ctx, rel, false)
	switch {
	case err != nil:
		return nil, nil, hfl.Record{}, err
	case ok && rec.IsDir():
		return nil, nil, hfl.Record{}, fmt.Errorf("%s: %w", rel, syscall.EISDIR)
	case !ok && flags&syscall.O_CREAT == 0:
		return nil, nil, hfl.Record{}, fmt.Errorf("%s: %w", rel, fs.ErrNotExist)
	}
	flags &^= syscall.O_CREAT | syscall.O_EXCL
	if ok && flags&syscall.O_TRUNC == 0 {
		if _, err := d.WaitPath(ctx, rel, tid); err != nil {
			return nil, nil, hfl.Record{}, err
		}
		return d.writeHere(rel, flags, tid, rec)
	}
	// Truncated (or gone meanwhile): a new file here replaces what this
	// node had of the old version.
	if !d.clearForFetch(ctx, rel) && d.existsHere(rel) {
		if d.busy0(rel) {
			// Being written here already: join its writers.
			return d.writeHere(rel, flags, tid, rec)
		}
		if st, complete := d.completeHere(rel); complete && d.currentHere(ctx, rel, st) {
			// The current version arrived here since the caller
			// looked (a reader on this node fetched it): write it.
			return d.writeHere(rel, flags, tid, rec)
		}
		return nil, nil, hfl.Record{}, fmt.Errorf("%s: %w", rel, syscall.EEXIST)
	}
	mode, uid, gid := uint32(0o644), uint32(os.Geteuid()), uint32(os.Getegid())
	if ok {
		mode, uid, gid = rec.Mode&0o7777, rec.Uid, rec.Gid
	}
	parent, base := path.Split(rel)
	dirfd, err := d.dirBeneath(strings.TrimSuffix(parent, "/"), uid, gid)
	if err != nil {
		return nil, nil, hfl.Record{}, err
	}
	defer unix.Close(dirfd)
	d.BeginCreate(rel)
	defer d.EndCreate(rel)
	fd, err := backing.Openat(dirfd, base, flags|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode)
	if err != nil {
		return nil, nil, hfl.Record{}, &os.PathError{Op: "open", Path: rel, Err: err}
	}
	f := os.NewFile(uintptr(fd), d.BackingPath(rel))
	unix.Fchmod(fd, mode) // the daemon's umask does not apply
	if ok && os.Geteuid() == 0 {
		unix.Fchown(fd, int(uid), int(gid))
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		f.Close()
		return nil, nil, hfl.Record{}, err
	}
	if ok {
		d.inherit(fd, rec.InodeNumber()) // the same file, written anew
	}
	w := d.BeginWrite(IDOf(&st), tid, rel, true)
	w.Opened(fd)
	return w, f, rec, nil
}

// busy0 reports whether the file at rel is being written here.
func (d *DMD) busy0(rel string) bool {
	var st syscall.Stat_t
	if d.back.Lstat(rel, &st) != nil {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.busy[IDOf(&st)] != nil || d.creating[rel] > 0
}

// writeHere opens rel for writing as it is here: a file being written
// here (one more writer) or the current version, complete here.
func (d *DMD) writeHere(rel string, flags int, tid uint32, rec hfl.Record) (*Writer, *os.File, hfl.Record, error) {
	var st syscall.Stat_t
	if err := d.back.Lstat(rel, &st); err != nil {
		return nil, nil, hfl.Record{}, err
	}
	w := d.BeginWrite(IDOf(&st), tid, rel, false)
	f, err := d.OpenBeneath(rel, flags|unix.O_NOFOLLOW)
	if err != nil {
		w.Abort()
		return nil, nil, hfl.Record{}, err
	}
	w.Opened(int(f.Fd()))
	return w, f, rec, nil
}

// Claim tells the job that thread tid's process rewrites rel, which was
// published as prev (zero: look it up): rel's record names this node as its writer, and
// every node that held a copy drops it before Claim returns. Opens that
// start afterwards anywhere wait for this node's publish of the new
// version (close-to-open).
//
// The claim is the writer's to end: its last handle publishes the new
// version, or takes the claim back (see Writer.finish). A claim left in
// the store would keep every reader of rel waiting.
func (w *Writer) Claim(ctx context.Context, rel string, prev hfl.Record, tid uint32) error {
	d := w.d
	if d.solo() {
		return nil
	}
	// A close that waits to tell the others (a home that does not answer)
	// is listed with the opens that wait.
	done, _ := d.startWait(rel, tid, "rewrite told")
	defer done()
	if prev.Path == "" {
		rec, ok := d.PublishedAs(ctx, rel)
		if !ok {
			return nil // published nowhere: nobody holds a copy
		}
		prev = rec
	}
	claim := prev
	claim.Path, claim.Owner, claim.Target = rel, d.cfg.Node, ""
	out, err := d.loc.Publish(ctx, claim, hfl.PublishOptions{Tell: hfl.TellSure, Claim: true})
	if err != nil {
		d.stats.claimErrors.Add(1)
		return err
	}
	d.mu.Lock()
	if w.ws.claims == nil {
		w.ws.claims = make(map[string]uint64, 1)
	}
	w.ws.claims[rel] = max(w.ws.claims[rel], out.Generation)
	d.mu.Unlock()
	d.stats.claims.Add(1)
	return nil
}

// Materialize brings rel, published elsewhere, here as it is, for a change
// of names that needs it here (a rename or a link of it): a file is
// fetched, a symbolic link or a directory made. A directory that exists
// here must hold nothing published elsewhere (ErrRemoteTree): it moves
// only if all it holds is here.
func (d *DMD) Materialize(ctx context.Context, rel string, tid uint32) error {
	if d.solo() {
		return nil
	}
	var st syscall.Stat_t
	if err := d.back.Lstat(rel, &st); err == nil {
		switch st.Mode & syscall.S_IFMT {
		case syscall.S_IFDIR:
			return d.onlyHere(ctx, rel)
		case syscall.S_IFREG:
			if d.currentHere(ctx, rel, &st) {
				return nil
			}
			_, err := d.WaitPath(ctx, rel, tid)
			return err
		}
		return nil
	}
	rec, ok, err := d.Entry(ctx, rel, false)
	switch {
	case err != nil:
		return err
	case !ok:
		return fmt.Errorf("%s: %w", rel, fs.ErrNotExist)
	case rec.IsDir():
		if err := d.ShadowDir(ctx, rel, rec); err != nil {
			return err
		}
		return d.onlyHere(ctx, rel)
	case rec.IsSymlink():
		return d.linkHere(rel, rec)
	}
	_, err = d.WaitPath(ctx, rel, tid)
	return err
}

// onlyHere fails with ErrRemoteTree if anything under directory rel is
// published elsewhere and not here.
func (d *DMD) onlyHere(ctx context.Context, rel string) error {
	after := ""
	for {
		recs, err := d.List(ctx, rel, after, hfl.DefaultListLimit)
		if err != nil {
			return err
		}
		for _, rec := range recs {
			var st syscall.Stat_t
			if err := d.back.Lstat(rec.Path, &st); err != nil {
				return fmt.Errorf("%s: %s is on node %s: %w", rel, rec.Path, rec.Owner, ErrRemoteTree)
			}
			if st.Mode&syscall.S_IFMT == syscall.S_IFDIR {
				if err := d.onlyHere(ctx, rec.Path); err != nil {
					return err
				}
			} else if st.Mode&syscall.S_IFMT == syscall.S_IFREG && !d.currentHere(ctx, rec.Path, &st) {
				return fmt.Errorf("%s: %s is on node %s: %w", rel, rec.Path, rec.Owner, ErrRemoteTree)
			}
		}
		if len(recs) < hfl.DefaultListLimit {
			return nil
		}
		after = recs[len(recs)-1].Name()
	}
}

// linkHere makes the symbolic link rec describes at rel.
func (d *DMD) linkHere(rel string, rec hfl.Record) error {
	parent, base := path.Split(rel)
	dirfd, err := d.dirBeneath(strings.TrimSuffix(parent, "/"), rec.Uid, rec.Gid)
	if err != nil {
		return err
	}
	defer unix.Close(dirfd)
	if err := unix.Symlinkat(rec.Target, dirfd, base); err != nil && !errors.Is(err, unix.EEXIST) {
		return &os.PathError{Op: "symlink", Path: rel, Err: err}
	}
	if os.Geteuid() == 0 {
		unix.Fchownat(dirfd, base, int(rec.Uid), int(rec.Gid), unix.AT_SYMLINK_NOFOLLOW)
	}
	d.inheritAt(rel, rec.InodeNumber())
	d.noteCopy(rel, copyInfo{owner: rec.Owner, gen: rec.Generation}, nil)
	return nil
}
