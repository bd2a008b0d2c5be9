package notice

import (
	"fmt"
	"testing"
	"time"

	"github.com/dyadfs/dyadfs/hfl/store/embedded"
)

// TestPreviousHomeOnlyIfItCameFirst: a home that joined a moment ago
// passes changes on to the home the others chose before it came, unless
// that node came after it (then no view ever made it the home).
func TestPreviousHomeOnlyIfItCameFirst(t *testing.T) {
	locs, _ := noticeClusterOver(t, 2, embedded.New())
	home := locs[0].n
	var dir string
	for i := 0; ; i++ {
		dir = fmt.Sprintf("run/d%d", i)
		if h, _, ok := home.homeOf(dir); ok && h.Node == "n0" {
			break
		}
	}
	now := time.Now()
	for _, c := range []struct {
		what   string
		n0, n1 time.Time // when n0 reads each member first seen
		want   bool
	}{
		{"the other came after the home", now.Add(-time.Second), now, false},
		{"both seen at once (the other may have come first)", now, now, true},
		{"the other came first", now, now.Add(-time.Second), true},
		{"the home joined long ago", now.Add(-2 * handoff), now.Add(-3 * handoff), false},
	} {
		home.mu.Lock()
		home.since = map[string]time.Time{"n0": c.n0, "n1": c.n1}
		home.mu.Unlock()
		prev, ok := home.previousHome(dir)
		if ok != c.want || (ok && prev.Node != "n1") {
			t.Errorf("%s: previous home %v, %v; want %v", c.what, prev.Node, ok, c.want)
		}
	}
}
