package test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/dyadfs/dyadfs/fs"
)

func sha(n *node, path string) string {
	n.c.t.Helper()
	return strings.Fields(n.mustSh(sha256Cmd + path))[0]
}

// sha256Cmd is a command that prints the SHA-256 of the file named after it
// first. OpenSSL's uses the CPU's SHA instructions; Debian 12's sha256sum
// does not, and spends minutes of the suite on its 5 GiB files.
const sha256Cmd = "openssl dgst -sha256 -r "

// crcCmd prints the CRC of the file named after it first, then its size:
// for files of gigabytes, mostly holes. Debian 12's cksum computes it with
// the CPU's carry-less multiply, about 7 times as fast as OpenSSL's
// SHA-256, and a transfer that damages or reorders data changes it.
const crcCmd = "cksum "

// crc returns what crcCmd prints for path on n (without the name).
func crc(n *node, path string) string {
	n.c.t.Helper()
	f := strings.Fields(n.mustSh(crcCmd + path))
	return f[0] + " " + f[1]
}

// TestClusterConsumerWaitsFirst: a consumer on one node waits for files
// before their producer on another node has started, and reads each one,
// checksummed, once it is published: empty, one byte, 4 KiB, 64 MiB and a
// sparse 5 GiB file, which arrives sparse.
func TestClusterConsumerWaitsFirst(t *testing.T) {
	forEachWire(t, func(t *testing.T, w wire) {
		c := newClusterOn(t, w, 2)
		a, b := c.nodes[0], c.nodes[1]
		files := []struct{ name, produce string }{
			{"empty", ": > sizes/empty"},
			{"one", "printf x > sizes/one"},
			{"4k", "head -c 4096 /dev/urandom > sizes/4k"},
			{"64m", "head -c 67108864 /dev/urandom > sizes/64m"},
			// Written under another name, then renamed: published once, whole.
			{"sparse5g", "truncate -s 5G sizes/.s && printf tail | dd of=sizes/.s bs=1 seek=5368709000 conv=notrunc status=none && printf head | dd of=sizes/.s conv=notrunc status=none && mv sizes/.s sizes/sparse5g"},
		}
		got := map[string]<-chan result{}
		for _, f := range files {
			got[f.name] = b.startShFor(3*bound, crcCmd+"sizes/"+f.name)
		}
		b.waitStatus("consumers waiting", func(st fs.Status) bool { return st.DMD.Waiting == len(files) })
		a.mustSh("mkdir -p sizes")
		for _, f := range files {
			a.mustSh(f.produce)
		}
		for _, f := range files {
			// Reading 5 GiB twice on two loaded cores takes a while.
			r := within(t, "consumer of "+f.name, 3*bound, got[f.name])
			if r.err != nil {
				t.Fatalf("consumer of %s: %v", f.name, r)
			}
			if got := strings.Fields(r.stdout); len(got) < 2 || got[0]+" "+got[1] != crc(a, "sizes/"+f.name) {
				t.Fatalf("%s: consumer read CRC and size %q, producer wrote %s", f.name, r.stdout, crc(a, "sizes/"+f.name))
			}
		}
		var st syscall.Stat_t
		if err := syscall.Stat(filepath.Join(b.backing, "sizes/sparse5g"), &st); err != nil {
			t.Fatal(err)
		}
		if st.Size != 5<<30 || st.Blocks*512 > 1<<20 {
			t.Fatalf("the consumer's copy of the sparse file: size %d, %d bytes allocated; want 5 GiB with holes", st.Size, st.Blocks*512)
		}
		if n := copyCount(b.status()); n != uint64(len(files)) {
			t.Fatalf("consumer made %d copies, want %d", n, len(files))
		}
	})
}

// TestClusterOneTransferPerNode: consumers on three nodes, several processes
// on each, open the same file at once; each node transfers it once.
func TestClusterOneTransferPerNode(t *testing.T) {
	c := newCluster(t, 4)
	producer, consumers := c.nodes[0], c.nodes[1:]
	const perNode = 4
	var reads []<-chan result
	for _, n := range consumers {
		for i := 0; i < perNode; i++ {
			reads = append(reads, n.startSh("sha256sum shared/data"))
		}
	}
	for _, n := range consumers {
		n.waitStatus("readers waiting", func(st fs.Status) bool { return st.DMD.OpensWaited >= perNode })
	}
	producer.mustSh("mkdir shared && head -c 8388608 /dev/urandom > shared/data")
	want := sha(producer, "shared/data")
	for _, ch := range reads {
		r := within(t, "reader", bound, ch)
		if r.err != nil || strings.Fields(r.stdout)[0] != want {
			t.Fatalf("reader: %v, want sha256 %s", r, want)
		}
	}
	for _, n := range consumers {
		if got := transferCount(n.status()); got != 1 {
			t.Errorf("%s made %d transfers of one file, want 1", n.name, got)
		}
	}
}

