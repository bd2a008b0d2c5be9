//go:build ucx

package ucx

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dyadfs/dyadfs/dtl"
	"github.com/dyadfs/dyadfs/dtl/wire"
)

// Built tells whether this binary was built with UCX (the ucx build tag).
const Built = true

// Tuning. bench_test.go measures the choices.
const (
	// chunkSize is the size of a data chunk and of a pool buffer.
	chunkSize = 1 << 20
	// sendSlots and recvSlots size the two pools. A daemon serves and
	// fetches at once: separate pools keep its sends (held until the
	// peer pulls) from starving its receives, and two daemons fetching
	// from each other from deadlocking.
	sendSlots = 32
	recvSlots = 32
	// window bounds the chunks of one transfer in flight, so that many
	// transfers share the pools.
	window = 8
	// pulls bounds the chunks of one transfer a consumer receives at once.
	// Chunks pulled together share the link, and a stalled transfer is
	// one that completes no chunk within the stall timeout: with the
	// whole window pulled at once over a slow link (8 MiB at 2 MB/s), no
	// chunk completes for seconds although bytes flow. Two keep one
	// rendezvous handshake overlapped with the other chunk's data.
	pulls = 2
	// inlineMax: files up to this size travel whole in one eager message
	// with their description (one message each way).
	inlineMax = 32 << 10
	// maxHandshaking bounds the peers authenticating at once.
	maxHandshaking = 256
	// idleTTL: a consumer closes an endpoint idle for longer; serverIdle:
	// an owner closes one that sends no request for longer. The owner
	// waits longer, so that a consumer rarely sends on an endpoint the
	// owner is closing (and when it does, it retries once).
	idleTTL    = 60 * time.Second
	serverIdle = 2 * idleTTL
)

// tuning is what tests may change.
type tuning struct {
	// ucx overrides UCX options (ucp_config_modify), such as TLS.
	ucx                  map[string]string
	chunk                int
	sendSlots, recvSlots int
	window               int
	pulls                int
	idleTTL, serverIdle  time.Duration
}

func defaultTuning() tuning {
	return tuning{
		chunk: chunkSize, sendSlots: sendSlots, recvSlots: recvSlots, window: window, pulls: pulls,
		idleTTL: idleTTL, serverIdle: serverIdle,
	}
}

// handlerFunc answers peers' messages (see dtl.MessageHandler).
type handlerFunc = func(ctx context.Context, from string, msg []byte) ([]byte, error)

// Transport is the UCX backend of dtl.Transport and dtl.Messenger. One
// value serves and fetches for a daemon.
type Transport struct {
	cfg dtl.Config
	log *slog.Logger
	tun tuning

	// ctx ends with Close; requests to the Source and message handlers
	// run under it.
	ctx    context.Context
	cancel context.CancelFunc
	// wg counts Fetch and Message calls, serving goroutines and message
	// handlers; Close waits for them before the worker frees anything.
	wg sync.WaitGroup

	mu      sync.Mutex
	closed  bool
	serving bool
	addr    string

	// handler answers messages: the served Source's, if it answers them.
	handler atomic.Pointer[handlerFunc]

	w     *worker
	stats wire.Counters
}

var (
	_ dtl.Transport = (*Transport)(nil)
	_ dtl.Messenger = (*Transport)(nil)
)

// New returns a Transport for cfg. It creates the UCP context and worker
// (so that a machine where UCX cannot run says so at once); it listens
// only on Serve.
func New(cfg dtl.Config) (*Transport, error) {
	return newTransport(cfg, defaultTuning())
}

func newTransport(cfg dtl.Config, tun tuning) (*Transport, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if len(cfg.Node) > maxNode {
		return nil, fmt.Errorf("ucx transport: node id of %d bytes is longer than the %d the protocol carries", len(cfg.Node), maxNode)
	}
	cfg.Secret = append([]byte(nil), cfg.Secret...)
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t := &Transport{cfg: cfg, log: log.With("transport", "ucx"), tun: tun, ctx: ctx, cancel: cancel}
	w, err := startWorker(t)
	if err != nil {
		cancel()
		var se *StatusError
		if errors.As(err, &se) {
			return nil, fmt.Errorf("ucx transport: %w", err)
		}
		return nil, err
	}
	t.w = w
	return t, nil
}

