// Package dtltest is the conformance suite every dtl.Transport backend
// runs, and a directory-backed dtl.Source (Source) for tests.
//
// A backend's test calls Run with a factory of transport pairs. The suite
// uses nothing but the dtl interfaces: the server serves a Source, the
// client fetches from server.Addr().
package dtltest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
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

// NewPair returns two fresh transports, neither serving yet: the suite
// calls server.Serve and client.Fetch, and closes both (Close may be
// called more than once). Every call must configure its pair with a new
// random job secret, so that a client of one pair does not hold the secret
// of another pair's server. StallTimeout must be at least 10 s (the
// default), so that the suite can tell a prompt failure from a stall.
type NewPair func(t *testing.T) (server, client dtl.Transport)

const (
	// bound caps every call, so that a broken backend fails the suite
	// instead of hanging it.
	bound = 60 * time.Second
	// prompt is how soon a cancelled or cut transfer must end: well
	// under any stall timeout the suite allows.
	prompt = 5 * time.Second
)

// Run runs the whole suite against the pairs newPair returns.
func Run(t *testing.T, newPair func(t *testing.T) (server, client dtl.Transport)) {
	tests := []struct {
		name string
		fn   func(*testing.T, NewPair)
	}{
		{"Sizes", sizes},
		{"SparseOver4GiB", sparseOver4GiB},
		{"Refusals", refusals},
		{"RewrittenWhileSent", rewrittenWhileSent},
		{"WrongOwner", wrongOwner},
		{"BadPathsNeverReachSource", badPaths},
		{"Sequential", sequential},
		{"Concurrent", concurrent},
		{"CancelMidTransfer", cancelMidTransfer},
		{"CancelledBeforeStart", cancelledBeforeStart},
		{"ServerCloseMidTransfer", serverCloseMidTransfer},
		{"WrongSecret", wrongSecret},
		{"Unreachable", unreachable},
		{"FetchAfterClose", fetchAfterClose},
		{"Unreadable", unreadable},
		{"FetcherPermanent", fetcherPermanent},
		{"FetcherBacksOff", fetcherBacksOff},
		{"CorruptContent", corruptContent},
		{"CorruptNotice", corruptNotice},
		{"Ranges", ranges},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, newPair) })
	}
}

// env is one pair with the server serving a fresh Source.
type env struct {
	server, client dtl.Transport
	src            *Source
	addr           string
	dstDir         string // where fetched files go
}

func start(t *testing.T, newPair NewPair) *env {
	t.Helper()
	server, client := newPair(t)
	t.Cleanup(func() {
		client.Close()
		server.Close()
	})
	src := NewSource(t.TempDir())
	if err := server.Serve(src); err != nil {
		t.Fatalf("Serve: %v", err)
	}
	addr := server.Addr()
	if addr == "" {
		t.Fatal("Addr is empty after Serve")
	}
	return &env{server: server, client: client, src: src, addr: addr, dstDir: t.TempDir()}
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	t.Cleanup(cancel)
	return ctx
}

