package dtltest

import (
	"bytes"
	"crypto/rand"
	"net"
	"sync"
	"testing"
)

// LogBuf collects a transport's log lines (slog's handlers write to it
// from any goroutine).
type LogBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *LogBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *LogBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// NewSecret returns a random job secret.
func NewSecret() []byte {
	s := make([]byte, 32)
	rand.Read(s)
	return s
}

// AcceptLoop listens on loopback and serves each connection with serve on
// a goroutine of its own; track makes serve's other connections closed
// with the test too. Everything ends with the test. It returns the address
// to dial.
func AcceptLoop(t testing.TB, serve func(c net.Conn, track func(net.Conn))) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	track := func(c net.Conn) {
		mu.Lock()
		conns = append(conns, c)
		mu.Unlock()
	}
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			track(c)
			wg.Go(func() { serve(c, track) })
		}
	})
	return ln.Addr().String()
}
