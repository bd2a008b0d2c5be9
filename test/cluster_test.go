package test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dyadfs/dyadfs/internal/poll"

	"github.com/dyadfs/dyadfs/hfl/store/etcd"

	"github.com/dyadfs/dyadfs/fs"
	"github.com/dyadfs/dyadfs/hfl"
)

// A cluster is several dyadfs "nodes" on this machine. Each node has its own
// network namespace, joined by a veth to a bridge that lives in a private
// switch namespace (so no traffic touches the host's network), and its own
// persistent mount namespace, so every node mounts dyadfs at the same path
// as on a real cluster, over its own backing directory. An etcd server runs
// in a namespace of its own on the same bridge. Everything is torn down when
// the test ends, whether it passed or not.
type cluster struct {
	t      testing.TB
	id     string // short random id in namespace and interface names
	dir    string
	mnt    string // the mountpoint every node uses
	nsDir  string // holds the persistent mount namespaces
	sw     string // switch network namespace
	etcdNS string
	etcd   *exec.Cmd
	nodes  []*node
	secret string // path of a shared --secret-file, if set
	// etcdOnDisk keeps etcd's data in the test's directory on disk.
	etcdOnDisk bool
	// backingOnTmpfs keeps the nodes' backing directories on tmpfs.
	backingOnTmpfs bool
	// Namespace is the job namespace the nodes join.
	namespace string
	// etcdArgs are more flags for etcd.
	etcdArgs []string
	// wire is the data transport the nodes use.
	wire wire
	// logLevel is the daemons' (debug unless set).
	logLevel string
}

const (
	subnet   = "10.77.0."
	etcdIP   = subnet + "2"
	etcdAddr = etcdIP + ":2379"
	dtlPort  = "7447"
)

// node is one dyadfs node of a cluster.
type node struct {
	c       *cluster
	name    string
	netns   string
	mntns   string // file the mount namespace is bound to
	ip      string
	veth    string // the node's end of its link, in the switch namespace
	backing string
	logFile string
	flags   []string
	// wrap runs the daemon under a command (setpriv, say).
	wrap []string
	pid  int
}

func clusterPrerequisite(t testing.TB) {
	t.Helper()
	requireEnv(t)
	for _, prog := range []string{"ip", "nsenter", "unshare", "etcd"} {
		if _, err := exec.LookPath(prog); err != nil {
			t.Skipf("skipping: %s is not installed: run scripts/setup.sh", prog)
		}
	}
}

// newCluster starts etcd and n nodes named n0, n1, ... with extra mount flags.
func newCluster(t testing.TB, n int, flags ...string) *cluster {
	t.Helper()
	return newClusterWith(t, clusterOptions{nodes: n, flags: flags})
}

// newClusterOn starts etcd and n nodes whose files travel over w.
func newClusterOn(t testing.TB, w wire, n int, flags ...string) *cluster {
	t.Helper()
	return newClusterWith(t, clusterOptions{nodes: n, flags: flags, wire: w})
}

// clusterOptions shape a cluster.
type clusterOptions struct {
	nodes int
	flags []string
	// etcdOnDisk keeps etcd's data on disk instead of tmpfs.
	etcdOnDisk bool
	// backingOnTmpfs puts the nodes' backing directories on tmpfs
	// (/dev/shm), node-local storage without a disk.
	backingOnTmpfs bool
	// etcdArgs are more flags for etcd (--quota-backend-bytes, say).
	etcdArgs []string
	// wire is the data transport the nodes use (TCP by default).
	wire wire
	// logLevel is the daemons' log level (debug by default; benchmarks
	// of CPU use info, as users run them).
	logLevel string
}

