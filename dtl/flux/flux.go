// Package flux is the data transport over Flux RPC (--dtl flux, DYAD's
// FLUX_RPC): requests and file data travel as Flux messages, routed by
// rank through the brokers' overlay, with no port of dyadfs's own to open.
//
// Each daemon registers a service ("<name>") on its broker; a peer is
// reached at the address "flux:<rank>". A fetch is an "open" request: the
// owner opens the file through its Source (which checks that it is
// published, complete, the version asked for and inside the backing
// directory) and answers with its description and its data extents; then
// read requests of at most chunk bytes, window of them in flight at once
// (Flux RPCs have no back-pressure: a window bounds what the brokers hold);
// then a "close", which checks that the file did not change meanwhile. A
// transfer that nobody reads for a while (its consumer went away) is
// closed by the owner. Messages (the locator's notices) are one request
// each.
//
// Every request carries its sender's node id and a token, an HMAC of it
// keyed with the job secret: a daemon of another job (or anything else on
// the instance) is refused before the Source sees anything. Flux's overlay
// authenticates and routes; the token binds requests to the job.
package flux

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dyadfs/dyadfs/dtl"
	fluxc "github.com/dyadfs/dyadfs/flux"
)

const (
	// chunk is the most a read request asks for: a Flux message of
	// 256 KiB to 1 MiB moves fastest.
	chunk = 1 << 20
	// window is how many reads a fetch has in flight.
	window = 8
	// maxExtents bounds the extents an open lists: past them, the rest
	// of the file is read as data.
	maxExtents = 4096
	tokenLen   = sha256.Size
)

// Transport is the Flux RPC backend of dtl.Transport and dtl.Messenger.
type Transport struct {
	cfg  dtl.Config
	h    *fluxc.Handle
	name string
	log  *slog.Logger
	tok  [tokenLen]byte // this node's token

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	svc     *fluxc.Service
	closed  bool
	src     dtl.Source
	handler dtl.MessageHandler
	tokens  map[string][tokenLen]byte // peers' expected tokens
	// transfers are the files open for consumers, by id.
	transfers map[uint64]*transfer
	nextID    uint64

	stats Stats
}

// transfer is a file open for a consumer.
type transfer struct {
	f       *os.File
	info    dtl.FileInfo
	regular bool
	from    string

	mu   sync.Mutex
	cond *sync.Cond
	next int64 // where a sequential file (a pipe) is read next
	used time.Time
	gone bool
}

// Stats counts what the transport did.
type Stats struct {
	Served, Refused, BytesSent, BytesRecv, Messages int64
}

var (
	_ dtl.Transport = (*Transport)(nil)
	_ dtl.Messenger = (*Transport)(nil)
)

// New makes the transport over handle h; its service is "<name>" (unique
// to the job on each broker). cfg.Listen and cfg.Advertise play no part.
func New(h *fluxc.Handle, name string, cfg dtl.Config) (*Transport, error) {
	if cfg.Listen == "" {
		cfg.Listen = "flux" // Validate wants one; Flux routes by rank
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if name == "" || strings.ContainsAny(name, ". ") {
		return nil, fmt.Errorf("flux transport: service name %q must be non-empty, without dots or spaces", name)
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	t := &Transport{cfg: cfg, h: h, name: name, log: log, tokens: make(map[string][tokenLen]byte),
		transfers: make(map[uint64]*transfer)}
	t.tok = token(cfg.Secret, cfg.Node)
	t.ctx, t.cancel = context.WithCancel(context.Background())
	return t, nil
}

// token is node's proof that it holds the job secret.
func token(secret []byte, node string) [tokenLen]byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("dyadfs-flux/1\x00"))
	m.Write([]byte(node))
	var t [tokenLen]byte
	m.Sum(t[:0])
	return t
}

// Addr is where peers reach this daemon: "flux:<rank>/<service>".
func (t *Transport) Addr() string {
	return "flux:" + strconv.FormatUint(uint64(t.h.Rank()), 10) + "/" + t.name
}

// endpoint reads a peer's address: its rank and service.
func endpoint(addr string) (uint32, string, error) {
	r, ok := strings.CutPrefix(addr, "flux:")
	r, svc, _ := strings.Cut(r, "/")
	n, err := strconv.ParseUint(r, 10, 32)
	if !ok || err != nil || svc == "" {
		return 0, "", fmt.Errorf("flux transport: address %q is not flux:<rank>/<service>: %w", addr, dtl.ErrUnavailable)
	}
	return uint32(n), svc, nil
}

