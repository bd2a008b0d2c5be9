package tcp

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dyadfs/dyadfs/dtl"
	"github.com/dyadfs/dyadfs/dtl/dtltest"

	"github.com/dyadfs/dyadfs/dtl/peerauth"
)

// Tests of dtl.Messenger: the suite every messenger passes, messages
// between two real transports, and a real client against fake servers.

func TestMessenger(t *testing.T) {
	dtltest.RunMessenger(t, dtltest.MessengerBackend{
		New: func(t *testing.T, node string, secret []byte) dtl.Transport {
			tr, _ := newTransport(t, secret, opts{node: node})
			return tr
		},
		Counters: func(tr dtl.Transport) dtltest.MessageCounters {
			s := tr.(*Transport).Stats()
			return dtltest.MessageCounters{Dials: s.Dials, Reused: s.Reused, Messages: s.Messages, Answered: s.Answered, Refused: s.Refused}
		},
	})
}

// echoed is what dtltest.Echo answers from to msg.
func echoed(from string, msg []byte) []byte {
	r, _ := dtltest.Echo(context.Background(), from, msg)
	return r
}

// messaging is a server of node "owner" whose handler is h, serving a
// fresh Source, and a client of node "asker" holding the same secret.
func messaging(t *testing.T, h handlerFunc) (server, client *Transport, src *dtltest.Source) {
	return dtltest.Messaging(t, func(t *testing.T, node string, secret []byte) *Transport {
		tr, _ := newTransport(t, secret, opts{node: node})
		return tr
	}, h)
}

// TestMessagesAndFetches: messages and fetches interleave on the pooled
// connections, from many goroutines at once.
func TestMessagesAndFetches(t *testing.T) {
	server, client, src := messaging(t, dtltest.Echo)
	data := dtltest.Patterned(100_000)
	if err := src.WriteFile("f", data); err != nil {
		t.Fatal(err)
	}
	ctx := ctxFor(t)
	const workers, rounds = 8, 40
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range rounds {
				if (i+w)%2 == 0 {
					msg := dtltest.Patterned(i * 300)
					reply, err := client.Message(ctx, server.Addr(), "owner", msg)
					if err != nil || !bytes.Equal(reply, echoed("asker", msg)) {
						t.Errorf("message %d: %d bytes, %v", i, len(reply), err)
						return
					}
					continue
				}
				dst := dtltest.Dst(t)
				info, err := client.Fetch(ctx, server.Addr(), dtl.Request{Path: "f", Owner: "owner"}, dtl.NewSink(dst))
				if err != nil || info.Size != int64(len(data)) {
					t.Errorf("fetch %d: %+v %v", i, info, err)
					return
				}
				got := make([]byte, len(data)+1)
				if n, _ := dst.ReadAt(got, 0); !bytes.Equal(got[:n], data) {
					t.Errorf("fetch %d: wrong contents", i)
					return
				}
			}
		})
	}
	wg.Wait()
	client.Close()
	server.Close()
	cs, ss := client.Stats(), server.Stats()
	if cs.Dials > workers || cs.Dials+cs.Reused != workers*rounds || cs.Messages != workers*rounds/2 || ss.Served != workers*rounds/2 {
		t.Errorf("client %+v server %+v: want at most %d dials for %d fetches and %d messages", cs, ss, workers, workers*rounds/2, workers*rounds/2)
	}
}

