package dmd

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/dyadfs/dyadfs/internal/poll"

	"github.com/dyadfs/dyadfs/hfl/store/embedded"

	"github.com/dyadfs/dyadfs/dtl"
	"github.com/dyadfs/dyadfs/hfl"
)

// fetched writes data into a temporary file as a transfer would.
func (fx *fixture) fetched(t *testing.T, data string) *os.File {
	t.Helper()
	f, err := os.CreateTemp(fx.d.TempDir(), "fetch-*")
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(data)
	t.Cleanup(func() { f.Close() })
	return f
}

func TestInstallRefusesSymlinkedParent(t *testing.T) {
	fx := newFixture(t, nil)
	outside := t.TempDir()
	os.Symlink(outside, filepath.Join(fx.dir, "out"))
	err := fx.d.Install(fx.fetched(t, "evil"), dtl.Version{Path: "out/ld.so.preload", Owner: "n2", Info: dtl.FileInfo{Generation: 5}})
	if err == nil {
		t.Fatal("installed a file through a symbolic link")
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 0 {
		t.Fatalf("files appeared outside the backing directory: %v", entries)
	}
	for _, p := range []string{".dyadfs/x", "../escape"} {
		if err := fx.d.Install(fx.fetched(t, "x"), dtl.Version{Path: p, Owner: "n2"}); err == nil {
			t.Errorf("installed %q", p)
		}
	}
}

func TestInstallMakesDirectoriesAndNeverReplaces(t *testing.T) {
	fx := newFixture(t, nil)
	tmp := fx.fetched(t, "copy")
	tmp.Chown(65534, 65534)
	if err := fx.d.Install(tmp, dtl.Version{Path: "a/b/c.dat", Owner: "n2", Info: dtl.FileInfo{Generation: 7}}); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(filepath.Join(fx.dir, "a/b"))
	if err != nil || !st.IsDir() {
		t.Fatalf("a/b: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(fx.dir, "a/b/c.dat")); string(b) != "copy" {
		t.Fatalf("installed %q", b)
	}
	if fx.d.markers && !isReplica(filepath.Join(fx.dir, "a/b/c.dat")) {
		t.Fatal("the copy is not marked as one")
	}
	err = fx.d.Install(fx.fetched(t, "again"), dtl.Version{Path: "a/b/c.dat", Owner: "n2", Info: dtl.FileInfo{Generation: 8}})
	if !errors.Is(err, fs.ErrExist) {
		t.Fatalf("second install: %v, want fs.ErrExist", err)
	}
	if b, _ := os.ReadFile(filepath.Join(fx.dir, "a/b/c.dat")); string(b) != "copy" {
		t.Fatalf("the first copy was replaced by %q", b)
	}
}

func TestCopiesAreNotRepublished(t *testing.T) {
	fx := newFixture(t, nil)
	if !fx.d.markers {
		t.Skip("no user xattrs on this filesystem")
	}
	if err := fx.d.Install(fx.fetched(t, "copy"), dtl.Version{Path: "c.dat", Owner: "n2", Info: dtl.FileInfo{Generation: 3}}); err != nil {
		t.Fatal(err)
	}
	os.Chmod(filepath.Join(fx.dir, "c.dat"), 0o600)
	fx.d.Changed(fx.ctx(), "c.dat")
	if rec, err := fx.record("c.dat"); err == nil {
		t.Fatalf("a chmod of a copy published it as this node's: %+v", rec)
	}
	// Written here, it becomes this node's own.
	w, f := fx.openWrite("c.dat", os.O_WRONLY|os.O_APPEND)
	f.WriteString("+")
	fx.end(w, f, "c.dat")
	if rec, err := fx.record("c.dat"); err != nil || rec.Owner != "n1" {
		t.Fatalf("after a local write: %+v, %v", rec, err)
	}
	if isReplica(filepath.Join(fx.dir, "c.dat")) {
		t.Fatal("a file written here still carries the copy's mark")
	}
}

func TestServeNewerGenerationThanCached(t *testing.T) {
	fx := newFixture(t, nil)
	fx.write("s.dat", "v1")
	first, _ := fx.record("s.dat")
	// Another publish of the same file reaches the store without passing
	// through this node's cache (as a consumer can see it first).
	st, _ := os.Stat(filepath.Join(fx.dir, "s.dat"))
	newer, err := fx.store.Publish(fx.ctx(), fx.d.loc.Slot("s.dat"), hfl.Record{Path: "s.dat", Owner: "n1", Size: st.Size(), Mode: 0o100644, MtimeNs: st.ModTime().UnixNano()})
	if err != nil || newer.Generation <= first.Generation {
		t.Fatal(err)
	}
	sf, info, err := fx.d.OpenPublished(fx.ctx(), dtl.Request{Path: "s.dat", Generation: newer.Generation})
	if err != nil {
		t.Fatalf("serving a generation newer than the cache: %v", err)
	}
	defer sf.Close()
	if info.Generation != newer.Generation {
		t.Fatalf("served generation %d, want %d", info.Generation, newer.Generation)
	}
	if err := fx.d.Unchanged(sf, info); err != nil {
		t.Fatalf("Unchanged of an unchanged file: %v", err)
	}
	w, f := fx.openWrite("s.dat", os.O_WRONLY)
	if err := fx.d.Unchanged(sf, info); !errors.Is(err, dtl.ErrBusy) {
		t.Fatalf("Unchanged while a writer holds it: %v, want dtl.ErrBusy", err)
	}
	fx.end(w, f, "s.dat")
}

func TestSharedStoragePublishesRenames(t *testing.T) {
	fx := newFixture(t, func(c *Config) { c.SharedStorage = true })
	fx.write("tmp", "whole")
	os.Rename(filepath.Join(fx.dir, "tmp"), filepath.Join(fx.dir, "final"))
	fx.d.Renamed(fx.ctx(), "tmp", "final")
	if _, err := fx.record("final"); err != nil {
		t.Fatalf("shared storage: renamed file not published: %v", err)
	}
	if _, ok := fx.d.LocalRecord(fx.ctx(), "final"); !ok {
		t.Fatal("shared storage: a published, matching file is not readable")
	}
	// A file another node writes, unpublished: not readable here.
	os.WriteFile(filepath.Join(fx.dir, "theirs"), []byte("partial"), 0o644)
	if _, ok := fx.d.LocalRecord(fx.ctx(), "theirs"); ok {
		t.Fatal("shared storage: an unpublished file counts as complete")
	}
}

// flakyStore fails publishes and removes while down is set.
type flakyStore struct {
	hfl.Store
	down atomic.Bool
}

func (f *flakyStore) Publish(ctx context.Context, key hfl.Slot, rec hfl.Record) (hfl.Record, error) {
	if f.down.Load() {
		return hfl.Record{}, errors.New("store down")
	}
	return f.Store.Publish(ctx, key, rec)
}

func (f *flakyStore) Remove(ctx context.Context, key hfl.Slot, owner hfl.RemoveCond) (uint64, error) {
	if f.down.Load() {
		return 0, errors.New("store down")
	}
	return f.Store.Remove(ctx, key, owner)
}

func TestFailedPublishesAreRetried(t *testing.T) {
	store := &flakyStore{}
	fx := newFixtureOver(t, nil, func(inner hfl.Store) hfl.Store { store.Store = inner; return store })
	d, dir := fx.d, fx.dir

	w, f := fx.create("kept")
	fx.end(w, f, "kept") // published while the store works
	store.down.Store(true)
	fx.write("late", "x")
	os.Remove(filepath.Join(dir, "kept"))
	d.Removed(fx.ctx(), "kept", FileID{}, true)
	if d.PendingPublishes() != 2 {
		t.Fatalf("%d pending, want 2", d.PendingPublishes())
	}
	store.down.Store(false)
	poll.Until(t, 20*time.Second, "pending publishes retried", func() bool { return d.PendingPublishes() == 0 })
	if _, err := fx.record("late"); err != nil {
		t.Fatalf("failed publish not retried: %v", err)
	}
	if _, err := fx.record("kept"); !errors.Is(err, hfl.ErrNotFound) {
		t.Fatalf("failed unpublish not retried: %v", err)
	}
}

func TestUncleanStopDropsCopies(t *testing.T) {
	dir := t.TempDir()
	fx := newFixture(t, func(c *Config) { c.Backing = dir })
	if !fx.d.markers {
		t.Skip("no user xattrs on this filesystem")
	}
	fx.d.Install(fx.fetched(t, "copy"), dtl.Version{Path: "copy.dat", Owner: "n2", Info: dtl.FileInfo{Generation: 2}})
	// The daemon dies: no Close, no clean marker.
	fx.d.Shutdown()
	store := embedded.New()
	t.Cleanup(func() { store.Close() })
	cfg := DefaultConfig()
	cfg.Backing, cfg.Node = dir, "n1"
	d2 := newDMD(t, cfg, store)
	res, err := d2.Scan(context.Background())
	if err != nil || res.Dropped != 1 {
		t.Fatalf("scan after an unclean stop: %+v, %v; want one copy dropped", res, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "copy.dat")); !os.IsNotExist(err) {
		t.Fatalf("the copy is still there: %v", err)
	}
}

// refusingStore fails publishes with err while it is set.
type refusingStore struct {
	hfl.Store
	err atomic.Pointer[error]
}

func (s *refusingStore) Publish(ctx context.Context, key hfl.Slot, rec hfl.Record) (hfl.Record, error) {
	if e := s.err.Load(); e != nil {
		return hfl.Record{}, *e
	}
	return s.Store.Publish(ctx, key, rec)
}

func (s *refusingStore) refuse(err error) {
	if err == nil {
		s.err.Store(nil)
		return
	}
	s.err.Store(&err)
}

// TestCloseReportsTheStoresVerdict: with CloseWait, the writer's last
// close publishes the file and returns what the store said: nothing, a
// refusal at once, or, from a store that does not answer, a failure after
// CloseWait; a failed file is listed as pending and published later. A
// close by another process, or while the process holds another descriptor,
// publishes nothing (the release does); a file changed after its close
// is published again at release.
func TestCloseReportsTheStoresVerdict(t *testing.T) {
	const closeWait = 300 * time.Millisecond
	store := &refusingStore{}
	fx := newFixtureOver(t, func(c *Config) { c.CloseWait = closeWait },
		func(inner hfl.Store) hfl.Store { store.Store = inner; return store })
	d := fx.d
	notHeld := func(uint32) bool { return false }
	const tid = 1 // BeginWrite's writer in fx.create

	w, f := fx.create("ok")
	f.WriteString("x")
	if err := w.Close(fx.ctx(), int(f.Fd()), "ok", tid, notHeld); err != nil {
		t.Fatalf("Close: %v", err)
	}
	rec, err := fx.record("ok")
	if err != nil {
		t.Fatalf("not published at close: %v", err)
	}
	fx.end(w, f, "ok")
	if again, _ := fx.record("ok"); again.Generation != rec.Generation {
		t.Fatal("an unchanged file was published again at release")
	}

	store.refuse(fmt.Errorf("etcd: %w", hfl.ErrNoSpace))
	w, f = fx.create("full")
	f.WriteString("x")
	start := time.Now()
	err = w.Close(fx.ctx(), int(f.Fd()), "full", tid, notHeld)
	if !errors.Is(err, ErrPublish) || !errors.Is(err, hfl.ErrNoSpace) || time.Since(start) > 200*time.Millisecond {
		t.Fatalf("Close into a full store: %v after %v; want ErrPublish for ErrNoSpace at once", err, time.Since(start))
	}
	if p := d.PendingList(); len(p) != 1 || p[0].Path != "full" || !strings.Contains(p[0].Reason, "full") {
		t.Fatalf("pending: %+v", p)
	}
	fx.end(w, f, "full")

	store.refuse(fmt.Errorf("etcd: %w", hfl.ErrUnavailable))
	w, f = fx.create("down")
	f.WriteString("x")
	start = time.Now()
	err = w.Close(fx.ctx(), int(f.Fd()), "down", tid, notHeld)
	if took := time.Since(start); !errors.Is(err, ErrPublish) || took < closeWait || took > 5*closeWait {
		t.Fatalf("Close while the store does not answer: %v after %v; want ErrPublish after %v", err, took, closeWait)
	}
	fx.end(w, f, "down")
	store.refuse(nil)
	poll.Until(t, 20*time.Second, "pending publishes land", func() bool { return d.PendingPublishes() == 0 })
	for _, rel := range []string{"full", "down"} {
		if _, err := fx.record(rel); err != nil {
			t.Fatalf("%s not published once the store took writes: %v", rel, err)
		}
	}

	// Closes that are not the writer's last publish nothing: a copy in
	// another process while the opener holds the file, and the opener's
	// while it holds another descriptor.
	w, f = fx.create("later")
	f.WriteString("x")
	openerHolds := func(pid uint32) bool { return pid == tid }
	if err := w.Close(fx.ctx(), int(f.Fd()), "later", uint32(os.Getpid()), openerHolds); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(fx.ctx(), int(f.Fd()), "later", tid, func(uint32) bool { return true }); err != nil {
		t.Fatal(err)
	}
	if _, err := fx.record("later"); !errors.Is(err, hfl.ErrNotFound) {
		t.Fatalf("published at a close that was not the last: %v", err)
	}
	// The last close publishes; more writes after it, at release.
	if err := w.Close(fx.ctx(), int(f.Fd()), "later", tid, notHeld); err != nil {
		t.Fatal(err)
	}
	first, err := fx.record("later")
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("more")
	fx.end(w, f, "later")
	if rec, err := fx.record("later"); err != nil || rec.Generation <= first.Generation || rec.Size != 5 {
		t.Fatalf("written after its close: %+v, %v; want a newer publish of 5 bytes", rec, err)
	}

	// A process that inherited the descriptor closes it last (a
	// command started with a redirection its shell opened and closed):
	// that close publishes.
	w, f = fx.create("inherited")
	f.WriteString("x")
	if err := w.Close(fx.ctx(), int(f.Fd()), "inherited", uint32(os.Getpid()), notHeld); err != nil {
		t.Fatal(err)
	}
	if _, err := fx.record("inherited"); err != nil {
		t.Fatalf("not published at the inheritor's last close: %v", err)
	}
	fx.end(w, f, "inherited")
}

// TestUnchangedSeesRewriteInPlace: a file rewritten in place while it is
// sent, keeping its size and its mtime (two writes within one tick of the
// clock), is reported changed: the consumer waits for the new version
// instead of taking a mix of two for damage.
func TestUnchangedSeesRewriteInPlace(t *testing.T) {
	fx := newFixture(t, nil)
	rec := fx.written("r.dat", "aaaa")
	sf, info, err := fx.d.OpenPublished(fx.ctx(), dtl.Request{Path: "r.dat", Generation: rec.Generation})
	if err != nil {
		t.Fatal(err)
	}
	defer sf.Close()
	p := filepath.Join(fx.dir, "r.dat")
	st, _ := os.Stat(p)
	w, f := fx.openWrite("r.dat", os.O_WRONLY|os.O_TRUNC)
	f.WriteString("bbbb")
	os.Chtimes(p, st.ModTime(), st.ModTime())
	if err := fx.d.Unchanged(sf, info); !errors.Is(err, dtl.ErrBusy) {
		t.Fatalf("while it is written: %v, want dtl.ErrBusy", err)
	}
	fx.end(w, f, "r.dat")
	if err := fx.d.Unchanged(sf, info); !errors.Is(err, dtl.ErrBusy) {
		t.Fatalf("rewritten with its size and mtime kept: %v, want dtl.ErrBusy", err)
	}
	// Served again, it is the new version, unchanged.
	sf2, info2, err := fx.d.OpenPublished(fx.ctx(), dtl.Request{Path: "r.dat"})
	if err != nil {
		t.Fatal(err)
	}
	defer sf2.Close()
	if err := fx.d.Unchanged(sf2, info2); err != nil || info2.Checksum == info.Checksum {
		t.Fatalf("the new version: %v, checksum %v (was %v)", err, info2.Checksum, info.Checksum)
	}
}

// unlinkingStore, once armed, runs unlink before the next publish of a
// path reaches the store: a writer's unlink that lands while its release
// publishes.
type unlinkingStore struct {
	hfl.Store
	path   string
	unlink atomic.Pointer[func()]
}

func (s *unlinkingStore) Publish(ctx context.Context, key hfl.Slot, rec hfl.Record) (hfl.Record, error) {
	if f := s.unlink.Load(); f != nil && rec.Path == s.path && s.unlink.CompareAndSwap(f, nil) {
		(*f)()
	}
	return s.Store.Publish(ctx, key, rec)
}

// TestReleaseAfterLinkAndUnlink: git writes each object under a temporary
// name, closes it, links it to its real name and unlinks the temporary
// one, while the kernel sends the release of the closed file. The release
// publishes nothing for a link (only for new bytes), and a release that
// does publish takes it back if the name was unlinked meanwhile: no name
// removed here stays in the namespace.
func TestReleaseAfterLinkAndUnlink(t *testing.T) {
	store := &unlinkingStore{path: "tmp_obj"}
	fx := newFixtureOver(t, func(c *Config) { c.CloseWait = 5 * time.Second },
		func(inner hfl.Store) hfl.Store { store.Store = inner; return store })
	d := fx.d
	notHeld := func(uint32) bool { return false }
	const tid = 1
	tmp, final := filepath.Join(fx.dir, "tmp_obj"), filepath.Join(fx.dir, "obj")

	w, f := fx.create("tmp_obj")
	f.WriteString("blob")
	if err := w.Close(fx.ctx(), int(f.Fd()), "tmp_obj", tid, notHeld); err != nil {
		t.Fatalf("Close: %v", err)
	}
	first, err := fx.record("tmp_obj")
	if err != nil {
		t.Fatalf("not published at close: %v", err)
	}
	time.Sleep(10 * time.Millisecond) // a later ctime
	if err := os.Link(tmp, final); err != nil {
		t.Fatal(err)
	}
	d.Changed(fx.ctx(), "obj")
	fx.end(w, f, "tmp_obj")
	if rec, err := fx.record("tmp_obj"); err != nil || rec.Generation != first.Generation {
		t.Fatalf("after a link, the release published the first name again: %+v, %v", rec, err)
	}
	os.Remove(tmp)
	d.Removed(fx.ctx(), "tmp_obj", IDOf(statOf(t, final)), false)
	if _, err := fx.record("tmp_obj"); !errors.Is(err, hfl.ErrNotFound) {
		t.Fatalf("unlinked, still published: %v", err)
	}

	// New bytes after the close: the release publishes them, while the
	// writer unlinks the name.
	w, f = fx.create("tmp_obj")
	f.WriteString("blob")
	if err := w.Close(fx.ctx(), int(f.Fd()), "tmp_obj", tid, notHeld); err != nil {
		t.Fatalf("Close: %v", err)
	}
	f.WriteString(" and more")
	unlink := func() {
		var st syscall.Stat_t
		syscall.Stat(tmp, &st)
		os.Remove(tmp)
		d.Removed(fx.ctx(), "tmp_obj", IDOf(&st), true)
	}
	store.unlink.Store(&unlink)
	fx.end(w, f, "tmp_obj")
	if store.unlink.Load() != nil {
		t.Fatal("the release did not publish the new bytes")
	}
	if rec, err := fx.record("tmp_obj"); !errors.Is(err, hfl.ErrNotFound) {
		t.Fatalf("a name unlinked while its release published it stays published: %+v, %v", rec, err)
	}
}

func statOf(t *testing.T, p string) *syscall.Stat_t {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	return &st
}

// TestWaitEndsIfMissing: the open of a name its caller saw, by a caller
// that does not wait for missing files, fails with ENOENT once the
// namespace has nothing there, at once or when the file it waits for (being
// rewritten elsewhere) is removed; a caller that waits goes on waiting, and
// both wait for a file being written here.
func TestWaitEndsIfMissing(t *testing.T) {
	fx := newFixture(t, nil)
	noWait := dmdEndsIfMissing(fx.ctx(), true)
	if _, err := fx.d.WaitPath(noWait, "gone", 0); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a path published nowhere, for a caller that does not wait: %v; want fs.ErrNotExist", err)
	}
	short, cancel := context.WithTimeout(dmdEndsIfMissing(fx.ctx(), false), 300*time.Millisecond)
	defer cancel()
	if _, err := fx.d.WaitPath(short, "gone", 0); errors.Is(err, fs.ErrNotExist) || err == nil {
		t.Fatalf("a caller that waits: %v; want it to wait until its context ends", err)
	}

	// A file being made here is waited for by everyone.
	w, f := fx.create("new")
	f.WriteString("made here")
	made := waitingNoWait(t, fx, "new", "a file being written here, for a caller that does not wait")
	fx.end(w, f, "new")
	if err := <-made; err != nil {
		t.Fatalf("a file written here, once its writer closed it: %v", err)
	}

	slot := fx.d.loc.Slot("busy")
	if _, err := fx.store.Publish(fx.ctx(), slot, hfl.Record{Path: "busy", Owner: "n2", Size: 1, Mode: 0o100644, Writing: true}); err != nil {
		t.Fatal(err)
	}
	done := waitingNoWait(t, fx, "busy", "a file being rewritten elsewhere")
	if _, err := fx.store.Remove(fx.ctx(), slot, hfl.RemoveCond{}); err != nil {
		t.Fatal(err)
	}
	fx.d.loc.Forget("busy") // what the removal's notice does
	select {
	case err := <-done:
		if !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("removed while waited for: %v; want fs.ErrNotExist", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("removed while waited for: still waiting")
	}
}

// waitingNoWait starts the wait of a caller that does not wait for rel,
// checks that it still waits a moment later (what names rel in a failure),
// and returns where its result comes.
func waitingNoWait(t *testing.T, fx *fixture, rel, what string) <-chan error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		_, err := fx.d.WaitPath(dmdEndsIfMissing(fx.ctx(), true), rel, 0)
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("%s: %v; want it waited for", what, err)
	case <-time.After(300 * time.Millisecond):
	}
	return done
}