// Serve listens on cfg.Listen and answers peers with files from src until
// Close. It returns once it listens.
func (t *Transport) Serve(src dtl.Source) error {
	if src == nil {
		return errors.New("ucx transport: nil source")
	}
	ap, err := resolve(t.ctx, t.cfg.Listen, true)
	if err != nil {
		return fmt.Errorf("ucx transport: listen address %q: %w", t.cfg.Listen, err)
	}
	t.mu.Lock()
	switch {
	case t.closed:
		t.mu.Unlock()
		return errClosed
	case t.serving:
		t.mu.Unlock()
		return errors.New("ucx transport: already serving")
	}
	t.serving = true
	t.mu.Unlock()
	if h, ok := src.(dtl.MessageHandler); ok {
		f := handlerFunc(h.HandleMessage)
		t.handler.Store(&f)
	}
	var port uint16
	ran := t.w.do(func(w *worker) { port, err = w.listen(ap, src) })
	if !ran {
		err = errClosed
	}
	if err != nil {
		t.mu.Lock()
		t.serving = false
		t.mu.Unlock()
		return err
	}
	addr := t.cfg.Advertise
	if addr == "" {
		addr = advertise(ap.Addr(), port)
	}
	t.mu.Lock()
	t.addr = addr
	t.mu.Unlock()
	t.log.Info("serving files", "listen", netip.AddrPortFrom(ap.Addr(), port).String(), "addr", addr)
	return nil
}

// Addr is the address peers reach Serve at: cfg.Advertise if set, else the
// listening address, with the port the system chose for ":0" and, for an
// unspecified host, the machine's first non-loopback IPv4 address.
func (t *Transport) Addr() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.addr
}

// Stats returns the counters and the state of the buffer pools.
func (t *Transport) Stats() Stats {
	w := t.w
	return Stats{
		Stats:     t.stats.Load(),
		SendSlots: w.sendPool.n, SendFree: w.sendPool.freeSlots(),
		RecvSlots: w.recvPool.n, RecvFree: w.recvPool.freeSlots(),
		Endpoints: w.nEndpoints.Load(), InFlight: w.nInFlight.Load(),
	}
}

// Close stops listening, ends the transfers in progress in both
// directions (their callers get an error that is net.ErrClosed), closes
// every endpoint, waits until every Fetch, Message, serving goroutine and
// message handler has returned and UCX has completed every request, and
// frees everything. It may be called more than once.
func (t *Transport) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		<-t.w.done
		return nil
	}
	t.closed = true
	t.mu.Unlock()
	t.cancel()
	t.w.do(func(w *worker) { w.shutdown() })
	t.wg.Wait()
	t.w.do(func(w *worker) { w.exit() })
	<-t.w.done
	return nil
}

// listen opens the UCP listener (on the worker).
func (w *worker) listen(ap netip.AddrPort, src dtl.Source) (uint16, error) {
	if w.closing {
		return 0, errClosed
	}
	ip := ap.Addr().String()
	port, err := w.createListener(ip, ap.Port())
	if err != nil {
		return 0, fmt.Errorf("ucx transport: listen on %s: %w", net.JoinHostPort(ip, strconv.Itoa(int(ap.Port()))), err)
	}
	w.src = src
	return port, nil
}

// advertise is the address to publish for a listener on host.
func advertise(host netip.Addr, port uint16) string {
	h := host.String()
	if host.IsUnspecified() {
		h = dtl.FirstIPv4()
	}
	return net.JoinHostPort(h, strconv.Itoa(int(port)))
}

// endpointInfo describes the endpoint to addr, its lanes included (for
// tests and debugging).
func (t *Transport) endpointInfo(addr string) string {
	var s string
	t.w.do(func(w *worker) { s = w.epInfo(addr) })
	return s
}