// Dst is an empty file to fetch into, closed when the test ends.
func Dst(t testing.TB) *os.File {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "dst-*")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func randomBytes(t *testing.T, n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

// fetch fetches p from e's server and checks that the received file and
// the reply match the source file.
func (e *env) fetch(t *testing.T, ctx context.Context, p string) {
	t.Helper()
	if err := e.fetchCheck(ctx, p); err != nil {
		t.Fatal(err)
	}
}

func (e *env) fetchCheck(ctx context.Context, p string) error {
	f, err := os.CreateTemp(e.dstDir, "dst-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	sink := dtl.NewSink(f)
	info, err := e.client.Fetch(ctx, e.addr, dtl.Request{Path: p}, sink)
	if err != nil {
		return fmt.Errorf("fetch %s: %w", p, err)
	}
	if err := e.compare(p, info, f); err != nil {
		return err
	}
	// What the Sink hashed on the way is the content's checksum.
	if got, err := sink.Sum(info.Size); err != nil || got != info.Checksum {
		return fmt.Errorf("%s: checksum of what arrived %v (%v), the owner's %v", p, got, err, info.Checksum)
	}
	return nil
}

// compare checks a received file against the source file.
func (e *env) compare(p string, info dtl.FileInfo, got *os.File) error {
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(e.src.Root(), p), &st); err != nil {
		return err
	}
	src, err := os.Open(filepath.Join(e.src.Root(), p))
	if err != nil {
		return err
	}
	defer src.Close()
	checksum, err := digest.File(src, st.Size)
	if err != nil {
		return err
	}
	want := dtl.FileInfo{Size: st.Size, Mode: st.Mode, Uid: st.Uid, Gid: st.Gid, MtimeNs: st.Mtim.Nano(), Generation: e.src.generation(p), Checksum: checksum}
	if info != want {
		return fmt.Errorf("%s: reply says %+v, source has %+v", p, info, want)
	}
	gs, err := got.Stat()
	if err != nil {
		return err
	}
	if gs.Size() != st.Size {
		return fmt.Errorf("%s: received %d bytes, source has %d", p, gs.Size(), st.Size)
	}
	a, err := FileSum(filepath.Join(e.src.Root(), p))
	if err != nil {
		return err
	}
	b, err := FileSum(got.Name())
	if err != nil {
		return err
	}
	if a != b {
		return fmt.Errorf("%s: received content differs (sha256 %x, source %x)", p, b, a)
	}
	return nil
}

// FileSum is the SHA-256 of the file at name.
func FileSum(name string) ([32]byte, error) {
	var s [32]byte
	f, err := os.Open(name)
	if err != nil {
		return s, err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return s, fmt.Errorf("read %s: %w", name, err)
	}
	h.Sum(s[:0])
	return s, nil
}

// SameContent reports, on t, an error if the files at a and b cannot be
// read or differ. It may be called from any goroutine.
func SameContent(t testing.TB, a, b string) {
	t.Helper()
	x, err := FileSum(a)
	if err == nil {
		var y [32]byte
		if y, err = FileSum(b); err == nil && x != y {
			err = fmt.Errorf("%s and %s differ", a, b)
		}
	}
	if err != nil {
		t.Error(err)
	}
}

func sizes(t *testing.T, newPair NewPair) {
	e := start(t, newPair)
	ctx := ctxFor(t)
	for _, n := range []int{0, 1, 4096, 8 << 20} {
		p := fmt.Sprintf("dir/sub/f%d", n)
		if err := e.src.WriteFile(p, randomBytes(t, n)); err != nil {
			t.Fatal(err)
		}
		e.src.SetGeneration(p, uint64(n)+7)
		e.fetch(t, ctx, p)
	}
	// Generations above 2^63 and odd modes travel intact.
	p := "odd"
	if err := e.src.WriteFile(p, []byte("x")); err != nil {
		t.Fatal(err)
	}
	os.Chmod(filepath.Join(e.src.Root(), p), 0o4751)
	e.src.SetGeneration(p, 1<<63+5)
	e.fetch(t, ctx, p)
}

// sparseOver4GiB sends a sparse file larger than 4 GiB with a few data
// blocks, one across the 4 GiB boundary, and checks that the received file
// is as sparse.
func sparseOver4GiB(t *testing.T, newPair NewPair) {
	e := start(t, newPair)
	ctx := ctxFor(t)
	const size = 5<<30 + 4097
	name := filepath.Join(e.src.Root(), "big.sparse")
	f, err := os.Create(name)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(size); err != nil {
		t.Skipf("cannot make a %d-byte sparse file here: %v", int64(size), err)
	}
	blocks := map[int64][]byte{
		0:               randomBytes(t, 4096),
		1 << 30:         randomBytes(t, 100),
		1<<32 - 2048:    randomBytes(t, 4096), // across 4 GiB
		size - 1000:     randomBytes(t, 1000), // the tail
		3<<30 + 1234567: randomBytes(t, 70000),
	}
	for off, b := range blocks {
		if _, err := f.WriteAt(b, off); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	var st syscall.Stat_t
	if err := syscall.Stat(name, &st); err != nil {
		t.Fatal(err)
	}
	if st.Blocks*512 > 16<<20 {
		t.Skipf("the filesystem under %s does not keep holes (%d blocks)", e.src.Root(), st.Blocks)
	}

	got := Dst(t)
	start := time.Now()
	info, err := e.client.Fetch(ctx, e.addr, dtl.Request{Path: "big.sparse"}, dtl.NewSink(got))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("fetched a %d-byte sparse file in %v", info.Size, time.Since(start))
	if info.Size != size {
		t.Fatalf("reply size %d, want %d", info.Size, int64(size))
	}
	var gst syscall.Stat_t
	if err := syscall.Fstat(int(got.Fd()), &gst); err != nil {
		t.Fatal(err)
	}
	if gst.Size != size {
		t.Fatalf("received %d bytes, want %d", gst.Size, int64(size))
	}
	if gst.Blocks*512 > 16<<20 {
		t.Errorf("received file is not sparse: %d bytes allocated", gst.Blocks*512)
	}
	for off, b := range blocks {
		have := make([]byte, len(b))
		if _, err := got.ReadAt(have, off); err != nil {
			t.Fatalf("read at %d: %v", off, err)
		}
		if !bytes.Equal(have, b) {
			t.Errorf("block at %d differs", off)
		}
	}
	src, err := os.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	if err := sameSparse(src, got, size); err != nil {
		t.Error(err)
	}
}

// sameSparse compares two files over the data extents of either; outside
// them both read as zeros.
func sameSparse(a, b *os.File, size int64) error {
	var ranges [][2]int64
	for _, f := range []*os.File{a, b} {
		ranges = append(ranges, Extents(f, size)...)
	}
	bufA, bufB := make([]byte, 1<<20), make([]byte, 1<<20)
	for _, r := range ranges {
		for off := r[0]; off < r[1]; {
			n := min(int64(len(bufA)), r[1]-off)
			na, _ := a.ReadAt(bufA[:n], off)
			nb, _ := b.ReadAt(bufB[:n], off)
			if na != int(n) || nb != int(n) || !bytes.Equal(bufA[:n], bufB[:n]) {
				return fmt.Errorf("files differ in [%d, %d)", off, off+n)
			}
			off += n
		}
	}
	return nil
}

// Extents lists f's data extents within its first size bytes (the whole
// file where the filesystem cannot tell).
func Extents(f *os.File, size int64) [][2]int64 {
	var out [][2]int64
	fd := int(f.Fd())
	for off := int64(0); off < size; {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if err != nil {
			if off == 0 && !errors.Is(err, unix.ENXIO) {
				return [][2]int64{{0, size}}
			}
			break
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil || hole <= data {
			hole = size
		}
		out = append(out, [2]int64{data, min(hole, size)})
		off = hole
	}
	return out
}

// refusals: each refusal of the Source reaches the client as a
// *dtl.RemoteError for the right error, and the connection stays good.
func refusals(t *testing.T, newPair NewPair) {
	e := start(t, newPair)
	ctx := ctxFor(t)
	for _, p := range []string{"np", "busy", "outside", "ok"} {
		if err := e.src.WriteFile(p, []byte("data of "+p)); err != nil {
			t.Fatal(err)
		}
	}
	e.src.Set("np", NotPublished)
	e.src.Set("busy", Busy)
	e.src.Set("outside", Outside)
	// A link leading out of the directory.
	os.Symlink("../../../../../../../../../../../../etc/passwd", filepath.Join(e.src.Root(), "escape"))
	os.Mkdir(filepath.Join(e.src.Root(), "adir"), 0o755)
	cases := []struct {
		path string
		want error
	}{
		{"missing", dtl.ErrNotFound},
		{"no/such/dir/file", dtl.ErrNotFound},
		{"adir", dtl.ErrNotFound},
		{"np", dtl.ErrNotPublished},
		{"busy", dtl.ErrBusy},
		{"outside", dtl.ErrOutside},
		{"escape", dtl.ErrOutside},
	}
	for round := 0; round < 2; round++ {
		for _, c := range cases {
			_, err := e.client.Fetch(ctx, e.addr, dtl.Request{Path: c.path, Generation: 3}, dtl.NewSink(Dst(t)))
			var re *dtl.RemoteError
			if !errors.As(err, &re) || !errors.Is(err, c.want) || re.Msg == "" {
				t.Errorf("fetch %s: got %v, want a *dtl.RemoteError for %q with a message", c.path, err, c.want)
			}
		}
		// Refusals leave the transport able to fetch.
		e.fetch(t, ctx, "ok")
	}
}

// rewrittenWhileSent: a file that changed while it was sent is refused at
// the end of the transfer (dtl.ErrBusy); the transport still works.
func rewrittenWhileSent(t *testing.T, newPair NewPair) {
	e := start(t, newPair)
	ctx := ctxFor(t)
	e.src.WriteFile("moving", bytes.Repeat([]byte("m"), 3<<20))
	e.src.WriteFile("ok", []byte("fine"))
	e.src.Set("moving", Rewritten)
	_, err := e.client.Fetch(ctx, e.addr, dtl.Request{Path: "moving"}, dtl.NewSink(Dst(t)))
	if !errors.Is(err, dtl.ErrBusy) {
		t.Fatalf("fetch of a file rewritten while sent: %v, want dtl.ErrBusy", err)
	}
	e.fetch(t, ctx, "ok")
}

// wrongOwner: a request for node X answered by a daemon of another node
// fails as unreachable, before any file is asked for.
func wrongOwner(t *testing.T, newPair NewPair) {
	e := start(t, newPair)
	ctx := ctxFor(t)
	e.src.WriteFile("f", []byte("x"))
	calls := e.src.Calls()
	_, err := e.client.Fetch(ctx, e.addr, dtl.Request{Path: "f", Owner: "someone-else"}, dtl.NewSink(Dst(t)))
	if !errors.Is(err, dtl.ErrUnavailable) || e.src.Calls() != calls {
		t.Fatalf("fetch from the wrong node: %v (source called %d times), want dtl.ErrUnavailable and no call", err, e.src.Calls()-calls)
	}
}

// badPaths: paths that are not clean and relative are refused with
// dtl.ErrOutside before the Source sees them.
func badPaths(t *testing.T, newPair NewPair) {
	e := start(t, newPair)
	ctx := ctxFor(t)
	if err := e.src.WriteFile("ok", []byte("ok")); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"../x", "..", "/etc/passwd", "a/../../x", "a/../ok", "./ok", "a//ok", "ok/", ".", "", "ok\x00", "a/\x00/b"} {
		_, err := e.client.Fetch(ctx, e.addr, dtl.Request{Path: p}, dtl.NewSink(Dst(t)))
		if !errors.Is(err, dtl.ErrOutside) {
			t.Errorf("fetch %q: got %v, want %v", p, err, dtl.ErrOutside)
		}
	}
	if n := e.src.Calls(); n != 0 {
		t.Errorf("the Source was called %d times for bad paths", n)
	}
	e.fetch(t, ctx, "ok")
}

// sequential: many fetches one after the other, of files that change.
func sequential(t *testing.T, newPair NewPair) {
	e := start(t, newPair)
	ctx := ctxFor(t)
	for i := range 200 {
		p := fmt.Sprintf("s/%d", i%7)
		if err := e.src.WriteFile(p, randomBytes(t, i*37)); err != nil {
			t.Fatal(err)
		}
		e.src.SetGeneration(p, uint64(i))
		e.fetch(t, ctx, p)
	}
}

// concurrent: 64 goroutines fetch several files each at once.
func concurrent(t *testing.T, newPair NewPair) {
	e := start(t, newPair)
	ctx := ctxFor(t)
	sizes := []int{0, 1, 4096, 100_000, 1<<20 + 7}
	for i, n := range sizes {
		if err := e.src.WriteFile(fmt.Sprintf("c/%d", i), randomBytes(t, n)); err != nil {
			t.Fatal(err)
		}
	}
	const workers = 64
	errs := make(chan error, workers*len(sizes))
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range sizes {
				errs <- e.fetchCheck(ctx, fmt.Sprintf("c/%d", (i+w)%len(sizes)))
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

// result is what a Fetch running in a goroutine returned.
type result struct {
	err  error
	took time.Duration
}

func fetchAsync(ctx context.Context, c dtl.Transport, addr, p string, f *os.File) <-chan result {
	done := make(chan result, 1)
	go func() {
		start := time.Now()
		_, err := c.Fetch(ctx, addr, dtl.Request{Path: p}, dtl.NewSink(f))
		done <- result{err, time.Since(start)}
	}()
	return done
}

// begin waits for the transfer of a streamed path to start and feeds it
// some data. The pipe is closed at the end of the test.
func begin(t *testing.T, writers <-chan *os.File, done <-chan result) *os.File {
	t.Helper()
	select {
	case w := <-writers:
		t.Cleanup(func() { w.Close() })
		// 64 KiB fit in a pipe: this does not wait for the transport.
		if _, err := w.Write(make([]byte, 64<<10)); err != nil {
			t.Fatal(err)
		}
		return w
	case r := <-done:
		t.Fatalf("Fetch returned before the source was opened: %v", r.err)
	case <-time.After(bound):
		t.Fatal("the server never opened the file")
	}
	return nil
}

func wait(t *testing.T, done <-chan result) result {
	t.Helper()
	select {
	case r := <-done:
		return r
	case <-time.After(bound):
		t.Fatal("Fetch did not return")
	}
	return result{}
}

// cancelMidTransfer: cancelling the context ends a transfer at once with
// the context's error, while the server has more to send.
func cancelMidTransfer(t *testing.T, newPair NewPair) {
	e := start(t, newPair)
	writers := e.src.Stream("slow", 1<<30)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := fetchAsync(ctx, e.client, e.addr, "slow", Dst(t))
	begin(t, writers, done)
	cancel()
	cancelled := time.Now()
	r := wait(t, done)
	if !errors.Is(r.err, context.Canceled) {
		t.Errorf("Fetch after cancel: got %v, want %v", r.err, context.Canceled)
	}
	if took := time.Since(cancelled); took > prompt {
		t.Errorf("Fetch returned %v after cancel", took)
	}
	// The transport is still good.
	if err := e.src.WriteFile("after", []byte("after")); err != nil {
		t.Fatal(err)
	}
	e.fetch(t, ctxFor(t), "after")
}

func cancelledBeforeStart(t *testing.T, newPair NewPair) {
	e := start(t, newPair)
	if err := e.src.WriteFile("f", []byte("f")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := e.client.Fetch(ctx, e.addr, dtl.Request{Path: "f"}, dtl.NewSink(Dst(t)))
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Fetch with a cancelled context: got %v, want %v", err, context.Canceled)
	}
	dl, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel2()
	_, err = e.client.Fetch(dl, e.addr, dtl.Request{Path: "f"}, dtl.NewSink(Dst(t)))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Fetch with an expired context: got %v, want %v", err, context.DeadlineExceeded)
	}
}

// serverCloseMidTransfer: closing the server ends its transfers; the client
// sees a failure that is not a refusal, at once.
func serverCloseMidTransfer(t *testing.T, newPair NewPair) {
	e := start(t, newPair)
	writers := e.src.Stream("slow", 1<<30)
	done := fetchAsync(ctxFor(t), e.client, e.addr, "slow", Dst(t))
	w := begin(t, writers, done)
	closed := make(chan error, 1)
	closing := time.Now()
	go func() { closed <- e.server.Close() }()
	r := wait(t, done)
	var re *dtl.RemoteError
	switch {
	case r.err == nil:
		t.Error("Fetch succeeded although the server closed mid-transfer")
	case errors.As(r.err, &re):
		t.Errorf("Fetch: got a refusal %v, want a transfer failure", r.err)
	}
	if took := time.Since(closing); took > prompt {
		t.Errorf("Fetch returned %v after the server closed", took)
	}
	// However the server ends its read of the source, it does end.
	w.Close()
	select {
	case <-closed:
	case <-time.After(bound):
		t.Fatal("server Close did not return")
	}
}

// wrongSecret: a client of another job is refused and the server's Source
// is never asked for anything.
func wrongSecret(t *testing.T, newPair NewPair) {
	e := start(t, newPair)
	if err := e.src.WriteFile("f", []byte("f")); err != nil {
		t.Fatal(err)
	}
	other, stranger := newPair(t)
	t.Cleanup(func() {
		stranger.Close()
		other.Close()
	})
	for range 3 {
		_, err := stranger.Fetch(ctxFor(t), e.addr, dtl.Request{Path: "f"}, dtl.NewSink(Dst(t)))
		if !errors.Is(err, dtl.ErrUnauthorized) {
			t.Errorf("fetch with another secret: got %v, want %v", err, dtl.ErrUnauthorized)
		}
	}
	if n := e.src.Calls(); n != 0 {
		t.Errorf("the Source was called %d times for an unauthorized client", n)
	}
	e.fetch(t, ctxFor(t), "f")
}

// unreachable: a server that is gone is reported as dtl.ErrUnavailable.
func unreachable(t *testing.T, newPair NewPair) {
	e := start(t, newPair)
	e.server.Close()
	_, err := e.client.Fetch(ctxFor(t), e.addr, dtl.Request{Path: "f"}, dtl.NewSink(Dst(t)))
	if !errors.Is(err, dtl.ErrUnavailable) {
		t.Errorf("fetch from a closed server: got %v, want %v", err, dtl.ErrUnavailable)
	}
}

func fetchAfterClose(t *testing.T, newPair NewPair) {
	e := start(t, newPair)
	if err := e.src.WriteFile("f", []byte("f")); err != nil {
		t.Fatal(err)
	}
	e.fetch(t, ctxFor(t), "f")
	if err := e.client.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.Fetch(ctxFor(t), e.addr, dtl.Request{Path: "f"}, dtl.NewSink(Dst(t))); err == nil {
		t.Error("Fetch on a closed transport succeeded")
	}
	if err := e.client.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// ranges fetches byte ranges of a file (in the middle, across zeros,
// past its end) and checks that only their bytes arrive, at their
// offsets, and the reply describes the whole file. A transport that does
// not fetch ranges skips it.
func ranges(t *testing.T, newPair NewPair) {
	e := start(t, newPair)
	if !dtl.FetchesRanges(e.client) {
		t.Skip("this transport fetches whole files only")
	}
	ctx := ctxFor(t)
	const size = 5<<20 + 12345
	content := randomBytes(t, size)
	clear(content[2<<20 : 3<<20]) // a run of zeros
	if err := e.src.WriteFile("big", content); err != nil {
		t.Fatal(err)
	}
	e.src.SetGeneration("big", 9)
	for _, r := range [][2]int64{{1 << 20, 1 << 20}, {0, 100}, {2<<20 - 10, 1<<20 + 20}, {5 << 20, 1 << 20}, {4<<20 + 7, 3}} {
		f := Dst(t)
		if err := f.Truncate(size); err != nil {
			t.Fatal(err)
		}
		info, err := e.client.Fetch(ctx, e.addr, dtl.Request{Path: "big", Generation: 9, Off: r[0], Len: r[1]}, dtl.NewSink(f))
		if err != nil {
			t.Fatalf("range of %d bytes at %d: %v", r[1], r[0], err)
		}
		if info.Size != size || info.Generation != 9 {
			t.Fatalf("range of %d bytes at %d: the reply describes %+v", r[1], r[0], info)
		}
		got := make([]byte, size)
		if _, err := f.ReadAt(got, 0); err != nil {
			t.Fatal(err)
		}
		end := min(r[0]+r[1], size)
		for i := range int64(size) {
			want := byte(0)
			if i >= r[0] && i < end {
				want = content[i]
			}
			if got[i] != want {
				t.Fatalf("range of %d bytes at %d: byte %d is %d, want %d", r[1], r[0], i, got[i], want)
			}
		}
		if st, _ := f.Stat(); st.Size() != size {
			t.Fatalf("range of %d bytes at %d: the destination's size changed to %d", r[1], r[0], st.Size())
		}
	}
}
