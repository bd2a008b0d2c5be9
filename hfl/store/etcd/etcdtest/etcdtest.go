// Package etcdtest runs a real, single-member etcd server for tests: Debian's
// /usr/bin/etcd (package etcd-server), on 127.0.0.1 with free ports and its
// data in a temporary directory (on /dev/shm when there is one). Tests stop,
// kill and restart it to see how clients live through outages.
//
// No server outlives its test: t.Cleanup kills its process group, and the
// kernel kills it if the test binary dies first (PR_SET_PDEATHSIG).
package etcdtest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Binary is the etcd server the tests run.
const Binary = "/usr/bin/etcd"

// How long a server may take to become healthy, and to stop on SIGTERM.
const (
	readyTimeout = 30 * time.Second
	stopTimeout  = 10 * time.Second
)

// Server is a running (or stopped) etcd server.
type Server struct {
	dir        string // holds data/ and etcd.log
	clientPort int
	peerPort   int
	args       []string // more flags for etcd
	// tls: clients connect over TLS with a certificate the CA signed;
	// health is read from a plain HTTP metrics port then.
	tls         *TLSFiles
	metricsPort int

	mu     sync.Mutex
	proc   *os.Process
	exited chan struct{} // closed when proc has exited and been reaped
}

// Start starts an etcd server and waits until it is healthy. It skips the
// test if etcd is not installed, and fails it if etcd does not start.
func Start(t testing.TB) *Server {
	t.Helper()
	return StartWith(t)
}

// StartWith is Start with more flags for etcd (--quota-backend-bytes, say).
func StartWith(t testing.TB, args ...string) *Server {
	t.Helper()
	return startWith(t, nil, 0, args...)
}

func startWith(t testing.TB, tlsFiles *TLSFiles, metricsPort int, args ...string) *Server {
	t.Helper()
	if _, err := os.Stat(Binary); err != nil {
		t.Skipf("etcd-server is not installed (%s missing): run scripts/setup.sh", Binary)
	}
	dir, err := os.MkdirTemp(tmpRoot(), "dyadfs-etcdtest-")
	if err != nil {
		t.Fatalf("etcdtest: %v", err)
	}
	s := &Server{dir: dir, args: args, tls: tlsFiles, metricsPort: metricsPort}
	// Cleanups run last-registered first: kill, then remove the data.
	t.Cleanup(func() { os.RemoveAll(dir) })
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("etcdtest: end of %s:\n%s", s.logPath(), s.logTail(30))
		}
		s.Kill()
	})
	// Free ports can be taken between finding them and etcd binding them:
	// try a few times.
	for attempt := 1; ; attempt++ {
		s.clientPort, s.peerPort, err = freePorts()
		if err == nil {
			err = s.start()
		}
		if err == nil {
			return s
		}
		if attempt == 3 {
			t.Fatalf("etcdtest: %v", err)
		}
		os.RemoveAll(s.dataDir())
	}
}

// TLSFiles are the PEM files of a TLS etcd: its CA, and the server's
// certificate and key (for 127.0.0.1).
type TLSFiles struct{ CA, Cert, Key string }

// StartTLS starts an etcd that serves clients over TLS only and requires
// a client certificate signed by files.CA.
func StartTLS(t testing.TB, files TLSFiles) *Server {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	return startWith(t, &files, port, "--cert-file", files.Cert, "--key-file", files.Key,
		"--client-cert-auth", "--trusted-ca-file", files.CA,
		"--listen-metrics-urls", "http://127.0.0.1:"+strconv.Itoa(port))
}

// tmpRoot prefers tmpfs, where etcd's fsyncs cost nothing.
func tmpRoot() string {
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() && syscall.Access("/dev/shm", 2 /* W_OK */) == nil {
		return "/dev/shm"
	}
	return os.TempDir()
}

// Endpoints returns the client endpoint, "127.0.0.1:port".
func (s *Server) Endpoints() string { return "127.0.0.1:" + strconv.Itoa(s.clientPort) }

// Pid is the server's process id (for its CPU time in /proc).
func (s *Server) Pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return 0
	}
	return s.proc.Pid
}

