//go:build ucx

package ucx

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dyadfs/dyadfs/dtl"
	"github.com/dyadfs/dyadfs/dtl/dtltest"
	"github.com/dyadfs/dyadfs/internal/poll"
)

// prompt is how soon a transfer cut by a dead peer or a Close must end.
const prompt = 5 * time.Second

// poolsFull waits until every buffer of tr's pools is back in its ring and
// no UCX request is outstanding: after a transfer its sender's last
// completion may come a little after its receiver returned.
func poolsFull(t testing.TB, tr *Transport) {
	t.Helper()
	full := func() bool {
		st := tr.Stats()
		return st.SendFree == st.SendSlots && st.RecvFree == st.RecvSlots
	}
	if !poll.Within(5*time.Second, full) {
		t.Fatalf("buffer pools not full again: %+v", tr.Stats())
	}
}

// TestManySmallConcurrent: 1,000 transfers of small files at once (whole
// messages and chunked ones), each intact, on one endpoint; the pools are
// full afterwards.
func TestManySmallConcurrent(t *testing.T) {
	onEachWire(t, func(t *testing.T, tls string) {
		server, client, src := dtltest.Pair(t, opts{tls: tls}, testTransport)
		const files = 50
		sums := make([][32]byte, files)
		for i := range files {
			data := make([]byte, (i*2741)%(3*inlineMax))
			rand.Read(data)
			sums[i] = sha256.Sum256(data)
			if err := src.WriteFile(fmt.Sprintf("small/%d", i), data); err != nil {
				t.Fatal(err)
			}
		}
		dir := t.TempDir()
		ctx := ctxFor(t)
		var wg sync.WaitGroup
		for i := range 1000 {
			wg.Go(func() {
				p := fmt.Sprintf("small/%d", i%files)
				f, err := os.Create(filepath.Join(dir, fmt.Sprint(i)))
				if err != nil {
					t.Error(err)
					return
				}
				defer f.Close()
				if _, err := client.Fetch(ctx, server.Addr(), dtl.Request{Path: p}, dtl.NewSink(f)); err != nil {
					t.Errorf("fetch %s: %v", p, err)
					return
				}
				if got, err := dtltest.FileSum(f.Name()); err != nil || got != sums[i%files] {
					t.Errorf("fetch %s: content differs (%v)", p, err)
				}
			})
		}
		wg.Wait()
		if st := client.Stats(); st.Dials != 1 {
			t.Errorf("%+v: want all on one endpoint", st)
		}
		poolsFull(t, client)
		poolsFull(t, server)
	})
}

// sparseSum hashes a sparse file by its data: the offset, length and bytes
// of each of the extents given (those of the source), so that the source
// and a copy compare without reading gigabytes of holes.
func sparseSum(t testing.TB, f *os.File, extents [][2]int64) [32]byte {
	h := sha256.New()
	buf := make([]byte, 1<<20)
	for _, e := range extents {
		fmt.Fprintf(h, "%d+%d:", e[0], e[1]-e[0])
		for off := e[0]; off < e[1]; {
			n := min(int64(len(buf)), e[1]-off)
			if _, err := f.ReadAt(buf[:n], off); err != nil {
				t.Fatalf("read %s at %d: %v", f.Name(), off, err)
			}
			h.Write(buf[:n])
			off += n
		}
	}
	var s [32]byte
	h.Sum(s[:0])
	return s
}