// Serve implements dtl.Transport: it registers the service.
func (t *Transport) Serve(src dtl.Source) error {
	if src == nil {
		return errors.New("flux transport: nil source")
	}
	t.mu.Lock()
	if t.closed || t.svc != nil {
		t.mu.Unlock()
		return errors.New("flux transport: closed or serving already")
	}
	t.mu.Unlock()
	ctx, cancel := context.WithTimeout(t.ctx, 30*time.Second)
	defer cancel()
	svc, err := t.h.Serve(ctx, t.name)
	if err != nil {
		return fmt.Errorf("flux transport: register service %s on rank %d: %w", t.name, t.h.Rank(), err)
	}
	h, _ := src.(dtl.MessageHandler)
	t.mu.Lock()
	t.svc, t.src, t.handler = svc, src, h
	t.mu.Unlock()
	for method, fn := range map[string]func(string, []byte, fluxc.Request){
		"open": decoded(t.serveOpen), "read": decoded(t.serveRead), "close": decoded(t.serveClose), "msg": t.serveMsg,
	} {
		svc.Handle(method, t.guard(fn))
	}
	t.wg.Add(1)
	go t.janitor()
	return nil
}

// janitor closes the transfers nobody has read for a few stall timeouts:
// their consumers went away (the open answer, a read's, or the close got
// lost with them).
func (t *Transport) janitor() {
	defer t.wg.Done()
	tick := time.NewTicker(t.cfg.StallTimeout)
	defer tick.Stop()
	for {
		select {
		case <-t.ctx.Done():
			t.mu.Lock()
			all := t.transfers
			t.transfers = map[uint64]*transfer{}
			t.mu.Unlock()
			for _, x := range all {
				x.close()
			}
			return
		case <-tick.C:
		}
		var idle []*transfer
		t.mu.Lock()
		for id, x := range t.transfers {
			x.mu.Lock()
			old := time.Since(x.used) > 3*t.cfg.StallTimeout
			x.mu.Unlock()
			if old {
				delete(t.transfers, id)
				idle = append(idle, x)
			}
		}
		t.mu.Unlock()
		for _, x := range idle {
			x.close()
		}
	}
}

// close ends a transfer: a read waiting for its turn fails.
func (x *transfer) close() {
	x.mu.Lock()
	x.gone = true
	x.cond.Broadcast()
	x.mu.Unlock()
	x.f.Close()
}

// Close implements dtl.Transport.
func (t *Transport) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		t.wg.Wait()
		return nil
	}
	t.closed = true
	svc := t.svc
	t.mu.Unlock()
	t.cancel()
	if svc != nil {
		svc.Close()
	}
	t.wg.Wait()
	return nil
}

// Stats returns the counters.
func (t *Transport) Stats() Stats {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.stats
}

func (t *Transport) count(f func(*Stats)) {
	t.mu.Lock()
	f(&t.stats)
	t.mu.Unlock()
}

// Requests: u8 length and the sender's node id, its token, the body.
func (t *Transport) request(body []byte) []byte {
	b := make([]byte, 0, 1+len(t.cfg.Node)+tokenLen+len(body))
	b = append(b, byte(len(t.cfg.Node)))
	b = append(b, t.cfg.Node...)
	b = append(b, t.tok[:]...)
	return append(b, body...)
}

// guard checks a request's sender before fn sees its body.
func (t *Transport) guard(fn func(from string, body []byte, r fluxc.Request)) func(fluxc.Request) {
	return func(r fluxc.Request) {
		p := r.Payload()
		if len(p) < 1 || len(p) < 1+int(p[0])+tokenLen {
			refuse(r, codeProtocol, "short request")
			return
		}
		from := string(p[1 : 1+p[0]])
		got := p[1+int(p[0]) : 1+int(p[0])+tokenLen]
		t.mu.Lock()
		want, ok := t.tokens[from]
		if !ok {
			want = token(t.cfg.Secret, from)
			t.tokens[from] = want
		}
		t.mu.Unlock()
		if !hmac.Equal(got, want[:]) {
			t.count(func(s *Stats) { s.Refused++ })
			t.log.Warn("refused a request: its sender does not hold this job's secret", "node", from)
			refuse(r, codeUnauthorized, fmt.Sprintf("node %q could not prove it holds this job's secret", from))
			return
		}
		// Counted under the lock that Close takes: a request that
		// arrives while Close waits for the others is answered as by a
		// daemon that is gone (the transfer fails and is tried again),
		// not added to the count Close is waiting on; not as busy,
		// which would tell the consumer the file is being written.
		if err := t.enter(); err != nil {
			r.RespondError(syscall.ENOSYS, "the transport is closing")
			return
		}
		defer t.wg.Done()
		fn(from, p[1+int(p[0])+tokenLen:], r)
	}
}