// URL returns the dyadfs store URL of the server, "etcd://127.0.0.1:port".
func (s *Server) URL() string {
	if s.tls != nil {
		return "https://" + s.Endpoints()
	}
	return "etcd://" + s.Endpoints()
}

// DataDir returns the server's data directory.
func (s *Server) DataDir() string { return s.dataDir() }

func (s *Server) dataDir() string { return s.dir + "/data" }
func (s *Server) logPath() string { return s.dir + "/etcd.log" }

// Stop stops the server with SIGTERM, as an orderly shutdown, and waits until
// it has exited (killing it if it takes longer than 10 s). Its data stays.
func (s *Server) Stop() { s.signal(syscall.SIGTERM) }

// Kill kills the server with SIGKILL, as a crash, and waits until it has
// exited. Its data stays.
func (s *Server) Kill() { s.signal(syscall.SIGKILL) }

func (s *Server) signal(sig syscall.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return
	}
	// The server runs in a process group of its own; signal all of it.
	syscall.Kill(-s.proc.Pid, sig)
	select {
	case <-s.exited:
	case <-time.After(stopTimeout):
		syscall.Kill(-s.proc.Pid, syscall.SIGKILL)
		<-s.exited
	}
	s.proc, s.exited = nil, nil
}

// Restart stops the server if it runs, then starts it again on the same
// ports and data directory and waits until it is healthy. It fails t (the
// calling test, which may be a subtest of the one that started the server)
// if the server does not come back.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.Stop()
	if err := s.start(); err != nil {
		t.Fatalf("etcdtest: restart: %v", err)
	}
}

// Watchers returns the number of watches the server holds (its
// etcd_debugging_mvcc_watcher_total gauge): a test can wait until a client's
// watch is in place instead of sleeping.
func (s *Server) Watchers() (int, error) {
	body, err := s.get("/metrics")
	if err != nil {
		return 0, err
	}
	const metric = "etcd_debugging_mvcc_watcher_total "
	sc := bufio.NewScanner(bytes.NewReader(body))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), metric); ok {
			n, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return int(n), err
		}
	}
	return 0, fmt.Errorf("etcd at %s: no metric %s", s.Endpoints(), strings.TrimSpace(metric))
}

// WaitWatchers waits until the server holds at least n watches, or fails t
// after 10 s.
func (s *Server) WaitWatchers(t testing.TB, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := s.Watchers()
		if err == nil && got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("etcdtest: %d watchers after 10s (%v), want %d", got, err, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (s *Server) get(path string) ([]byte, error) {
	c := http.Client{Timeout: time.Second}
	addr := s.Endpoints()
	if s.metricsPort != 0 {
		addr = "127.0.0.1:" + strconv.Itoa(s.metricsPort)
	}
	resp, err := c.Get("http://" + addr + path)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return body, fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	return body, nil
}

// start runs etcd and waits until it reports itself healthy.
func (s *Server) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		return errors.New("already running")
	}
	if err := os.MkdirAll(s.dataDir(), 0o700); err != nil {
		return err
	}
	logf, err := os.OpenFile(s.logPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close() // the child has its own copy
	fmt.Fprintf(logf, "=== etcdtest: starting %s\n", time.Now().Format(time.RFC3339Nano))

	client := "http://" + s.Endpoints()
	if s.tls != nil {
		client = "https://" + s.Endpoints()
	}
	peer := "http://127.0.0.1:" + strconv.Itoa(s.peerPort)
	cmd := exec.Command(Binary,
		"--name", "etcdtest",
		"--data-dir", s.dataDir(),
		"--listen-client-urls", client,
		"--advertise-client-urls", client,
		"--listen-peer-urls", peer,
		"--initial-advertise-peer-urls", peer,
		"--initial-cluster", "etcdtest="+peer,
		"--initial-cluster-state", "new",
		"--logger", "zap",
		"--log-outputs", "stderr",
	)
	cmd.Args = append(cmd.Args, s.args...)
	cmd.Env = serverEnv()
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := spawn(cmd); err != nil {
		return fmt.Errorf("start %s: %w", Binary, err)
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()
	s.proc, s.exited = cmd.Process, exited

	deadline := time.Now().Add(readyTimeout)
	for {
		body, err := s.get("/health")
		if err == nil && bytes.Contains(body, []byte(`"health":"true"`)) {
			return nil
		}
		select {
		case <-exited:
			s.proc, s.exited = nil, nil
			return fmt.Errorf("etcd exited before it was ready (%s); its log ends:\n%s", cmd.ProcessState, s.logTail(20))
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
			s.proc, s.exited = nil, nil
			return fmt.Errorf("etcd not healthy after %v (last: %v); its log ends:\n%s", readyTimeout, err, s.logTail(20))
		}
	}
}

// serverEnv is the test's environment without ETCD_* variables, which would
// configure the server behind the flags' back. etcd 3.4 runs on amd64 and
// ppc64le only unless told otherwise.
func serverEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ETCD_") {
			env = append(env, kv)
		}
	}
	if runtime.GOARCH != "amd64" && runtime.GOARCH != "ppc64le" {
		env = append(env, "ETCD_UNSUPPORTED_ARCH="+runtime.GOARCH)
	}
	return env
}