func dmdEndsIfMissing(ctx context.Context, noWait bool) context.Context {
	return EndsIfMissing(ctx, func() bool { return noWait })
}

// TestReplacedFileKeptWhileWriterOpens: this node's file, replaced
// elsewhere, is not removed by a look at it while a writer here opens its
// name: that open may have truncated this very file and not be registered
// yet, and its bytes would be lost and its claim never published.
func TestReplacedFileKeptWhileWriterOpens(t *testing.T) {
	fx := newFixture(t, nil)
	fx.write("v", "mine")
	if _, err := fx.store.Publish(fx.ctx(), fx.d.loc.Slot("v"), hfl.Record{Path: "v", Owner: "n2", Size: 6, Mode: 0o100644}); err != nil {
		t.Fatal(err)
	}
	fx.d.loc.Forget("v") // what the notice of n2's publish does
	fx.d.BeginCreate("v")
	fx.d.CurrentHere(fx.ctx(), "v") // a lookup on another thread
	_, err := os.Stat(filepath.Join(fx.dir, "v"))
	fx.d.EndCreate("v")
	if err != nil {
		t.Fatalf("removed while a writer opened its name: %v", err)
	}
	if fx.d.CurrentHere(fx.ctx(), "v") {
		t.Fatal("a file replaced elsewhere is shown as current")
	}
}

