package dmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/dyadfs/dyadfs/fs/caller"
	"github.com/dyadfs/dyadfs/hfl"

	"github.com/dyadfs/dyadfs/metrics"
)

// A file's writeState lives from its first write handle until it is
// finished, exactly once, by finishLocked: when its last writer has made it
// durable (if asked) and let readers in, or when its last name goes while no
// writer holds it. Between the last writer's release and that moment the
// state is "ending": a new writer may still join it (then the ending writer
// leaves the publish to the new one), but nothing else finishes it.
type writeState struct {
	writers    int
	pids       map[uint32]int      // processes holding write handles
	names      map[string]struct{} // names the file had while written
	incomplete bool                // found with a crash marker at start
	dirty      bool                // created by a writer
	made       bool                // a new file, made by its writer: it carries no marks
	before     fileStamp           // attributes when the first writer opened it
	haveBefore bool
	mark       int  // the slot of its being-written mark (0: none)
	ending     bool // the last writer is finishing it
	finished   bool
	done       chan struct{} // closed when finished
	// claims are the names its writers claimed (see Writer.Claim), by
	// the claim's generation: its finish publishes them or takes them
	// back.
	claims map[string]uint64
}

func newWriteState() *writeState {
	return &writeState{pids: make(map[uint32]int), names: make(map[string]struct{}), done: make(chan struct{})}
}

// finishLocked ends ws: readers of id are let in. d.mu must be held.
func (d *DMD) finishLocked(id FileID, ws *writeState) {
	if ws.finished {
		return
	}
	ws.finished = true
	d.unmarkWritingLocked(ws)
	if d.busy[id] == ws {
		delete(d.busy, id)
	}
	close(ws.done)
}

// Writer is one write handle on a backing file.
type Writer struct {
	d   *DMD
	id  FileID
	pid uint32
	ws  *writeState
	// closed says that a close of the handle dropped it from its state
	// (see Close); finishedAs, if not nil, is what the file was when that
	// close finished it.
	closed     bool
	finishedAs *fileStamp
	// closing serializes Close and End: closes of copies of the
	// descriptor in several processes can come at once.
	closing sync.Mutex
}