// makeSparse writes a size-byte file with n extents of random data, the
// first at offset 0, spread over the file at offsets that are not chunk
// aligned.
func makeSparse(t testing.TB, name string, size int64, n int, extent int) {
	f, err := os.Create(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	data := make([]byte, extent)
	for i := range n {
		rand.Read(data)
		off := int64(i) * (size / int64(n))
		if i > 0 {
			off += 12345 * 4096
		}
		if _, err := f.WriteAt(data, off); err != nil {
			t.Fatal(err)
		}
	}
}

// TestLargeConcurrent: 8 transfers of 1 GiB files at once (sparse, with
// 64 MiB of random data each in 4 extents that cut across chunks), each
// intact and as sparse as its source; the pools are full afterwards.
func TestLargeConcurrent(t *testing.T) {
	if testing.Short() {
		t.Skip("moves 1 GiB of data per wire")
	}
	onEachWire(t, func(t *testing.T, tls string) {
		server, client, src := dtltest.Pair(t, opts{tls: tls}, testTransport)
		const size, files = 1 << 30, 8
		for i := range files {
			makeSparse(t, filepath.Join(src.Root(), fmt.Sprint(i)), size, 4, 16<<20)
		}
		ctx := ctxFor(t)
		dsts := make([]*os.File, files)
		var wg sync.WaitGroup
		start := time.Now()
		for i := range files {
			dsts[i] = dtltest.Dst(t)
			wg.Go(func() {
				if _, err := client.Fetch(ctx, server.Addr(), dtl.Request{Path: fmt.Sprint(i)}, dtl.NewSink(dsts[i])); err != nil {
					t.Errorf("fetch %d: %v", i, err)
				}
			})
		}
		wg.Wait()
		t.Logf("8 x 1 GiB (512 MiB of data) in %v", time.Since(start))
		for i, dst := range dsts {
			sf, err := os.Open(filepath.Join(src.Root(), fmt.Sprint(i)))
			if err != nil {
				t.Fatal(err)
			}
			ext := dtltest.Extents(sf, size)
			if a, b := sparseSum(t, sf, ext), sparseSum(t, dst, ext); a != b {
				t.Errorf("file %d: content differs", i)
			}
			sf.Close()
			if st, _ := dst.Stat(); st.Size() != size {
				t.Errorf("file %d: %d bytes, want %d", i, st.Size(), int64(size))
			}
			// Whatever data the copy holds lies within the
			// source's extents (elsewhere it would not be zeros).
			for _, d := range dtltest.Extents(dst, size) {
				inside := false
				for _, e := range ext {
					inside = inside || (d[0] >= e[0] && d[1] <= e[1])
				}
				if !inside {
					t.Errorf("file %d: data at [%d, %d) of the copy is a hole of the source", i, d[0], d[1])
				}
			}
		}
		if st := server.Stats(); st.BytesSent != files*64<<20 {
			t.Errorf("server sent %d bytes, want only the data (%d)", st.BytesSent, files*64<<20)
		}
		poolsFull(t, client)
		poolsFull(t, server)
	})
}

// TestSmallPools: with two buffers a side and one chunk in flight per
// transfer, many transfers at once still all arrive (the pools and the
// window are the flow control, nothing deadlocks), and the pools are full
// afterwards.
func TestSmallPools(t *testing.T) {
	tiny := func(tun *tuning) {
		tun.chunk, tun.sendSlots, tun.recvSlots, tun.window = 64<<10, 2, 2, 1
	}
	server, client, src := dtltest.Pair(t, opts{tune: tiny}, testTransport)
	data := make([]byte, 3<<20+12345)
	rand.Read(data)
	src.WriteFile("f", data)
	want := sha256.Sum256(data)
	ctx := ctxFor(t)
	var wg sync.WaitGroup
	for range 24 {
		dst := dtltest.Dst(t)
		wg.Go(func() {
			if _, err := client.Fetch(ctx, server.Addr(), dtl.Request{Path: "f"}, dtl.NewSink(dst)); err != nil {
				t.Error(err)
				return
			}
			if got, err := dtltest.FileSum(dst.Name()); err != nil || got != want {
				t.Errorf("content differs (%v)", err)
			}
		})
	}
	wg.Wait()
	poolsFull(t, client)
	poolsFull(t, server)
}

// TestTwoWays: two daemons fetch from each other at once, each both owner
// and consumer of one transport.
func TestTwoWays(t *testing.T) {
	tiny := func(tun *tuning) { tun.sendSlots, tun.recvSlots = 4, 4 }
	s := dtltest.NewSecret()
	a, srcA, _ := served(t, s, opts{node: "a", tune: tiny})
	b, srcB, _ := served(t, s, opts{node: "b", tune: tiny})
	data := make([]byte, 16<<20)
	rand.Read(data)
	srcA.WriteFile("f", data)
	srcB.WriteFile("f", data)
	want := sha256.Sum256(data)
	ctx := ctxFor(t)
	var wg sync.WaitGroup
	for i := range 16 {
		from, to := a, b
		if i%2 == 1 {
			from, to = b, a
		}
		dst := dtltest.Dst(t)
		wg.Go(func() {
			if _, err := from.Fetch(ctx, to.Addr(), dtl.Request{Path: "f", Owner: to.cfg.Node}, dtl.NewSink(dst)); err != nil {
				t.Error(err)
			} else if got, err := dtltest.FileSum(dst.Name()); err != nil || got != want {
				t.Errorf("content differs (%v)", err)
			}
		})
	}
	wg.Wait()
	poolsFull(t, a)
	poolsFull(t, b)
}

// TestServerClosedThenNewServer: an owner closed in the middle of
// transfers fails them at once, not as refusals; the consumer's buffers
// come back; the next transfer, to a new owner and to one that took the
// old one's address, succeeds.
func TestServerClosedThenNewServer(t *testing.T) {
	onEachWire(t, func(t *testing.T, tls string) {
		s := dtltest.NewSecret() // the new owners hold it too
		server, src, _ := served(t, s, opts{tls: tls})
		client, _ := testTransport(t, s, opts{tls: tls})
		addr := server.Addr()
		writers := src.Stream("slow", 1<<30)
		big := make([]byte, 64<<20)
		rand.Read(big)
		src.WriteFile("big", big)
		ctx := ctxFor(t)
		done := dtltest.FetchAllAsync(t, ctx, client, addr, "slow", "slow", "slow", "slow", "big")
		defer dtltest.CloseAll(dtltest.Feed(writers, 4, 60<<10))
		closing := time.Now()
		go server.Close()
		for range 5 {
			select {
			case err := <-done:
				var re *dtl.RemoteError
				if errors.As(err, &re) {
					t.Errorf("a transfer cut by its owner's Close failed as a refusal: %v", err)
				}
				t.Logf("cut: %v", err)
			case <-time.After(30 * time.Second):
				t.Fatal("a transfer did not end")
			}
		}
		if took := time.Since(closing); took > prompt {
			t.Errorf("transfers ended %v after the owner closed", took)
		}
		poolsFull(t, client)

		// A new owner elsewhere, and one at the old address.
		other, osrc, _ := served(t, s, opts{tls: tls})
		osrc.WriteFile("f", big)
		if _, err := client.Fetch(ctx, other.Addr(), dtl.Request{Path: "f"}, dtl.NewSink(dtltest.Dst(t))); err != nil {
			t.Fatalf("fetch from a new owner: %v", err)
		}
		_, port, _ := net.SplitHostPort(addr)
		again, asrc, _ := served(t, s, opts{tls: tls, listen: "127.0.0.1:" + port})
		asrc.WriteFile("f", big)
		dst := dtltest.Dst(t)
		if _, err := client.Fetch(ctx, again.Addr(), dtl.Request{Path: "f"}, dtl.NewSink(dst)); err != nil {
			t.Fatalf("fetch from an owner at the old address: %v", err)
		}
		if got, err := dtltest.FileSum(dst.Name()); err != nil || got != sha256.Sum256(big) {
			t.Errorf("content differs (%v)", err)
		}
		poolsFull(t, client)
	})
}

// TestClientCloseCancels: a consumer's Close ends its transfers in flight,
// each with an error that is net.ErrClosed, at once; its buffers are all
// back, and the owner's come back too.
func TestClientCloseCancels(t *testing.T) {
	onEachWire(t, func(t *testing.T, tls string) {
		server, client, src := dtltest.Pair(t, opts{tls: tls}, testTransport)
		writers := src.Stream("slow", 1<<30)
		name := filepath.Join(src.Root(), "sparse")
		makeSparse(t, name, 1<<30, 8, 32<<20)
		ctx := ctxFor(t)
		done := dtltest.FetchAllAsync(t, ctx, client, server.Addr(), "slow", "sparse", "slow", "sparse", "slow", "sparse", "slow", "sparse")
		defer dtltest.CloseAll(dtltest.Feed(writers, 4, 60<<10))
		closing := time.Now()
		client.Close()
		for range 8 {
			if err := <-done; !errors.Is(err, net.ErrClosed) {
				// A sparse file may have arrived whole first.
				if err != nil {
					t.Errorf("got %v, want %v", err, net.ErrClosed)
				}
			}
		}
		if took := time.Since(closing); took > prompt {
			t.Errorf("Close took %v", took)
		}
		st := client.Stats()
		if st.RecvFree != st.RecvSlots || st.SendFree != st.SendSlots || st.InFlight != 0 || st.Endpoints != 0 {
			t.Errorf("after Close: %+v", st)
		}
		poolsFull(t, server)
		if _, err := client.Fetch(ctx, server.Addr(), dtl.Request{Path: "sparse"}, dtl.NewSink(dtltest.Dst(t))); !errors.Is(err, net.ErrClosed) {
			t.Errorf("Fetch after Close: %v", err)
		}
	})
}

// TestCloseEndsEverything: Close with endpoints idle, transfers in flight
// both ways and messages being handled returns once all of them are gone,
// and leaves no goroutine behind.
func TestCloseEndsEverything(t *testing.T) {
	dtltest.CheckNoLeak(t, func() {
		s := dtltest.NewSecret()
		server, src, serverLog := served(t, s, opts{})
		client, clientLog := testTransport(t, s, opts{})
		slowHandler := handlerFunc(func(ctx context.Context, from string, msg []byte) ([]byte, error) {
			<-ctx.Done()
			return nil, ctx.Err()
		})
		server.handler.Store(&slowHandler)
		ctx := ctxFor(t)
		done := make(chan error, 6)
		defer dtltest.CloseAll(dtltest.Underway(t, ctx, client, server.Addr(), src, done))
		for range 2 {
			go func() {
				_, err := client.Message(ctx, server.Addr(), "", []byte("wait"))
				done <- err
			}()
		}
		// The server's goroutines are blocked reading pipes nobody
		// writes, its handlers wait for the end: Close must end them.
		server.Close()
		for range 6 {
			if err := <-done; err == nil {
				t.Error("a transfer cut by Close succeeded")
			}
		}
		client.Close()
		// Closing is no failure: neither log has an error in it.
		for _, lb := range []*dtltest.LogBuf{serverLog, clientLog} {
			if strings.Contains(lb.String(), "level=ERROR") {
				t.Errorf("an error logged by closing:\n%s", lb)
			}
		}
	})
}

// TestWrongSecretRefused: a consumer of another job is refused before the
// Source is asked anything, and so is one facing an owner of another job;
// the refusal is a *dtl.RemoteError for dtl.ErrUnauthorized and is logged.
func TestWrongSecretRefused(t *testing.T) {
	server, src, _ := served(t, dtltest.NewSecret(), opts{node: "owner"})
	src.WriteFile("f", []byte("f"))
	stranger, slog := testTransport(t, dtltest.NewSecret(), opts{node: "stranger"})
	for range 3 {
		_, err := stranger.Fetch(ctxFor(t), server.Addr(), dtl.Request{Path: "f"}, dtl.NewSink(dtltest.Dst(t)))
		var re *dtl.RemoteError
		if !errors.As(err, &re) || !errors.Is(err, dtl.ErrUnauthorized) {
			t.Errorf("got %v, want a *dtl.RemoteError for %v", err, dtl.ErrUnauthorized)
		}
	}
	if src.Calls() != 0 {
		t.Error("the Source was called")
	}
	if !bytes.Contains([]byte(slog.String()), []byte("does not hold this job's secret (job secrets differ); nothing is fetched")) {
		t.Errorf("no refusal in the log:\n%s", slog)
	}
	if st := stranger.Stats(); st.Dials != 0 || st.RecvFree != st.RecvSlots {
		t.Errorf("%+v", st)
	}
}

// TestIdleEndpointsClosed: endpoints idle for longer than their time are
// closed on both sides, and the next transfer opens a new one.
func TestIdleEndpointsClosed(t *testing.T) {
	quick := func(tun *tuning) { tun.idleTTL, tun.serverIdle = 300*time.Millisecond, 600*time.Millisecond }
	server, client, src := dtltest.Pair(t, opts{tune: quick}, testTransport)
	src.WriteFile("f", []byte("data"))
	fetch := func() {
		t.Helper()
		if _, err := client.Fetch(ctxFor(t), server.Addr(), dtl.Request{Path: "f"}, dtl.NewSink(dtltest.Dst(t))); err != nil {
			t.Fatal(err)
		}
	}
	fetch()
	poll.Until(t, 5*time.Second, "idle endpoints closed", func() bool {
		return client.Stats().Endpoints == 0 && server.Stats().Endpoints == 0
	})
	fetch()
	if st := client.Stats(); st.Dials != 2 {
		t.Errorf("%+v: want a second endpoint", st)
	}
}

// TestCancelReleases: fetches cancelled in the middle of files whose chunks
// are in flight free every buffer on both sides, and the owner stops
// sending.
func TestCancelReleases(t *testing.T) {
	server, client, src := dtltest.Pair(t, opts{}, testTransport)
	makeSparse(t, filepath.Join(src.Root(), "big"), 4<<30, 16, 16<<20)
	for range 10 {
		ctx, cancel := context.WithCancel(context.Background())
		done := dtltest.FetchAllAsync(t, ctx, client, server.Addr(), "big", "big", "big", "big")
		time.Sleep(20 * time.Millisecond) // some chunks in flight
		cancel()
		for range 4 {
			if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("got %v, want %v", err, context.Canceled)
			}
		}
	}
	poolsFull(t, client)
	poolsFull(t, server)
	if st := server.Stats(); st.BytesSent >= 40*256<<20 {
		t.Errorf("the owner sent %d bytes: it did not stop", st.BytesSent)
	}
}

