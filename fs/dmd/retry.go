package dmd

import (
	"context"
	"time"
)

// Publishes and unpublishes that failed (the store was down) are retried in
// the background, with a growing pause, until they succeed. A retry makes
// the store agree with the file as it is then: published if it is complete
// here, withdrawn if it is gone.
const (
	retryFirst = 100 * time.Millisecond
	retryMax   = 5 * time.Second
)

func (d *DMD) retryLater(rel string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.retries == nil {
		d.retries = make(map[string]struct{})
	}
	d.retries[rel] = struct{}{}
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

		var again []string
		for rel := range batch {
			ctx, cancel := context.WithTimeout(context.Background(), retryMax)
			if err := d.reconcile(ctx, rel); err != nil {
				again = append(again, rel)
			}
			cancel()
		}

		d.mu.Lock()
		for _, rel := range again {
			if d.retries == nil {
				d.retries = make(map[string]struct{})
			}
			d.retries[rel] = struct{}{}
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

// reconcile makes the store agree with rel as it is on this node.
func (d *DMD) reconcile(ctx context.Context, rel string) error {
	st, complete := d.completeHere(rel)
	switch {
	case complete && !(d.markers && isReplica(d.BackingPath(rel))):
		if _, err := d.loc.Publish(ctx, recordOf(rel, d.cfg.Node, st)); err != nil {
			return err
		}
		d.stats.publishes.Add(1)
		d.log.Info("published after retry", "path", rel)
	case !d.existsHere(rel):
		if err := d.loc.Unpublish(ctx, rel, d.cfg.Node); err != nil {
			return err
		}
		d.stats.unpublishes.Add(1)
		d.log.Info("unpublished after retry", "path", rel)
	}
	return nil
}

// PendingPublishes is how many files wait for a publish retry.
func (d *DMD) PendingPublishes() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.retries)
}
