// Package dtl is the data transport layer: it moves the bytes of a
// published file from the daemon that owns it to a daemon that wants it.
//
// One interface, Transport, fits every backend: DYAD's Flux streaming RPC,
// UCX and Margo, and dyadfs's TCP. A consumer asks an owner for a path and
// receives the file into a file it provides; an owner serves only published,
// complete files of its own backing store (Source). The orchestration every
// backend shares (temporary file, verification, rename into place, one
// transfer per path, retries, dead owners) lives in Fetcher, once.
package dtl

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/dyadfs/dyadfs/internal/digest"
)

// Request asks an owner for a file.
type Request struct {
	// Path is clean and relative to the managed directory.
	Path string
	// Generation is the record generation the consumer located (0: any).
	// An owner serves its current version, at least this one; the reply
	// says which.
	Generation uint64
	// Owner is the node the consumer means to ask (empty: whoever answers
	// at the address). A daemon of another node at that address, one that
	// took the port of an owner that restarted elsewhere, is not asked.
	Owner string
	// Off and Len, with Len > 0, ask for the bytes [Off, Off+Len) only
	// (clipped to the file), of a transport that FetchesRanges: the
	// reply describes the whole file, the destination receives only
	// those bytes at their offsets, and its size is left alone.
	Off, Len int64
}

// RangeFetcher is implemented by transports that honour Request.Off and
// Len. Others send whole files, and a consumer then fetches files whole.
type RangeFetcher interface {
	FetchesRanges() bool
}

// FetchesRanges reports whether t honours byte ranges.
func FetchesRanges(t Transport) bool {
	r, ok := t.(RangeFetcher)
	return ok && r.FetchesRanges()
}

// FileInfo describes the file an owner sends. The copy a consumer makes
// keeps its owner and group (HPC nodes share user ids), mode and mtime.
type FileInfo struct {
	Size       int64
	Mode       uint32
	Uid, Gid   uint32
	MtimeNs    int64
	Generation uint64
	// Checksum is the content's, computed by the owner when it published
	// the file (zero: none). The consumer checks the bytes it received
	// against it.
	Checksum digest.Sum
}

// Source is the serving side's view of its managed directory.
type Source interface {
	// OpenPublished opens the published, complete regular file req.Path
	// for reading, confined to the backing directory, and describes it.
	// It fails with ErrNotFound, ErrNotPublished, ErrBusy, ErrOutside or
	// ErrUnreadable.
	OpenPublished(ctx context.Context, req Request) (*os.File, FileInfo, error)
	// Unchanged reports, once the file was sent, whether it is still the
	// file described: a writer that opened it meanwhile may have changed
	// what was sent, and the consumer must not keep that.
	Unchanged(f *os.File, info FileInfo) error
}

// Transport is one backend.
type Transport interface {
	// Serve starts answering peers' requests with files from src and
	// returns once it listens. It runs until Close.
	Serve(src Source) error
	// Addr is the address peers reach Serve at (valid after Serve).
	Addr() string
	// Fetch asks the daemon at addr for req and writes the file into dst
	// (an empty file, through the Sink that hashes what arrives); holes
	// may stay holes, so dst's size is set with Truncate. It returns what
	// the owner sent, with the owner's checksum. Errors are *RemoteError when the owner refused, ErrUnavailable
	// when it could not be reached, or the transfer's cause otherwise.
	Fetch(ctx context.Context, addr string, req Request, dst *Sink) (FileInfo, error)
	// Close stops serving, ends transfers in progress and closes idle
	// connections.
	Close() error
}

// MaxMessage bounds a message and its reply.
const MaxMessage = 60 << 10