// TestClusterChain: A produces, B consumes and produces from it, C consumes
// B's file.
func TestClusterChain(t *testing.T) {
	c := newCluster(t, 3)
	a, b, cc := c.nodes[0], c.nodes[1], c.nodes[2]
	last := cc.startSh("cat chain/f2")
	middle := b.startSh("h=$(sha256sum chain/f1 | cut -d' ' -f1) && echo $h > chain/.f2 && mv chain/.f2 chain/f2")
	cc.waitStatus("C waiting", func(st fs.Status) bool { return st.DMD.Waiting == 1 })
	b.waitStatus("B waiting", func(st fs.Status) bool { return st.DMD.Waiting == 1 })
	a.mustSh("mkdir chain && echo seed > chain/f1")
	if r := within(t, "B", bound, middle); r.err != nil {
		t.Fatalf("B: %v", r)
	}
	r := within(t, "C", bound, last)
	if want := sha(a, "chain/f1") + "\n"; r.err != nil || r.stdout != want {
		t.Fatalf("C read %v, want %q", r, want)
	}
}

// TestClusterFanIn: three producers, ten files each, one consumer of all.
func TestClusterFanIn(t *testing.T) {
	forEachWire(t, func(t *testing.T, w wire) {
		c := newClusterOn(t, w, 4)
		producers, consumer := c.nodes[:3], c.nodes[3]
		var names []string
		var want strings.Builder
		for _, p := range producers {
			for i := 0; i < 10; i++ {
				names = append(names, fmt.Sprintf("fanin/%s-%d", p.name, i))
				fmt.Fprintf(&want, "%s %d\n", p.name, i)
			}
		}
		all := consumer.startSh("for f in " + strings.Join(names, " ") + "; do cat $f; done")
		consumer.waitStatus("consumer waiting", func(st fs.Status) bool { return st.DMD.Waiting == 1 })
		var producing []<-chan result
		for _, p := range producers {
			producing = append(producing, p.startSh(fmt.Sprintf("mkdir -p fanin && for i in $(seq 0 9); do echo \"%s $i\" > fanin/%s-$i; done", p.name, p.name)))
		}
		for _, ch := range producing {
			if r := within(t, "producer", bound, ch); r.err != nil {
				t.Fatal(r)
			}
		}
		if r := within(t, "consumer", bound, all); r.err != nil || r.stdout != want.String() {
			t.Fatalf("consumer read %v, want %q", r, want.String())
		}
	})
}

// TestClusterSharedStorage: with storage all nodes see, consumers wait for
// the record and read the file in place: no transfer.
func TestClusterSharedStorage(t *testing.T) {
	c := newCluster(t, 0)
	shared := filepath.Join(c.dir, "shared-backing")
	os.MkdirAll(shared, 0o755)
	a := c.addNodeAt("n0", shared, "--shared-storage")
	b := c.addNodeAt("n1", shared, "--shared-storage")
	read := b.startSh("cat out/result")
	b.waitStatus("consumer waiting", func(st fs.Status) bool { return st.DMD.Waiting == 1 })
	a.mustSh("mkdir -p out && echo computed > out/result")
	if r := within(t, "consumer", bound, read); r.err != nil || r.stdout != "computed\n" {
		t.Fatalf("consumer: %v", r)
	}
	if st := b.status(); st.DMD.Fetches != 0 {
		t.Fatalf("shared storage made %d fetches", st.DMD.Fetches)
	}
}

// TestClusterNamespacesIsolated: two jobs on one store never see each
// other's files.
func TestClusterNamespacesIsolated(t *testing.T) {
	c := newCluster(t, 2)
	a, b := c.nodes[0], c.nodes[1]
	other := c.addNode("n2", "--namespace", "other-job", "--wait-timeout", "1s")
	a.mustSh("echo job1 > private")
	if r := other.sh("cat private"); r.err == nil || !strings.Contains(r.stderr, "timed out") {
		t.Fatalf("a node of another job read the file: %v", r)
	}
	if r := b.sh("cat private"); r.err != nil || r.stdout != "job1\n" {
		t.Fatalf("a node of the same job: %v", r)
	}
}

// TestClusterReplicaKeepsOwner: the copy a consumer node makes keeps the
// file's owner, group and mode, so users keep access to their files.
func TestClusterReplicaKeepsOwner(t *testing.T) {
	c := newCluster(t, 2)
	a, b := c.nodes[0], c.nodes[1]
	a.mustSh("echo mine > owned && chown 65534:65534 owned && chmod 640 owned")
	if got := b.mustSh("cat owned && stat -c '%u:%g %a' owned"); got != "mine\n65534:65534 640\n" {
		t.Fatalf("consumer sees %q", got)
	}
}
