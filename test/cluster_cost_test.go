package test

import (
	"fmt"
	"os"
	"path/filepath"
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
	script := writersScript(writers, files, filepath.Join(c.dir, "ok"))
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

// writersScript runs writers shell loops at once, each writing files
// small files into its own directory; a file whose close succeeded is
// listed in okList. It fails if any writer failed. dd opens and closes
// each file itself (and fails if its close fails): a shell's redirection
// would keep the file open in the shell after the command exits, and
// the shell ignores that close's error.
func writersScript(writers, files int, okList string) string {
	return fmt.Sprintf(`
for w in $(seq 1 %d); do
  (mkdir -p w$w && i=0 && while [ $i -lt %d ]; do
     dd if=/dev/urandom of=w$w/f$i bs=1024 count=1 status=none || { echo "create w$w/f$i failed" >&2; exit 1; }
     echo w$w/f$i >> %s.$w
     i=$((i+1))
   done) &
  pids="$pids $!"
done
fail=0
for p in $pids; do wait $p || fail=1; done
cat %s.* > %s
exit $fail`, writers, files, okList, okList, okList)
}

// TestClusterGroupCommit: 16 writers whose closes wait for the store
// share its transactions (the store section of the status counts them),
// and every file is read on the other node with its bytes. The status
// says where the waiting closes' time went.
func TestClusterGroupCommit(t *testing.T) {
	const writers, files = 16, 60
	c := newCluster(t, 2)
	n0, n1 := c.nodes[0], c.nodes[1]
	ok := filepath.Join(c.dir, "ok")
	if res := within(t, "writers", 3*time.Minute, n0.startShFor(3*time.Minute, writersScript(writers, files, ok))); res.err != nil {
		t.Fatalf("writers: %v", res)
	}
	store := n0.status().Extra["store"].(map[string]any)
	txns, pubs := store["transactions"].(float64), store["transaction_publishes"].(float64)
	if pubs < writers*files || txns >= pubs {
		t.Fatalf("store section %v: want at least %d publishes in fewer transactions", store, writers*files)
	}
	t.Logf("%v publishes in %v transactions", pubs, txns)
	cl := n0.status().DMD.Closes
	stages := cl.CheckSeconds + cl.RecordSeconds + cl.CommitSeconds + cl.TellSeconds
	if cl.Count != writers*files || cl.CommitSeconds <= 0 || cl.TellSeconds <= 0 || cl.RecordSeconds <= 0 || stages > cl.TotalSeconds {
		t.Fatalf("status waiting closes %+v: want %d closes, each stage timed, within their total", cl, writers*files)
	}
	if out, err := n0.run(dyadfsBin, "status", c.mnt); err != nil || !strings.Contains(out, "closes that waited for the store") {
		t.Fatalf("dyadfs status does not show the waiting closes: %v\n%s", err, out)
	}
	sameOnBoth(t, c, n0, n1, ok, writers*files)
}

// sameOnBoth checks that node b reads every file listed in list as node a
// wrote it (its backing file), and that there are want of them.
func sameOnBoth(t *testing.T, c *cluster, a, b *node, list string, want int) {
	t.Helper()
	data, err := os.ReadFile(list)
	if err != nil {
		t.Fatal(err)
	}
	names := strings.Fields(string(data))
	if want >= 0 && len(names) != want {
		t.Fatalf("%d files closed; want %d", len(names), want)
	}
	script := "cd " + c.mnt + "\nfor f in " + strings.Join(names, " ") + "; do cmp $f " + a.backing + "/$f; done"
	// Killed after a minute: then the waits and the unpublished files say
	// which file never came.
	if res := <-b.startShFor(time.Minute, script); res.err != nil {
		t.Fatalf("node 2 reads what node 1 wrote: %v\nnode 2 waits: %+v\nnode 1 unpublished: %+v", res, b.status().Waiters, a.status().Unpublished)
	}
}

// TestClusterGroupCommitKilled: the daemon killed while its writers'
// closes wait in batches loses no file whose close succeeded: once it is
// mounted again, the other node reads every one of them.
func TestClusterGroupCommitKilled(t *testing.T) { killWhileWriting(t) }

// TestClusterAsidePublishesKilled: the same with closes that do not wait
// (--publish-wait 0), whose publishes wait for each other to share a
// transaction: killed with publishes lingering, the daemon loses none of
// them once it is mounted again (its start's scan publishes them). A file
// whose close returned before the daemon took its release is held back
// at the start as being written, and says so in the log; written again,
// it is published.
func TestClusterAsidePublishesKilled(t *testing.T) {
	killWhileWriting(t, "--publish-wait", "0")
}

// killWhileWriting kills node 1 (mounted with flags) while 16 writers
// create files on it, mounts it again, and checks that node 2 reads every
// file whose close succeeded. With closes that wait, none of them is held
// back at the start as being written; with --publish-wait 0, those held
// back are written again first.
func killWhileWriting(t *testing.T, flags ...string) {
	const writers, files = 16, 400
	c := newCluster(t, 2, flags...)
	n0, n1 := c.nodes[0], c.nodes[1]
	ok := filepath.Join(c.dir, "ok")
	done := n0.startShFor(3*time.Minute, writersScript(writers, files, ok))
	eventually(t, "writers under way", func() bool {
		out, _ := n0.run("sh", "-c", "cat "+ok+".* 2>/dev/null | wc -l")
		closed, _ := strconv.Atoi(strings.TrimSpace(out))
		return closed >= 200
	})
	n0.kill()
	res := within(t, "writers", time.Minute, done)
	if res.err == nil {
		t.Fatalf("writers all finished before the kill: %v", res)
	}
	t.Logf("writers: %v", res)
	n0.start()
	data, err := os.ReadFile(ok)
	if err != nil {
		t.Fatal(err)
	}
	closed := make(map[string]bool)
	for _, name := range strings.Fields(string(data)) {
		closed[name] = true
	}
	for _, held := range heldBack(n0.readLog()) {
		if !closed[held] {
			continue // its close failed with the kill
		}
		if len(flags) == 0 {
			t.Fatalf("%s: its waiting close succeeded, yet it was held back as being written at the start", held)
		}
		t.Logf("%s: closed before the daemon took its release; held back, written again", held)
		// Its bytes from the backing directory: an open to read it
		// waits, as on every node, until it is written again.
		n0.mustSh("cat " + n0.backing + "/" + held + " > " + c.dir + "/again && cat " + c.dir + "/again > " + held)
	}
	sameOnBoth(t, c, n0, n1, ok, -1)
	t.Logf("%d files closed before the kill, all read on node 2", len(closed))
}

// heldBack returns the files a daemon's log says its start held back as
// being written when the daemon before it stopped.
func heldBack(log string) []string {
	var out []string
	for _, line := range strings.Split(log, "\n") {
		if !strings.Contains(line, "file was being written when dyadfs stopped") {
			continue
		}
		if i := strings.Index(line, " path="); i >= 0 {
			out = append(out, strings.Fields(line[i+len(" path="):])[0])
		}
	}
	return out
}
