package test

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dyadfs/dyadfs/dtl/dtltest"
	"github.com/dyadfs/dyadfs/fs"
)

// faultBound is how long a consumer may take to fail once the owner is gone
// or cut off: the stall timeout (2s), a dial timeout (5s) and the lease
// (2s), with room to spare, and well under the fetch timeout (30s): an EIO
// within it comes from noticing the fault, not from giving up.
const faultBound = 20 * time.Second

// noPartial checks that a failed transfer left nothing visible on n: not the
// file, and no temporary file.
func noPartial(t *testing.T, n *node, rel string) {
	t.Helper()
	if _, err := os.Lstat(filepath.Join(n.backing, rel)); !os.IsNotExist(err) {
		t.Fatalf("%s: %s exists after a failed transfer (%v)", n.name, rel, err)
	}
	// The fetcher keeps a few empty files ready; none may hold data.
	tmp, _ := os.ReadDir(filepath.Join(n.backing, ".dyadfs", "tmp-"+n.name))
	for _, e := range tmp {
		if info, err := e.Info(); err == nil && info.Size() != 0 {
			t.Fatalf("%s: a partial file was left after a failed transfer: %s (%d bytes)", n.name, e.Name(), info.Size())
		}
	}
}

func failsWithEIO(t *testing.T, what string, ch <-chan result) {
	t.Helper()
	r := within(t, what, faultBound, ch)
	if r.err == nil || !strings.Contains(r.stderr, "Input/output error") {
		t.Fatalf("%s: %v, want EIO", what, r)
	}
}

// faultedTransfer: a consumer on B reads a file A published, and A becomes
// unreachable (cut) before the transfer starts or, with during, while it
// runs (A's link is slowed so that it takes a while). The consumer gets EIO
// within faultBound and nothing partial is left on B; once A is back
// (restore), a read returns the file.
func faultedTransfer(t *testing.T, w wire, during bool, cut, restore func(a *node)) (retries uint64) {
	c := newClusterOn(t, w, 2)
	a, b := c.nodes[0], c.nodes[1]
	// Larger than a file whose bytes travel with its notices: the home
	// keeps those, and a consumer needs no transfer from the owner.
	size := 64 << 10
	if during {
		size = 32 << 20
	}
	a.mustSh(fmt.Sprintf("head -c %d /dev/urandom > f", size))
	want := sha(a, "f")
	if during {
		a.slowLink("16mbit")
	}
	var reader <-chan result
	if during {
		reader = b.startSh("sha256sum f")
		waitTransferStarted(t, b)
		cut(a)
	} else {
		// Cut first: a reader started before could have its 64 KiB
		// before the cut.
		cut(a)
		reader = b.startSh("sha256sum f")
	}
	failsWithEIO(t, "consumer of an owner that became unreachable", reader)
	noPartial(t, b, "f")
	// Retries back off: a handful while the owner's lease runs out, not
	// one every few milliseconds.
	retries = transportCounter(b.status(), "retries")
	if retries > 15 {
		t.Fatalf("%d retries before giving up: the consumer hammered the owner", retries)
	}
	if during {
		a.fullSpeed()
	}
	restore(a)
	// After a cut link, the owner registers again once its lease ran out.
	if got := eventuallySha(t, b, "f"); got != want {
		t.Fatalf("after the owner returned: sha256 %s, want %s", got, want)
	}
	return retries
}

// waitTransferStarted waits until n has a transfer in progress.
func waitTransferStarted(t *testing.T, n *node) {
	t.Helper()
	eventually(t, n.name+": a transfer in progress", func() bool {
		tmp, _ := os.ReadDir(filepath.Join(n.backing, ".dyadfs", "tmp-"+n.name))
		for _, e := range tmp {
			if info, err := e.Info(); err == nil && info.Size() > 0 {
				return true
			}
		}
		return false
	})
}

// eventuallySha is the sha256 of p read on n, once a read succeeds.
func eventuallySha(t *testing.T, n *node, p string) string {
	t.Helper()
	var got string
	eventually(t, n.name+": read "+p, func() bool {
		r := n.sh("sha256sum " + p)
		if r.err != nil {
			return false
		}
		got = strings.Fields(r.stdout)[0]
		return true
	})
	return got
}