// Refusals travel as an error response whose message begins with a code.
const (
	codeNotFound     = "notfound"
	codeNotPublished = "notpublished"
	codeBusy         = "busy"
	codeOutside      = "outside"
	codeUnauthorized = "unauthorized"
	codeUnreadable   = "unreadable"
	codeRefused      = "refused"
	codeProtocol     = "protocol"
	codeInternal     = "internal"
	codeWrongNode    = "wrongnode"
)

var codes = map[string]error{
	codeNotFound: dtl.ErrNotFound, codeNotPublished: dtl.ErrNotPublished, codeBusy: dtl.ErrBusy,
	codeOutside: dtl.ErrOutside, codeUnauthorized: dtl.ErrUnauthorized, codeUnreadable: dtl.ErrUnreadable,
	codeRefused: dtl.ErrRefused,
}

// codeOf is the code a Source's error is told with.
func codeOf(err error) string {
	for code, e := range codes {
		if errors.Is(err, e) {
			return code
		}
	}
	return codeInternal
}

func refuse(r fluxc.Request, code, msg string) {
	r.RespondError(syscall.EINVAL, code+": "+msg)
}

// remoteErr turns an error response into dtl's errors.
func remoteErr(op string, err error) error {
	var fe *fluxc.Error
	if errors.As(err, &fe) {
		if code, msg, ok := strings.Cut(fe.Msg, ": "); ok && fe.Errno == syscall.EINVAL {
			if target, ok := codes[code]; ok {
				return &dtl.RemoteError{Err: target, Msg: msg}
			}
			switch code {
			case codeWrongNode:
				return fmt.Errorf("flux transport: %s: %w: %s", op, dtl.ErrUnavailable, msg)
			case codeProtocol:
				return fmt.Errorf("flux transport: %s: %w: %s", op, dtl.ErrProtocol, msg)
			case codeInternal:
				return fmt.Errorf("flux transport: %s: the owner failed: %s", op, msg)
			}
		}
		switch fe.Errno {
		case syscall.ENOSYS, syscall.EHOSTUNREACH:
			// No daemon of the job on that rank (gone), or no broker.
			return fmt.Errorf("flux transport: %s: %w: %w", op, dtl.ErrUnavailable, err)
		}
	}
	return fmt.Errorf("flux transport: %s: %w", op, err)
}

// openReq is an open, read or close request.
type openReq struct {
	Path       string `json:"path,omitempty"`
	Generation uint64 `json:"gen,omitempty"`
	Owner      string `json:"owner,omitempty"`
	// ID names the transfer an open began (reads and the close).
	ID uint64 `json:"id,omitempty"`
	// Off and Len are a read's.
	Off int64 `json:"off,omitempty"`
	Len int64 `json:"len,omitempty"`
	// Check asks the close to check that the file did not change while
	// it was sent.
	Check bool `json:"check,omitempty"`
}

// openAns describes the file: its FileInfo and its data extents, and the
// transfer's id.
type openAns struct {
	ID      uint64       `json:"id"`
	Info    dtl.FileInfo `json:"info"`
	Extents [][2]int64   `json:"extents"`
}

// checkPath refuses, before the Source sees it, a path that is not clean
// and relative.
func checkPath(p string) error {
	if p == "" || p == "." || strings.IndexByte(p, 0) >= 0 || strings.HasPrefix(p, "/") {
		return fmt.Errorf("path %q: %w", p, dtl.ErrOutside)
	}
	for elem := range strings.SplitSeq(p, "/") {
		if elem == "" || elem == "." || elem == ".." {
			return fmt.Errorf("path %q is not clean: %w", p, dtl.ErrOutside)
		}
	}
	return nil
}

