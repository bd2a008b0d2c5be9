// Package every runs work now and then, until its context ends.
package every

import (
	"context"
	"time"
)

// Run calls f every d until ctx ends; it returns then.
func Run(ctx context.Context, d time.Duration, f func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f()
		}
	}
}