func killDaemon(a *node)    { a.kill() }
func restartDaemon(a *node) { a.start() }
func cutLink(a *node)       { a.linkDown() }
func restoreLink(a *node)   { a.linkUp() }

func TestClusterOwnerKilledBeforeTransfer(t *testing.T) {
	faultedTransfer(t, tcpWire, false, killDaemon, restartDaemon)
}

func TestClusterOwnerKilledDuringTransfer(t *testing.T) {
	forEachWire(t, func(t *testing.T, w wire) {
		// The connection breaks while the owner's lease still runs: the
		// consumer retries, and counts it.
		if n := faultedTransfer(t, w, true, killDaemon, restartDaemon); n == 0 {
			t.Fatal("no retry was counted after the owner died mid-transfer")
		}
	})
}

func TestClusterLinkCutBeforeTransfer(t *testing.T) {
	faultedTransfer(t, tcpWire, false, cutLink, restoreLink)
}

func TestClusterLinkCutDuringTransfer(t *testing.T) {
	forEachWire(t, func(t *testing.T, w wire) {
		faultedTransfer(t, w, true, cutLink, restoreLink)
	})
}

// TestClusterEtcdRestart: consumers keep waiting while etcd restarts and
// wake on a publish made after it.
func TestClusterEtcdRestart(t *testing.T) {
	c := newCluster(t, 2)
	a, b := c.nodes[0], c.nodes[1]
	readers := []<-chan result{b.startSh("cat later/f"), b.startSh("cat later/f")}
	b.waitStatus("readers waiting", func(st fs.Status) bool { return st.DMD.OpensWaited >= 2 })
	c.stopEtcd()
	c.startEtcd()
	for _, ch := range readers {
		if r, waiting := notYet(ch); !waiting {
			t.Fatalf("a reader stopped waiting across the etcd restart: %v", r)
		}
	}
	a.mustSh("mkdir later && echo after-restart > later/f")
	for _, ch := range readers {
		if r := within(t, "reader", bound, ch); r.err != nil || r.stdout != "after-restart\n" {
			t.Fatalf("reader: %v", r)
		}
	}
}

// TestClusterEtcdDownAtWaitAndPublish: with etcd down, a consumer starts
// waiting and the producer publishes; once etcd is back the publish lands
// (it is retried) and the consumer wakes. A small file, whose bytes travel
// with its notice, reaches its waiting consumer while etcd is still down:
// it is complete, and its home heard of it.
func TestClusterEtcdDownAtWaitAndPublish(t *testing.T) {
	c := newCluster(t, 2, "--publish-wait", "1s")
	a, b := c.nodes[0], c.nodes[1]
	c.stopEtcd()
	reader := b.startSh("sha256sum down/f")
	small := b.startSh("cat down/small")
	b.waitStatus("readers waiting", func(st fs.Status) bool { return st.DMD.OpensWaited >= 2 })
	// The writers' closes fail once --publish-wait has passed (the writer
	// hears that the file is not published); the files stay, and are
	// published once etcd is back.
	a.mustSh("mkdir down")
	big := make([]byte, 32768)
	rand.Read(big)
	for rel, data := range map[string]string{"down/f": hex.EncodeToString(big), "down/small": "while-down"} {
		if what, _ := closeOf(t, a, rel, data); what != "EIO" {
			t.Fatalf("close of %s while etcd is down: %s, want EIO", rel, what)
		}
	}
	want := sha(a, "down/f")
	a.waitStatus("publishes queued for retry", func(st fs.Status) bool { return st.DMD.PendingPublishes == 2 })
	if r := within(t, "reader of the small file", bound, small); r.err != nil || r.stdout != "while-down" {
		t.Fatalf("reader of the small file: %v", r)
	}
	if r, waiting := notYet(reader); !waiting {
		t.Fatalf("the reader finished while etcd was down: %v", r)
	}
	c.startEtcd()
	if r := within(t, "reader", bound, reader); r.err != nil || strings.Fields(r.stdout)[0] != want {
		t.Fatalf("reader: %v, want sha256 %s", r, want)
	}
	a.waitStatus("publishes landed", func(st fs.Status) bool { return st.DMD.PendingPublishes == 0 })
}

