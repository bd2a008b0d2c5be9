package dmd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dyadfs/dyadfs/dtl"
	"github.com/dyadfs/dyadfs/hfl"
	"github.com/dyadfs/dyadfs/internal/digest"
)

var _ dtl.Source = (*DMD)(nil)

// OpenPublished implements dtl.Source: it opens a file for a peer. Only
// complete files this node published are served, and only from inside the
// backing directory: the path is resolved beneath it by the kernel
// (openat2 RESOLVE_BENEATH), so "..", absolute paths and symbolic links
// that leave the directory are refused, as is dyadfs's own state.
func (d *DMD) OpenPublished(ctx context.Context, req dtl.Request) (*os.File, dtl.FileInfo, error) {
	path := req.Path
	rel, err := hfl.CleanPath(path)
	if err != nil || rel != path || rel == InternalDir || strings.HasPrefix(rel, InternalDir+"/") {
		return nil, dtl.FileInfo{}, fmt.Errorf("%q: %w", path, dtl.ErrOutside)
	}
	f, err := d.OpenBeneath(rel, unix.O_RDONLY|unix.O_NOCTTY|unix.O_NONBLOCK)
	switch {
	case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ENOTDIR):
		return nil, dtl.FileInfo{}, fmt.Errorf("%s: %w", rel, dtl.ErrNotFound)
	case errors.Is(err, unix.EXDEV), errors.Is(err, unix.ELOOP):
		return nil, dtl.FileInfo{}, fmt.Errorf("%s leads outside the backing directory: %w", rel, dtl.ErrOutside)
	case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM), errors.Is(err, unix.EIO):
		// No retry makes the file readable.
		return nil, dtl.FileInfo{}, fmt.Errorf("%w: %w", dtl.ErrUnreadable, err)
	case err != nil:
		return nil, dtl.FileInfo{}, fmt.Errorf("open %s: %w", rel, err)
	}
	info, err := d.servable(ctx, rel, f, req.Generation)
	if err != nil {
		f.Close()
		return nil, dtl.FileInfo{}, err
	}
	// Reads block from here on (the O_NONBLOCK only kept a FIFO from
	// hanging the open).
	if err := unix.SetNonblock(int(f.Fd()), false); err != nil {
		f.Close()
		return nil, dtl.FileInfo{}, err
	}
	return f, info, nil
}

// OpenBeneath opens rel in the backing directory with flags, resolving it
// beneath the directory: a path whose resolution would leave it, or that
// goes through a symbolic link (which dyadfs never needs: the kernel
// follows the mount's links), fails (EXDEV, ELOOP), and so does a link at
// its end.
func (d *DMD) OpenBeneath(rel string, flags int) (*os.File, error) {
	fd, err := d.back.OpenFile(rel, flags, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: rel, Err: err}
	}
	return os.NewFile(uintptr(fd), d.BackingPath(rel)), nil
}

// servable checks that f, opened at rel, is a complete regular file that
// this node published, at least at generation gen, and describes it.
func (d *DMD) servable(ctx context.Context, rel string, f *os.File, gen uint64) (dtl.FileInfo, error) {
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		return dtl.FileInfo{}, err
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return dtl.FileInfo{}, fmt.Errorf("%s is not a regular file: %w", rel, dtl.ErrNotFound)
	}
	d.mu.Lock()
	busy := d.busy[IDOf(&st)] != nil
	ahead, publishing := d.publishing[rel]
	releasing, base := d.releasing[rel] > 0, d.releaseBase[rel]
	d.mu.Unlock()
	aheadIsIt := publishing && ahead.Size == st.Size && ahead.MtimeNs == st.Mtim.Nano()
	if busy || (releasing && !aheadIsIt && !d.committed(rel, base, st.Size, st.Mtim.Nano(), nil)) {
		// Being written, or a version just written is being hashed
		// and published: the record found is not yet its (a rewrite
		// in place can keep the size, and the clock's tick the
		// mtime), so the consumer waits for its publish.
		return dtl.FileInfo{}, fmt.Errorf("%s: %w", rel, dtl.ErrBusy)
	}
	if aheadIsIt && gen == 0 {
		// Its publish is being committed: a consumer told ahead of it
		// asks for it (generation 0, none assigned yet).
		d.stats.serves.Add(1)
		return dtl.FileInfo{Size: st.Size, Mode: st.Mode, Uid: st.Uid, Gid: st.Gid, MtimeNs: st.Mtim.Nano(), Checksum: ahead.Sum}, nil
	}
	rec, _, err := d.loc.Record(ctx, rel)
	if gen > 0 && (errors.Is(err, hfl.ErrNotFound) || (err == nil && rec.Generation < gen)) {
		// The consumer saw a newer publish than this node's cache, or a
		// store member that lags, knows of: ask the store for it.
		wctx, cancel := context.WithTimeout(ctx, authoritativeWait)
		rec, err = d.loc.Wait(wctx, rel, gen-1)
		cancel()
		if errors.Is(err, context.DeadlineExceeded) {
			err = hfl.ErrNotFound
		}
	}
	if errors.Is(err, hfl.ErrNotFound) || (err == nil && rec.Owner != d.cfg.Node) {
		return dtl.FileInfo{}, fmt.Errorf("%s: %w", rel, dtl.ErrNotPublished)
	}
	if err != nil {
		return dtl.FileInfo{}, fmt.Errorf("record of %s: %w", rel, err)
	}
	if rec.Size != st.Size || rec.MtimeNs != st.Mtim.Nano() {
		// Changed since it was published without a write handle or a
		// change of this name seeing it (through another hard link of
		// it, say): publish it as it is, so that the consumer, which
		// waits for a newer version, gets one.
		go d.Changed(d.life, rel)
		return dtl.FileInfo{}, fmt.Errorf("%s differs from its published record: %w", rel, dtl.ErrBusy)
	}
	d.stats.serves.Add(1)
	return dtl.FileInfo{Size: st.Size, Mode: st.Mode, Uid: st.Uid, Gid: st.Gid, MtimeNs: st.Mtim.Nano(), Generation: rec.Generation, Checksum: rec.Sum}, nil
}