func newClusterWith(t testing.TB, o clusterOptions) *cluster {
	t.Helper()
	clusterPrerequisite(t)
	n, flags := o.nodes, o.flags
	id := make([]byte, 2)
	rand.Read(id)
	c := &cluster{t: t, id: "dy" + hex.EncodeToString(id), dir: t.TempDir(), namespace: "job-" + hex.EncodeToString(id),
		etcdOnDisk: o.etcdOnDisk, backingOnTmpfs: o.backingOnTmpfs, etcdArgs: o.etcdArgs, wire: o.wire, logLevel: o.logLevel}
	if c.logLevel == "" {
		c.logLevel = "debug"
	}
	c.mnt = filepath.Join(c.dir, "dmd")
	c.nsDir = filepath.Join(c.dir, "ns")
	c.sw = c.id + "sw"
	c.etcdNS = c.id + "e"
	t.Cleanup(c.teardown)
	os.Mkdir(c.mnt, 0o755)
	os.Mkdir(c.nsDir, 0o755)
	// Persistent mount namespaces must be bound to files on a mount that
	// does not propagate.
	c.must("mount", "--bind", c.nsDir, c.nsDir)
	c.must("mount", "--make-private", c.nsDir)

	c.must("ip", "netns", "add", c.sw)
	c.must("ip", "-n", c.sw, "link", "add", "br0", "type", "bridge")
	c.must("ip", "-n", c.sw, "link", "set", "br0", "up")
	c.must("ip", "-n", c.sw, "link", "set", "lo", "up")
	c.addHost(c.etcdNS, c.id+"e", etcdIP)
	c.startEtcd()
	for i := 0; i < n; i++ {
		c.addNode(fmt.Sprintf("n%d", i), flags...)
	}
	return c
}

