package dmd

import (
	"context"
	"time"
)

// Publishes that failed (the store was down) are retried in the background,
// with a growing pause, until they succeed. A retry publishes the file as it
// is then (Changed), so a file changed or removed meanwhile is handled.
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
			if rec, ok := d.LocalRecord(ctx, rel); ok {
				if _, err := d.loc.Publish(ctx, rec); err != nil {
					again = append(again, rel)
				} else {
					d.stats.publishes.Add(1)
					d.log.Info("published after retry", "path", rel)
				}
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

// PendingPublishes is how many files wait for a publish retry.
func (d *DMD) PendingPublishes() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.retries)
}
