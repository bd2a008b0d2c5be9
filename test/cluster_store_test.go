package test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dyadfs/dyadfs/fs"
	"github.com/dyadfs/dyadfs/hfl/store/etcd/etcdtest"
)

// When the metadata store refuses a publish, the writer hears it: its
// close fails, the file stays on its node (listed as unpublished, with the
// reason) and is published once the store takes it.

// writeAndClose is a python3 program that writes argv[2] into the file
// argv[1] and closes it, and prints how the close went ("ok" or the
// errno's name) and how long it took.
const writeAndClose = `import errno, os, sys, time
f = open(sys.argv[1], 'w')
f.write(sys.argv[2])
f.flush()
start = time.monotonic()
try:
    f.close()
    print('ok', time.monotonic() - start)
except OSError as e:
    print(errno.errorcode[e.errno], time.monotonic() - start)
`

// closeOf writes rel on n with python3 and returns how its close went and
// how long the close took.
func closeOf(t *testing.T, n *node, rel, data string) (string, time.Duration) {
	t.Helper()
	prog := filepath.Join(n.c.dir, "write-and-close.py")
	if err := os.WriteFile(prog, []byte(writeAndClose), 0o644); err != nil {
		t.Fatal(err)
	}
	r := n.sh(fmt.Sprintf("python3 %s %s '%s'", prog, rel, data))
	var what string
	var secs float64
	if _, err := fmt.Sscan(r.stdout, &what, &secs); err != nil {
		t.Fatalf("%s: python3: %v", n.name, r)
	}
	return what, time.Duration(secs * float64(time.Second))
}

// unpublished returns n's status entry for rel among its unpublished files.
func unpublished(st fs.Status, rel string) (reason string, ok bool) {
	for _, p := range st.Unpublished {
		if p.Path == rel {
			return p.Reason, true
		}
	}
	return "", false
}

func storeSection(st fs.Status) map[string]any {
	s, _ := st.Extra["store"].(map[string]any)
	return s
}

// etcdCounting is a helper ENDPOINTS PREFIX that prints what count
// returns for them.
func etcdCounting[N int | int64](count func(ctx context.Context, endpoints, prefix string) (N, error)) func(args []string) int {
	return func(args []string) int {
		ctx, cancel := context.WithTimeout(context.Background(), bound)
		defer cancel()
		n, err := count(ctx, args[0], args[1])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Println(n)
		return 0
	}
}

func init() {
	// etcd-fill ENDPOINTS PREFIX: write into etcd until it is full; print
	// how many keys that took.
	helpers["etcd-fill"] = etcdCounting(etcdtest.Fill)
	// etcd-reclaim ENDPOINTS: compact, defragment, disarm.
	helpers["etcd-reclaim"] = func(args []string) int {
		ctx, cancel := context.WithTimeout(context.Background(), bound)
		defer cancel()
		if err := etcdtest.Reclaim(ctx, args[0]); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return 0
	}
}

