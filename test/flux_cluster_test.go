//go:build flux

package test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dyadfs/dyadfs/dtl"
	fluxdtl "github.com/dyadfs/dyadfs/dtl/flux"
	"github.com/dyadfs/dyadfs/flux/fluxtest"
	"github.com/dyadfs/dyadfs/fs"
)

// dyadfs inside a Flux instance: `flux start --test-size=N` runs N brokers
// on this machine; each gets a dyadfs daemon of its own (its FLUX_URI, its
// mountpoint and backing directory), with the Flux KVS as the store and
// Flux RPC (or TCP) between them. The node ids are the brokers' ranks.

// newFluxMounts mounts dyadfs on every rank of a new instance of n
// brokers, with the transport dtl.
func newFluxMounts(t *testing.T, n int, dtl string, flags ...string) []*mount {
	t.Helper()
	requireEnv(t)
	return newFluxMountsIn(t, fluxtest.Start(t, n), dtl, flags...)
}

// newFluxMountsIn mounts dyadfs on every rank of the instance in.
func newFluxMountsIn(t *testing.T, in *fluxtest.Instance, dtl string, flags ...string) []*mount {
	t.Helper()
	n := len(in.URIs)
	id := make([]byte, 3)
	rand.Read(id)
	ns := "fjob" + hex.EncodeToString(id)
	ms := make([]*mount, n)
	for r := range n {
		args := append([]string{"--store", "flux://", "--namespace", ns, "--dtl", dtl,
			"--fetch-timeout", "30s", "--stall-timeout", "2s"}, flags...)
		env := []string{"FLUX_URI=" + in.URIs[r]}
		switch dtl {
		case "tcp":
			args = append(args, "--listen", "127.0.0.1:"+freePort(t))
		case "ucx":
			// The ranks share this host: shared memory is allowed.
			args = append(args, "--listen", "127.0.0.1:"+freePort(t))
			env = append(env, "UCX_TLS=sm,tcp")
		}
		ms[r] = newFluxMountEnv(t, env, args...)
	}
	return ms
}

// newFluxMount mounts dyadfs for the broker at uri: no --node, so the
// node id is the broker's rank.
func newFluxMount(t *testing.T, uri string, flags ...string) *mount {
	t.Helper()
	return newFluxMountEnv(t, []string{"FLUX_URI=" + uri}, flags...)
}

// newFluxMountEnv mounts dyadfs with the environment env (FLUX_URI and
// maybe UCX's).
func newFluxMountEnv(t *testing.T, env []string, flags ...string) *mount {
	t.Helper()
	root, mnt, backing := mountDirs(t)
	m := &mount{t: t, mnt: mnt, backing: backing, logFile: filepath.Join(root, "dyadfs.log")}
	m.args, m.env = flags, env
	args := append([]string{"mount", "--backing", m.backing, "--log-file", m.logFile, "--log-level", "debug"}, m.args...)
	out, err := dyadfsEnv(t, m.env, append(args, m.mnt)...)
	if err != nil {
		t.Fatalf("dyadfs mount: %v\n%s\nlog:\n%s", err, out, m.readLog())
	}
	m.pid = m.status().PID
	t.Cleanup(m.cleanup)
	return m
}

// restart mounts m again over the same backing directory.
func (m *mount) restart() {
	m.t.Helper()
	args := append([]string{"mount", "--backing", m.backing, "--log-file", m.logFile, "--log-level", "debug"}, m.args...)
	out, err := dyadfsEnv(m.t, m.env, append(args, m.mnt)...)
	if err != nil {
		m.t.Fatalf("dyadfs mount again: %v\n%s", err, out)
	}
	m.pid = m.status().PID
}

// shaOf is the sha256 of the file at p.
func shaOf(t *testing.T, dir, p string) string {
	t.Helper()
	r := run(t, dir, "openssl", "dgst", "-sha256", "-r", p) // see sha256Cmd
	if r.err != nil {
		t.Fatalf("sha256 of %s: %v", p, r)
	}
	return strings.Fields(r.stdout)[0]
}