// TestMessageCancel: a caller gives up on a slow handler at once; the
// connection is not pooled, and the server carries on.
func TestMessageCancel(t *testing.T) {
	entered := make(chan struct{}, 1)
	release := make(chan struct{})
	server, client, _ := messaging(t, func(ctx context.Context, from string, msg []byte) ([]byte, error) {
		if string(msg) != "slow" {
			return dtltest.Echo(ctx, from, msg)
		}
		entered <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
		}
		return []byte("late"), nil
	})
	defer close(release)
	for _, c := range []struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
		want error
	}{
		{"Cancel", func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			go func() { <-entered; cancel() }()
			return ctx, cancel
		}, context.Canceled},
		{"Deadline", func() (context.Context, context.CancelFunc) {
			go func() { <-entered }()
			return context.WithTimeout(context.Background(), 100*time.Millisecond)
		}, context.DeadlineExceeded},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := c.ctx()
			defer cancel()
			start := time.Now()
			_, err := client.Message(ctx, server.Addr(), "", []byte("slow"))
			if took := time.Since(start); !errors.Is(err, c.want) || took > 2*time.Second {
				t.Fatalf("got %v after %v, want %v at once", err, took, c.want)
			}
			client.mu.Lock()
			pooled, active := client.nIdle, len(client.active)
			client.mu.Unlock()
			if pooled != 0 || active != 0 {
				t.Errorf("%d pooled, %d active connections after a cancelled message", pooled, active)
			}
		})
	}
	// A new connection carries on while the slow handlers still wait.
	if reply, err := client.Message(ctxFor(t), server.Addr(), "", []byte("ab")); err != nil || string(reply) != "asker:ba" {
		t.Fatalf("after the cancelled messages: %q %v", reply, err)
	}
}

// TestCloseEndsHandlers: Close cancels the handlers' context and waits for
// them; the sender sees the connection end.
func TestCloseEndsHandlers(t *testing.T) {
	entered := make(chan struct{})
	server, client, _ := messaging(t, func(ctx context.Context, from string, msg []byte) ([]byte, error) {
		close(entered)
		<-ctx.Done()
		return nil, ctx.Err()
	})
	done := make(chan error, 1)
	go func() {
		_, err := client.Message(ctxFor(t), server.Addr(), "", []byte("x"))
		done <- err
	}()
	<-entered
	server.Close()
	select {
	case err := <-done:
		var re *dtl.RemoteError
		if err == nil || errors.As(err, &re) {
			t.Errorf("got %v, want the connection lost", err)
		}
		t.Log(err)
	case <-time.After(5 * time.Second):
		t.Fatal("the message outlived the server's Close")
	}
}

// TestMessageStaleRetry: a pooled connection the server has closed is
// replaced, once, transparently.
func TestMessageStaleRetry(t *testing.T) {
	server, client, _ := messaging(t, dtltest.Echo)
	ctx := ctxFor(t)
	if _, err := client.Message(ctx, server.Addr(), "", []byte("a")); err != nil {
		t.Fatal(err)
	}
	server.mu.Lock()
	for sc := range server.serving {
		sc.conn.Close()
	}
	server.mu.Unlock()
	if reply, err := client.Message(ctx, server.Addr(), "", []byte("ab")); err != nil || string(reply) != "asker:ba" {
		t.Fatalf("%q %v", reply, err)
	}
	if st := client.Stats(); st.Dials != 2 || st.Retried != 1 {
		t.Errorf("%+v: want 2 dials, 1 retry", st)
	}
}

