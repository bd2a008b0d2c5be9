package dtl

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"time"
)

// RangeStats counts the byte ranges fetched for files read in ranges.
type RangeStats struct {
	Fetches atomic.Uint64 // ranges received whole
	Bytes   atomic.Uint64 // bytes asked for in them
	Failed  atomic.Uint64 // ranges that failed (after retries)
}

// FetchesRanges reports whether this fetcher's transport honours byte
// ranges (see RangeFetcher).
func (f *Fetcher) FetchesRanges() bool { return FetchesRanges(f.cfg.Transport) }

// Ranges returns the range counters.
func (f *Fetcher) Ranges() *RangeStats { return &f.ranges }

// FetchRange writes the bytes [off, off+n) of v's file into dst, at their
// offsets, and returns what the owner said of the file. The caller checks
// that the owner still has v's version (the owner serves its current
// one) and verifies the bytes. Failures that may pass (a connection
// reset, an owner restarting) are retried, within the fetcher's timeout.
func (f *Fetcher) FetchRange(ctx context.Context, v Version, off, n int64, dst *os.File) (FileInfo, error) {
	req := Request{Path: v.Path, Generation: v.Info.Generation, Owner: v.Owner, Off: off, Len: n}
	var b backoff
	start := time.Now()
	for attempt := 0; ; attempt++ {
		p, err := f.owner(ctx, v.Owner, attempt > 0)
		if err == nil && p.Transport != "" && p.Transport != f.cfg.TransportName {
			f.ranges.Failed.Add(1)
			return FileInfo{}, fmt.Errorf("%w: owner %s uses the %s transport, this node %s", ErrPermanent, v.Owner, p.Transport, f.cfg.TransportName)
		}
		var info FileInfo
		if err == nil {
			info, err = f.cfg.Transport.Fetch(ctx, p.Addr, req, NewSink(dst))
		}
		if err == nil {
			f.ranges.Fetches.Add(1)
			f.ranges.Bytes.Add(uint64(n))
			return info, nil
		}
		if errors.Is(err, ErrOwnerGone) || classify(err) != retry || ctx.Err() != nil || time.Since(start) > f.cfg.Timeout {
			f.ranges.Failed.Add(1)
			return FileInfo{}, fmt.Errorf("fetch %d bytes at %d of %s from %s: %w", n, off, v.Path, v.Owner, err)
		}
		f.stats.Retries.Add(1)
		t := time.NewTimer(b.next())
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
	}
}

// Message sends msg to node's daemon through the transport, if it carries
// messages (see Messenger), and returns the reply.
func (f *Fetcher) Message(ctx context.Context, node string, msg []byte) ([]byte, error) {
	m, ok := f.cfg.Transport.(Messenger)
	if !ok {
		return nil, fmt.Errorf("the %s transport carries no messages: %w", f.cfg.TransportName, ErrRefused)
	}
	p, err := f.owner(ctx, node, false)
	if err != nil {
		return nil, err
	}
	reply, err := m.Message(ctx, p.Addr, node, msg)
	if errors.Is(err, ErrUnavailable) {
		// The registration may be stale: once more with a fresh one.
		if p, err2 := f.owner(ctx, node, true); err2 == nil {
			return m.Message(ctx, p.Addr, node, msg)
		}
	}
	return reply, err
}
