package dmd

import (
	"context"
	"errors"
	"sort"
	"time"

	"github.com/dyadfs/dyadfs/hfl"
)

// Publishes and removals that failed (the store was down, or refused them)
// are retried in the background, with a growing pause, until they succeed.
// A retried publish makes the store agree with the file as it is then:
// published if it is complete here and this node's own; a file removed
// meanwhile is dropped from the list. A retried removal removes what the
// removal would have removed, and no newer publish.
const (
	retryFirst = 100 * time.Millisecond
	retryMax   = 5 * time.Second
)

// retryOp is what a retry does.
type retryOp struct {
	remove bool
	cond   hfl.RemoveCond // of a removal
}

var retryPublish = retryOp{}

// pending is a publish or removal that has not landed yet.
type pending struct {
	op     retryOp
	since  time.Time // its first failure
	reason string    // its last failure
	// seq grows with every failure recorded: a retry that succeeds drops
	// the entry only if no failure was recorded while it ran.
	seq uint64
}

// Pending describes a file whose publish (or removal) has not landed, for
// the status.
type Pending struct {
	Path    string  `json:"path"`
	Op      string  `json:"op"` // "publish" or "remove"
	Seconds float64 `json:"pending_seconds"`
	Reason  string  `json:"reason"`
}

// retryLater records that op on rel failed with err, and makes sure the
// retry loop runs.
func (d *DMD) retryLater(rel string, op retryOp, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.retries == nil {
		d.retries = make(map[string]*pending)
	}
	p := d.retries[rel]
	if p == nil {
		p = &pending{since: time.Now()}
		d.retries[rel] = p
	}
	p.op, p.seq = op, p.seq+1
	if err != nil {
		p.reason = err.Error()
	}
	if !d.retrying {
		d.retrying = true
		go d.retryLoop()
	}
}

func (d *DMD) retryLoop() {
	pause := retryFirst
	for {
		select {
		case <-d.shutdown:
			return
		case <-time.After(pause):
		}
		type attempt struct {
			rel string
			op  retryOp
			seq uint64
		}
		d.mu.Lock()
		batch := make([]attempt, 0, len(d.retries))
		for rel, p := range d.retries {
			batch = append(batch, attempt{rel, p.op, p.seq})
		}
		d.mu.Unlock()

		failed := false
		for _, a := range batch {
			ctx, cancel := context.WithTimeout(context.Background(), retryMax)
			err := d.reconcile(ctx, a.rel, a.op)
			cancel()
			d.mu.Lock()
			if p := d.retries[a.rel]; p != nil && p.seq == a.seq {
				if err == nil {
					delete(d.retries, a.rel)
				} else {
					p.reason = err.Error()
				}
			}
			d.mu.Unlock()
			failed = failed || err != nil
		}

		d.mu.Lock()
		if len(d.retries) == 0 {
			d.retrying = false
			d.mu.Unlock()
			return
		}
		d.mu.Unlock()
		if failed {
			pause = min(2*pause, retryMax)
		} else {
			pause = retryFirst
		}
	}
}

// reconcile retries op on rel.
func (d *DMD) reconcile(ctx context.Context, rel string, op retryOp) error {
	if op.remove {
		if d.existsHere(rel) && op.cond.Owner == d.cfg.Node {
			return nil // it came back here: its publish says what it is
		}
		err := d.loc.Unpublish(ctx, rel, op.cond, false)
		if errors.Is(err, hfl.ErrConflict) {
			return nil // published again since: the newer publish wins
		}
		if err != nil {
			return err
		}
		d.stats.unpublishes.Add(1)
		d.log.Info("unpublished after retry", "path", rel)
		return nil
	}
	st, complete := d.completeHere(rel)
	if _, isCopy := d.copyOf(rel); !complete || isCopy {
		return nil
	}
	d.beginRelease(rel)
	defer d.released(rel)
	rec, err := d.fileRecord(rel, -1, st, nil, false)
	if errors.Is(err, errGone) {
		return nil // renamed or removed meanwhile: that change publishes
	}
	if err != nil {
		return err
	}
	// As any publish: a change told meanwhile is looked at once it is
	// done (see publishDone).
	if err := d.publish(ctx, rec, publishAside); err != nil {
		return err
	}
	d.log.Info("published after retry", "path", rel)
	return nil
}

// PendingPublishes is how many paths wait for a publish or removal retry.
func (d *DMD) PendingPublishes() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.retries)
}

// PublishesInProgress is how many closes are publishing their file now
// (a close that waits for the store is one of them).
func (d *DMD) PublishesInProgress() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, c := range d.releasing {
		n += c
	}
	return n
}

// maxPendingListed bounds the status's list of pending publishes.
const maxPendingListed = 100

// PendingList returns the oldest pending publishes and removals (at most
// maxPendingListed), oldest first.
func (d *DMD) PendingList() []Pending {
	now := time.Now()
	d.mu.Lock()
	out := make([]Pending, 0, len(d.retries))
	for rel, p := range d.retries {
		op := "publish"
		if p.op.remove {
			op = "remove"
		}
		out = append(out, Pending{Path: rel, Op: op, Seconds: now.Sub(p.since).Seconds(), Reason: p.reason})
	}
	d.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Seconds > out[j].Seconds })
	if len(out) > maxPendingListed {
		out = out[:maxPendingListed]
	}
	return out
}