// TestMessageBadServers: replies that break the protocol wrap
// dtl.ErrProtocol and are not pooled; a stalled reply fails within the
// stall timeout.
func TestMessageBadServers(t *testing.T) {
	const stall = 200 * time.Millisecond
	secret := dtltest.NewSecret()
	send := func(frames ...[]byte) func(c net.Conn, br *bufio.Reader, typ frameType, p []byte) {
		return func(c net.Conn, br *bufio.Reader, typ frameType, p []byte) {
			if typ != tMsg {
				return
			}
			for _, f := range frames {
				c.Write(f)
			}
			hold(c)
		}
	}
	tooLong := func() []byte {
		b, s := beginFrame(nil, tReply)
		return endFrame(append(b, make([]byte, dtl.MaxMessage+1)...), s)
	}
	cases := []struct {
		name   string
		handle func(c net.Conn, br *bufio.Reader, typ frameType, p []byte)
		proto  bool // a protocol error; else a stall
	}{
		{"ReplyTooLong", send(tooLong()), true},
		{"OversizedFrame", send([]byte{byte(tReply), 0, 1, 0, 1}), true},
		{"HeaderForAMessage", send(appendHeader(nil, dtl.FileInfo{Size: 1})), true},
		{"UnknownCode", send(appendError(nil, errFrame{Code: 999, Msg: "?"})), true},
		{"ShortReply", send([]byte{byte(tReply), 0, 0, 0, 9, 1, 2}), false},
		{"NoReply", send(), false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			addr := fakeServerFrames(t, secret, "fake", c.handle)
			client, _ := newTransport(t, secret, opts{stall: stall})
			start := time.Now()
			_, err := client.Message(ctxFor(t), addr, "fake", []byte("x"))
			took := time.Since(start)
			var re *dtl.RemoteError
			switch {
			case err == nil || errors.As(err, &re) || errors.Is(err, dtl.ErrUnavailable):
				t.Errorf("got %v, want a failure of the exchange", err)
			case c.proto && !errors.Is(err, dtl.ErrProtocol):
				t.Errorf("got %v, want %v", err, dtl.ErrProtocol)
			case !c.proto && (errors.Is(err, dtl.ErrProtocol) || took < stall || took > stall+time.Second):
				t.Errorf("got %v after %v, want a stall after %v", err, took, stall)
			}
			if idleConns(client) != 0 {
				t.Error("a connection out of step was pooled")
			}
		})
	}
}

// TestMessageTrailingBytes: bytes after a reply leave the connection out
// of step: the reply is good, the connection is not pooled.
func TestMessageTrailingBytes(t *testing.T) {
	secret := dtltest.NewSecret()
	addr := fakeServerFrames(t, secret, "fake", func(c net.Conn, br *bufio.Reader, typ frameType, p []byte) {
		c.Write(append(appendReply(nil, []byte("ok")), appendReady(nil)...))
		hold(c)
	})
	client, _ := newTransport(t, secret, opts{})
	if reply, err := client.Message(ctxFor(t), addr, "", []byte("x")); err != nil || string(reply) != "ok" {
		t.Fatalf("%q %v", reply, err)
	}
	if idleConns(client) != 0 {
		t.Error("a connection out of step was pooled")
	}
}

// TestServerNodeBound: a server's proof covers the node id it announces: a
// server that announces one id with a proof made for another is refused.
func TestServerNodeBound(t *testing.T) {
	secret := dtltest.NewSecret()
	addr := dtltest.AcceptLoop(t, func(c net.Conn, _ func(net.Conn)) {
		defer c.Close()
		br := bufio.NewReader(c)
		var buf []byte
		_, p, err := readFrame(br, &buf)
		if err != nil {
			return
		}
		h, err := decodeHello(p)
		if err != nil {
			return
		}
		ch := challenge{Version: protoVersion, Nonce: peerauth.NewNonce(), Node: "owner"}
		ch.MAC = peerauth.Sign(secret, labelServer, peerauth.Proof{ClientNonce: h.Nonce, ServerNonce: ch.Nonce, ClientNode: h.Node, ServerNode: "impostor"})
		c.Write(appendChallenge(nil, ch))
		readFrame(br, &buf)
	})
	client, _ := newTransport(t, secret, opts{})
	_, err := client.Message(ctxFor(t), addr, "owner", []byte("x"))
	if !errors.Is(err, dtl.ErrUnauthorized) {
		t.Errorf("got %v, want %v", err, dtl.ErrUnauthorized)
	}
}

func TestNodeTooLong(t *testing.T) {
	cfg := dtl.DefaultConfig()
	cfg.Node, cfg.Listen, cfg.Secret = strings.Repeat("n", maxNode+1), ":0", dtltest.NewSecret()
	if _, err := New(cfg); err == nil {
		t.Errorf("New accepted a node id of %d bytes", len(cfg.Node))
	}
}

// idleConns is how many connections tr keeps in its pool.
func idleConns(tr *Transport) int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.nIdle
}
