package test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/dyadfs/dyadfs/fs"
)

// TestClusterNoticesWakeWaiters: consumers on two nodes wait for files
// whose homes spread over three nodes; the producer's publishes reach them
// as notices, and every file read is the file written.
func TestClusterNoticesWakeWaiters(t *testing.T) {
	c := newCluster(t, 3)
	a, consumers := c.nodes[0], c.nodes[1:]
	const files = 12
	reads := map[string]<-chan result{}
	for _, n := range consumers {
		for i := 0; i < files; i++ {
			reads[fmt.Sprintf("%s/f%d", n.name, i)] = n.startSh(fmt.Sprintf("sha256sum out/f%d", i))
		}
	}
	for _, n := range consumers {
		n.waitStatus("readers waiting", func(st fs.Status) bool { return st.DMD.Waiting == files })
	}
	a.mustSh(fmt.Sprintf("mkdir out && for i in $(seq 0 %d); do head -c 4096 /dev/urandom > out/f$i; done", files-1))
	for key, ch := range reads {
		r := within(t, "reader "+key, bound, ch)
		if r.err != nil {
			t.Fatalf("reader %s: %v", key, r)
		}
		i := strings.TrimPrefix(key[strings.Index(key, "/")+1:], "f")
		if want := sha(a, "out/f"+i); strings.Fields(r.stdout)[0] != want {
			t.Fatalf("%s read sha256 %s, producer wrote %s", key, r.stdout, want)
		}
	}
	for _, n := range consumers {
		st := n.status()
		ns := st.Locator.Notices
		if ns == nil || ns.Members != 3 || ns.WokenBy == 0 {
			t.Errorf("%s: notices %+v: want 3 members and waits woken by notices", n.name, ns)
		}
	}
}

// TestClusterHomeDown: a node that is home to some of the awaited paths
// dies while consumers wait; its notices are lost, and the waiters learn of
// the publishes from etcd instead.
func TestClusterHomeDown(t *testing.T) {
	c := newCluster(t, 3)
	a, b, home := c.nodes[0], c.nodes[1], c.nodes[2]
	const files = 12 // a third of them, on average, have their home on the dead node
	var reads []<-chan result
	for i := 0; i < files; i++ {
		reads = append(reads, b.startSh(fmt.Sprintf("sha256sum out/f%d", i)))
	}
	b.waitStatus("readers waiting", func(st fs.Status) bool { return st.DMD.Waiting == files })
	home.kill()
	a.mustSh(fmt.Sprintf("mkdir out && for i in $(seq 0 %d); do head -c 4096 /dev/urandom > out/f$i; done", files-1))
	for i, ch := range reads {
		r := within(t, fmt.Sprintf("reader of f%d", i), bound, ch)
		if r.err != nil {
			t.Fatalf("reader of f%d: %v", i, r)
		}
		if want := sha(a, fmt.Sprintf("out/f%d", i)); strings.Fields(r.stdout)[0] != want {
			t.Fatalf("f%d: read sha256 %s, producer wrote %s", i, r.stdout, want)
		}
	}
}

// TestClusterSmallFilesTravelWithNotices: files up to 16 KiB reach a
// waiting consumer with their notices, without a transfer, and a reader
// that comes later is answered by their homes; a larger one is
// transferred. Every file read is the file written, with the producer's
// mode and mtime; the producer writes them through write-only descriptors,
// as a shell does.
func TestClusterSmallFilesTravelWithNotices(t *testing.T) {
	forEachWire(t, func(t *testing.T, w wire) {
		c := newClusterOn(t, w, 3)
		a, b, late := c.nodes[0], c.nodes[1], c.nodes[2]
		sizes := map[string]int{"empty": 0, "one": 1, "4k": 4096, "16k": 16384, "16k1": 16385}
		reads := map[string]<-chan result{}
		for name := range sizes {
			reads[name] = b.startSh("sha256sum small/" + name + " && stat -c '%a %Y' small/" + name)
		}
		b.waitStatus("readers waiting", func(st fs.Status) bool { return st.DMD.Waiting == len(sizes) })
		a.mustSh("mkdir small")
		for name, size := range sizes {
			a.mustSh(fmt.Sprintf("umask 027 && head -c %d /dev/urandom > small/%s", size, name))
		}
		check := func(who, name string, r result) {
			t.Helper()
			if r.err != nil {
				t.Fatalf("%s reading %s: %v", who, name, r)
			}
			want := sha(a, "small/"+name) + " " + a.mustSh("stat -c '%a %Y' small/"+name)
			if got := strings.Fields(r.stdout); len(got) < 4 || strings.Join([]string{got[0], got[2], got[3]}, " ") != strings.TrimSpace(want) {
				t.Fatalf("%s read %s as %q, producer wrote %q", who, name, r.stdout, want)
			}
		}
		for name, ch := range reads {
			check(b.name, name, within(t, "reader of "+name, bound, ch))
		}
		for name := range sizes {
			check(late.name, name, late.sh("sha256sum small/"+name+" && stat -c '%a %Y' small/"+name))
		}
		for _, n := range []*node{b, late} {
			st := n.status()
			if copies := copyCount(st); copies != uint64(len(sizes)) {
				t.Errorf("%s made %d copies, want %d", n.name, copies, len(sizes))
			}
			if got := transportCounter(st, "from_notices"); got == 0 || got > 4 {
				t.Errorf("%s: %d copies from notices, want 1 to 4 (the files up to 16 KiB)", n.name, got)
			}
			if got := transportCounter(st, "transfers"); got == 0 {
				t.Errorf("%s: the 16 KiB + 1 file was not transferred", n.name)
			}
		}
	})
}
