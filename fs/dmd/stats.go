package dmd

import (
	"sync/atomic"
	"time"

	"github.com/dyadfs/dyadfs/metrics"
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
	staleCopies    atomic.Uint64
	replaced       atomic.Uint64
	claims         atomic.Uint64
	claimErrors    atomic.Uint64
	checksums      atomic.Uint64
	checksumBytes  atomic.Uint64
	checksumNanos  atomic.Uint64
	// originReads counts files opened from the origin, originPublished
	// those brought here from it and published.
	originReads     atomic.Uint64
	originPublished atomic.Uint64

	// closes counts writers' closes that published and waited for the
	// store; the close...Ns fields, where their time went (see CloseStats).
	closes atomic.Uint64

	closeCheckNs, closeRecordNs, closeCommitNs, closeTellNs, closeNs atomic.Uint64
}

// closed counts a waiting close.
func (c *counters) closed(s *closeSpent) {
	c.closes.Add(1)
	c.closeCheckNs.Add(uint64(s.check))
	c.closeRecordNs.Add(uint64(s.record))
	c.closeCommitNs.Add(uint64(s.store.Commit))
	c.closeTellNs.Add(uint64(s.store.Tell))
	c.closeNs.Add(uint64(s.total))
}

// CloseStats is where the time of writers' closes that published the file
// and waited for the store went, added up over those closes (a stage's
// mean is its seconds divided by Count). The rest of Total is the
// bookkeeping around the stages.
type CloseStats struct {
	Count uint64 `json:"count" help:"Writers' closes that published the file and waited for the store."`
	// Check: is it the writer's last close (no other descriptor of the
	// file open, which /proc/<pid>/fd shows).
	CheckSeconds float64 `json:"check_seconds_total" help:"Time waiting closes spent checking that they were their writer's last (/proc/<pid>/fd)."`
	// Record: the file's record, from its attributes, marks, bytes and
	// checksum.
	RecordSeconds float64 `json:"record_seconds_total" help:"Time waiting closes spent making the file's record (attributes, marks, bytes, checksum)."`
	// Commit: the store's commit, as the close waited for it.
	CommitSeconds float64 `json:"commit_seconds_total" help:"Time waiting closes spent waiting for the store's commit."`
	// Tell: the record sent ahead and the path's home told, which told
	// every node that holds the path first.
	TellSeconds  float64 `json:"tell_seconds_total" help:"Time waiting closes spent telling the path's home, which tells every node that holds the path."`
	TotalSeconds float64 `json:"seconds_total" help:"Time waiting closes took in all."`
}

func (c *counters) waited(d time.Duration) {
	metrics.OpenWait.Observe(d.Seconds())
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
	// StaleCopies counts copies dropped because a newer version was
	// published; Replaced, this node's files replaced by another node's
	// publish (the last publish wins); Claims, rewrites of published files
	// told to the job before their writer's close returned.
	StaleCopies uint64 `json:"stale_copies_dropped"`
	Replaced    uint64 `json:"replaced_by_other_nodes"`
	Claims      uint64 `json:"rewrites_claimed"`
	ClaimErrors uint64 `json:"rewrite_claim_errors"`
	// Checksums counts the files hashed to publish them, ChecksumBytes
	// their bytes and ChecksumSeconds the time it took.
	Checksums       uint64  `json:"checksums"`
	ChecksumBytes   uint64  `json:"checksum_bytes"`
	ChecksumSeconds float64 `json:"checksum_seconds_total"`
	// Copies and Superseded count what the backing directory holds of
	// other nodes' files, and this node's files set aside.
	Copies     int `json:"copies"`
	Superseded int `json:"set_aside"`
	BusyFiles  int `json:"busy_files"`
	Waiting    int `json:"waiting_paths"`
	// PendingPublishes are files whose publish failed and is retried.
	PendingPublishes int `json:"pending_publishes"`
	// OriginReads counts files read from the origin (a parallel file
	// system) because no node published them; OriginPublished, those of
	// them brought here and published for the other nodes.
	OriginReads     uint64 `json:"origin_reads"`
	OriginPublished uint64 `json:"origin_published"`
	// Cache is what the copies take against the capacity.
	Cache CacheStats `json:"cache"`
	// Ranged is what large files read in ranges fetched.
	Ranged RangedStats `json:"ranged"`
	// Closes is where waiting closes' time went.
	Closes CloseStats `json:"waiting_closes"`
}

// Stats returns a snapshot of the counters.
func (d *DMD) Stats() Stats {
	d.mu.Lock()
	busy, pending := len(d.busy), len(d.retries)
	superseded := len(d.superseded)
	d.mu.Unlock()
	copies := d.copies.len()
	waiting := d.loc.WaitingPaths()
	c := &d.stats
	return Stats{
		WriteOpens:       c.writeOpens.Load(),
		WriteReleases:    c.writeReleases.Load(),
		Publishes:        c.publishes.Load(),
		PublishErrors:    c.publishErrors.Load(),
		Fsyncs:           c.fsyncs.Load(),
		Unpublishes:      c.unpublishes.Load(),
		OpensWaited:      c.opensWaited.Load(),
		WaitSeconds:      seconds(&c.waitNanos),
		WaitMaxSeconds:   seconds(&c.waitMaxNanos),
		WaitTimeouts:     c.waitTimeouts.Load(),
		WaitInterrupts:   c.waitInterrupts.Load(),
		Fetches:          c.fetches.Load(),
		FetchErrors:      c.fetchErrors.Load(),
		Serves:           c.serves.Load(),
		ScanPublished:    c.scanPublished.Load(),
		ScanIncomplete:   c.scanIncomplete.Load(),
		StaleCopies:      c.staleCopies.Load(),
		Replaced:         c.replaced.Load(),
		Claims:           c.claims.Load(),
		ClaimErrors:      c.claimErrors.Load(),
		Checksums:        c.checksums.Load(),
		ChecksumBytes:    c.checksumBytes.Load(),
		ChecksumSeconds:  seconds(&c.checksumNanos),
		Copies:           copies,
		Superseded:       superseded,
		BusyFiles:        busy,
		Waiting:          waiting,
		PendingPublishes: pending,
		OriginReads:      c.originReads.Load(),
		OriginPublished:  c.originPublished.Load(),
		Cache:            d.copies.stats(),
		Ranged:           d.rangedStats(),
		Closes: CloseStats{
			Count:         c.closes.Load(),
			CheckSeconds:  seconds(&c.closeCheckNs),
			RecordSeconds: seconds(&c.closeRecordNs),
			CommitSeconds: seconds(&c.closeCommitNs),
			TellSeconds:   seconds(&c.closeTellNs),
			TotalSeconds:  seconds(&c.closeNs),
		},
	}
}

func seconds(ns *atomic.Uint64) float64 { return time.Duration(ns.Load()).Seconds() }
