package test

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// Races across nodes, each found by running ordinary programs on three
// nodes at once: what the README promises holds while they race.

// loopFor is a shell loop that runs body for d.
func loopFor(d time.Duration, body string) string {
	return fmt.Sprintf("end=$(($(date +%%s)+%d)); while [ $(date +%%s) -lt $end ]; do %s; done", int(d.Seconds()), body)
}

// TestClusterOpenWhileRenamedOver: a reader's open of an existing file is
// never turned into an open of the mount's root (EISDIR) or of nothing
// (ENOENT) when a rename replaces the name on the reader's node between
// the kernel's LOOKUP and its OPEN, while the version it replaces came
// from another node.
func TestClusterOpenWhileRenamedOver(t *testing.T) {
	c := newCluster(t, 2)
	a, b := c.nodes[0], c.nodes[1]
	a.mustSh("head -c 65536 /dev/urandom > x")
	const d = 12 * time.Second
	writer := b.startSh(loopFor(d, "head -c 65536 /dev/urandom > x; sleep 0.1"))
	renamer := a.startSh(loopFor(d, "head -c 65536 /dev/urandom > x.tmp && mv x.tmp x; sleep 0.1"))
	reader := a.startSh(loopFor(d, "cat x >/dev/null 2>>../read-errors || true; n=$((n+1))") + "; echo $n")
	nowait := a.startSh("export DYADFS_WAIT=0; " + loopFor(d, "cat x >/dev/null 2>>../nowait-errors || true; n=$((n+1))") + "; echo $n")
	for _, ch := range []<-chan result{writer, renamer} {
		if r := <-ch; r.err != nil {
			t.Fatalf("a writer failed: %v", r)
		}
	}
	for _, x := range []struct {
		ch   <-chan result
		errs string
	}{{reader, "read-errors"}, {nowait, "nowait-errors"}} {
		r := <-x.ch
		if r.err != nil {
			t.Fatalf("a reader failed: %v", r)
		}
		errs := c.readFile(x.errs)
		t.Logf("%s: %s opens", x.errs, strings.TrimSpace(r.stdout))
		if errs != "" {
			t.Errorf("opens of an existing file failed while it was renamed over (%s):\n%.2000s", x.errs, errs)
		}
	}
}
