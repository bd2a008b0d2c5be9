//go:build ucx

package ucx

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"

	"github.com/dyadfs/dyadfs/dtl"
	"github.com/dyadfs/dyadfs/dtl/dtltest"
)

// Tests of dtl.Messenger between two real transports.

// messaging is a server of node "owner" whose handler is h, serving a
// fresh Source, and a client of node "asker" holding the same secret.
func messaging(t *testing.T, o opts, h handlerFunc) (server, client *Transport, src *dtltest.Source) {
	t.Helper()
	s := newSecret()
	so := o
	so.node = "owner"
	server, _ = testTransport(t, s, so)
	if h != nil {
		server.handler.Store(&h)
	}
	src = dtltest.NewSource(t.TempDir())
	if err := server.Serve(src); err != nil {
		t.Fatal(err)
	}
	co := o
	co.node = "asker"
	client, _ = testTransport(t, s, co)
	return server, client, src
}

// echo answers "from:" and the message, reversed.
func echo(ctx context.Context, from string, msg []byte) ([]byte, error) {
	reply := make([]byte, 0, len(from)+1+len(msg))
	reply = append(append(reply, from...), ':')
	for i := len(msg) - 1; i >= 0; i-- {
		reply = append(reply, msg[i])
	}
	return reply, nil
}

func patterned(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i>>8)
	}
	return b
}

// TestMessageRoundTrip: messages of every size up to dtl.MaxMessage reach
// the handler with the node id the client proved, their replies come
// back, and all go on one endpoint.
func TestMessageRoundTrip(t *testing.T) {
	for name, tls := range wires {
		t.Run(name, func(t *testing.T) {
			server, client, _ := messaging(t, opts{tls: tls}, echo)
			ctx := ctxFor(t)
			sizes := []int{0, 1, 100, 4096, 9000, dtl.MaxMessage - len("asker:")}
			for _, n := range sizes {
				msg := patterned(n)
				for _, node := range []string{"", "owner"} {
					reply, err := client.Message(ctx, server.Addr(), node, msg)
					if err != nil {
						t.Fatalf("%d bytes to node %q: %v", n, node, err)
					}
					if want, _ := echo(ctx, "asker", msg); !bytes.Equal(reply, want) {
						t.Fatalf("%d bytes to node %q: reply of %d bytes, want %d", n, node, len(reply), len(want))
					}
				}
			}
			// The largest message and the largest reply.
			largest := handlerFunc(func(ctx context.Context, from string, msg []byte) ([]byte, error) {
				if len(msg) != dtl.MaxMessage || from != "asker" {
					return nil, fmt.Errorf("got %d bytes from %q", len(msg), from)
				}
				return bytes.Clone(msg), nil
			})
			server.handler.Store(&largest)
			msg := patterned(dtl.MaxMessage)
			reply, err := client.Message(ctx, server.Addr(), "owner", msg)
			if err != nil || !bytes.Equal(reply, msg) {
				t.Fatalf("MaxMessage: reply of %d bytes, %v", len(reply), err)
			}
			client.Close()
			server.Close()
			cs, ss := client.Stats(), server.Stats()
			m := int64(2*len(sizes) + 1)
			if cs.Dials != 1 || cs.Reused != m-1 || cs.Messages != m || ss.Answered != m || ss.Refused != 0 {
				t.Errorf("client %+v server %+v: want 1 dial, %d reuses, %d messages answered", cs, ss, m-1, m)
			}
		})
	}
}

// TestMessagesConcurrent: many messages at once on one endpoint, each
// answered with its own reply.
func TestMessagesConcurrent(t *testing.T) {
	server, client, _ := messaging(t, opts{}, echo)
	ctx := ctxFor(t)
	var wg sync.WaitGroup
	for i := range 500 {
		wg.Go(func() {
			msg := []byte(fmt.Sprintf("message %d", i))
			reply, err := client.Message(ctx, server.Addr(), "owner", msg)
			if want, _ := echo(ctx, "asker", msg); err != nil || !bytes.Equal(reply, want) {
				t.Errorf("message %d: %q, %v", i, reply, err)
			}
		})
	}
	wg.Wait()
	if st := client.Stats(); st.Dials != 1 {
		t.Errorf("%+v: want one endpoint", st)
	}
}

