package dtl_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dyadfs/dyadfs/dtl"
	"github.com/dyadfs/dyadfs/dtl/dtltest"
	"github.com/dyadfs/dyadfs/dtl/tcp"
)

// owners is a fixed membership for tests.
type owners struct {
	mu      sync.Mutex
	members map[string]dtl.Peer
}

func (o *owners) Peer(ctx context.Context, node string) (dtl.Peer, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	m, ok := o.members[node]
	if !ok {
		return dtl.Peer{}, fmt.Errorf("node %s: %w", node, dtl.ErrOwnerGone)
	}
	return m, nil
}

func (o *owners) remove(node string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.members, node)
}

type fixture struct {
	src     *dtltest.Source
	fetcher *dtl.Fetcher
	owners  *owners
	dst     string // consumer's backing directory
}

func newFixture(t *testing.T, timeout time.Duration) *fixture {
	t.Helper()
	return newFixtureIn(t, timeout, t.TempDir())
}

// newFixtureIn is newFixture with the consumer's backing directory dst.
func newFixtureIn(t *testing.T, timeout time.Duration, dst string) *fixture {
	t.Helper()
	secret := make([]byte, 32)
	rand.Read(secret)
	server := dtltest.Loopback(t, "owner", secret, tcp.New)
	client := dtltest.Loopback(t, "consumer", secret, tcp.New)
	src := dtltest.Serving(t, server)
	fx := &fixture{src: src, owners: &owners{members: map[string]dtl.Peer{"owner": {Addr: server.Addr()}}}, dst: dst}
	tmp := filepath.Join(fx.dst, ".tmp")
	os.Mkdir(tmp, 0o700)
	f, err := dtl.NewFetcher(dtl.FetcherConfig{Transport: client, Owners: fx.owners, Dest: dirDest(fx.dst), TempDir: tmp, Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	fx.fetcher = f
	t.Cleanup(func() { f.Close() })
	return fx
}

// dirDest installs fetched files under a directory.
type dirDest string

func (d dirDest) Present(ctx context.Context, p string) bool {
	_, err := os.Stat(filepath.Join(string(d), p))
	return err == nil
}

func (d dirDest) Install(tmp *os.File, rec dtl.Version) error {
	dst := filepath.Join(string(d), rec.Path)
	os.MkdirAll(filepath.Dir(dst), 0o755)
	return unix.Renameat2(unix.AT_FDCWD, tmp.Name(), unix.AT_FDCWD, dst, unix.RENAME_NOREPLACE)
}

func (fx *fixture) rec(path string) dtl.Version {
	return dtl.Version{Path: path, Owner: "owner", Info: dtl.FileInfo{Generation: 1}}
}

func (fx *fixture) nothingLeft(t *testing.T, path string) {
	t.Helper()
	if _, err := os.Lstat(filepath.Join(fx.dst, path)); !os.IsNotExist(err) {
		t.Fatalf("%s exists after a failed fetch", path)
	}
	// The fetcher keeps a few empty files ready; none may hold data.
	tmp, _ := os.ReadDir(filepath.Join(fx.dst, ".tmp"))
	for _, e := range tmp {
		if info, err := e.Info(); err == nil && info.Size() != 0 {
			t.Fatalf("a partial file was left: %s (%d bytes)", e.Name(), info.Size())
		}
	}
}

func TestFetchOneTransferForManyWaiters(t *testing.T) {
	fx := newFixture(t, 10*time.Second)
	data := bytes.Repeat([]byte("dyadfs"), 1<<18)
	if err := fx.src.WriteFile("d/f", data); err != nil {
		t.Fatal(err)
	}
	os.Chmod(filepath.Join(fx.src.Root(), "d/f"), 0o640)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- fx.fetcher.Fetch(context.Background(), fx.rec("d/f"))
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(filepath.Join(fx.dst, "d/f"))
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("fetched %d bytes, %v; want the %d written", len(got), err, len(data))
	}
	st, _ := os.Stat(filepath.Join(fx.dst, "d/f"))
	if st.Mode().Perm() != 0o640 {
		t.Fatalf("fetched file mode %v, want 0640", st.Mode().Perm())
	}
	// One transfer: fetches that came after it found the file there.
	if n := fx.fetcher.Stats().Transfers.Load(); n != 1 {
		t.Fatalf("%d transfers for 16 concurrent fetches of one file", n)
	}
}

func TestFetchStaleVersion(t *testing.T) {
	fx := newFixture(t, 10*time.Second)
	for path, st := range map[string]dtltest.State{"gone": dtltest.Published, "unpub": dtltest.NotPublished, "busy": dtltest.Busy} {
		if path != "gone" {
			fx.src.WriteFile(path, []byte("x"))
			fx.src.Set(path, st)
		}
		err := fx.fetcher.Fetch(context.Background(), fx.rec(path))
		if !errors.Is(err, dtl.ErrStale) {
			t.Errorf("%s: %v, want ErrStale", path, err)
		}
		fx.nothingLeft(t, path)
	}
}

func TestFetchDeadOwnerFailsAtOnce(t *testing.T) {
	fx := newFixture(t, time.Minute)
	fx.src.WriteFile("f", []byte("x"))
	fx.owners.remove("owner")
	start := time.Now()
	err := fx.fetcher.Fetch(context.Background(), fx.rec("f"))
	if !errors.Is(err, dtl.ErrOwnerGone) || time.Since(start) > 10*time.Second {
		t.Fatalf("fetch from a node that is not running: %v after %v, want ErrOwnerGone at once", err, time.Since(start))
	}
	fx.nothingLeft(t, "f")
}

func TestFetchUnreachableOwnerTimesOut(t *testing.T) {
	fx := newFixture(t, 500*time.Millisecond)
	fx.owners.members["owner"] = dtl.Peer{Addr: "127.0.0.1:1"}
	err := fx.fetcher.Fetch(context.Background(), fx.rec("f"))
	if err == nil || errors.Is(err, dtl.ErrStale) || fx.fetcher.Stats().Retries.Load() == 0 {
		t.Fatalf("fetch from an unreachable owner: %v after %d retries; want a failure after retries", err, fx.fetcher.Stats().Retries.Load())
	}
	fx.nothingLeft(t, "f")
}

// TestFetchWaiterInterrupted: a waiter that gives up returns at once; the
// transfer goes on for the others.
func TestFetchWaiterInterrupted(t *testing.T) {
	fx := newFixture(t, 10*time.Second)
	writers := fx.src.Stream("slow", 1<<20) // served from a pipe the test holds
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- fx.fetcher.Fetch(ctx, fx.rec("slow")) }()
	other := make(chan error, 1)
	go func() { other <- fx.fetcher.Fetch(context.Background(), fx.rec("slow")) }()
	w := <-writers
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("interrupted waiter: %v", err)
	}
	w.Write(bytes.Repeat([]byte("s"), 1<<20))
	w.Close()
	if err := <-other; err != nil {
		t.Fatalf("the other waiter: %v", err)
	}
	if _, err := os.Stat(filepath.Join(fx.dst, "slow")); err != nil {
		t.Fatalf("the file did not arrive: %v", err)
	}
}