// decoded reads the body of a request about a file for fn, and refuses
// one that does not decode.
func decoded(fn func(from string, q openReq, r fluxc.Request)) func(string, []byte, fluxc.Request) {
	return func(from string, body []byte, r fluxc.Request) {
		var q openReq
		if err := json.Unmarshal(body, &q); err != nil {
			refuse(r, codeProtocol, err.Error())
			return
		}
		fn(from, q, r)
	}
}

func (t *Transport) serveOpen(from string, q openReq, r fluxc.Request) {
	if q.Owner != "" && q.Owner != t.cfg.Node {
		refuse(r, codeWrongNode, fmt.Sprintf("rank %d answers as node %q, not %q", t.h.Rank(), t.cfg.Node, q.Owner))
		return
	}
	if err := checkPath(q.Path); err != nil {
		t.count(func(s *Stats) { s.Refused++ })
		refuse(r, codeOutside, err.Error())
		return
	}
	f, info, err := t.src.OpenPublished(t.ctx, dtl.Request{Path: q.Path, Generation: q.Generation})
	if err != nil {
		if t.ctx.Err() != nil {
			r.RespondError(syscall.ENOSYS, "the transport is closing")
			return
		}
		t.count(func(s *Stats) { s.Refused++ })
		refuse(r, codeOf(err), err.Error())
		return
	}
	st, err := f.Stat()
	if err != nil || info.Size < 0 {
		f.Close()
		refuse(r, codeUnreadable, fmt.Sprintf("stat %s: %v", q.Path, err))
		return
	}
	x := &transfer{f: f, info: info, regular: st.Mode().IsRegular(), from: from, used: time.Now()}
	x.cond = sync.NewCond(&x.mu)
	ans := openAns{Info: info}
	if x.regular {
		if st.Size() != info.Size {
			f.Close()
			refuse(r, codeBusy, fmt.Sprintf("%s is %d bytes, its description says %d", q.Path, st.Size(), info.Size))
			return
		}
		ans.Extents = extents(f, info.Size)
	} else if info.Size > 0 {
		ans.Extents = [][2]int64{{0, info.Size}} // read as it comes
	}
	t.mu.Lock()
	if t.ctx.Err() != nil {
		t.mu.Unlock()
		f.Close()
		r.RespondError(syscall.ENOSYS, "the transport is closing")
		return
	}
	t.nextID++
	ans.ID = t.nextID
	t.transfers[ans.ID] = x
	t.mu.Unlock()
	b, _ := json.Marshal(ans)
	r.Respond(b)
}

// transferOf is the transfer a read or close names, if it is from from.
func (t *Transport) transferOf(id uint64, from string) *transfer {
	t.mu.Lock()
	defer t.mu.Unlock()
	x := t.transfers[id]
	if x == nil || x.from != from {
		return nil
	}
	return x
}

func (t *Transport) serveRead(from string, q openReq, r fluxc.Request) {
	x := t.transferOf(q.ID, from)
	if x == nil {
		if t.ctx.Err() != nil {
			r.RespondError(syscall.ENOSYS, "the transport is closing")
			return
		}
		refuse(r, codeProtocol, fmt.Sprintf("no transfer %d open for node %q (closed after a stall?)", q.ID, from))
		return
	}
	if q.Len <= 0 || q.Len > chunk || q.Off < 0 || q.Off > x.info.Size-q.Len {
		refuse(r, codeProtocol, fmt.Sprintf("read of %d bytes at %d of a %d-byte file", q.Len, q.Off, x.info.Size))
		return
	}
	buf := make([]byte, q.Len)
	var n int
	var err error
	if x.regular {
		x.mu.Lock()
		x.used = time.Now()
		x.mu.Unlock()
		n, err = x.f.ReadAt(buf, q.Off)
	} else {
		n, err = x.readInTurn(buf, q.Off)
	}
	if t.ctx.Err() != nil {
		r.RespondError(syscall.ENOSYS, "the transport is closing")
		return
	}
	if int64(n) < q.Len {
		if err == nil || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			refuse(r, codeBusy, fmt.Sprintf("%s ended at %d, before its described size", x.f.Name(), q.Off+int64(n)))
			return
		}
		refuse(r, codeUnreadable, fmt.Sprintf("read %s at %d: %v", x.f.Name(), q.Off, err))
		return
	}
	if err := r.Respond(buf); err == nil {
		t.count(func(s *Stats) { s.BytesSent += q.Len })
	}
}

