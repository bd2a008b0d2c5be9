package dtltest

import (
	"bytes"
	"crypto/rand"
	"sync"
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
