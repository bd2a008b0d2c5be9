//go:build ucx

package ucx

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dyadfs/dyadfs/dtl"
	"github.com/dyadfs/dyadfs/dtl/dtltest"
)

// netns is a network namespace joined to this one by a veth pair: the
// host end (hostIf, hostIP here) and eth0 (nsIP) inside. Its name begins
// with "dy" and hex digits, as scripts/test.sh expects of what tests leave.
type netns struct {
	name, hostIf string
	hostIP, nsIP string
}

func newNetns(t testing.TB) *netns {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("network namespaces need root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("no ip command (iproute2)")
	}
	var b [4]byte
	rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	n := &netns{
		name:   "dy" + id + "ucx",
		hostIf: "dy" + id[:8] + "h",
		hostIP: fmt.Sprintf("10.%d.%d.1", 200+int(b[0])%50, b[1]),
		nsIP:   fmt.Sprintf("10.%d.%d.2", 200+int(b[0])%50, b[1]),
	}
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	run("netns", "add", n.name)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", n.name).Run() })
	run("link", "add", n.hostIf, "type", "veth", "peer", "name", "eth0", "netns", n.name)
	t.Cleanup(func() { exec.Command("ip", "link", "del", n.hostIf).Run() })
	run("addr", "add", n.hostIP+"/30", "dev", n.hostIf)
	run("link", "set", n.hostIf, "up")
	run("-n", n.name, "addr", "add", n.nsIP+"/30", "dev", "eth0")
	run("-n", n.name, "link", "set", "eth0", "up")
	run("-n", n.name, "link", "set", "lo", "up")
	return n
}

// TestNetns: UCX over TCP between two network namespaces, the owner in a
// process inside one and the consumer here, reached through a veth: files
// (whole, chunked, sparse) and messages; once with UCX_NET_DEVICES naming
// the veth's ends (as a site would pin the fabric) and once with UCX left
// to choose among every interface, each side's loopback included.
func TestNetns(t *testing.T) {
	for _, c := range []struct {
		restrict bool
		enter    string // how the owner enters the namespace
	}{{true, "ip-netns-exec"}, {false, "ip-netns-exec"}, {false, "nsenter"}} {
		t.Run(fmt.Sprintf("net_devices=%v/%s", c.restrict, c.enter), func(t *testing.T) {
			restrict := c.restrict
			n := newNetns(t)
			s := dtltest.NewSecret()
			env := []string{"UCX_TLS=tcp"}
			o := opts{tls: "tcp"}
			if restrict {
				env = append(env, "UCX_NET_DEVICES=eth0")
				o.ucx = map[string]string{"NET_DEVICES": n.hostIf}
			}
			// ip netns exec also mounts the namespace's /sys (where UCX
			// reads its devices); nsenter, as dyadfs's cluster tests
			// use it, does not.
			enter := []string{"ip", "netns", "exec", n.name}
			if c.enter == "nsenter" {
				enter = []string{"nsenter", "--net=/run/netns/" + n.name, "--"}
			}
			h := startHelper(t, s, n.nsIP+":0", env, enter...)
			if !strings.HasPrefix(h.addr, n.nsIP+":") {
				t.Fatalf("the owner advertises %s, want %s", h.addr, n.nsIP)
			}
			files := map[string]int{"small": 3000, "chunked": 5<<20 + 77}
			for p, size := range files {
				data := make([]byte, size)
				rand.Read(data)
				os.WriteFile(filepath.Join(h.dir, p), data, 0o644)
			}
			makeSparse(t, filepath.Join(h.dir, "sparse"), 2<<30, 3, 3<<20)
			client, _ := testTransport(t, s, o)
			ctx := ctxFor(t)
			for _, p := range []string{"small", "chunked", "sparse"} {
				dst := dtltest.Dst(t)
				info, err := client.Fetch(ctx, h.addr, dtl.Request{Path: p, Owner: "helper"}, dtl.NewSink(dst))
				if err != nil {
					t.Fatalf("fetch %s: %v", p, err)
				}
				sf, _ := os.Open(filepath.Join(h.dir, p))
				ext := dtltest.Extents(sf, info.Size)
				if sparseSum(t, sf, ext) != sparseSum(t, dst, ext) {
					t.Errorf("%s: content differs", p)
				}
				sf.Close()
			}
			// The helper answers messages with their bytes: a message
			// and its reply crossed the namespaces.
			reply, err := client.Message(context.Background(), h.addr, "helper", []byte("hi"))
			if string(reply) != "hi" || err != nil {
				t.Errorf("message: %q, %v, want its echo", reply, err)
			}
			poolsFull(t, client)
		})
	}
}
