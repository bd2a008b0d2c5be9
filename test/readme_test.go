package test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// readmeBlock returns the first sh code block after heading in README.md.
func readmeBlock(t *testing.T, heading string) string {
	t.Helper()
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i := strings.Index(s, "\n"+heading+"\n")
	if i < 0 {
		t.Fatalf("README.md has no %q", heading)
	}
	s = s[i:]
	start := strings.Index(s, "```sh\n")
	if start < 0 {
		t.Fatalf("no sh block after %q", heading)
	}
	s = s[start+len("```sh\n"):]
	end := strings.Index(s, "\n```")
	return s[:end+1]
}

// TestReadmeTryOnOneMachine runs the README's "Try it on one machine"
// recipe as written (in a network and mount namespace of its own, so that
// its etcd port and mounts are private): two daemons share a file and
// unmount.
func TestReadmeTryOnOneMachine(t *testing.T) {
	requireEnv(t)
	if _, err := exec.LookPath("etcd"); err != nil {
		t.Skip("skipping: etcd is not installed: run scripts/setup.sh")
	}
	if _, err := os.Stat("/tmp/try"); err == nil {
		t.Skip("skipping: /tmp/try exists (the recipe's directory): remove it")
	}
	t.Cleanup(func() { os.RemoveAll("/tmp/try"); os.Remove("/tmp/try-etcd.log") })
	block := readmeBlock(t, "### Try it on one machine")
	script := filepath.Join(t.TempDir(), "recipe.sh")
	if err := os.WriteFile(script, []byte(block), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	cmd := exec.CommandContext(ctx, "unshare", "--net", "--mount", "--propagation", "private", "bash", "-c",
		`ip link set lo up && bash -e "$0"; rc=$?
		# The daemons finish with the store before etcd goes.
		for i in $(seq 300); do pgrep -f "^[^ ]*dyadfs mount .*/tmp/try/" >/dev/null || break; sleep 0.1; done
		pkill -f "^etcd --data-dir /tmp/try/etcd"; exit $rc`, script)
	cmd.Env = append(os.Environ(), "PATH="+filepath.Dir(dyadfsBin)+":"+os.Getenv("PATH"))
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "hello") {
		t.Fatalf("the README's recipe: %v\n%s\nscript:\n%s", err, out, block)
	}
}

// TestReadmeSeveralNodes runs the README's "Several nodes" block as
// written on three hosts made of namespaces on this machine (network, UTS
// for distinct hostnames, mount for /mnt): etcd at 10.0.0.1, two nodes
// that mount with the block's own command, and a file written on one is
// read on the other. /mnt and /local are each host's own (tmpfs); the
// block's other paths (/var/lib/dyadfs-etcd, ~/.job42.secret) are made on
// this machine for the test and removed after it.
func TestReadmeSeveralNodes(t *testing.T) {
	if _, err := exec.LookPath("etcd"); err != nil {
		t.Skip("skipping: etcd is not installed: run scripts/setup.sh")
	}
	home, _ := os.UserHomeDir()
	for _, p := range []string{"/var/lib/dyadfs-etcd", "/local", filepath.Join(home, ".job42.secret")} {
		if _, err := os.Stat(p); err == nil {
			t.Skipf("skipping: %s exists, and the README's block would use it", p)
		}
	}
	block := readmeBlock(t, "## Several nodes")
	parts := strings.Split(block, "\n\n")
	if len(parts) != 3 || !strings.Contains(parts[0], "etcd ") || !strings.Contains(parts[2], "dyadfs mount") {
		t.Fatalf("the README's block is not etcd, secret, mount:\n%s", block)
	}
	c := newClusterWith(t, clusterOptions{nodes: 0})
	t.Cleanup(func() {
		// The daemons finish with the store before etcd goes.
		for range 300 {
			if exec.Command("pgrep", "-f", "dyadfs mount --store etcd://10.0.0.1").Run() != nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		exec.Command("pkill", "-f", "^etcd --data-dir /var/lib/dyadfs-etcd").Run()
		time.Sleep(200 * time.Millisecond)
		os.RemoveAll("/var/lib/dyadfs-etcd")
		os.RemoveAll("/local")
		os.Remove(filepath.Join(home, ".job42.secret"))
	})
	bin := filepath.Dir(dyadfsBin)
	host := func(name, ip string) (run func(script string) (string, error), mntns string) {
		ns := c.id + name
		t.Cleanup(func() { runOut("ip", "netns", "del", ns) })
		c.addHost(ns, ns, ip)
		mntns = filepath.Join(c.nsDir, name)
		os.WriteFile(mntns, nil, 0o644)
		// Each host's own /mnt and /local (node-local storage).
		os.MkdirAll("/local", 0o755)
		c.must("unshare", "--mount="+mntns, "--propagation", "private", "sh", "-c", "mount -t tmpfs none /mnt && mount -t tmpfs none /local")
		return func(script string) (string, error) {
			return runOut("nsenter", "--mount="+mntns, "--net=/run/netns/"+ns, "--",
				"unshare", "--uts", "sh", "-c", "hostname "+name+" && export PATH="+bin+":$PATH && "+script)
		}, mntns
	}
	etcdHost, _ := host("e1", "10.0.0.1")
	// As written, with its output kept in a file instead of a terminal.
	if out, err := etcdHost("{\n" + parts[0] + "\n} >" + filepath.Join(c.dir, "readme-etcd.log") + " 2>&1"); err != nil {
		t.Fatalf("the README's etcd line: %v %s", err, out)
	}
	if out, err := runOut("bash", "-ec", parts[1]); err != nil {
		t.Fatalf("the README's secret line: %v %s", err, out)
	}
	var mntns []string
	for i, name := range []string{"node1", "node2"} {
		run, ns := host(name, fmt.Sprintf("10.0.0.%d", 11+i))
		mntns = append(mntns, ns)
		if out, err := run(parts[2]); err != nil {
			t.Fatalf("the README's mount on %s: %v %s", name, err, out)
		}
		t.Cleanup(func() { runOut("nsenter", "--mount="+ns, "--", "fusermount3", "-u", "-z", "/mnt/dmd") })
	}
	in := func(i int, script string) string {
		out, err := runOut("nsenter", "--mount="+mntns[i], "--", "sh", "-ec", script)
		if err != nil {
			t.Fatalf("node%d: %s: %v %s", i+1, script, err, out)
		}
		return out
	}
	in(0, "echo shared > /mnt/dmd/greeting")
	if got := in(1, "cat /mnt/dmd/greeting"); got != "shared\n" {
		t.Fatalf("node2 read %q", got)
	}
	for i := range mntns {
		in(i, "PATH="+bin+":$PATH dyadfs unmount /mnt/dmd")
	}
}