// readInTurn reads a file that cannot seek (a pipe), whose reads must come
// in order: it waits until the reads before off are done.
func (x *transfer) readInTurn(buf []byte, off int64) (int, error) {
	x.mu.Lock()
	for x.next != off && !x.gone {
		x.cond.Wait()
	}
	if x.gone {
		x.mu.Unlock()
		return 0, os.ErrClosed
	}
	x.used = time.Now()
	x.mu.Unlock()
	n, err := io.ReadFull(x.f, buf)
	x.mu.Lock()
	x.next += int64(n)
	x.used = time.Now()
	x.cond.Broadcast()
	x.mu.Unlock()
	return n, err
}

func (t *Transport) serveClose(from string, q openReq, r fluxc.Request) {
	x := t.transferOf(q.ID, from)
	if x == nil {
		refuse(r, codeProtocol, fmt.Sprintf("no transfer %d open for node %q", q.ID, from))
		return
	}
	t.mu.Lock()
	delete(t.transfers, q.ID)
	t.mu.Unlock()
	defer x.close()
	if !q.Check {
		r.Respond(nil)
		return
	}
	if err := t.src.Unchanged(x.f, x.info); err != nil {
		t.log.Info("file changed while it was sent; refused", "node", from, "path", x.f.Name(), "err", err)
		refuse(r, codeOf(err), err.Error())
		return
	}
	t.count(func(s *Stats) { s.Served++ })
	r.Respond(nil)
}

func (t *Transport) serveMsg(from string, body []byte, r fluxc.Request) {
	if len(body) < 1 || len(body) < 1+int(body[0]) {
		refuse(r, codeProtocol, "short message")
		return
	}
	if want := string(body[1 : 1+body[0]]); want != "" && want != t.cfg.Node {
		refuse(r, codeWrongNode, fmt.Sprintf("rank %d answers as node %q, not %q", t.h.Rank(), t.cfg.Node, want))
		return
	}
	body = body[1+int(body[0]):]
	t.mu.Lock()
	h := t.handler
	t.mu.Unlock()
	if h == nil {
		refuse(r, codeRefused, fmt.Sprintf("node %q handles no messages", t.cfg.Node))
		return
	}
	reply, err := h.HandleMessage(t.ctx, from, body)
	if err != nil {
		code := codeOf(err)
		if code == codeInternal {
			code = codeRefused
		}
		refuse(r, code, err.Error())
		return
	}
	if len(reply) > dtl.MaxMessage {
		refuse(r, codeRefused, fmt.Sprintf("the handler's reply of %d bytes exceeds the %d-byte limit", len(reply), dtl.MaxMessage))
		return
	}
	r.Respond(reply)
}

// enter counts a call in progress, unless the transport is closed.
func (t *Transport) enter() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return fmt.Errorf("flux transport: closed")
	}
	t.wg.Add(1)
	return nil
}

// rpc sends one request to service svc at rank, bounded by the stall
// timeout.
func (t *Transport) rpc(ctx context.Context, rank uint32, svc, method string, body []byte) ([]byte, error) {
	reply, err := t.h.RPC(ctx, svc+"."+method, rank, t.request(body), t.cfg.StallTimeout)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, remoteErr(method+" at rank "+strconv.FormatUint(uint64(rank), 10), err)
	}
	return reply, nil
}