// TestMessageTooLong: a message longer than dtl.MaxMessage is not sent.
func TestMessageTooLong(t *testing.T) {
	server, client, _ := messaging(t, opts{}, echo)
	_, err := client.Message(ctxFor(t), server.Addr(), "", make([]byte, dtl.MaxMessage+1))
	if err == nil || !strings.Contains(err.Error(), "limit") {
		t.Errorf("got %v, want the message refused for its size", err)
	}
	if st := client.Stats(); st.Dials != 0 {
		t.Errorf("%+v: a message too long to send was sent", st)
	}
}

// TestMessageRefusals: a handler's error, a reply too long and a server
// without a handler reach the caller as a *dtl.RemoteError, and the
// endpoint carries the next message.
func TestMessageRefusals(t *testing.T) {
	handler := func(ctx context.Context, from string, msg []byte) ([]byte, error) {
		switch string(msg) {
		case "fail":
			return []byte("ignored"), errors.New("the locator cannot take this")
		case "missing":
			return nil, fmt.Errorf("no record of x: %w", dtl.ErrNotFound)
		case "long":
			return make([]byte, dtl.MaxMessage+1), nil
		}
		return echo(ctx, from, msg)
	}
	cases := []struct {
		name    string
		handler handlerFunc
		msg     string
		want    error
		says    string
	}{
		{"HandlerError", handler, "fail", dtl.ErrRefused, "the locator cannot take this"},
		{"HandlerDtlError", handler, "missing", dtl.ErrNotFound, "no record of x"},
		{"ReplyTooLong", handler, "long", dtl.ErrRefused, "exceeds"},
		{"NoHandler", nil, "hello", dtl.ErrRefused, `node "owner" handles no messages`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			server, client, _ := messaging(t, opts{}, c.handler)
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
			if st := client.Stats(); st.Dials != 1 {
				t.Errorf("%+v: a refusal cost the endpoint", st)
			}
			if st := server.Stats(); st.Refused != 1 {
				t.Errorf("%+v: want 1 refusal counted", st)
			}
		})
	}
}

// TestMessageWrongNode: another node answering at the address fails the
// call with dtl.ErrUnavailable, before the message is sent.
func TestMessageWrongNode(t *testing.T) {
	server, client, _ := messaging(t, opts{}, echo)
	ctx := ctxFor(t)
	_, err := client.Message(ctx, server.Addr(), "elsewhere", []byte("x"))
	if !errors.Is(err, dtl.ErrUnavailable) || !strings.Contains(err.Error(), `"owner"`) {
		t.Fatalf("got %v, want %v naming the node that answers", err, dtl.ErrUnavailable)
	}
	if _, err := client.Message(ctx, server.Addr(), "owner", []byte("x")); err != nil {
		t.Fatal(err)
	}
	client.Close()
	server.Close()
	if st := server.Stats(); st.Answered != 1 {
		t.Errorf("%+v: the message for another node was handled", st)
	}
}

// TestMessageUnreachable: nothing listening, and peers without the secret,
// each way.
func TestMessageUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	client, _ := testTransport(t, newSecret(), opts{node: "asker"})
	if _, err := client.Message(ctxFor(t), dead, "", []byte("x")); !errors.Is(err, dtl.ErrUnavailable) {
		t.Errorf("nothing listening: got %v, want %v", err, dtl.ErrUnavailable)
	}
	called := false
	server, _ := testTransport(t, newSecret(), opts{node: "owner"})
	h := handlerFunc(func(ctx context.Context, from string, msg []byte) ([]byte, error) {
		called = true
		return nil, nil
	})
	server.handler.Store(&h)
	if err := server.Serve(dtltest.NewSource(t.TempDir())); err != nil {
		t.Fatal(err)
	}
	_, err = client.Message(ctxFor(t), server.Addr(), "", []byte("x"))
	var re *dtl.RemoteError
	if !errors.As(err, &re) || !errors.Is(err, dtl.ErrUnauthorized) {
		t.Errorf("another job's server: got %v, want a *dtl.RemoteError for %v", err, dtl.ErrUnauthorized)
	}
	server.Close()
	if called {
		t.Error("the handler of another job's server was called")
	}
}
