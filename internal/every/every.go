// Package every runs work now and then, until its context ends.
package every

import (
	"context"
	"time"
)

// Run calls f every d, and at once whenever now delivers (nil: never),
// until ctx ends; it returns then.
func Run(ctx context.Context, d time.Duration, now <-chan struct{}, f func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-now:
		}
		f()
	}
}
