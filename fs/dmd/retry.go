package dmd

import (
	"context"
	"errors"
	"time"

	"github.com/dyadfs/dyadfs/hfl"
)

// Publishes and removals that failed (the store was down) are retried in
// the background, with a growing pause, until they succeed. A retried
// publish makes the store agree with the file as it is then: published if
// it is complete here and this node's own. A retried removal removes what
// the removal would have removed, and no newer publish.
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

func (d *DMD) retryLater(rel string, op retryOp) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.retries == nil {
		d.retries = make(map[string]retryOp)
	}
	d.retries[rel] = op
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
		d.mu.Lock()
		batch := d.retries
		d.retries = nil
		d.mu.Unlock()

		again := make(map[string]retryOp)
		for rel, op := range batch {
			ctx, cancel := context.WithTimeout(context.Background(), retryMax)
			if err := d.reconcile(ctx, rel, op); err != nil {
				again[rel] = op
			}
			cancel()
		}

		d.mu.Lock()
		for rel, op := range again {
			if d.retries == nil {
				d.retries = make(map[string]retryOp)
			}
			if _, newer := d.retries[rel]; !newer {
				d.retries[rel] = op
			}
		}
		if len(d.retries) == 0 {
			d.retrying = false
			d.mu.Unlock()
			return
		}
		d.mu.Unlock()
		if len(again) > 0 {
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
	out, err := d.loc.Publish(ctx, recordOf(rel, d.cfg.Node, st))
	if err != nil {
		return err
	}
	d.stats.publishes.Add(1)
	d.markPublished(rel, out.Generation)
	d.log.Info("published after retry", "path", rel)
	return nil
}

// PendingPublishes is how many paths wait for a publish or removal retry.
func (d *DMD) PendingPublishes() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.retries)
}
