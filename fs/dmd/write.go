package dmd

import (
	"context"
	"syscall"

	"github.com/dyadfs/dyadfs/fs/caller"
	"github.com/dyadfs/dyadfs/hfl"
)

// Writer is one write handle on a backing file.
type Writer struct {
	d   *DMD
	id  FileID
	tid uint32
	ws  *writeState
}

// BeginCreate marks rel as being created, before the backing file exists, so
// that a reader already waiting for rel does not take the new, empty file for
// a complete one. EndCreate must follow.
func (d *DMD) BeginCreate(rel string) {
	d.mu.Lock()
	d.creating[rel]++
	d.mu.Unlock()
}

// EndCreate ends what BeginCreate started. By then the new file's writer is
// registered (or the create failed).
func (d *DMD) EndCreate(rel string) {
	d.mu.Lock()
	if d.creating[rel]--; d.creating[rel] <= 0 {
		delete(d.creating, rel)
	}
	d.mu.Unlock()
}

// BeginWrite registers a write handle on file id for thread tid. Call it
// before opening the backing file for writing, so that a truncating open is
// never seen half-way by a reader. dirty says the open creates or truncates
// the file.
func (d *DMD) BeginWrite(id FileID, tid uint32, dirty bool) *Writer {
	d.mu.Lock()
	ws := d.busy[id]
	if ws == nil {
		ws = &writeState{tids: make(map[uint32]int), done: make(chan struct{})}
		d.busy[id] = ws
	}
	ws.writers++
	ws.tids[tid]++
	ws.dirty = ws.dirty || dirty
	d.mu.Unlock()
	d.stats.writeOpens.Add(1)
	return &Writer{d: d, id: id, tid: tid, ws: ws}
}

// Opened records that the backing file is open as fd: it marks the file
// incomplete on disk (for crash recovery) and remembers its attributes, to
// tell at the end whether the writers changed it.
func (w *Writer) Opened(fd int) {
	d := w.d
	d.mu.Lock()
	needMarker := d.markers && !w.ws.marked
	w.ws.marked = w.ws.marked || needMarker
	d.mu.Unlock()
	if needMarker {
		if err := setMarker(fd); err != nil {
			d.log.Warn("cannot mark file as being written", "err", err)
		}
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return
	}
	d.mu.Lock()
	if !w.ws.haveBefore {
		w.ws.before, w.ws.haveBefore = stampOf(&st), true
	}
	d.mu.Unlock()
}

// Abort drops a write handle whose backing open failed. It publishes nothing.
func (w *Writer) Abort() {
	d := w.d
	d.mu.Lock()
	defer d.mu.Unlock()
	w.dropLocked()
	if w.ws.writers == 0 && !w.ws.incomplete && !w.ws.marked {
		delete(d.busy, w.id)
		close(w.ws.done)
	}
}

func (w *Writer) dropLocked() {
	w.ws.writers--
	if w.ws.tids[w.tid]--; w.ws.tids[w.tid] <= 0 {
		delete(w.ws.tids, w.tid)
	}
}

// End releases the write handle; fd is its backing file, still open. When it
// is the last write handle, End makes the data durable if configured, lets
// readers in and publishes the file under rel, its current path, if the
// writers changed it and it still has a name.
func (w *Writer) End(ctx context.Context, fd int, rel string) error {
	d := w.d
	defer d.stats.writeReleases.Add(1)
	d.mu.Lock()
	w.dropLocked()
	last := w.ws.writers == 0
	d.mu.Unlock()
	if !last {
		return nil
	}

	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		d.release(w, fd, false)
		return err
	}
	ws := w.ws
	d.mu.Lock()
	changed := ws.dirty || ws.incomplete || !ws.haveBefore || stampOf(&st) != ws.before
	d.mu.Unlock()
	if changed && d.cfg.FsyncOnPublish && st.Nlink > 0 {
		if err := syscall.Fsync(fd); err != nil {
			// Not durable: keep it unpublished and marked.
			d.log.Error("fsync before publish failed; file not published", "path", rel, "err", err)
			d.stats.publishErrors.Add(1)
			d.release(w, fd, false)
			return err
		}
		d.stats.fsyncs.Add(1)
	}
	if !d.release(w, fd, true) {
		return nil // a new writer came in; it publishes when done
	}
	if st.Nlink == 0 {
		return nil // unlinked while open: nothing to publish
	}
	d.notify(rel)
	if !changed {
		return nil
	}
	return d.publish(ctx, recordOf(rel, d.cfg.Node, &st))
}

// release ends the busy state of a file whose last writer is gone. A
// complete file loses its crash marker and readers are let in; an incomplete
// one (its data could not be made durable) stays busy and marked. It reports
// whether the file stopped being busy: false also when a new writer came in.
func (d *DMD) release(w *Writer, fd int, complete bool) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	ws := w.ws
	if ws.writers > 0 {
		return false
	}
	if !complete {
		ws.incomplete = true
		return false
	}
	if ws.marked {
		if err := clearMarker(fd); err != nil {
			d.log.Warn("cannot clear the being-written mark", "err", err)
		}
		ws.marked = false
	}
	delete(d.busy, w.id)
	close(ws.done)
	return true
}

// WaitComplete blocks while file id is being written, unless the calling
// thread's process holds one of its write handles: a process never waits for
// itself.
func (d *DMD) WaitComplete(ctx context.Context, id FileID, tid uint32) error {
	d.mu.Lock()
	ws := d.busy[id]
	var tids []uint32
	if ws != nil {
		for t := range ws.tids {
			tids = append(tids, t)
		}
	}
	d.mu.Unlock()
	if ws == nil || sameProcess(tid, tids) {
		return nil
	}

	ctx, cancel := d.waitContext(ctx)
	defer cancel()
	start := now()
	d.stats.opensWaited.Add(1)
	defer func() { d.stats.waited(since(start)) }()
	for {
		d.mu.Lock()
		ws := d.busy[id]
		d.mu.Unlock()
		if ws == nil {
			return nil
		}
		select {
		case <-ws.done:
		case <-ctx.Done():
			return d.waitErr(ctx)
		case <-d.shutdown:
			return ErrShutdown
		}
	}
}

// sameProcess reports whether thread tid belongs to the process of any of
// others.
func sameProcess(tid uint32, others []uint32) bool {
	if len(others) == 0 || tid == 0 {
		return false
	}
	mine, err := caller.Tgid(tid)
	if err != nil {
		return false
	}
	for _, o := range others {
		if o == tid {
			return true
		}
		if g, err := caller.Tgid(o); err == nil && g == mine {
			return true
		}
	}
	return false
}

func recordOf(rel, owner string, st *syscall.Stat_t) hfl.Record {
	return hfl.Record{
		Path:    rel,
		Owner:   owner,
		Size:    st.Size,
		Mode:    st.Mode,
		MtimeNs: st.Mtim.Nano(),
	}
}

func (d *DMD) publish(ctx context.Context, rec hfl.Record) error {
	if _, err := d.loc.Publish(ctx, rec); err != nil {
		d.stats.publishErrors.Add(1)
		d.log.Error("publish failed", "path", rec.Path, "err", err)
		return err
	}
	d.stats.publishes.Add(1)
	return nil
}