// BeginCreate marks rel as being created, before the backing file exists, so
// that a reader already waiting for rel does not take the new, empty file for
// a complete one. EndCreate must follow.
func (d *DMD) BeginCreate(rel string) {
	d.writeOpens.name(rel)
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

// BeginWrite registers a write handle on file id, opened as rel by thread
// tid. Call it before opening the backing file for writing, so that a
// truncating open is never seen half-way by a reader. created says the open
// creates the file.
func (d *DMD) BeginWrite(id FileID, tid uint32, rel string, created bool) *Writer {
	pid := processOf(tid)
	d.mu.Lock()
	ws := d.busy[id]
	if ws == nil {
		ws = newWriteState()
		d.busy[id] = ws
	}
	ws.writers++
	ws.pids[pid]++
	if rel != "" {
		ws.names[rel] = struct{}{}
	}
	ws.dirty = ws.dirty || created
	d.mu.Unlock()
	d.writeOpens.file(id)
	d.stats.writeOpens.Add(1)
	return &Writer{d: d, id: id, pid: pid, ws: ws}
}

// processOf returns the process of thread tid, or tid itself if it cannot
// be read (then only that thread counts as the writer).
func processOf(tid uint32) uint32 {
	if pid, err := caller.Tgid(tid); err == nil {
		return pid
	}
	return tid
}

// Made says that the writer's open made the file: a new inode, which
// carries none of dyadfs's marks.
func (w *Writer) Made() {
	w.d.mu.Lock()
	w.ws.made = true
	w.d.mu.Unlock()
}

// Opened records that the backing file is open as fd: it marks the file
// incomplete on disk (for crash recovery) and remembers its attributes, to
// tell at the end whether the writers changed it.
func (w *Writer) Opened(fd int) {
	d := w.d
	d.mu.Lock()
	d.markWritingLocked(w.id, w.ws)
	d.mu.Unlock()
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

// dropLocked removes the handle from its state. d.mu must be held.
func (w *Writer) dropLocked() {
	w.ws.writers--
	if w.ws.pids[w.pid]--; w.ws.pids[w.pid] <= 0 {
		delete(w.ws.pids, w.pid)
	}
}

// Abort drops a write handle whose backing open failed. It publishes nothing.
func (w *Writer) Abort() {
	d := w.d
	d.mu.Lock()
	defer d.mu.Unlock()
	w.dropLocked()
	if w.ws.writers == 0 && !w.ws.ending && !w.ws.incomplete {
		d.finishLocked(w.id, w.ws)
	}
}

// End releases the write handle; fd is its backing file, still open, and rel
// its current path as the caller knows it ("" if unknown). When it is the
// last write handle, End makes the data durable if configured, lets readers
// in, and publishes the file, if the writers changed it, under every name
// that still is this file: rel and the names it was given while written
// (renames and links during a write are common: write, then rename into
// place). A handle whose close finished the file already (see Close)
// publishes it again only if it changed since.
func (w *Writer) End(ctx context.Context, fd int, rel string) error {
	defer w.d.stats.writeReleases.Add(1)
	w.closing.Lock()
	defer w.closing.Unlock()
	if w.closed {
		return w.again(ctx, fd, rel, false)
	}
	_, err := w.finish(ctx, fd, rel, publishAside)
	return err
}

// Close is the close of one of the handle's descriptors, by thread tid, when
// Config.CloseWait asks for the store's verdict at close. If the closing
// process holds no other descriptor of the file (held tells), nor does the
// process that opened the handle, and no other handle on this node writes
// it, this close is its writer's last: the file is finished now, as End
// would finish it, and Close returns once the store took its publish, or
// with ErrPublish (the writer's close() fails then; the publish is
// retried). Any other close publishes nothing: the file is finished at its
// handle's release, as without CloseWait.
func (w *Writer) Close(ctx context.Context, fd int, rel string, tid uint32, held func(pid uint32) bool) error {
	d := w.d
	if d.cfg.CloseWait <= 0 || d.solo() {
		return nil
	}
	start := time.Now()
	w.closing.Lock()
	defer w.closing.Unlock()
	if w.closed {
		return w.again(ctx, fd, rel, true)
	}
	// The writer's last close: by the process that opened the handle,
	// or by one that inherited it (a shell opens a redirection, the
	// command it starts writes and closes), once neither holds it.
	d.mu.Lock()
	sole := w.ws.writers == 1
	d.mu.Unlock()
	if !sole || !w.Changed(fd) {
		return nil
	}
	if closer := processOf(tid); held(closer) || (closer != w.pid && held(w.pid)) {
		return nil // a copy of the descriptor is still open
	}
	done, _ := d.startWait(rel, tid, "publish at close")
	defer done()
	spent := closeSpent{check: time.Since(start)}
	how := publishVerdict
	how.spent = &spent
	st, err := w.finish(ctx, fd, rel, how)
	w.closed = true
	if st != nil {
		// As it is now: finishing it cleared its marks, a change of
		// its ctime that is not a write.
		var now syscall.Stat_t
		if syscall.Fstat(fd, &now) == nil {
			st = &now
		}
		stamp := stampOf(st)
		w.finishedAs = &stamp
	}
	spent.total = time.Since(start)
	d.stats.closed(&spent)
	return err
}

// again publishes the file once more if it changed since a close finished
// it (written through another descriptor of the handle), with the store's
// verdict if verdict.
func (w *Writer) again(ctx context.Context, fd int, rel string, verdict bool) error {
	d := w.d
	if w.finishedAs == nil {
		return nil // another writer finishes it
	}
	// Only the bytes count: a change of its ctime alone (a link, a
	// chmod: each published by its own call) is no new version. A link
	// then an unlink of the first name, as git does with every object,
	// would publish the first name again while it is being removed.
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil || st.Nlink == 0 || stampOf(&st).sameBytes(*w.finishedAs) {
		return nil
	}
	*w.finishedAs = stampOf(&st)
	if rel == "" || !d.names(rel, w.id) {
		return nil
	}
	d.loc.Changed(rel)
	rec, err := d.fileRecord(rel, fd, &st, nil, true)
	if err != nil {
		d.notHashed(rel, err)
		return nil
	}
	return d.publishName(ctx, rec, w.id, fd, closePublish(verdict))
}

// publishName publishes rec, the file id open as fd under its name
// rec.Path, and takes the publish back if the name was unlinked or renamed
// over meanwhile: a release runs alongside the writer's next calls, whose
// unpublish may reach the store before this publish does, and a name
// removed here must not stay published.
func (d *DMD) publishName(ctx context.Context, rec hfl.Record, id FileID, fd int, how publishHow) error {
	how.fd, how.haveFd = fd, true
	err := d.publish(ctx, rec, how)
	if name := rec.Path; !d.names(name, id) {
		d.withdraw(ctx, name)
		if d.existsHere(name) {
			d.Changed(ctx, name) // what took the name
		}
	}
	return err
}

// finish drops the handle and, when it was the last, finishes the file:
// see End. It publishes as how says; with a verdict, its publishes wait for
// the store (see Close) and the first failure is returned. It returns what
// the file was when finished, or nil if another handle still writes it.
func (w *Writer) finish(ctx context.Context, fd int, rel string, how publishHow) (*syscall.Stat_t, error) {
	d := w.d
	verdict := how.verdict
	start := time.Now()
	ws := w.ws
	d.mu.Lock()
	w.dropLocked()
	if ws.writers > 0 {
		d.mu.Unlock()
		return nil, nil
	}
	ws.ending = true
	if rel != "" {
		ws.names[rel] = struct{}{}
	}
	d.mu.Unlock()

	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		d.keepIncomplete(ws)
		return nil, err
	}
	d.mu.Lock()
	// A claimed file is published even if its bytes are as they were:
	// the claim told every node that a new version comes.
	changed := ws.dirty || ws.incomplete || !ws.haveBefore || stampOf(&st) != ws.before || len(ws.claims) > 0
	made := ws.made
	d.mu.Unlock()
	if changed && d.cfg.FsyncOnPublish && st.Nlink > 0 {
		if err := syscall.Fsync(fd); err != nil {
			// Not durable: keep it unpublished and marked.
			d.log.Error("fsync before publish failed; file not published", "path", rel, "err", err)
			d.stats.publishErrors.Add(1)
			d.keepIncomplete(ws)
			return nil, err
		}
		d.stats.fsyncs.Add(1)
	}
	if changed {
		// Changed here, a fetched copy is this node's own file now.
		if d.markers && !made {
			clearReplica(fd)
		}
		d.mu.Lock()
		for name := range ws.names {
			d.copies.forget(name)
			delete(d.superseded, name)
		}
		d.mu.Unlock()
	}
	var inline *hfl.Inline
	if changed {
		inline = d.inlineOf(fd, &st)
	}

	d.mu.Lock()
	if ws.writers > 0 {
		// A new writer came in; it publishes when it is done.
		ws.ending = false
		d.mu.Unlock()
		return nil, nil
	}
	if ws.incomplete && d.markers {
		// Found held at start: an earlier release marked it on the file.
		if err := clearMarker(fd); err != nil {
			d.log.Warn("cannot clear the being-written mark", "path", rel, "err", err)
		}
	}
	names := make([]string, 0, len(ws.names))
	for name := range ws.names {
		names = append(names, name)
		if changed {
			// Readers are let in now; its publish follows. Until it
			// is done, a change told from elsewhere does not remove
			// it (the publish is the newer one, or loses later).
			d.releaseLocked(name)
		}
	}
	d.finishLocked(w.id, ws)
	claims := ws.claims
	d.mu.Unlock()
	if changed {
		defer d.released(names...)
	}

	if st.Nlink == 0 {
		d.endClaims(ctx, claims, nil) // unlinked while open: nothing to publish
		return &st, nil
	}
	var first error
	written := changed
	var publishing []string // claimed names whose publish is under way
	for _, name := range names {
		if !d.names(name, w.id) {
			continue
		}
		d.loc.Changed(name)
		if changed {
			// Hashed once (the first name), for every name.
			rec, err := d.fileRecord(name, fd, &st, inline, written)
			if err != nil {
				d.notHashed(name, err)
				if _, ok := claims[name]; ok && !errors.Is(err, errGone) {
					publishing = append(publishing, name) // by its writer, or retried
				}
				continue
			}
			if _, ok := claims[name]; ok {
				publishing = append(publishing, name)
			}
			if written && how.spent != nil {
				how.spent.record = time.Since(start)
			}
			written = false
			// Without a verdict, a failed publish is only retried
			// (publish logs it): the release has no one to tell.
			if err := d.publishName(ctx, rec, w.id, fd, how); err != nil && verdict && first == nil {
				first = err
			}
		}
	}
	d.endClaims(ctx, claims, publishing)
	return &st, first
}

// endClaims takes back the claims of a finished file (name: the claim's
// generation) that its finish does not publish (the names in publishing
// are published, or will be): the file went, or its name is another
// file's now. Only the claim itself goes, not a newer record.
func (d *DMD) endClaims(ctx context.Context, claims map[string]uint64, publishing []string) {
	for name, gen := range claims {
		if !slices.Contains(publishing, name) {
			d.log.Debug("a rewrite claimed is not published; the claim is taken back", "path", name, "gen", gen)
			d.withdrawIf(ctx, name, hfl.RemoveCond{Owner: d.cfg.Node, MaxGeneration: gen})
		}
	}
}

// releaseLocked notes that this node is publishing a version of name it
// made (from its hashing to its commit): a change told from elsewhere
// meanwhile does not remove it (the publish is the newer one, or loses
// later: see publishDone). d.mu must be held; released ends it.
func (d *DMD) releaseLocked(name string) {
	if d.releasing[name] == 0 {
		d.releaseBase[name] = d.toldGen(name)
	}
	d.releasing[name]++
}

// beginRelease is releaseLocked for a republish (a chmod's, a retry's).
func (d *DMD) beginRelease(name string) {
	d.mu.Lock()
	d.releaseLocked(name)
	d.mu.Unlock()
}

// released ends what releaseLocked began, for each name.
func (d *DMD) released(names ...string) {
	d.mu.Lock()
	for _, name := range names {
		if d.releasing[name]--; d.releasing[name] <= 0 {
			delete(d.releasing, name)
			delete(d.releaseBase, name)
		}
	}
	d.mu.Unlock()
	for _, name := range names {
		d.publishDone(name)
	}
}

// inlineOf reads a small file that is about to be published, so that its
// bytes go with the notices of the publish (see hfl.Record.Inline). It
// returns nil if the file is larger than hfl.InlineMax, nobody is told of
// publishes, or the file changed while it was read.
func (d *DMD) inlineOf(fd int, st *syscall.Stat_t) *hfl.Inline {
	if st.Size > hfl.InlineMax || d.cfg.SharedStorage || !d.loc.CarriesBytes() {
		return nil
	}
	// Backing descriptors are readable (see backing.Openat); one the
	// daemon may not read (EBADF) leaves the bytes to a transfer.
	buf := make([]byte, st.Size)
	n, err := syscall.Pread(fd, buf, 0)
	var after syscall.Stat_t
	if (err != nil && !errors.Is(err, io.EOF)) || int64(n) != st.Size || syscall.Fstat(fd, &after) != nil || stampOf(&after) != stampOf(st) {
		return nil // a transfer will bring what is published
	}
	return &hfl.Inline{Data: buf}
}

// keepIncomplete leaves a file whose last writer failed busy and marked:
// readers wait until it is written again.
func (d *DMD) keepIncomplete(ws *writeState) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if ws.writers == 0 {
		ws.incomplete = true
	}
	ws.ending = false
}

