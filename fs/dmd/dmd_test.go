package dmd

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dyadfs/dyadfs/hfl/store/embedded"
	"golang.org/x/sys/unix"

	"github.com/dyadfs/dyadfs/hfl"
)

type fixture struct {
	t     *testing.T
	d     *DMD
	store *embedded.Store
	dir   string
}

func newFixture(t *testing.T, mod func(*Config)) *fixture {
	t.Helper()
	return newFixtureOver(t, mod, func(s hfl.Store) hfl.Store { return s })
}

// newFixtureOver is newFixture whose managed directory uses over(the
// fixture's store): a wrapper that fails on demand.
func newFixtureOver(t *testing.T, mod func(*Config), over func(hfl.Store) hfl.Store) *fixture {
	t.Helper()
	dir := t.TempDir()
	cfg := DefaultConfig()
	cfg.Backing = dir
	cfg.Node = "n1"
	if mod != nil {
		mod(&cfg)
	}
	store := embedded.New()
	t.Cleanup(func() { store.Close() })
	return &fixture{t: t, d: newDMD(t, cfg, over(store)), store: store, dir: cfg.Backing}
}

// newDMD starts a managed directory with cfg over store, closed at the end
// of the test.
func newDMD(t *testing.T, cfg Config, store hfl.Store) *DMD {
	t.Helper()
	d, err := New(cfg, Parts{Store: store, Locator: hfl.DefaultLocatorConfig()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func (fx *fixture) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	fx.t.Cleanup(cancel)
	return ctx
}

// create does what the FUSE layer does for open(O_CREAT|O_WRONLY): it
// returns the writer and the open backing file.
func (fx *fixture) create(rel string) (*Writer, *os.File) {
	fx.t.Helper()
	fx.d.BeginCreate(rel)
	defer fx.d.EndCreate(rel)
	p := filepath.Join(fx.dir, rel)
	os.MkdirAll(filepath.Dir(p), 0o755)
	f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		fx.t.Fatal(err)
	}
	var st syscall.Stat_t
	syscall.Fstat(int(f.Fd()), &st)
	w := fx.d.BeginWrite(IDOf(&st), 1, rel, true)
	w.Opened(int(f.Fd()))
	return w, f
}

func (fx *fixture) openWrite(rel string, flags int) (*Writer, *os.File) {
	fx.t.Helper()
	p := filepath.Join(fx.dir, rel)
	var st syscall.Stat_t
	if err := syscall.Stat(p, &st); err != nil {
		fx.t.Fatal(err)
	}
	w := fx.d.BeginWrite(IDOf(&st), 1, rel, false)
	f, err := os.OpenFile(p, flags, 0)
	if err != nil {
		w.Abort()
		fx.t.Fatal(err)
	}
	w.Opened(int(f.Fd()))
	return w, f
}

func (fx *fixture) end(w *Writer, f *os.File, rel string) {
	fx.t.Helper()
	if err := w.End(fx.ctx(), int(f.Fd()), rel); err != nil {
		fx.t.Fatalf("End: %v", err)
	}
	f.Close()
}

// write creates rel with data, as a writer does through the mount.
func (fx *fixture) write(rel, data string) {
	fx.t.Helper()
	w, f := fx.create(rel)
	f.WriteString(data)
	fx.end(w, f, rel)
}

// written is write that returns the published record.
func (fx *fixture) written(rel, data string) hfl.Record {
	fx.t.Helper()
	fx.write(rel, data)
	rec, err := fx.record(rel)
	if err != nil {
		fx.t.Fatal(err)
	}
	return rec
}

func (fx *fixture) record(rel string) (hfl.Record, error) {
	return fx.store.Lookup(context.Background(), fx.d.loc.Slot(rel))
}

func TestPublishOnLastRelease(t *testing.T) {
	fx := newFixture(t, nil)
	w1, f1 := fx.create("a/b.dat")
	w2, f2 := fx.openWrite("a/b.dat", os.O_WRONLY)
	f1.WriteString("hello ")
	fx.end(w1, f1, "a/b.dat")
	if _, err := fx.record("a/b.dat"); !errors.Is(err, hfl.ErrNotFound) {
		t.Fatalf("published while a writer is left: %v", err)
	}
	if _, ok := fx.d.LocalRecord(context.Background(), "a/b.dat"); ok {
		t.Fatal("file complete while a writer is left")
	}
	f2.WriteAt([]byte("world"), 6)
	fx.end(w2, f2, "a/b.dat")
	rec, err := fx.record("a/b.dat")
	if err != nil {
		t.Fatalf("not published after the last writer: %v", err)
	}
	if rec.Size != 11 || rec.Owner != "n1" || rec.Path != "a/b.dat" || rec.Mode&0o777 != 0o644 || rec.Generation == 0 {
		t.Fatalf("record %+v", rec)
	}
	if n := fx.marksLeft(); n != 0 {
		t.Fatalf("%d being-written marks left on a published file", n)
	}
}

func TestUnchangedWriterDoesNotRepublish(t *testing.T) {
	fx := newFixture(t, nil)
	fx.write("x", "data")
	first, _ := fx.record("x")
	w, f := fx.openWrite("x", os.O_RDWR)
	buf := make([]byte, 4)
	f.ReadAt(buf, 0)
	fx.end(w, f, "x")
	again, _ := fx.record("x")
	if again.Generation != first.Generation {
		t.Fatalf("read through a write handle republished: generation %d -> %d", first.Generation, again.Generation)
	}
	w, f = fx.openWrite("x", os.O_RDWR)
	f.WriteAt([]byte("DATA"), 0)
	fx.end(w, f, "x")
	changed, _ := fx.record("x")
	if changed.Generation <= first.Generation {
		t.Fatalf("same-size rewrite not republished")
	}
}

func TestUnlinkedWhileOpenNotPublished(t *testing.T) {
	fx := newFixture(t, nil)
	w, f := fx.create("gone")
	os.Remove(filepath.Join(fx.dir, "gone"))
	fx.end(w, f, "gone")
	if _, err := fx.record("gone"); !errors.Is(err, hfl.ErrNotFound) {
		t.Fatalf("unlinked file published: %v", err)
	}
	if n := fx.d.Stats().BusyFiles; n != 0 {
		t.Fatalf("%d files still busy", n)
	}
}

func TestWaitCompleteBlocksUntilRelease(t *testing.T) {
	fx := newFixture(t, nil)
	w, f := fx.create("f")
	var st syscall.Stat_t
	f.WriteString("partial")
	syscall.Fstat(int(f.Fd()), &st)
	done := make(chan error, 1)
	go func() { done <- fx.d.WaitComplete(fx.ctx(), IDOf(&st), "f", 0) }()
	for fx.d.Stats().OpensWaited == 0 {
		select {
		case err := <-done:
			t.Fatalf("WaitComplete returned %v while the file was being written", err)
		default:
			runtime.Gosched()
		}
	}
	f.WriteString(" and the rest")
	fx.end(w, f, "f")
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// Nothing busy: returns at once.
	if err := fx.d.WaitComplete(fx.ctx(), IDOf(&st), "f", 0); err != nil {
		t.Fatal(err)
	}
}

func TestWaitCompleteSameProcessDoesNotWait(t *testing.T) {
	fx := newFixture(t, nil)
	fx.d.BeginCreate("f")
	p := filepath.Join(fx.dir, "f")
	f, _ := os.Create(p)
	var st syscall.Stat_t
	syscall.Fstat(int(f.Fd()), &st)
	self := uint32(syscall.Gettid())
	w := fx.d.BeginWrite(IDOf(&st), self, "f", true)
	fx.d.EndCreate("f")
	w.Opened(int(f.Fd()))
	// Another thread of this process asks: it must not wait for itself.
	if err := fx.d.WaitComplete(fx.ctx(), IDOf(&st), "f", uint32(os.Getpid())); err != nil {
		t.Fatal(err)
	}
	fx.end(w, f, "f")
}

func TestWaitPathUntilPublished(t *testing.T) {
	fx := newFixture(t, nil)
	type res struct {
		p       string
		content string
		err     error
	}
	got := make(chan res, 1)
	go func() {
		p, err := fx.d.WaitPath(fx.ctx(), "run2/a/b.dat", 0)
		var c []byte
		if err == nil {
			c, err = os.ReadFile(p)
		}
		got <- res{p, string(c), err}
	}()
	w, f := fx.create("run2/a/b.dat")
	for i := 0; i < 100; i++ {
		f.WriteString("0123456789")
	}
	fx.end(w, f, "run2/a/b.dat")
	r := <-got
	if r.err != nil {
		t.Fatal(r.err)
	}
	if len(r.content) != 1000 {
		t.Fatalf("waiter read %d bytes, want the complete 1000", len(r.content))
	}
}

func TestWaitPathTimeoutInterruptShutdown(t *testing.T) {
	fx := newFixture(t, func(c *Config) { c.WaitTimeout = 20 * time.Millisecond })
	if _, err := fx.d.WaitPath(fx.ctx(), "never", 0); !errors.Is(err, ErrWaitTimeout) {
		t.Fatalf("timeout: got %v", err)
	}
	fx2 := newFixture(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { _, err := fx2.d.WaitPath(ctx, "never", 0); errc <- err }()
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("interrupt: got %v", err)
	}
	go func() { _, err := fx2.d.WaitPath(context.Background(), "never", 0); errc <- err }()
	fx2.d.Shutdown()
	if err := <-errc; !errors.Is(err, ErrShutdown) {
		t.Fatalf("shutdown: got %v", err)
	}
	st := fx.d.Stats()
	if st.WaitTimeouts != 1 || st.OpensWaited != 1 || st.Waiting != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestWaitPathOtherNodeWithoutTransport(t *testing.T) {
	fx := newFixture(t, nil)
	fx.d.loc.Publish(fx.ctx(), hfl.Record{Path: "remote", Owner: "n2", Size: 3}, hfl.PublishOptions{})
	if _, err := fx.d.WaitPath(fx.ctx(), "remote", 0); !errors.Is(err, ErrNoTransport) {
		t.Fatalf("got %v, want ErrNoTransport", err)
	}
}

func TestScanRepublishesAndHoldsIncomplete(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "d"), 0o755)
	os.WriteFile(filepath.Join(dir, "d/done"), []byte("complete"), 0o644)
	os.WriteFile(filepath.Join(dir, "half"), []byte("hal"), 0o644)
	// The marks a daemon that died left: "half", and a file gone since.
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(dir, "half"), &st); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(dir, InternalDir), 0o700)
	marks := openWritingMarks(filepath.Join(dir, InternalDir), "n1")
	marks.take(st.Ino + 1000)
	marks.take(st.Ino)
	marks.close()
	fx := newFixture(t, func(c *Config) { c.Backing = dir })
	if n := fx.marksLeft(); n != 2 {
		t.Fatalf("%d marks found at start, want 2", n)
	}
	res, err := fx.d.Scan(fx.ctx())
	if err != nil {
		t.Fatal(err)
	}
	if res.Published != 1 || res.Incomplete != 1 {
		t.Fatalf("scan %+v, want 1 published and 1 incomplete", res)
	}
	if _, err := fx.record("d/done"); err != nil {
		t.Fatalf("complete file not republished: %v", err)
	}
	if _, ok := fx.d.LocalRecord(context.Background(), "half"); ok {
		t.Fatal("half-written file looks complete")
	}
	// Writing it again publishes it.
	w, f := fx.openWrite("half", os.O_WRONLY|os.O_APPEND)
	f.WriteString("f")
	fx.end(w, f, "half")
	if rec, err := fx.record("half"); err != nil || rec.Size != 4 {
		t.Fatalf("rewritten file: %+v %v", rec, err)
	}
	if n := fx.marksLeft(); n != 0 {
		t.Fatalf("%d being-written marks left", n)
	}
}

