package dtltest

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
	"runtime"
	"testing"
	"time"

	"github.com/dyadfs/dyadfs/dtl"
	"github.com/dyadfs/dyadfs/dtl/peerauth"
	"github.com/dyadfs/dyadfs/internal/poll"
)

// Helpers for the tests a backend runs besides the suites: they look at
// its own counters and internals, but share these steps.

// Serving serves a new Source, in a directory of its own, with server.
func Serving(t testing.TB, server dtl.Transport) *Source {
	t.Helper()
	src := NewSource(t.TempDir())
	if err := server.Serve(src); err != nil {
		t.Fatal(err)
	}
	return src
}

// Pair is a server serving a new Source and a client, both made by open
// (a backend's constructor for its tests) with options o and one new
// secret.
func Pair[T dtl.Transport, O any](t testing.TB, o O, open func(testing.TB, []byte, O) (T, *LogBuf)) (server, client T, src *Source) {
	t.Helper()
	s := NewSecret()
	server, _ = open(t, s, o)
	src = Serving(t, server)
	client, _ = open(t, s, o)
	return server, client, src
}

// Loopback is a transport that newTransport makes for node on
// 127.0.0.1:0 with secret and otherwise the default configuration, closed
// at the end of the test: for tests of what runs over a transport. (A
// backend's own tests use Config.)
func Loopback[T dtl.Transport](t testing.TB, node string, secret []byte, newTransport func(dtl.Config) (T, error)) T {
	t.Helper()
	cfg := dtl.DefaultConfig()
	cfg.Node, cfg.Listen, cfg.Secret = node, "127.0.0.1:0", secret
	tr, err := newTransport(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	return tr
}

// Options are what a backend's tests vary in a transport's configuration.
type Options struct {
	Node              string // default: "node-" and the test's name
	Listen, Advertise string // default listen: 127.0.0.1:0
	Stall, Dial       time.Duration
}

// Config is the configuration of a test transport with secret and o,
// logging at debug level into the returned LogBuf.
func Config(t testing.TB, secret []byte, o Options) (dtl.Config, *LogBuf) {
	cfg := dtl.DefaultConfig()
	cfg.Node = "node-" + t.Name()
	if len(cfg.Node) > peerauth.MaxNode {
		cfg.Node = cfg.Node[:peerauth.MaxNode]
	}
	if o.Node != "" {
		cfg.Node = o.Node
	}
	cfg.Listen = "127.0.0.1:0"
	if o.Listen != "" {
		cfg.Listen = o.Listen
	}
	cfg.Advertise = o.Advertise
	cfg.Secret = secret
	if o.Stall > 0 {
		cfg.StallTimeout = o.Stall
	}
	if o.Dial > 0 {
		cfg.DialTimeout = o.Dial
	}
	lb := &LogBuf{}
	cfg.Log = slog.New(slog.NewTextHandler(lb, &slog.HandlerOptions{Level: slog.LevelDebug}))
	return cfg, lb
}

// CheckNewValidates checks that newTransport refuses bad configurations:
// a short secret, no stall timeout, a node id longer than the protocols
// carry.
func CheckNewValidates[T io.Closer](t *testing.T, newTransport func(dtl.Config) (T, error)) {
	refused := func(cfg dtl.Config) bool {
		tr, err := newTransport(cfg)
		if err == nil {
			tr.Close()
		}
		return err != nil
	}
	cfg := dtl.DefaultConfig()
	cfg.Node, cfg.Listen = "n", ":0"
	cfg.Secret = []byte("short")
	if !refused(cfg) {
		t.Error("New accepted a 5-byte secret")
	}
	cfg.Secret = NewSecret()
	stall := cfg.StallTimeout
	cfg.StallTimeout = 0
	if !refused(cfg) {
		t.Error("New accepted a zero stall timeout")
	}
	cfg.StallTimeout = stall
	cfg.Node = string(make([]byte, 300))
	if !refused(cfg) {
		t.Error("New accepted a 300-byte node id")
	}
}

// CheckAddr checks the address a transport advertises: Advertise if set,
// else its listener's, with the port the system chose for ":0" and, for an
// unspecified host, dtl.FirstIPv4(). open makes a transport, closed with
// the test, that listens on listen and advertises advertise; port, if not
// nil, tells the port it really listens on.
func CheckAddr(t *testing.T, open func(listen, advertise string) dtl.Transport, port func(dtl.Transport) string) {
	for _, c := range []struct {
		listen, advertise, host string
	}{
		{"127.0.0.1:0", "", "127.0.0.1"},
		{":0", "", dtl.FirstIPv4()},
		{"0.0.0.0:0", "", dtl.FirstIPv4()},
		{"127.0.0.1:0", "node7.example:7000", ""},
	} {
		tr := open(c.listen, c.advertise)
		if tr.Addr() != "" {
			t.Errorf("Addr before Serve: %q", tr.Addr())
		}
		if err := tr.Serve(NewSource(t.TempDir())); err != nil {
			t.Fatal(err)
		}
		if err := tr.Serve(NewSource(t.TempDir())); err == nil {
			t.Error("second Serve succeeded")
		}
		got := tr.Addr()
		if c.advertise != "" {
			if got != c.advertise {
				t.Errorf("listen %s advertise %s: Addr %s", c.listen, c.advertise, got)
			}
			continue
		}
		host, p, err := net.SplitHostPort(got)
		if err != nil || host != c.host || p == "0" || (port != nil && p != port(tr)) {
			t.Errorf("listen %s: Addr %s, want host %s and the port listened on", c.listen, got, c.host)
		}
		if ip := net.ParseIP(host); ip == nil || ip.To4() == nil {
			t.Errorf("listen %s: Addr %s is not an IPv4 address", c.listen, got)
		}
		tr.Close()
	}
	t.Logf("this machine advertises %s", dtl.FirstIPv4())
}

// CheckDialFailures checks that client, with a dial timeout of dial,
// fails at once when nothing listens and within about the timeout when a
// listener never answers, both as dtl.ErrUnavailable.
func CheckDialFailures(t *testing.T, client dtl.Transport, dial time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	start := time.Now()
	if _, err := client.Fetch(ctx, dead, dtl.Request{Path: "f"}, dtl.NewSink(Dst(t))); !errors.Is(err, dtl.ErrUnavailable) {
		t.Errorf("nothing listening: got %v, want %v", err, dtl.ErrUnavailable)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("nothing listening: took %v", took)
	}
	// The kernel completes connections that nobody accepts.
	mute, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer mute.Close()
	start = time.Now()
	_, err = client.Fetch(ctx, mute.Addr().String(), dtl.Request{Path: "f"}, dtl.NewSink(Dst(t)))
	if !errors.Is(err, dtl.ErrUnavailable) {
		t.Errorf("mute listener: got %v, want %v", err, dtl.ErrUnavailable)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("mute listener: took %v with a %v dial timeout", took, dial)
	}
}

// FetchSparse fetches from server, serving src, a 1 GiB file that holds
// 8 KiB of data, and checks that sent, the data bytes the server counts
// as sent, stays far below its size. It returns the copy.
func FetchSparse(t *testing.T, client, server dtl.Transport, src *Source, sent func() int64) *os.File {
	f, err := os.Create(filepath.Join(src.Root(), "sparse"))
	if err != nil {
		t.Fatal(err)
	}
	f.Truncate(1 << 30)
	f.WriteAt(bytes.Repeat([]byte("d"), 8192), 1<<29)
	f.Close()
	got := Dst(t)
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	info, err := client.Fetch(ctx, server.Addr(), dtl.Request{Path: "sparse"}, dtl.NewSink(got))
	if err != nil {
		t.Fatal(err)
	}
	if info.Size != 1<<30 {
		t.Fatalf("size %d", info.Size)
	}
	if n := sent(); n > 1<<20 {
		t.Errorf("sent %d bytes for 8 KiB of data", n)
	}
	return got
}

// CheckNoLeak runs f and checks that no goroutine it started outlives it
// (runtime goroutines, timers', get a few seconds to finish).
func CheckNoLeak(t *testing.T, f func()) {
	before := runtime.NumGoroutine()
	f()
	poll.Within(5*time.Second, func() bool { return runtime.NumGoroutine() <= before })
	if after := runtime.NumGoroutine(); after > before {
		buf := make([]byte, 1<<20)
		t.Errorf("%d goroutines before, %d after:\n%s", before, after, buf[:runtime.Stack(buf, true)])
	}
}

// FetchAsync starts fetching p from addr into a new destination file; the
// Fetch's error arrives on done.
func FetchAsync(t testing.TB, ctx context.Context, client dtl.Transport, addr, p string, done chan<- error) {
	dst := Dst(t)
	go func() {
		_, err := client.Fetch(ctx, addr, dtl.Request{Path: p}, dtl.NewSink(dst))
		done <- err
	}()
}

// FetchAllAsync starts fetching each of paths from addr, as FetchAsync
// does; the Fetches' errors arrive on the channel it returns.
func FetchAllAsync(t testing.TB, ctx context.Context, client dtl.Transport, addr string, paths ...string) <-chan error {
	done := make(chan error, len(paths))
	for _, p := range paths {
		FetchAsync(t, ctx, client, addr, p, done)
	}
	return done
}

// Feed waits for n transfers of a Stream to open it and writes size bytes
// into each pipe, so that they are under way. It returns the pipes, for
// the caller to close.
func Feed(writers <-chan *os.File, n, size int) []*os.File {
	ws := make([]*os.File, n)
	for i := range ws {
		ws[i] = <-writers
		ws[i].Write(make([]byte, size))
	}
	return ws
}

// Underway makes client, under ctx, fetch a small file from addr (serving
// src) five times, then start four transfers of a streamed file whose
// errors arrive on done, and feeds them so that they are under way. It
// returns the stream's pipes, for the caller to close.
func Underway(t *testing.T, ctx context.Context, client dtl.Transport, addr string, src *Source, done chan<- error) []*os.File {
	src.WriteFile("f", []byte("f"))
	writers := src.Stream("slow", 1<<30)
	for range 5 {
		if _, err := client.Fetch(ctx, addr, dtl.Request{Path: "f"}, dtl.NewSink(Dst(t))); err != nil {
			t.Fatal(err)
		}
	}
	for range 4 {
		FetchAsync(t, ctx, client, addr, "slow", done)
	}
	return Feed(writers, 4, 10000)
}

// CloseAll closes files, ignoring errors (for a defer).
func CloseAll(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}

// CheckShrunkFile checks that client does not receive as complete a file
// shorter than server's Source describes it.
func CheckShrunkFile(t *testing.T, server, client dtl.Transport) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "f"), make([]byte, 3<<20), 0o644)
	if err := server.Serve(lyingSource{dir: dir, size: 4 << 20}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	_, err := client.Fetch(ctx, server.Addr(), dtl.Request{Path: "f"}, dtl.NewSink(Dst(t)))
	if err == nil {
		t.Fatal("a file shorter than described was received")
	}
	t.Log(err)
}

// lyingSource serves the files of dir described with a wrong size.
type lyingSource struct {
	dir  string
	size int64
}

func (l lyingSource) Unchanged(*os.File, dtl.FileInfo) error { return nil }

func (l lyingSource) OpenPublished(ctx context.Context, req dtl.Request) (*os.File, dtl.FileInfo, error) {
	f, err := os.Open(filepath.Join(l.dir, req.Path))
	if err != nil {
		return nil, dtl.FileInfo{}, dtl.ErrNotFound
	}
	return f, dtl.FileInfo{Size: l.size, Mode: 0o100644, Generation: 1}, nil
}

// PublishRandom writes size random bytes to p in src and publishes them,
// hashed once as a producer does.
func PublishRandom(tb testing.TB, src *Source, p string, size int) {
	data := make([]byte, size)
	rand.Read(data)
	if err := src.WriteFile(p, data); err != nil {
		tb.Fatal(err)
	}
	if err := src.Publish(p); err != nil {
		tb.Fatal(err)
	}
}