func (s *Server) logTail(n int) string {
	b, err := os.ReadFile(s.logPath())
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// freePorts returns two ports that were free a moment ago.
func freePorts() (int, int, error) {
	var ports [2]int
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, 0, err
		}
		defer l.Close()
		ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	return ports[0], ports[1], nil
}

// The kernel delivers PR_SET_PDEATHSIG when the thread that forked the child
// exits, not the process, and Go ends a thread when a goroutine locked to it
// returns (golang/go#27505). So every server is forked from one goroutine
// locked to a thread of its own that never exits.
var (
	spawnOnce sync.Once
	spawnReqs chan spawnReq
)

type spawnReq struct {
	cmd  *exec.Cmd
	errc chan error
}

func spawn(cmd *exec.Cmd) error {
	spawnOnce.Do(func() {
		spawnReqs = make(chan spawnReq)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread lives on
			for r := range spawnReqs {
				r.errc <- r.cmd.Start()
			}
		}()
	})
	errc := make(chan error, 1)
	spawnReqs <- spawnReq{cmd, errc}
	return <-errc
}

// client connects to endpoints (host:port, comma-separated).
func client(endpoints string) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{Endpoints: strings.Split(endpoints, ","), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
}

// Fill writes 1 MiB values under key prefix until etcd refuses them for
// lack of space (its quota, --quota-backend-bytes), and returns how many
// it wrote.
func Fill(ctx context.Context, endpoints, prefix string) (int, error) {
	c, err := client(endpoints)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	v := strings.Repeat("x", 1<<20)
	for i := 0; ; i++ {
		_, err := c.Put(ctx, fmt.Sprintf("%s%06d", prefix, i), v)
		if errors.Is(err, rpctypes.ErrNoSpace) {
			return i, nil
		}
		if err != nil {
			return i, fmt.Errorf("fill etcd: %w", err)
		}
		if i > 10000 {
			return i, errors.New("fill etcd: the server takes everything (no quota?)")
		}
	}
}

// Reclaim does what an operator does once keys were deleted from a full
// etcd: compact its history, defragment every member and disarm its
// NOSPACE alarm.
func Reclaim(ctx context.Context, endpoints string) error {
	c, err := client(endpoints)
	if err != nil {
		return err
	}
	defer c.Close()
	resp, err := c.Get(ctx, "/")
	if err != nil {
		return err
	}
	if _, err := c.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		return fmt.Errorf("compact: %w", err)
	}
	for _, ep := range c.Endpoints() {
		if _, err := c.Defragment(ctx, ep); err != nil {
			return fmt.Errorf("defragment %s: %w", ep, err)
		}
	}
	if _, err := c.AlarmDisarm(ctx, &clientv3.AlarmMember{}); err != nil {
		return fmt.Errorf("disarm: %w", err)
	}
	return nil
}

// Count returns how many keys etcd holds under prefix.
func Count(ctx context.Context, endpoints, prefix string) (int64, error) {
	c, err := client(endpoints)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	resp, err := c.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return 0, err
	}
	return resp.Count, nil
}
