package dmd

import (
	"sync/atomic"
	"time"
)

type counters struct {
	writeOpens     atomic.Uint64
	writeReleases  atomic.Uint64
	publishes      atomic.Uint64
	publishErrors  atomic.Uint64
	fsyncs         atomic.Uint64
	unpublishes    atomic.Uint64
	opensWaited    atomic.Uint64
	waitNanos      atomic.Uint64
	waitMaxNanos   atomic.Uint64
	waitTimeouts   atomic.Uint64
	waitInterrupts atomic.Uint64
	fetches        atomic.Uint64
	fetchErrors    atomic.Uint64
	serves         atomic.Uint64
	scanPublished  atomic.Uint64
	scanIncomplete atomic.Uint64
}

func (c *counters) waited(d time.Duration) {
	n := uint64(d)
	c.waitNanos.Add(n)
	for {
		old := c.waitMaxNanos.Load()
		if n <= old || c.waitMaxNanos.CompareAndSwap(old, n) {
			return
		}
	}
}

// Stats is a snapshot of the managed directory's counters.
type Stats struct {
	WriteOpens     uint64  `json:"write_opens"`
	WriteReleases  uint64  `json:"write_releases"`
	Publishes      uint64  `json:"publishes"`
	PublishErrors  uint64  `json:"publish_errors"`
	Fsyncs         uint64  `json:"fsyncs_before_publish"`
	Unpublishes    uint64  `json:"unpublishes"`
	OpensWaited    uint64  `json:"opens_waited"`
	WaitSeconds    float64 `json:"wait_seconds_total"`
	WaitMaxSeconds float64 `json:"wait_seconds_max"`
	WaitTimeouts   uint64  `json:"wait_timeouts"`
	WaitInterrupts uint64  `json:"wait_interrupts"`
	Fetches        uint64  `json:"fetches"`
	FetchErrors    uint64  `json:"fetch_errors"`
	Serves         uint64  `json:"serves"`
	ScanPublished  uint64  `json:"scan_published"`
	ScanIncomplete uint64  `json:"scan_incomplete"`
	BusyFiles      int     `json:"busy_files"`
	Waiting        int     `json:"waiting_paths"`
	// PendingPublishes are files whose publish failed and is retried.
	PendingPublishes int `json:"pending_publishes"`
}

// Stats returns a snapshot of the counters.
func (d *DMD) Stats() Stats {
	d.mu.Lock()
	busy, waiting, pending := len(d.busy), len(d.watches), len(d.retries)
	d.mu.Unlock()
	c := &d.stats
	return Stats{
		WriteOpens:       c.writeOpens.Load(),
		WriteReleases:    c.writeReleases.Load(),
		Publishes:        c.publishes.Load(),
		PublishErrors:    c.publishErrors.Load(),
		Fsyncs:           c.fsyncs.Load(),
		Unpublishes:      c.unpublishes.Load(),
		OpensWaited:      c.opensWaited.Load(),
		WaitSeconds:      time.Duration(c.waitNanos.Load()).Seconds(),
		WaitMaxSeconds:   time.Duration(c.waitMaxNanos.Load()).Seconds(),
		WaitTimeouts:     c.waitTimeouts.Load(),
		WaitInterrupts:   c.waitInterrupts.Load(),
		Fetches:          c.fetches.Load(),
		FetchErrors:      c.fetchErrors.Load(),
		Serves:           c.serves.Load(),
		ScanPublished:    c.scanPublished.Load(),
		ScanIncomplete:   c.scanIncomplete.Load(),
		BusyFiles:        busy,
		Waiting:          waiting,
		PendingPublishes: pending,
	}
}
