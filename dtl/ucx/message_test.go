//go:build ucx

package ucx

import (
	"bytes"
	"fmt"
	"sync"
	"testing"

	"github.com/dyadfs/dyadfs/dtl"
	"github.com/dyadfs/dyadfs/dtl/dtltest"
)

// Tests of dtl.Messenger between two real transports: the suite every
// messenger passes, over each wire, and what is UCX's own.

func TestMessenger(t *testing.T) {
	onEachWire(t, func(t *testing.T, tls string) {
		dtltest.RunMessenger(t, dtltest.MessengerBackend{
			New: func(t *testing.T, node string, secret []byte) dtl.Transport {
				tr, _ := testTransport(t, secret, opts{node: node, tls: tls})
				return tr
			},
			Counters: func(tr dtl.Transport) dtltest.MessageCounters {
				s := tr.(*Transport).Stats()
				return dtltest.MessageCounters{Dials: s.Dials, Reused: s.Reused, Messages: s.Messages, Answered: s.Answered, Refused: s.Refused}
			},
		})
	})
}

// messaging is a server of node "owner" whose handler is h, serving a
// fresh Source, and a client of node "asker" holding the same secret.
func messaging(t *testing.T, h handlerFunc) (server, client *Transport, src *dtltest.Source) {
	return dtltest.Messaging(t, func(t *testing.T, node string, secret []byte) *Transport {
		tr, _ := testTransport(t, secret, opts{node: node})
		return tr
	}, h)
}

// TestMessagesConcurrent: many messages at once on one endpoint, each
// answered with its own reply.
func TestMessagesConcurrent(t *testing.T) {
	server, client, _ := messaging(t, dtltest.Echo)
	ctx := ctxFor(t)
	var wg sync.WaitGroup
	for i := range 500 {
		wg.Go(func() {
			msg := []byte(fmt.Sprintf("message %d", i))
			reply, err := client.Message(ctx, server.Addr(), "owner", msg)
			if want, _ := dtltest.Echo(ctx, "asker", msg); err != nil || !bytes.Equal(reply, want) {
				t.Errorf("message %d: %q, %v", i, reply, err)
			}
		})
	}
	wg.Wait()
	if st := client.Stats(); st.Dials != 1 {
		t.Errorf("%+v: want one endpoint", st)
	}
}