// marksLeft counts the being-written marks in the fixture's file of them.
func (fx *fixture) marksLeft() int {
	b, err := os.ReadFile(filepath.Join(fx.dir, InternalDir, "writing-n1"))
	if err != nil {
		fx.t.Fatal(err)
	}
	n := 0
	for i := 8; i+8 <= len(b); i += 8 {
		if string(b[i:i+8]) != "\x00\x00\x00\x00\x00\x00\x00\x00" {
			n++
		}
	}
	return n
}

// TestScanHoldsEarlierReleasesMarker: after an unclean stop, a file an
// earlier release marked with an attribute is held as incomplete, and the
// attribute goes once it is written again.
func TestScanHoldsEarlierReleasesMarker(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, InternalDir), 0o700) // not fresh, no clean stop
	os.WriteFile(filepath.Join(dir, "half"), []byte("hal"), 0o644)
	if err := unix.Setxattr(filepath.Join(dir, "half"), markerXattr, []byte{1}, 0); err != nil {
		t.Skipf("backing filesystem has no user xattrs: %v", err)
	}
	fx := newFixture(t, func(c *Config) { c.Backing = dir })
	res, err := fx.d.Scan(fx.ctx())
	if err != nil || res.Incomplete != 1 {
		t.Fatalf("scan %+v %v, want 1 incomplete", res, err)
	}
	w, f := fx.openWrite("half", os.O_WRONLY|os.O_APPEND)
	f.WriteString("f")
	fx.end(w, f, "half")
	if rec, err := fx.record("half"); err != nil || rec.Size != 4 {
		t.Fatalf("rewritten file: %+v %v", rec, err)
	}
	if fx.d.hasMarker("half") {
		t.Fatal("earlier release's marker left on a published file")
	}
}