// must runs a setup command and fails the test if it fails.
func (c *cluster) must(name string, args ...string) string {
	c.t.Helper()
	out, err := runOut(name, args...)
	if err != nil {
		c.t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return out
}

// addHost makes network namespace ns with address ip, linked to the bridge
// by a veth whose switch-side end is named veth.
func (c *cluster) addHost(ns, veth, ip string) {
	c.t.Helper()
	c.must("ip", "netns", "add", ns)
	c.must("ip", "link", "add", veth, "netns", c.sw, "type", "veth", "peer", "name", "eth0", "netns", ns)
	c.must("ip", "-n", c.sw, "link", "set", veth, "master", "br0", "up")
	c.must("ip", "-n", ns, "addr", "add", ip+"/24", "dev", "eth0")
	c.must("ip", "-n", ns, "link", "set", "eth0", "up")
	c.must("ip", "-n", ns, "link", "set", "lo", "up")
}

func (c *cluster) etcdDataDir() string {
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() && !c.etcdOnDisk {
		return filepath.Join("/dev/shm", "dyadfs-test-"+c.id+"-etcd")
	}
	return filepath.Join(c.dir, "etcd")
}

// startEtcd starts etcd (again, on the same data) in its namespace and waits
// until it answers.
func (c *cluster) startEtcd() {
	c.t.Helper()
	url := "http://" + etcdIP
	log, err := os.OpenFile(filepath.Join(c.dir, "etcd.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		c.t.Fatal(err)
	}
	defer log.Close()
	cmd := exec.Command("ip", "netns", "exec", c.etcdNS, "etcd",
		"--name", "e", "--data-dir", c.etcdDataDir(),
		"--listen-client-urls", url+":2379", "--advertise-client-urls", url+":2379",
		"--listen-peer-urls", url+":2380", "--initial-advertise-peer-urls", url+":2380",
		"--initial-cluster", "e="+url+":2380", "--logger", "zap", "--log-level", "warn")
	cmd.Args = append(cmd.Args, c.etcdArgs...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		c.t.Fatalf("start etcd: %v", err)
	}
	c.etcd = cmd
	if out, err := c.inNet(c.etcdNS, helperCmd("etcd-ready", "etcd://"+etcdAddr)...); err != nil {
		c.t.Fatalf("etcd did not come up: %v %s\n%s", err, out, c.readFile("etcd.log"))
	}
}

// stopEtcd kills etcd and waits for it to exit.
func (c *cluster) stopEtcd() {
	if c.etcd == nil {
		return
	}
	syscall.Kill(-c.etcd.Process.Pid, syscall.SIGKILL)
	c.etcd.Wait()
	c.etcd = nil
}

func (c *cluster) readFile(name string) string {
	b, _ := os.ReadFile(filepath.Join(c.dir, name))
	return string(b)
}

// helperCmd is the command line that runs this test binary as helper name.
func helperCmd(name string, args ...string) []string {
	return append([]string{"env", helperEnv + "=" + name, os.Args[0]}, args...)
}

// inNet runs a command in network namespace ns, bounded.
func (c *cluster) inNet(ns string, argv ...string) (string, error) {
	return runOut("ip", append([]string{"netns", "exec", ns}, argv...)...)
}

// addNode creates a node with its own backing directory and mounts dyadfs
// on it.
func (c *cluster) addNode(name string, flags ...string) *node {
	c.t.Helper()
	if c.backingOnTmpfs {
		return c.addNodeAt(name, filepath.Join(c.shmDir(), name), flags...)
	}
	return c.addNodeAt(name, filepath.Join(c.dir, name, "backing"), flags...)
}

// addNodeOnTmpfs creates a node whose backing directory is a tmpfs of
// size bytes (as mount's size= option says them): node-local storage that
// fills up, or that the test can make read-only.
func (c *cluster) addNodeOnTmpfs(name, size string, flags ...string) *node {
	c.t.Helper()
	backing := filepath.Join(c.dir, name, "backing")
	os.MkdirAll(backing, 0o755)
	c.must("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", backing)
	// The node's mount namespace keeps its own copy of the mount.
	c.t.Cleanup(func() { syscall.Unmount(backing, syscall.MNT_DETACH) })
	return c.addNodeAt(name, backing, flags...)
}

// addNodeWrapped creates a node whose daemon runs under the command wrap.
func (c *cluster) addNodeWrapped(name string, wrap []string, flags ...string) *node {
	c.t.Helper()
	return c.addNodeAtWith(name, filepath.Join(c.dir, name, "backing"), wrap, flags...)
}

// shmDir is where the cluster keeps what it puts on tmpfs besides etcd's
// data; scripts/test.sh removes what a killed test leaves there.
func (c *cluster) shmDir() string { return filepath.Join("/dev/shm", "dyadfs-test-"+c.id+"-nodes") }

// addNodeAt creates a node over backing, which other nodes may share.
func (c *cluster) addNodeAt(name, backing string, flags ...string) *node {
	c.t.Helper()
	return c.addNodeAtWith(name, backing, nil, flags...)
}

func (c *cluster) addNodeAtWith(name, backing string, wrap []string, flags ...string) *node {
	c.t.Helper()
	i := len(c.nodes)
	n := &node{
		c:       c,
		name:    name,
		netns:   c.id + name,
		mntns:   filepath.Join(c.nsDir, name),
		ip:      fmt.Sprintf("%s%d", subnet, 10+i),
		veth:    c.id + name,
		backing: backing,
		logFile: filepath.Join(c.dir, name+".log"),
		flags:   flags,
		wrap:    wrap,
	}
	c.nodes = append(c.nodes, n)
	os.MkdirAll(n.backing, 0o755)
	c.addHost(n.netns, n.veth, n.ip)
	if err := os.WriteFile(n.mntns, nil, 0o644); err != nil {
		c.t.Fatal(err)
	}
	c.must("unshare", "--mount="+n.mntns, "--propagation", "private", "true")
	n.start()
	return n
}

// argv prefixes a command with what runs it inside the node.
func (n *node) argv(cmd ...string) []string {
	return append([]string{"nsenter", "--mount=" + n.mntns, "--net=/run/netns/" + n.netns, "--"}, cmd...)
}

// mountArgs are the flags every node is mounted with.
func (n *node) mountArgs() []string {
	args := []string{"mount", "--store", "etcd://" + etcdAddr, "--namespace", n.c.namespace,
		"--node", n.name, "--listen", n.ip + ":" + dtlPort, "--backing", n.backing,
		"--log-file", n.logFile, "--log-level", n.c.logLevel,
		"--lease-ttl", "2s", "--fetch-timeout", "30s", "--stall-timeout", "2s"}
	if n.c.secret != "" {
		args = append(args, "--secret-file", n.c.secret)
	}
	args = append(args, n.c.wire.flags...)
	if dir := os.Getenv("DYADFS_TEST_CPU_PROFILES"); dir != "" {
		// For developers: each daemon's CPU profile, until it unmounts.
		args = append(args, "--cpu-profile", filepath.Join(dir, fmt.Sprintf("%s-%s-%d.prof", n.c.namespace, n.name, time.Now().UnixNano())))
	}
	if dir := os.Getenv("DYADFS_TEST_ALLOC_PROFILES"); dir != "" {
		// For developers: each daemon's allocations, at unmount.
		args = append(args, "--alloc-profile", filepath.Join(dir, fmt.Sprintf("%s-%s-%d.alloc", n.c.namespace, n.name, time.Now().UnixNano())))
	}
	return append(append(args, n.flags...), n.c.mnt)
}

// start mounts dyadfs on the node; `dyadfs mount` returns once it is ready.
func (n *node) start() {
	n.c.t.Helper()
	argv := append([]string{}, n.wrap...)
	if len(n.c.wire.env) > 0 {
		argv = append(append([]string{"env"}, n.c.wire.env...), argv...)
	}
	out, err := n.run(append(append(argv, dyadfsBin), n.mountArgs()...)...)
	if err != nil {
		n.c.t.Fatalf("%s: dyadfs mount: %v\n%s\nlog:\n%s", n.name, err, out, n.readLog())
	}
	st := n.status()
	n.pid = st.PID
	if want := n.c.wire.name; want != "" && !strings.HasPrefix(st.Info["transport"], want+" ") {
		n.c.t.Fatalf("%s: transport %q, want %s", n.name, st.Info["transport"], want)
	}
}

func (n *node) readLog() string {
	b, _ := os.ReadFile(n.logFile)
	return string(b)
}

// run runs a command inside the node, bounded.
func (n *node) run(cmd ...string) (string, error) {
	argv := n.argv(cmd...)
	return runOut(argv[0], argv[1:]...)
}

// sh runs a shell script in the node, in the mount directory.
func (n *node) sh(script string) result {
	n.c.t.Helper()
	argv := n.argv("sh", "-ec", "cd "+n.c.mnt+"\n"+script)
	return run(n.c.t, "/", argv[0], argv[1:]...)
}

// mustSh runs a script in the node and fails the test if it fails.
func (n *node) mustSh(script string) string {
	n.c.t.Helper()
	r := n.sh(script)
	if r.err != nil {
		n.c.t.Fatalf("%s: %q: %v", n.name, script, r)
	}
	return r.stdout
}

// startSh starts a script in the node and returns its result channel.
func (n *node) startSh(script string) <-chan result {
	n.c.t.Helper()
	return n.startShFor(bound, script)
}

// startShFor is startSh with the script killed after limit.
func (n *node) startShFor(limit time.Duration, script string) <-chan result {
	n.c.t.Helper()
	argv := n.argv("sh", "-ec", "cd "+n.c.mnt+"\n"+script)
	done, _ := startCmdFor(n.c.t, limit, "/", nil, argv[0], argv[1:]...)
	return done
}

// status reads the node's status file.
func (n *node) status() fs.Status {
	n.c.t.Helper()
	out, err := n.run("cat", filepath.Join(n.c.mnt, ".dyadfs", "status"))
	if err != nil {
		n.c.t.Fatalf("%s: read status: %v %s", n.name, err, out)
	}
	var st fs.Status
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		n.c.t.Fatalf("%s: parse status: %v", n.name, err)
	}
	return st
}

// waitStatus polls the node's status until cond holds.
func (n *node) waitStatus(what string, cond func(fs.Status) bool) {
	n.c.t.Helper()
	eventually(n.c.t, n.name+": "+what, func() bool { return cond(n.status()) })
}

// transferCount is how many files a node fetched, from its status.
func transferCount(st fs.Status) uint64 { return transportCounter(st, "transfers") }

// copyCount is how many files a node copied from other nodes: fetched, or
// made from the bytes a small file's notice carried.
func copyCount(st fs.Status) uint64 {
	return transportCounter(st, "transfers") + transportCounter(st, "from_notices")
}

func transportCounter(st fs.Status, name string) uint64 {
	tr, ok := st.Extra["transport"].(map[string]any)
	if !ok {
		return 0
	}
	n, _ := tr[name].(float64)
	return uint64(n)
}

// kill kills the node's daemon (SIGKILL) and lazily removes its dead mount,
// as an administrator would.
func (n *node) kill() {
	n.c.t.Helper()
	if n.pid == 0 {
		return
	}
	syscall.Kill(n.pid, syscall.SIGKILL)
	if !waitExit(n.pid, bound) {
		n.c.t.Fatalf("%s: daemon survived SIGKILL", n.name)
	}
	n.pid = 0
	n.run("fusermount3", "-u", "-z", n.c.mnt)
}

// stop unmounts dyadfs on the node, as a user would, and waits for the
// daemon to exit; start mounts it again over the same backing directory.
func (n *node) stop() {
	n.c.t.Helper()
	if out, err := n.run("fusermount3", "-u", n.c.mnt); err != nil {
		n.c.t.Fatalf("%s: fusermount3 -u: %v: %s", n.name, err, out)
	}
	if !waitExit(n.pid, bound) {
		n.c.t.Fatalf("%s: daemon still running after unmount", n.name)
	}
	n.pid = 0
}

// published returns the store's record of rel as the node's control
// directory shows it.
func (n *node) published(rel string) (hfl.Record, bool) {
	n.c.t.Helper()
	out, err := n.run("cat", filepath.Join(n.c.mnt, ".dyadfs", "locate", url.PathEscape(rel)))
	if err != nil {
		return hfl.Record{}, false
	}
	var l fs.Located
	if err := json.Unmarshal([]byte(out), &l); err != nil || l.Published == nil {
		return hfl.Record{}, false
	}
	return *l.Published, true
}

// linkDown cuts the node's network link; linkUp restores it.
func (n *node) linkDown() { n.c.must("ip", "-n", n.c.sw, "link", "set", n.veth, "down") }
func (n *node) linkUp()   { n.c.must("ip", "-n", n.c.sw, "link", "set", n.veth, "up") }

// slowLink limits what the node sends to rate (for example "20mbit");
// fullSpeed lifts the limit.
func (n *node) slowLink(rate string) {
	n.c.must("ip", "netns", "exec", n.netns, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", rate, "burst", "32kbit", "latency", "400ms")
}

func (n *node) fullSpeed() {
	n.c.must("ip", "netns", "exec", n.netns, "tc", "qdisc", "del", "dev", "eth0", "root")
}

// teardown removes everything the cluster made, in an order that works
// whatever state a failed test left.
func (c *cluster) teardown() {
	for _, n := range c.nodes {
		if c.t.Failed() {
			c.t.Logf("dyadfs log of %s:\n%s", n.name, n.readLog())
		}
		runOut("nsenter", "--mount="+n.mntns, "--", "fusermount3", "-u", "-z", c.mnt)
		if n.pid != 0 && !waitExit(n.pid, 10*time.Second) {
			syscall.Kill(n.pid, syscall.SIGKILL)
			waitExit(n.pid, 10*time.Second)
		}
		syscall.Unmount(n.mntns, syscall.MNT_DETACH)
		runOut("ip", "netns", "del", n.netns)
	}
	c.stopEtcd()
	if c.t.Failed() {
		c.t.Logf("etcd log:\n%s", c.readFile("etcd.log"))
	}
	os.RemoveAll(c.etcdDataDir())
	os.RemoveAll(c.shmDir())
	runOut("ip", "netns", "del", c.etcdNS)
	runOut("ip", "netns", "del", c.sw)
	syscall.Unmount(c.nsDir, syscall.MNT_DETACH)
}

// openEtcd opens the etcd store of a URL etcd://host:port[,...].
func openEtcd(ctx context.Context, url string) (*etcd.Store, error) {
	eps, err := etcd.ParseEndpoints(strings.TrimPrefix(url, "etcd://"))
	if err != nil {
		return nil, err
	}
	return etcd.Open(ctx, etcd.DefaultConfig(eps...))
}

func init() {
	// etcd-ready ENDPOINT-URL: wait (bounded) until the store answers.
	helpers["etcd-ready"] = func(args []string) int {
		var err error
		if poll.Within(bound, func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			var s *etcd.Store
			if s, err = openEtcd(ctx, args[0]); err == nil {
				s.Close()
			}
			return err == nil
		}) {
			return 0
		}
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
}