// TestFetchNeverReplaces: a file that appeared at the destination while a
// transfer ran (a local producer) is not replaced.
func TestFetchNeverReplaces(t *testing.T) {
	fx := newFixture(t, 10*time.Second)
	fx.src.WriteFile("f", []byte("remote"))
	writers := fx.src.Stream("f", 6)
	done := make(chan error, 1)
	go func() { done <- fx.fetcher.Fetch(context.Background(), fx.rec("f")) }()
	w := <-writers
	os.WriteFile(filepath.Join(fx.dst, "f"), []byte("local"), 0o644)
	w.Write([]byte("remote"))
	w.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(fx.dst, "f")); string(b) != "local" {
		t.Fatalf("the local file was replaced by %q", b)
	}
	fx.nothingLeft(t, "x")
}

// TestFetchFromNoticeBytes: a record that carries its file's bytes is
// installed from them, with its attributes, without a transfer; bytes that
// do not match the record's size are not trusted, and a transfer brings
// the file.
func TestFetchFromNoticeBytes(t *testing.T) {
	fx := newFixture(t, 10*time.Second)
	mtime := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	for _, data := range [][]byte{{}, []byte("x"), bytes.Repeat([]byte("n"), 16<<10)} {
		path := fmt.Sprintf("inline/%d", len(data))
		rec := dtl.Version{Path: path, Owner: "owner", Info: dtl.FileInfo{Size: int64(len(data)), Mode: 0o100604, MtimeNs: mtime.UnixNano(),
			Uid: uint32(os.Getuid()), Gid: uint32(os.Getgid())}, Inline: data}
		if err := fx.fetcher.Fetch(context.Background(), rec); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		got, err := os.ReadFile(filepath.Join(fx.dst, path))
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("%s: read %d bytes, %v; want the %d sent", path, len(got), err, len(data))
		}
		st, _ := os.Stat(filepath.Join(fx.dst, path))
		if st.Mode().Perm() != 0o604 || !st.ModTime().Equal(mtime) {
			t.Fatalf("%s: mode %v, mtime %v; want 0604 and %v", path, st.Mode().Perm(), st.ModTime(), mtime)
		}
	}
	if st := fx.fetcher.Stats(); st.FromNotices.Load() != 3 || st.Transfers.Load() != 0 {
		t.Fatalf("%d copies from notices, %d transfers; want 3 and none", st.FromNotices.Load(), st.Transfers.Load())
	}

	// Bytes that do not match the size: the owner's file is fetched.
	fx.src.WriteFile("short", []byte("owner's"))
	rec := fx.rec("short")
	rec.Info.Size, rec.Inline = 7, []byte("bad")
	if err := fx.fetcher.Fetch(context.Background(), rec); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(fx.dst, "short")); string(got) != "owner's" {
		t.Fatalf("read %q, want the owner's file", got)
	}
	if n := fx.fetcher.Stats().Transfers.Load(); n != 1 {
		t.Fatalf("%d transfers, want 1", n)
	}
}