// TestAddr: the advertised address names the listener's port and, for
// an unspecified host, an address of this machine.
func TestAddr(t *testing.T) {
	s := dtltest.NewSecret()
	open := func(listen, advertise string) dtl.Transport {
		tr, _ := testTransport(t, s, opts{listen: listen, advertise: advertise})
		return tr
	}
	dtltest.CheckAddr(t, open, nil)
	// A port taken by someone else.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	tr, _ := testTransport(t, s, opts{listen: ln.Addr().String()})
	if err := tr.Serve(dtltest.NewSource(t.TempDir())); err == nil {
		t.Error("Serve on a port in use succeeded")
	} else {
		t.Log(err)
	}
}

// TestNewValidates: bad configurations are refused.
func TestNewValidates(t *testing.T) {
	dtltest.CheckNewValidates(t, New)
}

// TestGoSignalsSurviveUCX: UCX installs handlers for SIGSEGV and the like;
// Go's own must still turn a nil dereference into a panic.
func TestGoSignalsSurviveUCX(t *testing.T) {
	testTransport(t, dtltest.NewSecret(), opts{})
	defer func() {
		if recover() == nil {
			t.Error("no panic")
		}
	}()
	var p *int
	*p = 1
}

// TestSparseSendsOnlyData: only the data extents of a sparse file travel.
func TestSparseSendsOnlyData(t *testing.T) {
	server, client, src := dtltest.Pair(t, opts{}, testTransport)
	got := dtltest.FetchSparse(t, client, server, src, func() int64 { return server.Stats().BytesSent })
	var st syscall.Stat_t
	syscall.Fstat(int(got.Fd()), &st)
	if st.Blocks*512 > 1<<20 {
		t.Errorf("the copy is not sparse: %d bytes allocated", st.Blocks*512)
	}
}