// Faults no retry can fix end the open at once, with their own errno.

// timedSh runs script on n and returns its result and how long the script
// itself took, measured inside the node (without nsenter's start-up).
func timedSh(n *node, script string) (result, time.Duration) {
	n.c.t.Helper()
	r := n.sh(`s=$(date +%s%N); rc=0; (` + script + `) || rc=$?; e=$(date +%s%N); echo "took $((e - s))" >&2; exit $rc`)
	var ns int64
	for _, line := range strings.Split(r.stderr, "\n") {
		if v, ok := strings.CutPrefix(line, "took "); ok {
			fmt.Sscan(v, &ns)
		}
	}
	return r, time.Duration(ns)
}

// failedForGood is how many transfers n gave up on for good with errno.
func failedForGood(st fs.Status, errno string) uint64 {
	tr, _ := st.Extra["transport"].(map[string]any)
	m, _ := tr["failed_for_good"].(map[string]any)
	v, _ := m[errno].(float64)
	return uint64(v)
}

// TestClusterConsumerStorageFaults: a consumer whose backing directory is
// a 20 MiB filesystem: a 64 MiB file fails to open with ENOSPC in under a
// second and moves no byte (its space is checked before the transfer),
// without retries; a file that fits arrives afterwards; once the
// filesystem is read-only, a fetch fails with EROFS.
func TestClusterConsumerStorageFaults(t *testing.T) {
	c := newCluster(t, 1)
	a := c.nodes[0]
	b := c.addNodeOnTmpfs("n1", "20m")
	a.mustSh("head -c 67108864 /dev/urandom > big && head -c 8388608 /dev/urandom > fits && head -c 1048576 /dev/urandom > later")
	want := sha(a, "fits")
	b.mustSh("stat big fits later > /dev/null") // the names are known here: what follows times the open alone
	served := transportCounter(a.status(), "bytes_served")

	r, took := timedSh(b, "cat big > /dev/null")
	if r.err == nil || !strings.Contains(r.stderr, "No space left on device") {
		t.Fatalf("cat of a file larger than the free space: %v, want ENOSPC", r)
	}
	if took > time.Second {
		t.Fatalf("ENOSPC took %v, want under a second", took)
	}
	if moved := transportCounter(a.status(), "bytes_served") - served; moved != 0 {
		t.Fatalf("%d bytes moved for a file that cannot fit", moved)
	}
	st := b.status()
	if failedForGood(st, "ENOSPC") != 1 || transportCounter(st, "retries") != 0 {
		t.Fatalf("status counts %v failed for good and %d retries, want one ENOSPC and none", st.Extra["transport"], transportCounter(st, "retries"))
	}
	if !strings.Contains(b.readLog(), "transfer cannot succeed") || !strings.Contains(b.readLog(), "free_bytes=") {
		t.Fatalf("the log does not say why the transfer failed, with the free space")
	}
	noPartial(t, b, "big")
	if got := eventuallySha(t, b, "fits"); got != want {
		t.Fatalf("the file that fits: sha256 %s, want %s", got, want)
	}

	// Read-only: the administrator remounted the backing filesystem.
	if out, err := b.run("mount", "-o", "remount,ro", b.backing); err != nil {
		t.Fatalf("remount read-only: %v %s", err, out)
	}
	r, took = timedSh(b, "cat later > /dev/null")
	if r.err == nil || !strings.Contains(r.stderr, "Read-only file system") || took > time.Second {
		t.Fatalf("cat on a read-only backing directory: %v after %v, want EROFS at once", r, took)
	}
	if got := failedForGood(b.status(), "EROFS"); got != 1 {
		t.Fatalf("status counts %d EROFS failures, want 1", got)
	}
}

