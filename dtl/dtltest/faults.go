package dtltest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dyadfs/dyadfs/dtl"
	"github.com/dyadfs/dyadfs/internal/digest"
)

// The faults of a transfer, through the transport and the Fetcher every
// transport shares: a failure no retry can fix ends the fetch at once with
// the errno a reader sees; one that may pass is retried, backing off.

// unreadable: a file the owner cannot open is refused as unreadable, and
// so is one that fails to read in the middle of its transfer, or ends
// before its described size (busy: it changed); the connection stays good.
func unreadable(t *testing.T, newPair NewPair) {
	e := start(t, newPair)
	ctx := ctxFor(t)
	e.src.WriteFile("locked", []byte("secret"))
	e.src.WriteFile("ok", []byte("fine"))
	e.src.Set("locked", Unreadable)
	e.src.ReadFails("broken", 3<<20)
	for _, c := range []struct {
		path string
		want error
	}{{"locked", dtl.ErrUnreadable}, {"broken", dtl.ErrUnreadable}} {
		_, err := e.client.Fetch(ctx, e.addr, dtl.Request{Path: c.path}, dtl.NewSink(Dst(t)))
		var re *dtl.RemoteError
		if !errors.As(err, &re) || !errors.Is(err, c.want) {
			t.Errorf("fetch %s: %v, want a *dtl.RemoteError for %v", c.path, err, c.want)
		}
		e.fetch(t, ctx, "ok")
	}
	// A file that ends early: what was sent is not the file described.
	writers := e.src.Stream("short", 1<<20)
	done := fetchAsync(ctx, e.client, e.addr, "short", Dst(t))
	w := begin(t, writers, done)
	w.Close()
	if r := wait(t, done); !errors.Is(r.err, dtl.ErrBusy) {
		t.Errorf("fetch of a file that ended early: %v, want dtl.ErrBusy", r.err)
	}
	e.fetch(t, ctx, "ok")
}

// failingDest is a Destination whose Install fails with err.
type failingDest struct{ err error }

func (d failingDest) Install(tmp *os.File, v dtl.Version) error {
	return &os.LinkError{Op: "install", Old: tmp.Name(), New: v.Path, Err: d.err}
}

// dirDest installs files under a directory.
type dirDest string

func (d dirDest) Install(tmp *os.File, v dtl.Version) error {
	dst := filepath.Join(string(d), v.Path)
	os.MkdirAll(filepath.Dir(dst), 0o755)
	return unix.Renameat2(unix.AT_FDCWD, tmp.Name(), unix.AT_FDCWD, dst, unix.RENAME_NOREPLACE)
}

// fixedOwners knows one owner, at addr: the suite does not know its node
// id, so versions name none (whoever answers there).
type fixedOwners struct {
	mu   sync.Mutex
	addr string
}

func (o *fixedOwners) Peer(ctx context.Context, node string) (dtl.Peer, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.addr == "" {
		return dtl.Peer{}, fmt.Errorf("node %s: %w", node, dtl.ErrOwnerGone)
	}
	return dtl.Peer{Addr: o.addr}, nil
}