// smallTmpfs mounts a tmpfs of size bytes for the test (as root).
func smallTmpfs(t *testing.T, size string) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size="+size); err != nil {
		t.Skipf("skipping: cannot mount a tmpfs (%v): run as root", err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}

// TestFetchReservesSpace: a file that cannot fit fails with ENOSPC before
// the owner is asked for it, for good, and leaves the space as it was; a
// sparse file whose data fits arrives however large it is; a file that
// fits arrives after one that did not.
func TestFetchReservesSpace(t *testing.T) {
	fx := newFixtureIn(t, time.Minute, smallTmpfs(t, "4m"))
	big := bytes.Repeat([]byte("b"), 6<<20)
	fx.src.WriteFile("big", big)
	rec := fx.rec("big")
	rec.Info.Size = int64(len(big))
	err := fx.fetcher.Fetch(context.Background(), rec)
	if !errors.Is(err, dtl.ErrPermanent) || !errors.Is(err, unix.ENOSPC) {
		t.Fatalf("fetch of a file larger than the free space: %v, want ENOSPC for good", err)
	}
	if n := fx.src.Calls(); n != 0 {
		t.Fatalf("the owner was asked %d times for a file that cannot fit", n)
	}
	if got := fx.fetcher.Stats().Permanent()["ENOSPC"]; got != 1 {
		t.Fatalf("permanent failures counted: %v", fx.fetcher.Stats().Permanent())
	}
	fx.nothingLeft(t, "big")

	// Sparse: 5 GiB with 64 KiB of data, into 4 MiB.
	f, _ := os.Create(filepath.Join(fx.src.Root(), "sparse"))
	f.WriteAt(bytes.Repeat([]byte("s"), 64<<10), 3<<30)
	f.Truncate(5 << 30)
	f.Close()
	rec = fx.rec("sparse")
	rec.Info.Size, rec.Alloc = 5<<30, 64<<10
	if err := fx.fetcher.Fetch(context.Background(), rec); err != nil {
		t.Fatalf("fetch of a sparse file whose data fits: %v", err)
	}
	// Its data does not fit twice.
	rec.Path, rec.Alloc = "sparse2", 8<<20
	if err := fx.fetcher.Fetch(context.Background(), rec); !errors.Is(err, unix.ENOSPC) {
		t.Fatalf("fetch of a sparse file whose data cannot fit: %v, want ENOSPC", err)
	}

	// One that fits still arrives.
	fx.src.WriteFile("fits", bytes.Repeat([]byte("f"), 2<<20))
	rec = fx.rec("fits")
	rec.Info.Size = 2 << 20
	if err := fx.fetcher.Fetch(context.Background(), rec); err != nil {
		t.Fatalf("fetch of a file that fits: %v", err)
	}
}