// TestFluxShare: files of every kind of size cross from rank 0 to rank 1
// whole (checksums), over Flux RPC and over TCP with the Flux store; a
// consumer that waits before its producer starts gets its file; many
// files closed at once all arrive; node ids are the ranks. UCX too, with
// shared memory allowed between the ranks of this host.
func TestFluxShare(t *testing.T) {
	for _, dtl := range []string{"flux", "tcp", "ucx"} {
		t.Run(dtl, func(t *testing.T) {
			if dtl == "ucx" && ucxTag == "" {
				t.Skip("skipping: built without UCX (install libucx-dev and test with -tags ucx)")
			}
			ms := newFluxMounts(t, 2, dtl)
			p, c := ms[0], ms[1]
			if st := c.status(); st.Node != "1" || p.status().Node != "0" {
				t.Fatalf("node ids %q and %q, want the ranks 0 and 1", p.status().Node, st.Node)
			}
			waiting := start(t, c.mnt, "cat", "late/f")
			c.waitStatus("a consumer waiting", func(st fs.Status) bool { return len(st.Waiters) == 1 })
			mustSh(t, p.mnt, `mkdir -p late sizes many && printf early > late/f
: > sizes/zero
head -c 4096 /dev/urandom > sizes/4k
head -c 67108864 /dev/urandom > sizes/64m
python3 -c "
f = open('sizes/sparse', 'wb')
for off in (0, 3 << 30, (4 << 30) - 100, 5 << 30):
    f.seek(off); f.write(b'data' * 1000)
f.truncate((5 << 30) + 4097)"
seq 1 200 | xargs -P 16 -I{} sh -c 'head -c 10000 /dev/urandom > many/f{}'`)
			if r := within(t, "the waiting consumer", bound, waiting); r.err != nil || r.stdout != "early" {
				t.Fatalf("the consumer that waited: %v", r)
			}
			for _, f := range []string{"sizes/zero", "sizes/4k", "sizes/64m"} {
				if got, want := shaOf(t, c.mnt, f), shaOf(t, p.mnt, f); got != want {
					t.Fatalf("%s: sha256 %s on rank 1, %s on rank 0", f, got, want)
				}
			}
			// 5 GiB, mostly holes: its CRC (see crcCmd).
			if got, want := mustSh(t, c.mnt, crcCmd+"sizes/sparse"), mustSh(t, p.mnt, crcCmd+"sizes/sparse"); got != want {
				t.Fatalf("sizes/sparse: CRC and size %q on rank 1, %q on rank 0", got, want)
			}
			var st syscall.Stat_t
			if err := syscall.Stat(filepath.Join(c.backing, "sizes/sparse"), &st); err != nil || st.Blocks*512 > 64<<20 {
				t.Fatalf("the sparse copy takes %d bytes (%v): holes were filled", st.Blocks*512, err)
			}
			if got, want := mustSh(t, c.mnt, "cd many && sha256sum * | sort"), mustSh(t, p.mnt, "cd many && sha256sum * | sort"); got != want {
				t.Fatalf("200 files closed at once: the consumer's checksums differ")
			}
		})
	}
}

// TestFluxOwnerKilled: the owner's daemon is killed while a consumer's
// transfer runs: the consumer's open fails with EIO within a bounded time
// (the owner's service went with it), nothing partial is left, and once
// the owner's daemon is back the file arrives.
func TestFluxOwnerKilled(t *testing.T) {
	// A whole transfer, which the test watches arrive (the file is above
	// the range threshold).
	ms := newFluxMounts(t, 2, "flux", "--range-threshold", "0")
	p, c := ms[0], ms[1]
	mustSh(t, p.mnt, "head -c 536870912 /dev/urandom > big")
	want := shaOf(t, p.mnt, "big")
	reader := start(t, c.mnt, "sha256sum", "big")
	tmp := filepath.Join(c.backing, ".dyadfs", "tmp-1")
	eventually(t, "a transfer in progress", func() bool {
		es, _ := os.ReadDir(tmp)
		for _, e := range es {
			if info, err := e.Info(); err == nil && info.Size() > 0 {
				return true
			}
		}
		return false
	})
	syscall.Kill(p.pid, syscall.SIGKILL)
	waitExit(p.pid, bound)
	p.pid = 0
	runOut("fusermount3", "-u", "-z", p.mnt)
	r := within(t, "the consumer of a killed owner", 20*time.Second, reader)
	if r.err == nil || !strings.Contains(r.stderr, "Input/output error") {
		t.Fatalf("the consumer: %v, want EIO", r)
	}
	if _, err := os.Lstat(filepath.Join(c.backing, "big")); !os.IsNotExist(err) {
		t.Fatalf("a partial file is visible: %v", err)
	}
	es, _ := os.ReadDir(tmp)
	for _, e := range es {
		if info, err := e.Info(); err == nil && info.Size() > 0 {
			t.Fatalf("a partial temporary file was left: %s", e.Name())
		}
	}
	p.restart()
	var got string
	eventually(t, "the file, once its owner is back", func() bool {
		r := run(t, c.mnt, "sha256sum", "big")
		if r.err != nil {
			return false
		}
		got = strings.Fields(r.stdout)[0]
		return true
	})
	if got != want {
		t.Fatalf("after the owner came back: sha256 %s, want %s", got, want)
	}
}

