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