// TestClusterOwnerCannotRead: the owner's daemon cannot read its backing
// file (it runs without the capability to override file permissions, and
// the file's mode is 000): the consumer gets EIO at once, without retries.
func TestClusterOwnerCannotRead(t *testing.T) {
	c := newCluster(t, 0)
	a := c.addNodeWrapped("n0", []string{"setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--"})
	b := c.addNode("n1")
	// Larger than a file whose bytes travel with its notices.
	a.mustSh("head -c 65536 /dev/urandom > locked && head -c 65536 /dev/urandom > open")
	if err := os.Chmod(filepath.Join(a.backing, "locked"), 0); err != nil {
		t.Fatal(err)
	}
	r, took := timedSh(b, "cat locked > /dev/null")
	if r.err == nil || !strings.Contains(r.stderr, "Input/output error") || took > 5*time.Second {
		t.Fatalf("cat of a file its owner cannot read: %v after %v, want EIO at once", r, took)
	}
	st := b.status()
	if failedForGood(st, "EIO") != 1 || transportCounter(st, "retries") != 0 {
		t.Fatalf("status counts %v, want one EIO failed for good and no retry", st.Extra["transport"])
	}
	noPartial(t, b, "locked")
	// The owner serves what it can read.
	if got, want := sha(b, "open"), sha(a, "open"); got != want {
		t.Fatalf("open: sha256 %s, want %s", got, want)
	}
}

// TestClusterCorruptCopy: a byte of a published file flips on its owner's
// disk (its size and mtime unchanged, as a failing disk leaves them). The
// consumer's open fails with EIO at once, nothing is installed, the
// mismatch is logged with the path and both nodes, and status and the
// metrics count it. Written again through the mount, the file arrives,
// verified; so does a small file, whose bytes travel with its notice.
func TestClusterCorruptCopy(t *testing.T) {
	c := newCluster(t, 2, "--metrics", ":9465")
	a, b := c.nodes[0], c.nodes[1]
	a.mustSh("head -c 3000000 /dev/urandom > data && echo small > small")
	dtltest.FlipByte(t, filepath.Join(a.backing, "data"), 1500000)

	r, took := timedSh(b, "cat data > /dev/null")
	if r.err == nil || !strings.Contains(r.stderr, "Input/output error") || took > 10*time.Second {
		t.Fatalf("cat of a file whose bytes changed on its owner's disk: %v after %v, want EIO at once", r, took)
	}
	noPartial(t, b, "data")
	st := b.status()
	if n := transportCounter(st, "corrupt_copies"); n != 1 || failedForGood(st, "EIO") != 1 {
		t.Fatalf("status counts %d corrupt copies, %d EIO failures; want 1, 1: %v", n, failedForGood(st, "EIO"), st.Extra["transport"])
	}
	logText := b.readLog()
	found := false
	for _, line := range strings.Split(logText, "\n") {
		if strings.Contains(line, "does not match its published checksum") && strings.Contains(line, "path=data") &&
			strings.Contains(line, "owner="+a.name) && strings.Contains(line, "node="+b.name) {
			found = true
		}
	}
	if !found {
		t.Fatalf("the consumer's log has no line naming the path and both nodes:\n%s", logText)
	}
	metricsText := b.mustSh(`python3 -c 'import urllib.request, sys; sys.stdout.write(urllib.request.urlopen("http://` + b.ip + `:9465/metrics").read().decode())'`)
	if n := sample(metricsText, "dyadfs_transport_corrupt_copies_total"); n != 1 {
		t.Fatalf("metrics count %v corrupt copies, want 1", n)
	}

	// Written again through the mount: published with a new checksum.
	a.mustSh("head -c 3000000 /dev/urandom > data")
	if got, want := sha(b, "data"), sha(a, "data"); got != want {
		t.Fatalf("data written again: sha256 %s, want %s", got, want)
	}
	if got := b.mustSh("cat small"); got != "small\n" {
		t.Fatalf("small: %q", got)
	}
	st = b.status()
	if n := transportCounter(st, "verified_copies"); n < 2 || transportCounter(st, "unverified_copies") != 0 {
		t.Fatalf("status counts %d verified, %d unverified copies; want 2 and 0: %v", n, transportCounter(st, "unverified_copies"), st.Extra["transport"])
	}
}