// TestClusterStoreFull: etcd reaches its quota. The close that crosses it
// fails with ENOSPC in under a second; the file stays on its node, listed
// as unpublished with the reason, and the status shows etcd's alarm.
// `dyadfs forget` refuses to forget a running job, and forgets a finished
// one (leaving this job whole); once the operator compacted, defragmented
// and disarmed etcd, the pending file is published, a reader on another
// node gets it, and the next close succeeds.
func TestClusterStoreFull(t *testing.T) {
	c := newClusterWith(t, clusterOptions{nodes: 2, etcdArgs: []string{"--quota-backend-bytes", "8388608"}})
	a, b := c.nodes[0], c.nodes[1]
	if what, _ := closeOf(t, a, "before.txt", "before"); what != "ok" {
		t.Fatalf("close before etcd is full: %s", what)
	}
	// Another (finished) job's leftovers fill etcd.
	if out, err := c.inNet(c.etcdNS, helperCmd("etcd-fill", etcdAddr, "/dyadfs/val/old-job/junk/")...); err != nil {
		t.Fatalf("fill etcd: %v %s", err, out)
	}
	reader := b.startSh("cat late.txt")
	what, took := closeOf(t, a, "late.txt", "late")
	if what != "ENOSPC" || took > time.Second {
		t.Fatalf("close into a full etcd: %s after %v, want ENOSPC in under a second", what, took)
	}
	st := a.status()
	if reason, ok := unpublished(st, "late.txt"); !ok || !strings.Contains(reason, "full") {
		t.Fatalf("the status lists %+v as unpublished, want late.txt with the reason", st.Unpublished)
	}
	a.waitStatus("etcd's alarm shown", func(st fs.Status) bool {
		return fmt.Sprint(storeSection(st)["alarms"]) == "[NOSPACE]"
	})
	if out, err := a.run(dyadfsBin, "status", c.mnt); err != nil || !strings.Contains(out, "NOSPACE") || !strings.Contains(out, "late.txt") {
		t.Fatalf("dyadfs status does not show the alarm and the unpublished file: %v\n%s", err, out)
	}

	// forget: not a running job; a finished one, whole, and nothing else.
	storeURL := "etcd://" + etcdAddr
	if out, err := a.run(dyadfsBin, "forget", "--store", storeURL, "--namespace", c.namespace); err == nil || !strings.Contains(out, "running") {
		t.Fatalf("forget of a running job: %v %s", err, out)
	}
	if out, err := a.run(dyadfsBin, "forget", "--dry-run", "--store", storeURL, "--namespace", "old-job"); err != nil || !strings.Contains(out, "would forget namespace old-job") {
		t.Fatalf("forget --dry-run of a finished job: %v %s", err, out)
	}
	if out, err := a.run(dyadfsBin, "forget", "--store", storeURL, "--namespace", "old-job"); err != nil || !strings.Contains(out, "forgot namespace old-job") {
		t.Fatalf("forget of a finished job: %v %s", err, out)
	}
	// A namespace with nothing in the store (a typo): an error, not "0 keys".
	var ee *exec.ExitError
	if out, err := a.run(dyadfsBin, "forget", "--store", storeURL, "--namespace", "old-jbo"); !errors.As(err, &ee) || ee.ExitCode() != 17 || !strings.Contains(out, "typo") {
		t.Fatalf("forget of a namespace with nothing in the store: %v %s, want exit 17", err, out)
	}
	if got := b.mustSh("cat before.txt"); got != "before" {
		t.Fatalf("after forgetting another job, before.txt reads %q", got)
	}
	if out, err := c.inNet(c.etcdNS, helperCmd("etcd-reclaim", etcdAddr)...); err != nil {
		t.Fatalf("reclaim etcd: %v %s", err, out)
	}
	if r := within(t, "the reader of late.txt", bound, reader); r.err != nil || r.stdout != "late" {
		t.Fatalf("the reader of late.txt: %v", r)
	}
	a.waitStatus("nothing unpublished", func(st fs.Status) bool { return len(st.Unpublished) == 0 })
	if what, _ := closeOf(t, a, "after.txt", "after"); what != "ok" {
		t.Fatalf("close once etcd has room: %s", what)
	}
	if got := b.mustSh("cat after.txt"); got != "after" {
		t.Fatalf("after.txt reads %q", got)
	}
}

// TestClusterStoreDown: with etcd down, a close waits --publish-wait and
// fails with EIO; the file is listed as unpublished and is published once
// etcd is back.
func TestClusterStoreDown(t *testing.T) {
	c := newCluster(t, 2, "--publish-wait", "2s")
	a, b := c.nodes[0], c.nodes[1]
	c.stopEtcd()
	what, took := closeOf(t, a, "down.txt", "while-down")
	if what != "EIO" || took < 2*time.Second || took > 10*time.Second {
		t.Fatalf("close while etcd is down: %s after %v, want EIO after the 2s bound", what, took)
	}
	if _, ok := unpublished(a.status(), "down.txt"); !ok {
		t.Fatalf("down.txt is not listed as unpublished")
	}
	a.waitStatus("etcd unreachable", func(st fs.Status) bool { return storeSection(st)["reachable"] == false })
	// The status names the endpoint that does not answer, and counts the
	// close that waits for its publish.
	if e, _ := storeSection(a.status())["error"].(string); !strings.Contains(e, etcdAddr) {
		t.Fatalf("the store's error %q does not name its endpoint %s", e, etcdAddr)
	}
	closing := a.startSh("echo x > waiting.txt")
	a.waitStatus("a close waiting for its publish counted", func(st fs.Status) bool {
		n, _ := storeSection(st)["publishes_in_progress"].(float64)
		return n >= 1
	})
	<-closing
	c.startEtcd()
	a.waitStatus("down.txt and waiting.txt published", func(st fs.Status) bool { return len(st.Unpublished) == 0 })
	if got := b.mustSh("cat down.txt"); got != "while-down" {
		t.Fatalf("down.txt reads %q once etcd is back", got)
	}
}