// names reports whether rel, in the backing store, is file id.
func (d *DMD) names(rel string, id FileID) bool {
	var st syscall.Stat_t
	return d.back.Lstat(rel, &st) == nil && IDOf(&st) == id
}

// noteName records that the file at rel, if it is being written, now also
// has that name, so that its last writer publishes it there.
func (d *DMD) noteName(rel string) {
	var st syscall.Stat_t
	if d.back.Lstat(rel, &st) != nil {
		return
	}
	d.mu.Lock()
	if ws := d.busy[IDOf(&st)]; ws != nil && !ws.finished {
		ws.names[rel] = struct{}{}
	}
	d.mu.Unlock()
}

// WaitComplete blocks while file id, at rel, is being written, unless the
// calling thread's process holds one of its write handles: a process never
// waits for itself.
func (d *DMD) WaitComplete(ctx context.Context, id FileID, rel string, tid uint32) error {
	d.mu.Lock()
	ws := d.busy[id]
	d.mu.Unlock()
	if ws == nil {
		return nil
	}
	pid := processOf(tid)
	d.mu.Lock()
	own := ws.pids[pid] > 0
	d.mu.Unlock()
	if own {
		return nil
	}

	ctx, _, end := d.openWaits(ctx, rel, tid, "writer")
	defer end()
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

func recordOf(rel, owner string, st *syscall.Stat_t) hfl.Record {
	rec := hfl.Record{
		Path:    rel,
		Owner:   owner,
		Size:    st.Size,
		Mode:    st.Mode,
		Uid:     st.Uid,
		Gid:     st.Gid,
		MtimeNs: st.Mtim.Nano(),
	}
	if alloc := st.Blocks * 512; alloc < st.Size && st.Mode&syscall.S_IFMT == syscall.S_IFREG {
		rec.Alloc = max(alloc, 1)
	}
	return rec
}

// Changed reports whether the file, open as fd, differs from what it was
// when its first writer opened it (or was created by one).
func (w *Writer) Changed(fd int) bool {
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return true
	}
	d := w.d
	d.mu.Lock()
	defer d.mu.Unlock()
	return w.ws.dirty || w.ws.incomplete || !w.ws.haveBefore || stampOf(&st) != w.ws.before
}