// TestMarkLeavesCtime: marking a file as being written, and clearing the
// mark at its release, does not change the file's ctime.
func TestMarkLeavesCtime(t *testing.T) {
	fx := newFixture(t, nil)
	w, f := fx.create("x")
	f.WriteString("data")
	var before, after syscall.Stat_t
	syscall.Fstat(int(f.Fd()), &before)
	if n := fx.marksLeft(); n != 1 {
		t.Fatalf("%d marks while written, want 1", n)
	}
	time.Sleep(10 * time.Millisecond)
	fx.end(w, f, "x")
	syscall.Stat(filepath.Join(fx.dir, "x"), &after)
	if before.Ctim != after.Ctim {
		t.Fatalf("ctime moved at the release: %v to %v", before.Ctim, after.Ctim)
	}
	if n := fx.marksLeft(); n != 0 {
		t.Fatalf("%d marks after the release", n)
	}
}

func mustOpen(t *testing.T, p string) *os.File {
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func TestRenameMovesRecords(t *testing.T) {
	fx := newFixture(t, nil)
	for _, rel := range []string{"dir/a", "dir/sub/b", "tmpfile"} {
		fx.write(rel, rel)
	}
	os.Rename(filepath.Join(fx.dir, "tmpfile"), filepath.Join(fx.dir, "final"))
	fx.d.Renamed(fx.ctx(), "tmpfile", "final")
	os.Rename(filepath.Join(fx.dir, "dir"), filepath.Join(fx.dir, "moved"))
	fx.d.Renamed(fx.ctx(), "dir", "moved")
	for _, gone := range []string{"tmpfile", "dir/a", "dir/sub/b"} {
		if _, err := fx.record(gone); !errors.Is(err, hfl.ErrNotFound) {
			t.Errorf("old name %s still published: %v", gone, err)
		}
	}
	for _, here := range []string{"final", "moved/a", "moved/sub/b"} {
		if _, err := fx.record(here); err != nil {
			t.Errorf("new name %s not published: %v", here, err)
		}
	}
}

func TestRemovedUnpublishes(t *testing.T) {
	fx := newFixture(t, nil)
	w, f := fx.create("r")
	var st syscall.Stat_t
	syscall.Fstat(int(f.Fd()), &st)
	fx.end(w, f, "r")
	os.Remove(filepath.Join(fx.dir, "r"))
	fx.d.Removed(fx.ctx(), "r", IDOf(&st), true)
	if _, err := fx.record("r"); !errors.Is(err, hfl.ErrNotFound) {
		t.Fatalf("unlinked file still published: %v", err)
	}
}

func TestFsyncOnPublish(t *testing.T) {
	fx := newFixture(t, func(c *Config) { c.FsyncOnPublish = true })
	fx.written("durable", "x")
}

// TestNotPublishedHalfRewritten: a publish whose hash finds the file
// changed because a writer opened it again (O_TRUNC) does not publish the
// half-written file; that writer's release publishes what it wrote.
func TestNotPublishedHalfRewritten(t *testing.T) {
	fx := newFixture(t, nil)
	first := fx.written("v", strings.Repeat("a", 1<<20))
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(fx.dir, "v"), &st); err != nil {
		t.Fatal(err)
	}
	w, f := fx.openWrite("v", os.O_WRONLY|os.O_TRUNC) // truncated: 0 bytes now
	if rec, err := fx.d.fileRecord("v", -1, &st, nil, true); !errors.Is(err, errRewritten) {
		t.Fatalf("hashing the file while it is written again: %+v, %v; want errRewritten", rec, err)
	}
	f.WriteString(strings.Repeat("b", 1<<20))
	fx.end(w, f, "v")
	rec, err := fx.record("v")
	if err != nil || rec.Size != 1<<20 || rec.Generation <= first.Generation || rec.Sum == first.Sum {
		t.Fatalf("after the rewrite: %+v, %v; want the new 1 MiB version", rec, err)
	}
}

