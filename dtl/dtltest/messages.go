package dtltest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/dyadfs/dyadfs/dtl"
)

// MessageCounters are the counters of a transport the messenger suite
// checks: what a client dialed (connections or endpoints), reused and had
// replies to; what a server answered and refused.
type MessageCounters struct {
	Dials, Reused, Messages, Answered, Refused int64
}

// MessengerBackend is what the messenger suite needs of a backend.
type MessengerBackend struct {
	// New returns a transport of node holding secret, not serving yet,
	// closed at the end of the test. It must be a dtl.Messenger.
	New func(t *testing.T, node string, secret []byte) dtl.Transport
	// Counters reads a transport's counters.
	Counters func(tr dtl.Transport) MessageCounters
}

// RunMessenger runs the tests every dtl.Messenger passes: messages
// between two real transports of nodes "owner" (the server) and "asker".
func RunMessenger(t *testing.T, b MessengerBackend) {
	for _, c := range []struct {
		name string
		run  func(*testing.T, MessengerBackend)
	}{
		{"RoundTrip", messageRoundTrip},
		{"TooLong", messageTooLong},
		{"Refusals", messageRefusals},
		{"WrongNode", messageWrongNode},
		{"Unreachable", messageUnreachable},
	} {
		t.Run(c.name, func(t *testing.T) { c.run(t, b) })
	}
}

// handling is a Source whose messages a replaceable handler answers.
type handling struct {
	*Source
	h atomic.Pointer[func(ctx context.Context, from string, msg []byte) ([]byte, error)]
}

func (s *handling) HandleMessage(ctx context.Context, from string, msg []byte) ([]byte, error) {
	return (*s.h.Load())(ctx, from, msg)
}

// messaging is a server of node "owner" answering with h (none if nil)
// and a client of node "asker" holding the same secret.
func messaging(t *testing.T, b MessengerBackend, h func(ctx context.Context, from string, msg []byte) ([]byte, error)) (server dtl.Transport, client dtl.Messenger, src *handling) {
	t.Helper()
	server, c, src := serveMessages(t, b.New, h)
	return server, c.(dtl.Messenger), src
}

// Messaging is a server of node "owner" answering messages with h (none
// if nil), serving a fresh Source, and a client of node "asker" holding
// the same secret; open makes a transport of node, closed with the test.
func Messaging[T dtl.Transport](t *testing.T, open func(t *testing.T, node string, secret []byte) T, h func(ctx context.Context, from string, msg []byte) ([]byte, error)) (server, client T, src *Source) {
	t.Helper()
	server, client, hs := serveMessages(t, open, h)
	return server, client, hs.Source
}

func serveMessages[T dtl.Transport](t *testing.T, open func(t *testing.T, node string, secret []byte) T, h func(ctx context.Context, from string, msg []byte) ([]byte, error)) (server, client T, src *handling) {
	t.Helper()
	secret := NewSecret()
	server = open(t, "owner", secret)
	src = &handling{Source: NewSource(t.TempDir())}
	var serving dtl.Source = src.Source
	if h != nil {
		src.h.Store(&h)
		serving = src
	}
	if err := server.Serve(serving); err != nil {
		t.Fatal(err)
	}
	client = open(t, "asker", secret)
	return server, client, src
}

// Echo answers "from:" and the message, reversed.
func Echo(ctx context.Context, from string, msg []byte) ([]byte, error) {
	reply := make([]byte, 0, len(from)+1+len(msg))
	reply = append(append(reply, from...), ':')
	for i := len(msg) - 1; i >= 0; i-- {
		reply = append(reply, msg[i])
	}
	return reply, nil
}

// Patterned is n bytes of a pattern.
func Patterned(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i>>8)
	}
	return b
}

// messageRoundTrip: messages of every size up to dtl.MaxMessage reach the
// handler with the node id the client proved, their replies come back,
// and all go on one connection.
func messageRoundTrip(t *testing.T, b MessengerBackend) {
	server, client, src := messaging(t, b, Echo)
	ctx := ctxFor(t)
	// The reply is 6 bytes longer than the message.
	sizes := []int{0, 1, 100, 4096, 9000, dtl.MaxMessage - len("asker:")}
	for _, n := range sizes {
		msg := Patterned(n)
		for _, node := range []string{"", "owner"} {
			reply, err := client.Message(ctx, server.Addr(), node, msg)
			if err != nil {
				t.Fatalf("%d bytes to node %q: %v", n, node, err)
			}
			if want, _ := Echo(ctx, "asker", msg); !bytes.Equal(reply, want) {
				t.Fatalf("%d bytes to node %q: reply of %d bytes, want %d", n, node, len(reply), len(want))
			}
		}
	}
	// The largest message and the largest reply.
	largest := func(ctx context.Context, from string, msg []byte) ([]byte, error) {
		if len(msg) != dtl.MaxMessage || from != "asker" {
			return nil, fmt.Errorf("got %d bytes from %q", len(msg), from)
		}
		return bytes.Clone(msg), nil
	}
	src.h.Store(&largest)
	msg := Patterned(dtl.MaxMessage)
	reply, err := client.Message(ctx, server.Addr(), "owner", msg)
	if err != nil || !bytes.Equal(reply, msg) {
		t.Fatalf("MaxMessage: reply of %d bytes, %v", len(reply), err)
	}
	// Close waits for the server: its counters are final.
	client.(dtl.Transport).Close()
	server.Close()
	cs, ss := b.Counters(client.(dtl.Transport)), b.Counters(server)
	m := int64(2*len(sizes) + 1)
	if cs.Dials != 1 || cs.Reused != m-1 || cs.Messages != m || ss.Answered != m || ss.Refused != 0 {
		t.Errorf("client %+v server %+v: want 1 dial, %d reuses, %d messages answered", cs, ss, m-1, m)
	}
}