// Messenger is implemented by transports that also carry small messages
// between daemons (the locator's notices of publishes and waits).
//
// A message is delivered at most once per call, except in one case: a
// transport may retry a message once on a new connection when a pooled one
// turns out closed before any answer came (as Fetch does), and if the peer
// had handled the message and then died or closed before replying, it is
// handled twice. Handlers should be idempotent.
type Messenger interface {
	// Message sends msg to the daemon at addr and returns its reply. node,
	// when not empty, is the node expected at addr: another node answering
	// there fails the call with ErrUnavailable (as Request.Owner does).
	// Errors: *RemoteError when the peer's handler failed or it has none,
	// ErrUnavailable when the peer cannot be reached, ctx's error.
	// A message longer than MaxMessage is not sent.
	Message(ctx context.Context, addr, node string, msg []byte) ([]byte, error)
}

// MessageHandler answers peers' messages. A Source that is also a
// MessageHandler answers the messages its transport receives, if the
// transport is a Messenger; otherwise they are refused (ErrRefused).
type MessageHandler interface {
	// HandleMessage answers msg from node from, the node id the peer
	// announced in its authenticated handshake. It must not block for
	// long: it runs on the connection's goroutine. A returned error
	// reaches the sender as a *RemoteError: for ErrRefused, or for
	// whichever of the Err* values a Source returns (ErrNotFound, ...)
	// the error Is. A reply longer than MaxMessage is refused (ErrRefused)
	// in its place. msg is valid only until the handler returns; ctx ends
	// when the transport closes, and Close waits for handlers to return.
	HandleMessage(ctx context.Context, from string, msg []byte) ([]byte, error)
}

// Config is what every backend is configured with.
type Config struct {
	// Node is this daemon's node id.
	Node string
	// Listen is the address Serve listens on ("host:port").
	Listen string
	// Advertise is the address peers use; empty means Listen.
	Advertise string
	// Secret authenticates peers: a peer without it is refused before any
	// file is read. It must be at least 16 bytes.
	Secret []byte
	// DialTimeout bounds connecting to a peer.
	DialTimeout time.Duration
	// StallTimeout bounds how long a transfer may go without progress.
	StallTimeout time.Duration
	// Log receives one line per refused request and per failed transfer.
	Log *slog.Logger
}

// DefaultConfig returns the defaults; Node, Listen and Secret must be set.
func DefaultConfig() Config {
	return Config{DialTimeout: 5 * time.Second, StallTimeout: 10 * time.Second}
}

// Validate checks the configuration.
func (c Config) Validate() error {
	if c.Node == "" {
		return errors.New("transport: node id must not be empty")
	}
	if c.Listen == "" {
		return errors.New("transport: listen address must not be empty")
	}
	if len(c.Secret) < 16 {
		return errors.New("transport: the job secret must be at least 16 bytes")
	}
	if c.DialTimeout <= 0 || c.StallTimeout <= 0 {
		return errors.New("transport: timeouts must be positive")
	}
	return nil
}

// Errors a Source returns and an owner reports to the consumer.
var (
	ErrNotFound     = errors.New("no such file")
	ErrNotPublished = errors.New("file is not published")
	ErrBusy         = errors.New("file is being written")
	ErrOutside      = errors.New("path is outside the managed directory")
	// ErrUnauthorized: the peers do not share the job secret.
	ErrUnauthorized = errors.New("peer is not authorized (job secrets differ)")
	// ErrUnavailable: the owner could not be reached.
	ErrUnavailable = errors.New("owner unreachable")
	// ErrProtocol: the peer broke the protocol.
	ErrProtocol = errors.New("protocol error")
	// ErrRefused: a peer's message handler failed, or it has none, or its
	// reply was longer than MaxMessage (see Messenger).
	ErrRefused = errors.New("message refused")
	// ErrUnreadable: the owner cannot read its file (permission denied,
	// an I/O error of its disk). Asking again does not help.
	ErrUnreadable = errors.New("owner cannot read the file")
)

// RemoteError is a refusal reported by the owner (for a message, by the
// peer). Is matches the Err* value it stands for.
type RemoteError struct {
	Err error  // one of the Err* values above
	Msg string // the owner's explanation
}

func (e *RemoteError) Error() string { return fmt.Sprintf("owner refused: %v: %s", e.Err, e.Msg) }
func (e *RemoteError) Unwrap() error { return e.Err }