// TestNotRepublishedWhileRewritten: a close that published the file, then
// an open of the same file for writing, truncating it, before the first
// handle's release (the kernel sends RELEASE after close returns): that
// release publishes nothing, not the truncated file; the new writer's
// close publishes what it wrote.
func TestNotRepublishedWhileRewritten(t *testing.T) {
	fx := newFixture(t, func(c *Config) { c.CloseWait = 5 * time.Second })
	notHeld := func(uint32) bool { return false }
	w, f := fx.create("v")
	f.WriteString(strings.Repeat("a", 1<<20))
	if err := w.Close(fx.ctx(), int(f.Fd()), "v", 1, notHeld); err != nil {
		t.Fatalf("Close: %v", err)
	}
	first, err := fx.record("v")
	if err != nil || first.Size != 1<<20 {
		t.Fatalf("published at close: %+v, %v", first, err)
	}
	w2, f2 := fx.openWrite("v", os.O_WRONLY|os.O_TRUNC) // 0 bytes now
	fx.end(w, f, "v")                                   // the first handle's release
	if rec, err := fx.record("v"); err != nil || rec.Generation != first.Generation {
		t.Fatalf("the release of the first handle published %+v (%v) while the file was written again; want %+v still", rec, err, first)
	}
	f2.WriteString(strings.Repeat("b", 1<<20))
	if err := w2.Close(fx.ctx(), int(f2.Fd()), "v", 1, notHeld); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	fx.end(w2, f2, "v")
	rec, err := fx.record("v")
	if err != nil || rec.Size != 1<<20 || rec.Generation <= first.Generation || rec.Sum == first.Sum {
		t.Fatalf("after the rewrite: %+v, %v; want the new 1 MiB version", rec, err)
	}
}

// TestAloneKeepsOneCopyOfRecords: a node alone over the in-process store
// keeps no second copy of its records in a cache (each file would cost
// its record twice), and still knows what it published without asking.
func TestAloneKeepsOneCopyOfRecords(t *testing.T) {
	fx := newFixture(t, nil)
	rec := fx.written("a/one.dat", "x")
	if n := fx.d.loc.Stats().Cached; n != 0 {
		t.Fatalf("%d records cached besides the store's own", n)
	}
	if got, exists, ok := fx.d.loc.Told("a/one.dat"); !ok || !exists || got.Generation != rec.Generation {
		t.Fatalf("told %+v, exists %v, ok %v; want generation %d", got, exists, ok, rec.Generation)
	}
}
