package main

import (
	"context"
	"sync"
	"time"

	"github.com/dyadfs/dyadfs/fs/dmd"
	"github.com/dyadfs/dyadfs/hfl"
	"github.com/dyadfs/dyadfs/internal/every"
)

// storeHealthEvery is how often the daemon asks the store how it is: the
// status shows the last answer, so that reading it costs no store request
// (tests and monitors read it often) and does not hang while the store is
// down.
const storeHealthEvery = 2 * time.Second

// storeMonitor keeps the store's last health report.
type storeMonitor struct {
	store     hfl.Store
	namespace string
	url       string

	mu      sync.Mutex
	health  hfl.Health
	err     error
	checked time.Time
}

// watchStore asks store for its health now and every storeHealthEvery
// until ctx ends.
func watchStore(ctx context.Context, store hfl.Store, url, namespace string) *storeMonitor {
	m := &storeMonitor{store: store, namespace: namespace, url: url}
	m.check(ctx)
	go every.Run(ctx, storeHealthEvery, nil, func() { m.check(ctx) })
	return m
}

func (m *storeMonitor) check(ctx context.Context) {
	cctx, cancel := context.WithTimeout(ctx, storeHealthEvery)
	defer cancel()
	h, err := m.store.Health(cctx, m.namespace)
	m.mu.Lock()
	defer m.mu.Unlock()
	m.health, m.err, m.checked = h, err, time.Now()
}

// committer is a store that gathers publishes into transactions.
type committer interface {
	Commits() (transactions, publishes uint64)
}

// section is the store's part of the status: its state when last asked,
// and the files waiting for it.
func (m *storeMonitor) section(d *dmd.DMD) map[string]any {
	m.mu.Lock()
	h, err, checked := m.health, m.err, m.checked
	m.mu.Unlock()
	s := map[string]any{
		"url":                       m.url,
		"reachable":                 err == nil,
		"checked_timestamp_seconds": float64(checked.UnixNano()) / 1e9,
		"db_bytes":                  h.Bytes,
		"records":                   h.Records,
		"alarms":                    h.Alarms,
		"pending_publishes":         d.PendingPublishes(),
		// Closes publishing now: during an outage, those that wait.
		"publishes_in_progress": d.PublishesInProgress(),
	}
	if h.Quota > 0 {
		s["quota_bytes"] = h.Quota
	}
	if err != nil {
		s["error"] = err.Error()
	}
	if p := d.PendingList(); len(p) > 0 {
		s["oldest_pending_timestamp_seconds"] = float64(time.Now().UnixNano())/1e9 - p[0].Seconds
	}
	if c, ok := m.store.(committer); ok {
		// Group commit: publishes per transaction is their ratio.
		s["transactions"], s["transaction_publishes"] = c.Commits()
	}
	return s
}