// notHashed deals with a file whose record could not be made (see
// fileRecord): one that went from rel is published by the change that
// took it; one that kept changing while it was hashed, or could not be
// read, is published later, hashed again (listed as pending meanwhile).
// Nothing is published unverified.
func (d *DMD) notHashed(rel string, err error) {
	if errors.Is(err, errGone) {
		d.log.Debug("file went before it was published; the change that took it publishes it", "path", rel, "err", err)
		return
	}
	if errors.Is(err, errRewritten) {
		d.log.Debug("file is written again before it was published; its writer publishes it", "path", rel)
		return
	}
	d.log.Info("file could not be hashed for its publish; hashed and published again shortly", "path", rel, "err", err)
	d.retryLater(rel, retryPublish, err)
}

// publishFile publishes the complete file at rel, whose lstat is st, for
// a caller that waits for it (the start's scan, an open that brought the
// file from the origin): aside, but at once.
func (d *DMD) publishFile(ctx context.Context, rel string, st *syscall.Stat_t) error {
	rec, err := d.fileRecord(rel, -1, st, nil, false)
	if err != nil {
		d.notHashed(rel, err)
		return err
	}
	return d.publish(ctx, rec, publishPrompt)
}

// publishHow says how a publish goes.
type publishHow struct {
	hfl.PublishOptions
	// verdict: the publish waits for the store's verdict. While the store
	// does not answer, it tries again for up to Config.CloseWait; a
	// refusal ends it at once. A failure wraps ErrPublish.
	verdict bool
	// spent, if not nil, adds up where a waiting close's time went.
	spent *closeSpent
	// fd, with haveFd, is the published file's open descriptor, which
	// its publish mark goes on through.
	fd     int
	haveFd bool
}