// authoritativeWait bounds asking the store for a generation a consumer saw.
const authoritativeWait = 2 * time.Second

// Unchanged implements dtl.Source: f, just sent, is still what info says:
// no writer has it open, none wrote it since (a version written is being
// published, or was), and nothing replaced it. Size and mtime alone would
// not tell: a rewrite in place can keep the size, and the clock's tick
// the mtime, while the bytes sent are a mix of two versions.
func (d *DMD) Unchanged(f *os.File, info dtl.FileInfo) error {
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		return err
	}
	changed := func() error { return fmt.Errorf("%s changed while it was sent: %w", f.Name(), dtl.ErrBusy) }
	rel, _ := filepath.Rel(d.cfg.Backing, f.Name())
	d.mu.Lock()
	busy := d.busy[IDOf(&st)] != nil
	p, publishing := d.publishing[rel]
	releasing, base := d.releasing[rel] > 0, d.releaseBase[rel]
	d.mu.Unlock()
	if busy || st.Size != info.Size || st.Mtim.Nano() != info.MtimeNs {
		return changed()
	}
	if publishing && sameVersion(p, info) {
		return nil // the version being published, sent ahead of its commit
	}
	if publishing || (releasing && !d.committed(rel, base, info.Size, info.MtimeNs, &info.Checksum)) {
		return changed()
	}
	// A change of the path since the version sent (written here and
	// published, replaced or removed elsewhere), unless it kept the bytes
	// (a chmod, a rename back).
	if rec, exists, ok := d.loc.Told(rel); ok && rec.Generation > info.Generation &&
		(!exists || rec.Owner != d.cfg.Node || rec.Writing || !sameVersion(rec, info)) {
		return changed()
	}
	return nil
}

// committed reports whether the version released at rel (see
// releaseBase), with size and mtime (and sum, if given), is committed:
// the newest record this node knows of rel is this node's, newer than
// base, and describes it.
func (d *DMD) committed(rel string, base uint64, size, mtime int64, sum *digest.Sum) bool {
	rec, exists, ok := d.loc.Told(rel)
	return ok && exists && rec.Owner == d.cfg.Node && !rec.Writing && rec.Generation > base &&
		rec.Size == size && rec.MtimeNs == mtime && (sum == nil || rec.Sum == *sum)
}

// toldGen is the generation of the newest record of rel this node knows.
func (d *DMD) toldGen(rel string) uint64 {
	rec, _, _ := d.loc.Told(rel)
	return rec.Generation
}

// sameVersion reports whether rec describes the file info describes.
func sameVersion(rec hfl.Record, info dtl.FileInfo) bool {
	return rec.Size == info.Size && rec.MtimeNs == info.MtimeNs && rec.Sum == info.Checksum
}

var _ dtl.MessageHandler = (*DMD)(nil)

// HandleMessage implements dtl.MessageHandler: peers' messages are the
// locator's notices, and readers' requests for block hashes.
func (d *DMD) HandleMessage(ctx context.Context, from string, msg []byte) ([]byte, error) {
	if len(msg) > 0 && msg[0] == blockListMsg {
		return d.answerBlockList(ctx, msg)
	}
	return d.loc.HandleMessage(ctx, from, msg)
}