// TestClaimIsPublishedOrTakenBack: a rewrite claimed at close (every node
// told that a new version comes) is always ended by the writer's last
// handle: its publish, even of the bytes as they were, or, if the file
// went meanwhile, the claim taken back. A claim left in the store keeps
// every reader of the name waiting.
func TestClaimIsPublishedOrTakenBack(t *testing.T) {
	fx := newFixture(t, nil)
	first := fx.written("same", "as it was")
	w, f := fx.openWrite("same", os.O_WRONLY)
	if err := w.Claim(fx.ctx(), "same", first, 1); err != nil {
		t.Fatal(err)
	}
	fx.end(w, f, "same")
	if rec, err := fx.record("same"); err != nil || rec.Writing || rec.Generation <= first.Generation {
		t.Fatalf("claimed, closed unchanged: %+v, %v; want a new version published", rec, err)
	}

	prev := fx.written("went", "v1")
	w, f = fx.openWrite("went", os.O_WRONLY|os.O_TRUNC)
	f.WriteString("v2")
	if err := w.Claim(fx.ctx(), "went", prev, 1); err != nil {
		t.Fatal(err)
	}
	if rec, _ := fx.record("went"); !rec.Writing {
		t.Fatalf("not claimed: %+v", rec)
	}
	os.Remove(filepath.Join(fx.dir, "went")) // gone from under its writer
	fx.end(w, f, "went")
	if rec, err := fx.record("went"); !errors.Is(err, hfl.ErrNotFound) {
		t.Fatalf("a claim whose file went: %+v, %v; want it taken back", rec, err)
	}
}