// Fetch implements dtl.Transport.
func (t *Transport) Fetch(ctx context.Context, addr string, req dtl.Request, dst *dtl.Sink) (dtl.FileInfo, error) {
	if !dst.Valid() {
		return dtl.FileInfo{}, errors.New("flux transport: nil destination file")
	}
	if err := t.enter(); err != nil {
		return dtl.FileInfo{}, err
	}
	defer t.wg.Done()
	rank, svc, err := endpoint(addr)
	if err != nil {
		return dtl.FileInfo{}, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(t.ctx, cancel)
	defer stop()
	q := openReq{Path: req.Path, Generation: req.Generation, Owner: req.Owner}
	body, _ := json.Marshal(q)
	raw, err := t.rpc(ctx, rank, svc, "open", body)
	if err != nil {
		return dtl.FileInfo{}, err
	}
	var ans openAns
	if err := json.Unmarshal(raw, &ans); err != nil {
		return dtl.FileInfo{}, fmt.Errorf("flux transport: open %s: %w: %v", req.Path, dtl.ErrProtocol, err)
	}
	info := ans.Info
	q = openReq{ID: ans.ID}
	finished := false
	defer func() {
		if !finished {
			// Let the owner close it now (else its janitor does).
			b, _ := json.Marshal(q)
			go t.h.RPC(t.ctx, svc+".close", rank, t.request(b), t.cfg.StallTimeout)
		}
	}()
	// The reads: every extent, in chunks, window of them at once.
	type piece struct{ off, n int64 }
	pieces := make(chan piece)
	errc := make(chan error, window)
	var wg sync.WaitGroup
	for range window {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for p := range pieces {
				rq := q
				rq.Off, rq.Len = p.off, p.n
				b, _ := json.Marshal(rq)
				data, err := t.rpc(ctx, rank, svc, "read", b)
				if err == nil && int64(len(data)) != p.n {
					err = fmt.Errorf("flux transport: read %s: %w: %d bytes at %d, %d asked", req.Path, dtl.ErrProtocol, len(data), p.off, p.n)
				}
				if err == nil {
					_, err = dst.WriteAt(data, p.off)
				}
				if err != nil {
					errc <- err
					cancel()
					return
				}
				t.count(func(s *Stats) { s.BytesRecv += p.n })
			}
		}()
	}
send:
	for _, e := range ans.Extents {
		if e[0] < 0 || e[1] <= 0 || e[0] > info.Size-e[1] {
			errc <- fmt.Errorf("flux transport: open %s: %w: extent %v of a %d-byte file", req.Path, dtl.ErrProtocol, e, info.Size)
			cancel()
			break
		}
		lo, hi := e[0], e[0]+e[1]
		if req.Len > 0 {
			// A range: only its part of the extent.
			lo, hi = max(lo, req.Off), min(hi, req.Off+req.Len)
		}
		for off := lo; off < hi; off += chunk {
			select {
			case pieces <- piece{off, min(chunk, hi-off)}:
			case <-ctx.Done():
				break send
			}
		}
	}
	close(pieces)
	wg.Wait()
	select {
	case err := <-errc:
		if t.ctx.Err() != nil {
			return dtl.FileInfo{}, fmt.Errorf("flux transport: closed: %w", err)
		}
		return dtl.FileInfo{}, err
	default:
	}
	if err := ctx.Err(); err != nil {
		return dtl.FileInfo{}, err
	}
	q.Check = true
	b, _ := json.Marshal(q)
	finished = true
	if _, err := t.rpc(ctx, rank, svc, "close", b); err != nil {
		return dtl.FileInfo{}, err
	}
	if req.Len == 0 {
		if err := dst.Truncate(info.Size); err != nil {
			return dtl.FileInfo{}, err
		}
	}
	return info, nil
}

// FetchesRanges implements dtl.RangeFetcher: the reads are the range's.
func (t *Transport) FetchesRanges() bool { return true }

// Message implements dtl.Messenger.
func (t *Transport) Message(ctx context.Context, addr, node string, msg []byte) ([]byte, error) {
	if len(msg) > dtl.MaxMessage {
		return nil, fmt.Errorf("flux transport: message of %d bytes to %s exceeds the %d-byte limit", len(msg), addr, dtl.MaxMessage)
	}
	if err := t.enter(); err != nil {
		return nil, err
	}
	defer t.wg.Done()
	rank, svc, err := endpoint(addr)
	if err != nil {
		return nil, err
	}
	// The node expected there goes first: another daemon on that rank
	// refuses the message.
	body := make([]byte, 0, 1+len(node)+len(msg))
	body = append(append(append(body, byte(len(node))), node...), msg...)
	reply, err := t.rpc(ctx, rank, svc, "msg", body)
	if err != nil {
		return nil, err
	}
	t.count(func(s *Stats) { s.Messages++ })
	return reply, nil
}

// extents lists f's data extents in its first size bytes (SEEK_DATA,
// SEEK_HOLE); where the filesystem cannot tell, or past maxExtents, the
// rest is data.
func extents(f *os.File, size int64) [][2]int64 {
	var out [][2]int64
	fd := int(f.Fd())
	for off := int64(0); off < size; {
		if len(out) == maxExtents {
			return append(out, [2]int64{off, size - off})
		}
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		switch {
		case errors.Is(err, unix.ENXIO):
			return out // a hole to the end
		case err != nil:
			return append(out, [2]int64{off, size - off})
		case data >= size:
			return out
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil || hole <= data || hole > size {
			hole = size
		}
		out = append(out, [2]int64{data, hole - data})
		off = hole
	}
	return out
}
