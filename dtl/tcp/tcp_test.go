package tcp

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dyadfs/dyadfs/dtl"
	"github.com/dyadfs/dyadfs/dtl/dtltest"
)

type opts struct {
	node        string // default: "node-" and the test's name
	stall, dial time.Duration
	listen      string
	advertise   string
}

// newTransport returns a transport on 127.0.0.1:0, closed at the end of
// the test, and its log.
func newTransport(t testing.TB, secret []byte, o opts) (*Transport, *dtltest.LogBuf) {
	t.Helper()
	cfg, lb := dtltest.Config(t, secret, dtltest.Options{Node: o.node, Listen: o.listen, Advertise: o.advertise, Stall: o.stall, Dial: o.dial})
	tr, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	return tr, lb
}

func TestConformance(t *testing.T) {
	dtltest.Run(t, func(t *testing.T) (dtl.Transport, dtl.Transport) {
		s := dtltest.NewSecret()
		server, _ := newTransport(t, s, opts{})
		client, _ := newTransport(t, s, opts{})
		return server, client
	})
}

// served is a server on a fresh dtltest.Source.
func served(t testing.TB, secret []byte, o opts) (*Transport, *dtltest.Source, *dtltest.LogBuf) {
	t.Helper()
	server, lb := newTransport(t, secret, o)
	return server, dtltest.Serving(t, server), lb
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestNewValidates(t *testing.T) {
	dtltest.CheckNewValidates(t, New)
}

func TestAddr(t *testing.T) {
	s := dtltest.NewSecret()
	open := func(listen, advertise string) dtl.Transport {
		tr, _ := newTransport(t, s, opts{listen: listen, advertise: advertise})
		return tr
	}
	dtltest.CheckAddr(t, open, func(tr dtl.Transport) string {
		_, port, _ := net.SplitHostPort(tr.(*Transport).ln.Addr().String())
		return port
	})
}

// TestReuse: fetches to one server share one connection.
func TestReuse(t *testing.T) {
	server, client, src := dtltest.Pair(t, opts{}, newTransport)
	src.WriteFile("f", []byte("hello"))
	ctx := ctxFor(t)
	for range 10 {
		if _, err := client.Fetch(ctx, server.Addr(), dtl.Request{Path: "f"}, dtl.NewSink(dtltest.Dst(t))); err != nil {
			t.Fatal(err)
		}
	}
	// A refusal keeps the connection too.
	if _, err := client.Fetch(ctx, server.Addr(), dtl.Request{Path: "missing"}, dtl.NewSink(dtltest.Dst(t))); !errors.Is(err, dtl.ErrNotFound) {
		t.Fatal(err)
	}
	if _, err := client.Fetch(ctx, server.Addr(), dtl.Request{Path: "f"}, dtl.NewSink(dtltest.Dst(t))); err != nil {
		t.Fatal(err)
	}
	// Close waits for the server's goroutines: its counters are final.
	client.Close()
	server.Close()
	cs, ss := client.Stats(), server.Stats()
	if cs.Dials != 1 || cs.Reused != 11 || ss.Accepts != 1 || ss.Served != 11 || ss.Refused != 1 {
		t.Errorf("client %+v server %+v: want 1 dial, 11 reuses, 1 accept, 11 served, 1 refused", cs, ss)
	}
	if cs.BytesRecv != 55 || ss.BytesSent != 55 {
		t.Errorf("bytes: received %d, sent %d, want 55", cs.BytesRecv, ss.BytesSent)
	}
}

// TestPoolBound: after many concurrent fetches, at most maxIdlePerAddr
// connections stay open.
func TestPoolBound(t *testing.T) {
	server, client, src := dtltest.Pair(t, opts{}, newTransport)
	src.WriteFile("f", bytes.Repeat([]byte("x"), 100_000))
	ctx := ctxFor(t)
	var wg sync.WaitGroup
	for range 3 * maxIdlePerAddr {
		f := dtltest.Dst(t)
		wg.Go(func() {
			if _, err := client.Fetch(ctx, server.Addr(), dtl.Request{Path: "f"}, dtl.NewSink(f)); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	client.mu.Lock()
	idle, active := len(client.idle[server.Addr()]), len(client.active)
	client.mu.Unlock()
	if idle > maxIdlePerAddr || idle == 0 || active != 0 {
		t.Errorf("%d idle connections (max %d), %d active", idle, maxIdlePerAddr, active)
	}
}

// TestFailedNotPooled: a cancelled transfer's connection is closed, not
// reused.
func TestFailedNotPooled(t *testing.T) {
	server, client, src := dtltest.Pair(t, opts{}, newTransport)
	writers := src.Stream("slow", 1<<20)
	src.WriteFile("f", []byte("f"))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := client.Fetch(ctx, server.Addr(), dtl.Request{Path: "slow"}, dtl.NewSink(dtltest.Dst(t)))
		done <- err
	}()
	w := <-writers
	defer w.Close()
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want %v", err, context.Canceled)
	}
	if _, err := client.Fetch(ctxFor(t), server.Addr(), dtl.Request{Path: "f"}, dtl.NewSink(dtltest.Dst(t))); err != nil {
		t.Fatal(err)
	}
	if st := client.Stats(); st.Dials != 2 || st.Reused != 0 {
		t.Errorf("%+v: want 2 dials, no reuse", st)
	}
}

// TestStaleRetry: a pooled connection the server has closed is replaced
// transparently.
func TestStaleRetry(t *testing.T) {
	server, client, src := dtltest.Pair(t, opts{}, newTransport)
	src.WriteFile("f", []byte("f"))
	ctx := ctxFor(t)
	if _, err := client.Fetch(ctx, server.Addr(), dtl.Request{Path: "f"}, dtl.NewSink(dtltest.Dst(t))); err != nil {
		t.Fatal(err)
	}
	server.mu.Lock()
	for sc := range server.serving {
		sc.conn.Close()
	}
	server.mu.Unlock()
	if _, err := client.Fetch(ctx, server.Addr(), dtl.Request{Path: "f"}, dtl.NewSink(dtltest.Dst(t))); err != nil {
		t.Fatal(err)
	}
	if st := client.Stats(); st.Dials != 2 || st.Retried != 1 {
		t.Errorf("%+v: want 2 dials, 1 retry", st)
	}
}

// TestIdleServerCloses: a server drops connections that stay idle.
func TestIdleServerCloses(t *testing.T) {
	s := dtltest.NewSecret()
	server, _ := newTransport(t, s, opts{})
	server.serverIdle = 50 * time.Millisecond
	src := dtltest.Serving(t, server)
	client, _ := newTransport(t, s, opts{})
	src.WriteFile("f", []byte("f"))
	if _, err := client.Fetch(ctxFor(t), server.Addr(), dtl.Request{Path: "f"}, dtl.NewSink(dtltest.Dst(t))); err != nil {
		t.Fatal(err)
	}
	client.mu.Lock()
	cc := client.idle[server.Addr()][0]
	client.mu.Unlock()
	cc.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := cc.conn.Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("idle connection: read %v, want EOF from the server", err)
	}
}

// TestUnauthorizedServer: a client finds out that a server lacks the
// secret before it proves its own, and says so.
func TestUnauthorizedServer(t *testing.T) {
	server, src, slg := served(t, dtltest.NewSecret(), opts{})
	client, clog := newTransport(t, dtltest.NewSecret(), opts{})
	src.WriteFile("f", []byte("f"))
	_, err := client.Fetch(ctxFor(t), server.Addr(), dtl.Request{Path: "f"}, dtl.NewSink(dtltest.Dst(t)))
	var re *dtl.RemoteError
	if !errors.As(err, &re) || !errors.Is(err, dtl.ErrUnauthorized) {
		t.Errorf("got %v, want a *dtl.RemoteError for %v", err, dtl.ErrUnauthorized)
	}
	if !strings.Contains(clog.String(), "does not hold this job's secret (job secrets differ); nothing is fetched") {
		t.Errorf("client log has no refusal:\n%s", clog)
	}
	if src.Calls() != 0 {
		t.Error("the Source was called")
	}
	t.Logf("client: %v\nserver log:\n%s", err, slg)
}

// TestDialFailures: nothing listening, and a listener that never answers.
func TestDialFailures(t *testing.T) {
	const dial = 200 * time.Millisecond
	client, _ := newTransport(t, dtltest.NewSecret(), opts{dial: dial})
	dtltest.CheckDialFailures(t, client, dial)
}

// TestCloseEndsEverything: Close with idle, active and serving
// connections returns once all of them are gone, and leaks no goroutine.
func TestCloseEndsEverything(t *testing.T) {
	dtltest.CheckNoLeak(t, func() {
		server, client, src := dtltest.Pair(t, opts{}, newTransport)
		done := make(chan error, 4)
		defer dtltest.CloseAll(dtltest.Underway(t, ctxFor(t), client, server.Addr(), src, done))
		// The server's goroutines are blocked reading pipes that
		// nobody writes: Close must end them.
		server.Close()
		for range 4 {
			if err := <-done; err == nil {
				t.Error("a transfer cut by Close succeeded")
			}
		}
		client.Close()
	})
}

// TestCloseWhileFetching: a client's Close ends its own Fetches, which
// return an error naming the closed transport.
func TestCloseWhileFetching(t *testing.T) {
	server, client, src := dtltest.Pair(t, opts{}, newTransport)
	writers := src.Stream("slow", 1<<30)
	done := make(chan error, 1)
	go func() {
		_, err := client.Fetch(ctxFor(t), server.Addr(), dtl.Request{Path: "slow"}, dtl.NewSink(dtltest.Dst(t)))
		done <- err
	}()
	w := <-writers
	defer w.Close()
	client.Close()
	if err := <-done; !errors.Is(err, net.ErrClosed) {
		t.Errorf("got %v, want %v", err, net.ErrClosed)
	}
}

// TestSparseSendsOnlyData: the server sends the data extents of a sparse
// file, not its holes.
func TestSparseSendsOnlyData(t *testing.T) {
	server, client, src := dtltest.Pair(t, opts{}, newTransport)
	dtltest.FetchSparse(t, client, server, src, func() int64 { return server.Stats().BytesSent })
}

// TestShrunkFile: a file that is shorter than its description is not sent
// as if it were complete.
func TestShrunkFile(t *testing.T) {
	s := dtltest.NewSecret()
	server, _ := newTransport(t, s, opts{})
	client, _ := newTransport(t, s, opts{})
	dtltest.CheckShrunkFile(t, server, client)
}

// flipProxy forwards connections to target and inverts one byte of what
// the server sends, at offset at of each connection's stream: a byte
// damaged on the wire that TCP's own checksum missed.
func flipProxy(t *testing.T, target string, at int64) string {
	t.Helper()
	return dtltest.AcceptLoop(t, func(c net.Conn, track func(net.Conn)) {
		defer c.Close()
		s, err := net.Dial("tcp", target)
		if err != nil {
			return
		}
		track(s)
		defer s.Close()
		go func() { io.Copy(s, c); s.(*net.TCPConn).CloseWrite() }()
		buf := make([]byte, 32<<10)
		var off int64
		for {
			n, err := s.Read(buf)
			if at >= off && at < off+int64(n) {
				buf[at-off] ^= 0xff
			}
			off += int64(n)
			if n > 0 {
				if _, werr := c.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	})
}

type ownerAt string

func (a ownerAt) Peer(context.Context, string) (dtl.Peer, error) {
	return dtl.Peer{Addr: string(a)}, nil
}

type intoDir string

func (d intoDir) Install(tmp *os.File, v dtl.Version) error {
	return os.Rename(tmp.Name(), filepath.Join(string(d), v.Path))
}

// A byte flipped in transit: the copy does not match the owner's
// checksum, so it is not installed; the mismatch is logged with the path
// and both nodes, and the next transfer brings the file whole. (Damage
// that stays, on the owner's disk, fails the fetch with EIO: the
// conformance suite's CorruptContent.) Straight to the server, the same
// file arrives.
func TestCorruptInTransit(t *testing.T) {
	s := dtltest.NewSecret()
	server, src, _ := served(t, s, opts{node: "owner"})
	client, _ := newTransport(t, s, opts{node: "consumer"})
	data := make([]byte, 3<<20)
	rand.Read(data)
	src.WriteFile("f", data)
	for _, c := range []struct {
		name    string
		addr    string
		flipped bool
	}{
		{"flipped on the way", flipProxy(t, server.Addr(), 2<<20), true},
		{"straight", server.Addr(), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			dest := t.TempDir()
			lb := &dtltest.LogBuf{}
			f, err := dtl.NewFetcher(dtl.FetcherConfig{Transport: client, Owners: ownerAt(c.addr), Dest: intoDir(dest),
				TempDir: t.TempDir(), Timeout: time.Minute, Node: "consumer",
				Log: slog.New(slog.NewTextHandler(lb, nil))})
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			err = f.Fetch(ctxFor(t), dtl.Version{Path: "f", Owner: "owner", Info: dtl.FileInfo{Size: int64(len(data)), Generation: 1}})
			got, rerr := os.ReadFile(filepath.Join(dest, "f"))
			// A damaged copy is never installed; the transfer that
			// follows it brings the file whole (the proxy damages the
			// first one only), and the mismatch is logged.
			if err != nil || rerr != nil || !bytes.Equal(got, data) || f.Stats().Verified.Load() != 1 || f.Stats().Corrupt.Load() != 0 {
				t.Fatalf("fetch: %v, read %v, verified %d, corrupt %d", err, rerr, f.Stats().Verified.Load(), f.Stats().Corrupt.Load())
			}
			line := lb.String()
			if !c.flipped {
				return
			}
			for _, w := range []string{"does not match its published checksum; fetching it again", "path=f", "owner=owner", "node=consumer"} {
				if !strings.Contains(line, w) {
					t.Errorf("log lacks %q:\n%s", w, line)
				}
			}
		})
	}
}
