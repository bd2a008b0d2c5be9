//go:build ucx

package ucx

import (
	"bytes"
	"context"
	"crypto/rand"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/dyadfs/dyadfs/dtl"
	"github.com/dyadfs/dyadfs/dtl/dtltest"
)

// wires are the UCX transports a test runs over (UCX_TLS): TCP, and what
// a site sets for daemons of one host (shared memory, with TCP to connect:
// chunks then move by CMA, see doc.go).
var wires = map[string]string{
	"tcp": "tcp",
	"shm": "sm,tcp",
}

type opts struct {
	node        string // default: "node-" and the test's name
	tls         string // UCX_TLS; default tcp
	stall, dial time.Duration
	listen      string
	advertise   string
	ucx         map[string]string // more UCX options
	tune        func(*tuning)
}

// testTransport returns a transport on 127.0.0.1:0, closed at the end of
// the test, and its log.
func testTransport(t testing.TB, secret []byte, o opts) (*Transport, *dtltest.LogBuf) {
	t.Helper()
	cfg, lb := dtltest.Config(t, secret, dtltest.Options{Node: o.node, Listen: o.listen, Advertise: o.advertise, Stall: o.stall, Dial: o.dial})
	tun := defaultTuning()
	tun.ucx = map[string]string{"TLS": "tcp"}
	if o.tls != "" {
		tun.ucx["TLS"] = o.tls
	}
	for k, v := range o.ucx {
		tun.ucx[k] = v
	}
	if o.tune != nil {
		o.tune(&tun)
	}
	tr, err := newTransport(cfg, tun)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		tr.Close()
		if t.Failed() {
			t.Logf("log of %s:\n%s", cfg.Node, lb)
		}
	})
	return tr, lb
}

func ctxFor(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// served is a server on a fresh dtltest.Source.
func served(t testing.TB, secret []byte, o opts) (*Transport, *dtltest.Source, *dtltest.LogBuf) {
	t.Helper()
	server, lb := testTransport(t, secret, o)
	return server, dtltest.Serving(t, server), lb
}

// onEachWire runs test as a subtest on each wire, named after it, with its
// UCX_TLS.
func onEachWire(t *testing.T, test func(t *testing.T, tls string)) {
	for name, tls := range wires {
		t.Run(name, func(t *testing.T) { test(t, tls) })
	}
}

// TestSmoke fetches a small and a chunked file on each wire, and shows
// the lanes UCX chose (go test -v).
func TestSmoke(t *testing.T) {
	onEachWire(t, func(t *testing.T, tls string) {
		server, client, src := dtltest.Pair(t, opts{tls: tls}, testTransport)
		data := make([]byte, 5<<20+3)
		rand.Read(data)
		src.WriteFile("big", data)
		src.WriteFile("small", []byte("hello"))
		for _, p := range []string{"small", "big", "small"} {
			dst := dtltest.Dst(t)
			start := time.Now()
			info, err := client.Fetch(ctxFor(t), server.Addr(), dtl.Request{Path: p}, dtl.NewSink(dst))
			if err != nil {
				t.Fatal(err)
			}
			got, _ := os.ReadFile(dst.Name())
			want, _ := os.ReadFile(src.Root() + "/" + p)
			if !bytes.Equal(got, want) {
				t.Fatalf("%s differs", p)
			}
			t.Logf("%s: %d bytes in %v", p, info.Size, time.Since(start))
		}
		t.Logf("client %+v", client.Stats())
		t.Logf("server %+v", server.Stats())
		t.Logf("the endpoint UCX made:\n%s", client.endpointInfo(server.Addr()))
	})
}

// TestSharedMemoryOnOneHost: between daemons of one host with
// UCX_TLS=sm,tcp, the endpoint (which handles peer failures) moves chunks
// through shared memory: its bulk lane is CMA, not TCP loopback.
func TestSharedMemoryOnOneHost(t *testing.T) {
	server, client, src := dtltest.Pair(t, opts{tls: wires["shm"]}, testTransport)
	data := make([]byte, 3<<20)
	rand.Read(data)
	src.WriteFile("f", data)
	dst := dtltest.Dst(t)
	if _, err := client.Fetch(ctxFor(t), server.Addr(), dtl.Request{Path: "f"}, dtl.NewSink(dst)); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(dst.Name()); !bytes.Equal(got, data) {
		t.Fatal("content differs")
	}
	info := client.endpointInfo(server.Addr())
	var bulk []string
	for _, line := range strings.Split(info, "\n") {
		if strings.Contains(line, "rma_bw") {
			if strings.Contains(line, "cma/") {
				return
			}
			bulk = append(bulk, strings.TrimSpace(strings.TrimLeft(line, "# ")))
		}
	}
	if scope, err := os.ReadFile("/proc/sys/kernel/yama/ptrace_scope"); err == nil && strings.TrimSpace(string(scope)) != "0" {
		t.Skipf("skipping: CMA needs ptrace between the daemons, which kernel.yama.ptrace_scope=%s forbids", strings.TrimSpace(string(scope)))
	}
	t.Fatalf("bulk lanes %q, want CMA; the endpoint:\n%s", bulk, info)
}

func TestConformance(t *testing.T) {
	onEachWire(t, func(t *testing.T, tls string) {
		dtltest.Run(t, func(t *testing.T) (dtl.Transport, dtl.Transport) {
			s := dtltest.NewSecret()
			server, _ := testTransport(t, s, opts{tls: tls})
			client, _ := testTransport(t, s, opts{tls: tls})
			return server, client
		})
	})
}