// closeSpent is where one waiting close's time went (see CloseStats).
type closeSpent struct {
	check, record, total time.Duration
	store                hfl.PublishSpent
}

var (
	// publishAside: the nodes that hold the path hear of it soon (the
	// record goes ahead of the commit, with a small file's bytes, for
	// consumers that wait).
	// Nothing waits for its commit, which may wait a moment for others.
	publishAside = publishHow{PublishOptions: hfl.PublishOptions{Ahead: true, Deferrable: true}}
	// publishPrompt is publishAside for a caller that waits for the
	// commit (no other node is told before it returns).
	publishPrompt = publishHow{PublishOptions: hfl.PublishOptions{Ahead: true}}
	// publishTold returns once every node that holds the path heard of
	// it: a change of names or attributes (a rename, a link, a chmod) is
	// seen everywhere once the call returns.
	publishTold = publishHow{PublishOptions: hfl.PublishOptions{Tell: hfl.TellSure}}
	// publishVerdict is a writer's close that reports the store's
	// verdict; the nodes that hold the path are told before it returns
	// (close-to-open), unless the path's home does not answer.
	publishVerdict = publishHow{PublishOptions: hfl.PublishOptions{Ahead: true, Tell: hfl.TellOnce}, verdict: true}
)

// closePublish is how a writer's close publishes: with the store's
// verdict or aside.
func closePublish(verdict bool) publishHow {
	if verdict {
		return publishVerdict
	}
	return publishAside
}

