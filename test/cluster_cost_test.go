package test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestClusterManyWritersFewDescriptors: a daemon whose descriptor limit
// is low (prlimit) takes 16 writers creating small files as fast as they
// can, with releases that publish after close (--publish-wait 0): every
// create succeeds (the daemon holds back new opens while releases catch
// up, instead of running out of descriptors), and the other node sees
// every file. The status shows the daemon's descriptors and its limit.
func TestClusterManyWritersFewDescriptors(t *testing.T) {
	const limit, writers, files = 128, 16, 250
	c := newCluster(t, 0)
	n0 := c.addNodeWrapped("n0", []string{"prlimit", fmt.Sprintf("--nofile=%d:%d", limit, limit)}, "--publish-wait", "0")
	n1 := c.addNode("n1", "--publish-wait", "0")

	st := n0.status()
	if st.Descriptors.Limit != limit || st.Descriptors.Open <= 0 || st.Descriptors.Open >= limit {
		t.Fatalf("status descriptors %+v; want the limit %d and the open count", st.Descriptors, limit)
	}
	script := fmt.Sprintf(`
for w in $(seq 1 %d); do
  (mkdir -p w$w && i=0 && while [ $i -lt %d ]; do
     head -c 1024 /dev/urandom > w$w/f$i || { echo "create w$w/f$i failed" >&2; exit 1; }
     i=$((i+1))
   done) &
  pids="$pids $!"
done
fail=0
for p in $pids; do wait $p || fail=1; done
exit $fail`, writers, files)
	res := within(t, "16 writers", 4*time.Minute, n0.startShFor(4*time.Minute, script))
	if res.err != nil {
		t.Fatalf("writers under a descriptor limit of %d: %v\nlog:\n%s", limit, res, tail(n0.readLog(), 30))
	}
	want := strconv.Itoa(writers * files)
	var got string
	deadline := time.Now().Add(time.Minute)
	for got != want && time.Now().Before(deadline) {
		out, err := n1.run("sh", "-c", "find "+c.mnt+" -type f -name 'f*' | wc -l")
		if got = strings.TrimSpace(out); err != nil {
			t.Fatalf("find on node 2: %v %s", err, out)
		}
	}
	if got != want {
		t.Fatalf("node 2 lists %s files; want %s", got, want)
	}
	st = n0.status()
	if st.Descriptors.Open >= limit || st.Descriptors.Limit != limit {
		t.Fatalf("status descriptors after the writers: %+v", st.Descriptors)
	}
	t.Logf("descriptors: %+v; held back: %d opens", st.Descriptors, st.Descriptors.OpensHeld)
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