func init() {
	// etcd-count ENDPOINTS PREFIX: print how many keys etcd has under PREFIX.
	helpers["etcd-count"] = etcdCounting(etcdtest.Count)
}

// etcdKeys counts the keys etcd holds under prefix.
func (c *cluster) etcdKeys(prefix string) int {
	c.t.Helper()
	out, err := c.inNet(c.etcdNS, helperCmd("etcd-count", etcdAddr, prefix)...)
	var n int
	if _, serr := fmt.Sscan(out, &n); err != nil || serr != nil {
		c.t.Fatalf("count etcd keys under %s: %v %s", prefix, err, out)
	}
	return n
}

// TestClusterStoreHoldsOnlyLiveFiles: nothing dyadfs writes to the store
// outlives the file it describes: once a tree made, rewritten, renamed and
// linked on two nodes is removed, the job's records and directory index
// are empty; what is left (registrations, the job secret) goes with
// `dyadfs forget --force`, and the status counts the records.
func TestClusterStoreHoldsOnlyLiveFiles(t *testing.T) {
	c := newCluster(t, 2)
	a, b := c.nodes[0], c.nodes[1]
	a.mustSh(`mkdir -p t/d1 t/d2 && for i in 1 2 3 4 5 6 7 8; do echo $i > t/d1/f$i; echo $i > t/d2/g$i; done
ln -s d1/f1 t/link && ln t/d1/f2 t/d1/hard`)
	b.mustSh(`echo more >> t/d1/f3 && mv t/d1/f4 t/d2/moved && printf new > t/d2/g1 && mkdir t/d3 && echo b > t/d3/b`)
	recs, index := "/dyadfs/rec/"+c.namespace+"/", "/dyadfs/dir/"+c.namespace+"/"
	// 16 files, a link and a hard link, 4 directories (t, d1, d2, d3)
	// and b's file: 23 records, each once, in its directory's index
	// (earlier releases kept a second copy under rec/).
	if n, m := c.etcdKeys(recs), c.etcdKeys(index); n != 0 || m != 23 {
		t.Fatalf("the store holds %d copies under rec/ and %d index entries, want none and 23", n, m)
	}
	a.waitStatus("the status counts the records", func(st fs.Status) bool {
		n, _ := storeSection(st)["records"].(float64)
		b, _ := storeSection(st)["db_bytes"].(float64)
		return n == 23 && b > 0
	})
	b.mustSh("rm -r t")
	if n, m := c.etcdKeys(recs), c.etcdKeys(index); n != 0 || m != 0 {
		t.Fatalf("after rm -r, the store holds %d records and %d index entries, want none", n, m)
	}
	if out, err := a.run(dyadfsBin, "forget", "--force", "--store", "etcd://"+etcdAddr, "--namespace", c.namespace); err != nil {
		t.Fatalf("forget --force: %v %s", err, out)
	}
	if n := c.etcdKeys("/dyadfs/val/" + c.namespace + "/"); n != 0 {
		t.Fatalf("after forget, %d values of the job are left", n)
	}
}

// TestClusterCloseSurvivesSignals: signals to a closing process (here
// SIGURG, which the Go runtime sends its own threads to preempt them) do
// not make the close that publishes fail: what a close starts, it
// finishes.
func TestClusterCloseSurvivesSignals(t *testing.T) {
	c := newCluster(t, 2)
	a := c.nodes[0]
	a.mustSh("mkdir sig")
	argv := a.argv(helperCmd("produce", filepath.Join(c.mnt, "sig"), "300", "4096", "pipelined")...)
	cmd := exec.Command(argv[0], argv[1:]...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	tick := time.NewTicker(500 * time.Microsecond)
	defer tick.Stop()
	deadline := time.After(bound)
	// nsenter and env exec the producer: the command's process is it.
	for {
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("producer: %v: %s", err, stderr.String())
			}
			if got := c.nodes[1].mustSh("ls sig | wc -l"); strings.TrimSpace(got) != "300" {
				t.Fatalf("the other node lists %s files, want 300", got)
			}
			return
		case <-tick.C:
			cmd.Process.Signal(syscall.SIGURG)
		case <-deadline:
			cmd.Process.Kill()
			t.Fatal("the producer did not finish")
		}
	}
}