// publish records rec in the store, as how says: the one way a file's
// record, from its last release, a retry or a change of names, reaches
// the store and the nodes. A failed publish (the store is unreachable, or
// refused it) is queued and retried until it lands or the file changes.
func (d *DMD) publish(ctx context.Context, rec hfl.Record, how publishHow) error {
	start := time.Now()
	d.mu.Lock()
	d.publishing[rec.Path] = rec
	d.mu.Unlock()
	if how.spent != nil {
		how.Spent = &how.spent.store
	}
	out, err := d.commit(ctx, rec, how)
	metrics.PublishDuration.WithLabelValues(metrics.Outcome(err)).Observe(time.Since(start).Seconds())
	d.mu.Lock()
	if d.publishing[rec.Path] == rec {
		delete(d.publishing, rec.Path)
	}
	d.mu.Unlock()
	if err != nil {
		d.stats.publishErrors.Add(1)
		d.log.Error("publish failed; will retry", "path", rec.Path, "err", err)
		d.retryLater(rec.Path, retryPublish, err)
		d.publishDone(rec.Path)
		if how.verdict {
			return fmt.Errorf("%w: %s: %w", ErrPublish, rec.Path, err)
		}
		return err
	}
	d.stats.publishes.Add(1)
	markFd := -1
	if how.haveFd {
		markFd = how.fd
	}
	d.markPublished(rec.Path, out.Generation, markFd)
	d.log.Debug("published", "path", rec.Path, "gen", out.Generation, "size", rec.Size, "writing", rec.Writing, "took", time.Since(start))
	d.publishDone(rec.Path)
	return nil
}

// commit is publish's call to the locator. With a verdict, a store that
// does not answer is asked again until Config.CloseWait has passed.
func (d *DMD) commit(ctx context.Context, rec hfl.Record, how publishHow) (hfl.Record, error) {
	if !how.verdict {
		return d.loc.Publish(ctx, rec, how.PublishOptions)
	}
	deadline := time.Now().Add(d.cfg.CloseWait)
	pause := 50 * time.Millisecond
	for {
		cctx, cancel := context.WithDeadline(ctx, deadline)
		out, err := d.loc.Publish(cctx, rec, how.PublishOptions)
		cancel()
		if err == nil || !errors.Is(err, hfl.ErrUnavailable) || ctx.Err() != nil || time.Until(deadline) <= 0 {
			return out, err
		}
		t := time.NewTimer(min(pause, time.Until(deadline)))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
		pause = min(2*pause, time.Second)
	}
}
