package test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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

// TestClusterOwnerKilledBeforeTransfer: the owner's daemon dies after
// publishing; a consumer gets EIO within a bounded time, nothing partial is
// left, and once the owner is back the consumer reads the file.
func TestClusterOwnerKilledBeforeTransfer(t *testing.T) {
	c := newCluster(t, 2)
	a, b := c.nodes[0], c.nodes[1]
	a.mustSh("echo precious > f")
	want := sha(a, "f")
	a.kill()
	failsWithEIO(t, "consumer of a dead owner's file", b.startSh("cat f"))
	noPartial(t, b, "f")
	a.start()
	if got := sha(b, "f"); got != want {
		t.Fatalf("after the owner returned: sha256 %s, want %s", got, want)
	}
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

// TestClusterOwnerKilledDuringTransfer: the owner dies while the file is on
// its way (its link is slowed so the transfer takes a while).
func TestClusterOwnerKilledDuringTransfer(t *testing.T) {
	c := newCluster(t, 2)
	a, b := c.nodes[0], c.nodes[1]
	a.mustSh("head -c 33554432 /dev/urandom > big")
	want := sha(a, "big")
	a.slowLink("16mbit")
	reader := b.startSh("sha256sum big")
	waitTransferStarted(t, b)
	a.kill()
	failsWithEIO(t, "consumer whose owner died mid-transfer", reader)
	noPartial(t, b, "big")
	a.fullSpeed()
	a.start()
	if got := sha(b, "big"); got != want {
		t.Fatalf("after the owner returned: sha256 %s, want %s", got, want)
	}
}

// TestClusterLinkCutBeforeTransfer: the owner's link goes down after it
// published; the consumer gets EIO, and reads the file once the link is up.
func TestClusterLinkCutBeforeTransfer(t *testing.T) {
	c := newCluster(t, 2)
	a, b := c.nodes[0], c.nodes[1]
	a.mustSh("echo across > f")
	want := sha(a, "f")
	a.linkDown()
	failsWithEIO(t, "consumer of an unreachable owner", b.startSh("cat f"))
	noPartial(t, b, "f")
	a.linkUp()
	// The owner's lease ran out while it was cut off; it registers again.
	var got string
	eventually(t, "read after the link came back", func() bool {
		r := b.sh("sha256sum f")
		if r.err != nil {
			return false
		}
		got = strings.Fields(r.stdout)[0]
		return true
	})
	if got != want {
		t.Fatalf("sha256 %s, want %s", got, want)
	}
}

// TestClusterLinkCutDuringTransfer: the owner's link goes down mid-transfer.
func TestClusterLinkCutDuringTransfer(t *testing.T) {
	c := newCluster(t, 2)
	a, b := c.nodes[0], c.nodes[1]
	a.mustSh("head -c 33554432 /dev/urandom > big")
	want := sha(a, "big")
	a.slowLink("16mbit")
	reader := b.startSh("sha256sum big")
	waitTransferStarted(t, b)
	a.linkDown()
	failsWithEIO(t, "consumer whose owner's link was cut", reader)
	noPartial(t, b, "big")
	a.fullSpeed()
	a.linkUp()
	var got string
	eventually(t, "read after the link came back", func() bool {
		r := b.sh("sha256sum big")
		if r.err != nil {
			return false
		}
		got = strings.Fields(r.stdout)[0]
		return true
	})
	if got != want {
		t.Fatalf("sha256 %s, want %s", got, want)
	}
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
// (it is retried) and the consumer wakes.
func TestClusterEtcdDownAtWaitAndPublish(t *testing.T) {
	c := newCluster(t, 2)
	a, b := c.nodes[0], c.nodes[1]
	c.stopEtcd()
	reader := b.startSh("cat down/f")
	b.waitStatus("reader waiting", func(st fs.Status) bool { return st.DMD.OpensWaited >= 1 })
	a.mustSh("mkdir down && echo while-down > down/f")
	a.waitStatus("publish queued for retry", func(st fs.Status) bool { return st.DMD.PendingPublishes == 1 })
	if r, waiting := notYet(reader); !waiting {
		t.Fatalf("the reader finished while etcd was down: %v", r)
	}
	c.startEtcd()
	if r := within(t, "reader", bound, reader); r.err != nil || r.stdout != "while-down\n" {
		t.Fatalf("reader: %v", r)
	}
}