// TestFluxRefusals: a rank's daemon serves over Flux RPC only published,
// complete files of its own backing directory, and only to requests that
// carry the job secret's token.
func TestFluxRefusals(t *testing.T) {
	requireEnv(t)
	in := fluxtest.Start(t, 2)
	secret := filepath.Join(t.TempDir(), "secret")
	os.WriteFile(secret, []byte("0123456789abcdef0123456789abcdef\n"), 0o600)
	ms := newFluxMountsIn(t, in, "flux", "--secret-file", secret)
	p := ms[0]
	mustSh(t, p.mnt, "echo published > ok.dat && mkdir sub && ln -s /etc/passwd sub/escape")
	os.WriteFile(filepath.Join(p.backing, "unpublished.dat"), []byte("x"), 0o644)
	holder, stdin := startCmd(t, p.mnt, nil, "sh", "-c", "exec 3>busy.dat && echo partial >&3 && read x")
	defer func() { stdin.Close(); <-holder }()
	p.waitStatus("a writer holds busy.dat", func(st fs.Status) bool { return st.DMD.BusyFiles == 1 })
	addr := strings.TrimPrefix(p.status().Info["transport"], "flux ")

	h := in.Open(t, 1) // closed after the probes made on it
	probe := func(key string) *fluxdtl.Transport {
		cfg := dtl.DefaultConfig()
		cfg.Node, cfg.Secret = "probe", []byte(key)
		cfg.DialTimeout, cfg.StallTimeout = 5*time.Second, 5*time.Second
		tr, err := fluxdtl.New(h, "probe-"+key[:4], cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tr.Close() })
		return tr
	}
	good, wrong := probe("0123456789abcdef0123456789abcdef"), probe("fedcba9876543210fedcba9876543210")
	for _, tc := range []struct {
		tr   *fluxdtl.Transport
		path string
		want error
	}{
		{good, "ok.dat", nil},
		{good, "../etc/passwd", dtl.ErrOutside},
		{good, "/etc/passwd", dtl.ErrOutside},
		{good, "sub/escape", dtl.ErrOutside},
		{good, ".dyadfs/tmp", dtl.ErrOutside},
		{good, "unpublished.dat", dtl.ErrNotPublished},
		{good, "busy.dat", dtl.ErrBusy},
		{good, "missing.dat", dtl.ErrNotFound},
		{wrong, "ok.dat", dtl.ErrUnauthorized},
	} {
		dst, err := os.CreateTemp(t.TempDir(), "got-")
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		info, err := tc.tr.Fetch(ctx, addr, dtl.Request{Path: tc.path}, dtl.NewSink(dst))
		cancel()
		dst.Close()
		switch {
		case tc.want == nil && (err != nil || info.Size != int64(len("published\n"))):
			t.Errorf("fetch %q: %v (%d bytes), want the file", tc.path, err, info.Size)
		case tc.want != nil && !errors.Is(err, tc.want):
			t.Errorf("fetch %q: %v, want %v", tc.path, err, tc.want)
		}
	}
}