// messageTooLong: a message longer than dtl.MaxMessage is not sent.
func messageTooLong(t *testing.T, b MessengerBackend) {
	server, client, _ := messaging(t, b, Echo)
	_, err := client.Message(ctxFor(t), server.Addr(), "", make([]byte, dtl.MaxMessage+1))
	if err == nil || !strings.Contains(err.Error(), "limit") {
		t.Errorf("got %v, want the message refused for its size", err)
	}
	if st := b.Counters(client.(dtl.Transport)); st.Dials != 0 {
		t.Errorf("%+v: a message too long to send was sent", st)
	}
}

// messageRefusals: a handler's error, a reply too long and a server
// without a handler reach the caller as a *dtl.RemoteError, and the
// connection carries the next message.
func messageRefusals(t *testing.T, b MessengerBackend) {
	handler := func(ctx context.Context, from string, msg []byte) ([]byte, error) {
		switch string(msg) {
		case "fail":
			return []byte("ignored"), errors.New("the locator cannot take this")
		case "missing":
			return nil, fmt.Errorf("no record of x: %w", dtl.ErrNotFound)
		case "long":
			return make([]byte, dtl.MaxMessage+1), nil
		case "huge":
			return make([]byte, 2*dtl.MaxMessage), nil
		}
		return Echo(ctx, from, msg)
	}
	for _, c := range []struct {
		name    string
		handler func(ctx context.Context, from string, msg []byte) ([]byte, error)
		msg     string
		want    error
		says    string // what the error must mention
	}{
		{"HandlerError", handler, "fail", dtl.ErrRefused, "the locator cannot take this"},
		{"HandlerDtlError", handler, "missing", dtl.ErrNotFound, "no record of x"},
		{"ReplyTooLong", handler, "long", dtl.ErrRefused, "exceeds"},
		{"ReplyFarTooLong", handler, "huge", dtl.ErrRefused, "exceeds"},
		{"NoHandler", nil, "hello", dtl.ErrRefused, `node "owner" handles no messages`},
	} {
		t.Run(c.name, func(t *testing.T) {
			server, client, _ := messaging(t, b, c.handler)
			ctx := ctxFor(t)
			_, err := client.Message(ctx, server.Addr(), "owner", []byte(c.msg))
			var re *dtl.RemoteError
			if !errors.As(err, &re) || !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.says) {
				t.Fatalf("got %v, want a *dtl.RemoteError for %v saying %q", err, c.want, c.says)
			}
			if c.handler != nil {
				reply, err := client.Message(ctx, server.Addr(), "owner", []byte("ok"))
				if err != nil || string(reply) != "asker:ko" {
					t.Fatalf("next message: %q %v", reply, err)
				}
			}
			if st := b.Counters(client.(dtl.Transport)); st.Dials != 1 {
				t.Errorf("%+v: a refusal cost the connection", st)
			}
			if st := b.Counters(server); st.Refused != 1 {
				t.Errorf("%+v: want 1 refusal counted", st)
			}
		})
	}
}

// messageWrongNode: another node answering at the address fails the call
// with dtl.ErrUnavailable, before the message is sent.
func messageWrongNode(t *testing.T, b MessengerBackend) {
	server, client, _ := messaging(t, b, Echo)
	ctx := ctxFor(t)
	_, err := client.Message(ctx, server.Addr(), "elsewhere", []byte("x"))
	if !errors.Is(err, dtl.ErrUnavailable) || !strings.Contains(err.Error(), `"owner"`) {
		t.Fatalf("got %v, want %v naming the node that answers", err, dtl.ErrUnavailable)
	}
	if _, err := client.Message(ctx, server.Addr(), "owner", []byte("x")); err != nil {
		t.Fatal(err)
	}
	client.(dtl.Transport).Close()
	server.Close()
	if st := b.Counters(server); st.Answered != 1 {
		t.Errorf("%+v: the message for another node was handled", st)
	}
}

// messageUnreachable: nothing listening, and a server of another job
// (another secret), whose handler is never called.
func messageUnreachable(t *testing.T, b MessengerBackend) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	server, _, src := messaging(t, b, Echo)
	var called atomic.Bool
	h := func(ctx context.Context, from string, msg []byte) ([]byte, error) {
		called.Store(true)
		return nil, nil
	}
	src.h.Store(&h)
	stranger := b.New(t, "asker", NewSecret()).(dtl.Messenger)
	for _, c := range []struct {
		name string
		addr string
		want error
	}{
		{"NothingListening", dead, dtl.ErrUnavailable},
		{"WrongSecret", server.Addr(), dtl.ErrUnauthorized},
	} {
		t.Run(c.name, func(t *testing.T) {
			if _, err := stranger.Message(ctxFor(t), c.addr, "", []byte("x")); !errors.Is(err, c.want) {
				t.Errorf("got %v, want %v", err, c.want)
			}
		})
	}
	server.Close() // its counters are final
	if st := b.Counters(server); st.Answered != 0 || called.Load() {
		t.Errorf("%+v: a message without the secret was handled", st)
	}
}