// newFetcher is a Fetcher over e's client that installs with dest.
func (e *env) newFetcher(t *testing.T, dest dtl.Destination, timeout time.Duration) *dtl.Fetcher {
	t.Helper()
	f, err := dtl.NewFetcher(dtl.FetcherConfig{Transport: e.client, Owners: &fixedOwners{addr: e.addr},
		Dest: dest, TempDir: t.TempDir(), Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func version(p string, size int) dtl.Version {
	return dtl.Version{Path: p, Info: dtl.FileInfo{Size: int64(size), Generation: 1}}
}

// fetcherPermanent: the shared Fetcher over this transport ends at once,
// after one request to the owner, when this node's storage refuses the
// file (each errno, as the reader sees it) or the owner cannot read it;
// each such failure is counted by its errno.
func fetcherPermanent(t *testing.T, newPair NewPair) {
	e := start(t, newPair)
	data := bytes.Repeat([]byte("d"), 2<<20)
	e.src.WriteFile("f", data)
	e.src.WriteFile("locked", data)
	e.src.Set("locked", Unreadable)
	for _, c := range []struct {
		name  string
		dest  dtl.Destination
		path  string
		errno syscall.Errno // what the reader sees
	}{
		{"full", failingDest{syscall.ENOSPC}, "f", syscall.ENOSPC},
		{"over quota", failingDest{syscall.EDQUOT}, "f", syscall.EDQUOT},
		{"read-only", failingDest{syscall.EROFS}, "f", syscall.EROFS},
		{"not writable", failingDest{syscall.EACCES}, "f", syscall.EACCES},
		{"not permitted", failingDest{syscall.EPERM}, "f", syscall.EACCES},
		{"owner cannot read", dirDest(t.TempDir()), "locked", syscall.EIO},
	} {
		t.Run(c.name, func(t *testing.T) {
			// A timeout a retry would reach: the failure must come first.
			f := e.newFetcher(t, c.dest, time.Minute)
			calls := e.src.Calls()
			start := time.Now()
			err := f.Fetch(ctxFor(t), version(c.path, len(data)))
			took := time.Since(start)
			if !errors.Is(err, dtl.ErrPermanent) || dtl.ReaderErrno(err) != c.errno {
				t.Fatalf("Fetch: %v (reader errno %v), want dtl.ErrPermanent and %v", err, dtl.ReaderErrno(err), c.errno)
			}
			if n := e.src.Calls() - calls; n != 1 || took > prompt {
				t.Fatalf("the owner was asked %d times in %v, want once and at once", n, took)
			}
			st := f.Stats()
			if got := st.Permanent()[unix.ErrnoName(c.errno)]; got != 1 || st.Retries.Load() != 0 {
				t.Fatalf("counted %v permanent failures and %d retries, want 1 %s and none", st.Permanent(), st.Retries.Load(), unix.ErrnoName(c.errno))
			}
		})
	}
}

// fetcherBacksOff: a transfer that fails for a reason that may pass (the
// owner went away) is retried with growing pauses until the timeout, each
// retry counted; it then fails, not as permanent.
func fetcherBacksOff(t *testing.T, newPair NewPair) {
	e := start(t, newPair)
	e.src.WriteFile("f", []byte("data"))
	e.server.Close()
	const timeout = 1500 * time.Millisecond
	f := e.newFetcher(t, dirDest(t.TempDir()), timeout)
	start := time.Now()
	err := f.Fetch(ctxFor(t), version("f", 4))
	took := time.Since(start)
	if err == nil || errors.Is(err, dtl.ErrPermanent) {
		t.Fatalf("Fetch from an owner that went away: %v, want a failure that is not permanent", err)
	}
	if took < timeout || took > timeout+prompt {
		t.Fatalf("Fetch gave up after %v, want just after the %v timeout", took, timeout)
	}
	// From 50 ms doubling: 8 retries at most in 1.5 s; without backing
	// off, dozens.
	if n := f.Stats().Retries.Load(); n < 3 || n > 8 {
		t.Fatalf("%d retries in %v, want a few, backing off", n, took)
	}
}

// corruptContent: a file whose bytes changed on the owner's disk after it
// was published (same size and mtime, as a flipped bit leaves it) arrives
// with the published checksum; the Fetcher finds the mismatch, installs
// nothing, leaves no temporary file, counts it, and fails for good with
// the reader's EIO. Sizes cover a notice-sized file, one block and many.
func corruptContent(t *testing.T, newPair NewPair) {
	e := start(t, newPair)
	for _, size := range []int{100, 1 << 20, 5<<20 + 3} {
		p := fmt.Sprintf("flipped-%d", size)
		data := randomBytes(t, size)
		if err := e.src.WriteFile(p, data); err != nil {
			t.Fatal(err)
		}
		if err := e.src.Publish(p); err != nil {
			t.Fatal(err)
		}
		FlipByte(t, filepath.Join(e.src.Root(), p), int64(size/2))
		dest, tmp := t.TempDir(), t.TempDir()
		f, err := dtl.NewFetcher(dtl.FetcherConfig{Transport: e.client, Owners: &fixedOwners{addr: e.addr},
			Dest: dirDest(dest), TempDir: tmp, Timeout: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		err = f.Fetch(ctxFor(t), version(p, size))
		if !errors.Is(err, dtl.ErrCorrupt) || !errors.Is(err, dtl.ErrPermanent) || dtl.ReaderErrno(err) != syscall.EIO {
			t.Errorf("%s: fetch of corrupt content: %v, want dtl.ErrCorrupt, permanent, EIO", p, err)
		}
		if st := f.Stats(); st.Corrupt.Load() != 1 || st.Verified.Load() != 0 {
			t.Errorf("%s: counted %d corrupt, %d verified; want 1, 0", p, st.Corrupt.Load(), st.Verified.Load())
		}
		f.Close()
		if ents, _ := os.ReadDir(dest); len(ents) != 0 {
			t.Errorf("%s: corrupt copy installed: %v", p, ents)
		}
		if ents, _ := os.ReadDir(tmp); len(ents) != 0 {
			t.Errorf("%s: temporary files left: %v", p, ents)
		}
	}
	// The same path published again as it now is arrives.
	e.src.WriteFile("good", []byte("good"))
	f := e.newFetcher(t, dirDest(t.TempDir()), time.Minute)
	if err := f.Fetch(ctxFor(t), version("good", 4)); err != nil || f.Stats().Verified.Load() != 1 {
		t.Errorf("fetch of an intact file: %v, verified %d", err, f.Stats().Verified.Load())
	}
}

// FlipByte inverts the bits of the byte at off in the file at name and
// gives the file back its mtime, as a failing disk would leave it.
func FlipByte(t testing.TB, name string, off int64) {
	t.Helper()
	st, err := os.Stat(name)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(name, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0xff
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(name, st.ModTime(), st.ModTime()); err != nil {
		t.Fatal(err)
	}
}

// corruptNotice: bytes a notice carried that do not match the record's
// checksum are not installed; the Fetcher counts them and brings the file
// by a transfer instead, which is verified too.
func corruptNotice(t *testing.T, newPair NewPair) {
	e := start(t, newPair)
	data := randomBytes(t, 300)
	e.src.WriteFile("small", data)
	dest := t.TempDir()
	f := e.newFetcher(t, dirDest(dest), time.Minute)
	v := version("small", len(data))
	v.Info.Checksum = digest.Bytes(data)
	v.Inline = append([]byte(nil), data...)
	v.Inline[7] ^= 1
	if err := f.Fetch(ctxFor(t), v); err != nil {
		t.Fatalf("fetch after a damaged notice: %v", err)
	}
	got, err := os.ReadFile(filepath.Join(dest, "small"))
	if err != nil || !bytes.Equal(got, data) {
		t.Errorf("installed %q (%v), want the owner's bytes", got, err)
	}
	st := f.Stats()
	if st.Corrupt.Load() != 1 || st.FromNotices.Load() != 0 || st.Transfers.Load() != 1 || st.Verified.Load() != 1 {
		t.Errorf("corrupt %d, from notices %d, transfers %d, verified %d; want 1, 0, 1, 1",
			st.Corrupt.Load(), st.FromNotices.Load(), st.Transfers.Load(), st.Verified.Load())
	}
}