// TestFluxScript: scripts/flux-dyadfs.sh mounts dyadfs next to every
// broker of an instance and unmounts it everywhere, waiting for the
// daemons to exit; with --forget the job's KVS namespace goes too. A rank
// that cannot mount fails the start, and the ranks that did are unmounted.
func TestFluxScript(t *testing.T) {
	requireEnv(t)
	in := fluxtest.Start(t, 2)
	dir := t.TempDir()
	script, err := filepath.Abs("../scripts/flux-dyadfs.sh")
	if err != nil {
		t.Fatal(err)
	}
	mnt, backing := filepath.Join(dir, "mnt{rank}"), filepath.Join(dir, "backing{rank}")
	mnts := []string{filepath.Join(dir, "mnt0"), filepath.Join(dir, "mnt1")}
	for _, m := range mnts {
		removeDefaultLog(t, m)
	}
	t.Cleanup(func() {
		for _, m := range mnts {
			runOut("fusermount3", "-u", "-z", m)
		}
	})
	env := []string{"FLUX_URI=" + in.URIs[0], "DYADFS=" + dyadfsBin, "DYADFS_BACKING=" + backing, "DYAD_KVS_NAMESPACE=scriptjob"}
	runScript := func(args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*bound)
		defer cancel()
		cmd := exec.CommandContext(ctx, "bash", append([]string{script}, args...)...)
		cmd.Env = append(os.Environ(), env...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := runScript("start", mnt, "--log-level", "debug"); err != nil {
		t.Fatalf("start: %v\n%s", err, out)
	}
	mustSh(t, mnts[0], "echo from-rank-0 > f")
	if got := mustSh(t, mnts[1], "cat f"); got != "from-rank-0\n" {
		t.Fatalf("rank 1 read %q", got)
	}
	pids := []int{}
	for _, m := range mnts {
		var st fs.Status
		b, err := os.ReadFile(filepath.Join(m, ".dyadfs", "status"))
		if err != nil || json.Unmarshal(b, &st) != nil {
			t.Fatalf("status of %s: %v", m, err)
		}
		pids = append(pids, st.PID)
	}
	if out, err := runScript("stop", mnt, "--forget"); err != nil || !strings.Contains(out, "forgot namespace scriptjob") {
		t.Fatalf("stop: %v\n%s", err, out)
	}
	for i, m := range mnts {
		if isMounted(m) {
			t.Errorf("%s is still mounted", m)
		}
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pids[i])); err == nil && strings.Fields(string(b))[2] != "Z" {
			t.Errorf("the daemon of rank %d (pid %d) still runs after stop", i, pids[i])
		}
	}
	h := in.Open(t, 0)
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	if names, err := h.ListDir(ctx, "dyadfs-scriptjob", "."); err == nil {
		t.Errorf("the job's KVS namespace is still there after --forget: %v", names)
	}

	// As the quick start has it, without {rank}: brokers sharing this
	// machine each get MOUNTPOINT-RANK and a backing directory of their
	// own; {rank} in a flag (the log file) becomes each one's rank.
	plain := filepath.Join(dir, "dmd")
	plainMnts := []string{plain + "-0", plain + "-1"}
	t.Cleanup(func() {
		for _, m := range plainMnts {
			runOut("fusermount3", "-u", "-z", m)
		}
		os.RemoveAll("/var/tmp/dyadfs/scriptjob2-0")
		os.RemoveAll("/var/tmp/dyadfs/scriptjob2-1")
	})
	env = []string{"FLUX_URI=" + in.URIs[0], "DYADFS=" + dyadfsBin, "DYAD_KVS_NAMESPACE=scriptjob2"}
	out, err := runScript("start", plain, "--log-file", filepath.Join(dir, "log{rank}"))
	if err != nil || !strings.Contains(out, plain+"-{rank} ({rank}: each broker's rank)") {
		t.Fatalf("start without {rank} on one machine: %v\n%s", err, out)
	}
	mustSh(t, plainMnts[1], "echo from-rank-1 > g")
	if got := mustSh(t, plainMnts[0], "cat g"); got != "from-rank-1\n" {
		t.Fatalf("rank 0 read %q", got)
	}
	for i := range 2 {
		if _, err := os.Stat(filepath.Join(dir, fmt.Sprintf("log%d", i))); err != nil {
			t.Errorf("the log file of rank %d: %v", i, err)
		}
	}
	if out, err := runScript("stop", plain, "--forget"); err != nil {
		t.Fatalf("stop: %v\n%s", err, out)
	}
	env = []string{"FLUX_URI=" + in.URIs[0], "DYADFS=" + dyadfsBin, "DYADFS_BACKING=" + backing, "DYAD_KVS_NAMESPACE=scriptjob"}

	// A mount that fails on one rank (its backing directory is a file)
	// fails the start, and leaves no rank mounted.
	os.MkdirAll(filepath.Join(dir, "backing0"), 0o755)
	os.RemoveAll(filepath.Join(dir, "backing1"))
	os.WriteFile(filepath.Join(dir, "backing1"), nil, 0o644)
	if out, err := runScript("start", mnt); err == nil || !strings.Contains(out, "did not start on every rank") {
		t.Fatalf("start with a bad rank: %v\n%s", err, out)
	}
	for _, m := range mnts {
		if isMounted(m) {
			t.Errorf("%s is mounted after a failed start", m)
		}
	}
}