// TestReleaseSkipsAnotherWritersTruncation: a writer's close published the
// file; before the kernel's release of that handle reaches the daemon, the
// program opens the file again with O_TRUNC. The first handle's release
// publishes nothing: the emptied bytes are the new writer's, published at
// its own end. Both kinds of new writer: one registered before it
// truncates, and a create (or an open that replaces a copy) that truncates
// while it is creating, before it registers.
func TestReleaseSkipsAnotherWritersTruncation(t *testing.T) {
	fx := newFixture(t, func(c *Config) { c.CloseWait = 5 * time.Second })
	notHeld := func(uint32) bool { return false }
	closed := func(data string) (*Writer, *os.File, hfl.Record) {
		t.Helper()
		w, f := fx.create("v")
		f.WriteString(data)
		if err := w.Close(fx.ctx(), int(f.Fd()), "v", 1, notHeld); err != nil {
			t.Fatalf("Close: %v", err)
		}
		rec, err := fx.record("v")
		if err != nil {
			t.Fatalf("not published at close: %v", err)
		}
		return w, f, rec
	}
	kept := func(first hfl.Record) {
		t.Helper()
		if rec, err := fx.record("v"); err != nil || rec.Generation != first.Generation || rec.Size != first.Size {
			t.Fatalf("the first handle's release published %+v (%v) while another writer had emptied the file; want %+v kept", rec, err, first)
		}
	}

	w1, f1, first := closed("version one")
	w2, f2 := fx.openWrite("v", os.O_WRONLY|os.O_TRUNC)
	fx.end(w1, f1, "v") // the first handle's release, late
	kept(first)
	f2.WriteString("version two")
	fx.end(w2, f2, "v")
	if rec, err := fx.record("v"); err != nil || rec.Size != int64(len("version two")) || rec.Generation <= first.Generation {
		t.Fatalf("the second writer's version: %+v, %v", rec, err)
	}

	os.Remove(filepath.Join(fx.dir, "v"))
	fx.d.Removed(fx.ctx(), "v", FileID{}, false)
	w1, f1, first = closed("version three")
	fx.d.BeginCreate("v")
	if err := os.Truncate(filepath.Join(fx.dir, "v"), 0); err != nil { // truncated before it registers
		t.Fatal(err)
	}
	fx.end(w1, f1, "v")
	fx.d.EndCreate("v")
	kept(first)
}