// TestDialFailures: nothing listening fails at once; a listener that
// accepts and never speaks UCX fails within the dial timeout; both as
// dtl.ErrUnavailable.
func TestDialFailures(t *testing.T) {
	const dial = 300 * time.Millisecond
	client, _ := testTransport(t, dtltest.NewSecret(), opts{dial: dial})
	dtltest.CheckDialFailures(t, client, dial)
	if _, err := client.Fetch(ctxFor(t), "no-such-host.invalid:7000", dtl.Request{Path: "f"}, dtl.NewSink(dtltest.Dst(t))); !errors.Is(err, dtl.ErrUnavailable) {
		t.Errorf("unknown host: got %v, want %v", err, dtl.ErrUnavailable)
	}
	poolsFull(t, client)
}

// TestJunkOnThePort: a peer that connects to the listener and sends what
// is not UCX's does no harm.
func TestJunkOnThePort(t *testing.T) {
	s := dtltest.NewSecret()
	server, src, _ := served(t, s, opts{})
	src.WriteFile("f", []byte("data"))
	for range 5 {
		c, err := net.Dial("tcp", server.Addr())
		if err != nil {
			t.Fatal(err)
		}
		c.Write(bytes.Repeat([]byte("GET / HTTP/1.0\r\n\r\n"), 100))
		c.Close()
	}
	client, _ := testTransport(t, s, opts{})
	if _, err := client.Fetch(ctxFor(t), server.Addr(), dtl.Request{Path: "f"}, dtl.NewSink(dtltest.Dst(t))); err != nil {
		t.Fatal(err)
	}
	if src.Calls() != 1 {
		t.Errorf("the Source was called %d times", src.Calls())
	}
}

// TestShrunkFile: a file shorter than its description is not sent as if
// it were complete.
func TestShrunkFile(t *testing.T) {
	s := dtltest.NewSecret()
	server, _ := testTransport(t, s, opts{})
	client, _ := testTransport(t, s, opts{})
	dtltest.CheckShrunkFile(t, server, client)
	poolsFull(t, client)
	poolsFull(t, server)
}
