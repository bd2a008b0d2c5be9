// Package tcp is dyadfs's TCP data transport (--dtl tcp), built on the
// standard library alone. Besides files it carries daemons' small messages
// (dtl.Messenger) on the same connections.
//
// A consumer's daemon keeps a few authenticated connections to each owner
// it fetches from and sends one request at a time on each; an owner answers
// every connection in its own goroutine. Files stream in chunks: only the
// data extents of sparse files travel, the owner sends with sendfile and the
// consumer receives with splice, so no file is ever held in memory and sizes
// are 64-bit throughout. Every read and write on a connection has a deadline
// renewed per chunk, so a silent peer fails a transfer within the stall
// timeout; a caller's context ends a transfer at once. protocol.go describes
// the wire format, auth.go the handshake.
package tcp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dyadfs/dyadfs/dtl"
	"github.com/dyadfs/dyadfs/dtl/wire"
)

// Tuning. Only the server idle timeout is a field (tests shorten it).
const (
	// chunkSize is how much data a server sends per chunk, and so per
	// renewal of the write deadline.
	chunkSize = 1 << 20
	// piece is how much a client receives per renewal of the read
	// deadline.
	piece = 1 << 20
	// smallChunk: chunks up to this size are read into the connection's
	// buffer and go out with the frames around them in one write;
	// larger ones go with sendfile.
	smallChunk = 32 << 10
	// bufSize is the size of each connection's read and write buffers.
	bufSize = 64 << 10
	// maxIdlePerAddr and maxIdle bound the pool of idle connections.
	maxIdlePerAddr = 16
	maxIdle        = 256
	// idleTTL: a client drops a connection idle for longer; serverIdle:
	// a server closes a connection that sends no request for longer.
	// The server waits longer, so that a client rarely picks a connection
	// the server is closing (and when it does, it retries once).
	idleTTL    = 60 * time.Second
	serverIdle = 2 * idleTTL
)

// errClosed is returned by a Transport that is closed.
var errClosed = fmt.Errorf("tcp transport: %w", net.ErrClosed)

// Stats counts what a Transport did. All counters only grow.
type Stats = wire.Stats

// handlerFunc answers peers' messages (see dtl.MessageHandler).
type handlerFunc = func(ctx context.Context, from string, msg []byte) ([]byte, error)

// Transport is the TCP backend of dtl.Transport. It serves and fetches;
// one value does both for a daemon.
type Transport struct {
	cfg dtl.Config
	log *slog.Logger

	// ctx ends with Close; requests to the Source run under it.
	ctx    context.Context
	cancel context.CancelFunc

	// wg counts the accept loop, connection goroutines, Fetch and Message
	// calls;
	// Close waits for them all.
	wg sync.WaitGroup

	mu      sync.Mutex
	closed  bool
	ln      net.Listener
	src     dtl.Source
	addr    string
	serving map[*serverConn]struct{}
	// handshaking bounds the connections that have not authenticated yet.
	handshaking chan struct{}
	active      map[*clientConn]struct{} // client connections in use by a Fetch
	idle        map[string][]*clientConn // pooled client connections, oldest first
	nIdle       int

	// handler answers messages: the served Source's, if it answers them.
	handler atomic.Pointer[handlerFunc]

	stats wire.Counters

	// serverIdle is how long a server waits for the next request (tests
	// shorten it).
	serverIdle time.Duration
}

var (
	_ dtl.Transport = (*Transport)(nil)
	_ dtl.Messenger = (*Transport)(nil)
)

// maxHandshaking bounds the connections authenticating at once.
const maxHandshaking = 256

// New returns a Transport for cfg; it does nothing until Serve or Fetch.
func New(cfg dtl.Config) (*Transport, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if len(cfg.Node) > maxNode {
		return nil, fmt.Errorf("tcp transport: node id of %d bytes is longer than the %d the protocol carries", len(cfg.Node), maxNode)
	}
	cfg.Secret = append([]byte(nil), cfg.Secret...)
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Transport{
		cfg:         cfg,
		log:         log.With("transport", "tcp"),
		ctx:         ctx,
		cancel:      cancel,
		serving:     make(map[*serverConn]struct{}),
		handshaking: make(chan struct{}, maxHandshaking),
		active:      make(map[*clientConn]struct{}),
		idle:        make(map[string][]*clientConn),
		serverIdle:  serverIdle,
	}, nil
}

// Serve listens on cfg.Listen and answers peers with files from src until
// Close. It returns once it listens.
func (t *Transport) Serve(src dtl.Source) error {
	if src == nil {
		return errors.New("tcp transport: nil source")
	}
	if h, ok := src.(dtl.MessageHandler); ok {
		f := handlerFunc(h.HandleMessage)
		t.handler.Store(&f)
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(t.ctx, "tcp", t.cfg.Listen)
	if err != nil {
		return fmt.Errorf("tcp transport: %w", err)
	}
	addr := t.cfg.Advertise
	if addr == "" {
		addr = advertise(t.cfg.Listen, ln.Addr())
	}
	t.mu.Lock()
	if t.closed || t.ln != nil {
		closed := t.closed
		t.mu.Unlock()
		ln.Close()
		if closed {
			return errClosed
		}
		return errors.New("tcp transport: already serving")
	}
	t.ln, t.src, t.addr = ln, src, addr
	t.wg.Add(1)
	t.mu.Unlock()
	go t.acceptLoop(ln, src)
	t.log.Info("serving files", "listen", ln.Addr().String(), "addr", addr)
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

// Stats returns the counters.
func (t *Transport) Stats() Stats {
	return t.stats.Load()
}

// Close stops listening, closes idle connections, ends the transfers in
// progress in both directions and waits until every goroutine of the
// transport (message handlers included), and every Fetch and Message, has
// returned. It may be called more than once.
func (t *Transport) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		t.wg.Wait()
		return nil
	}
	t.closed = true
	ln := t.ln
	var serving []*serverConn
	for sc := range t.serving {
		serving = append(serving, sc)
	}
	var clients []*clientConn
	for cc := range t.active {
		clients = append(clients, cc)
	}
	for _, list := range t.idle {
		clients = append(clients, list...)
	}
	t.idle, t.nIdle = nil, 0
	t.mu.Unlock()

	t.cancel()
	if ln != nil {
		ln.Close()
	}
	for _, sc := range serving {
		sc.abort()
	}
	for _, cc := range clients {
		cc.conn.Close()
	}
	t.wg.Wait()
	return nil
}

func (t *Transport) isClosed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.closed
}

// advertise is the address to publish for a listener opened on listen.
func advertise(listen string, actual net.Addr) string {
	_, port, err := net.SplitHostPort(actual.String())
	if err != nil {
		return actual.String()
	}
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		host = ""
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = dtl.FirstIPv4()
	}
	return net.JoinHostPort(host, port)
}
