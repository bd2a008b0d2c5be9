package etcd_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/dyadfs/dyadfs/internal/poll"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/dyadfs/dyadfs/hfl"
	"github.com/dyadfs/dyadfs/hfl/store"
	"github.com/dyadfs/dyadfs/hfl/store/etcd"
	"github.com/dyadfs/dyadfs/hfl/store/etcd/etcdtest"
	"github.com/dyadfs/dyadfs/hfl/store/storetest"
)

// openEtcd opens a store on srv (or on endpoint, if not empty) under prefix,
// closed when the test ends.
func openEtcd(t *testing.T, endpoint, prefix string, tune func(*etcd.Config)) *etcd.Store {
	t.Helper()
	cfg := etcd.DefaultConfig(endpoint)
	cfg.Prefix = prefix
	if tune != nil {
		tune(&cfg)
	}
	s, err := etcd.Open(context.Background(), cfg)
	if err != nil {
		t.Fatalf("etcd.Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// rawClient talks to the server directly, to look at what the store wrote.
func rawClient(t *testing.T, endpoint string) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// eslot places a record of these tests under key, in a directory index of
// their own in the key's namespace (its first element).
func eslot(key string) store.Slot {
	ns, _, _ := strings.Cut(key, "/")
	return store.Slot{Key: key, Dir: ns + "/etcdtest", Name: key}
}

func record(path, owner string) store.Record {
	return store.Record{Path: path, Owner: owner, Size: 42, Mode: 0o100644, MtimeNs: 1}
}

func TestEtcdStoreConformance(t *testing.T) {
	srv := etcdtest.Start(t)
	var n atomic.Int64
	storetest.Run(t, func(t *testing.T) store.Store {
		// One server, and a prefix per subtest so that each sees an empty store.
		return openEtcd(t, srv.Endpoints(), fmt.Sprintf("/kvtest/%d/", n.Add(1)), nil)
	})
}

func TestEtcdOpenStore(t *testing.T) {
	srv := etcdtest.Start(t)
	ctx := testCtx(t)
	s, err := etcd.Open(ctx, etcd.DefaultConfig(srv.Endpoints()))
	if err != nil {
		t.Fatalf("Open(%s): %v", srv.URL(), err)
	}
	defer s.Close()
	out, err := s.Publish(ctx, eslot("job/k"), record("p", "n1"))
	if err != nil {
		t.Fatal(err)
	}
	// The generation is the key's revision in etcd, under the default
	// prefix, in the index of its slot's directory.
	resp, err := rawClient(t, srv.Endpoints()).Get(ctx, etcd.DefaultPrefix+"dir/job/etcdtest//job/k")
	if err != nil || len(resp.Kvs) != 1 || uint64(resp.Kvs[0].ModRevision) != out.Generation {
		t.Fatalf("raw read of the record = %v, %v; want mod revision %d", resp, err, out.Generation)
	}
}

func TestEtcdOpenUnreachable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close() // nothing listens there now
	for _, tc := range []struct {
		name string
		open func(ctx context.Context) (store.Store, error)
	}{
		{"Deadline", func(ctx context.Context) (store.Store, error) {
			ctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			s, err := etcd.Open(ctx, etcd.DefaultConfig(dead))
			if err != nil {
				return nil, err // not a nil *Store in a non-nil store.Store
			}
			return s, nil
		}},
		{"DialTimeout", func(ctx context.Context) (store.Store, error) {
			cfg := etcd.DefaultConfig(dead)
			cfg.DialTimeout = 500 * time.Millisecond
			s, err := etcd.Open(ctx, cfg)
			if err != nil {
				return nil, err
			}
			return s, nil
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			s, err := tc.open(context.Background())
			took := time.Since(start)
			if err == nil {
				s.Close()
				t.Fatalf("opening a store on a dead endpoint succeeded")
			}
			if s != nil {
				t.Errorf("store %#v returned with error %v", s, err)
			}
			if !strings.Contains(err.Error(), dead) || strings.Contains(err.Error(), "\n") {
				t.Errorf("error %q: want one line naming %s", err, dead)
			}
			if took > 3*time.Second {
				t.Errorf("took %v to fail", took)
			}
			t.Logf("after %v: %v", took.Round(time.Millisecond), err)
		})
	}
}

// waitResult is what a Wait run in a goroutine returns.
type waitResult struct {
	rec store.Record
	err error
}

func waitAsync(ctx context.Context, s store.Store, slot store.Slot, after uint64) <-chan waitResult {
	c := make(chan waitResult, 1)
	go func() {
		r, err := s.Wait(ctx, slot, after)
		c <- waitResult{r, err}
	}()
	return c
}

// A pending Wait lives through a restart of etcd, whether it stops in order
// or crashes, and wakes on a publish made after it is back; a registration
// lives on too.
func TestEtcdWaitSurvivesRestart(t *testing.T) {
	for _, mode := range []string{"stop", "kill"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			srv := etcdtest.Start(t)
			ctx := testCtx(t)
			s := openEtcd(t, srv.Endpoints(), "/restart/", func(c *etcd.Config) {
				// Short, so that reads made while etcd is down time out and
				// are retried during the outage.
				c.RequestTimeout = time.Second
			})
			if err := s.Register(ctx, "job/nodes/n1", []byte("n1"), 2*time.Second, nil); err != nil {
				t.Fatal(err)
			}
			first, err := s.Publish(ctx, eslot("job/k"), record("p", "n1"))
			if err != nil {
				t.Fatal(err)
			}
			done := waitAsync(ctx, s, eslot("job/k"), first.Generation)
			srv.WaitWatchers(t, 1)

			if mode == "stop" {
				srv.Stop()
			} else {
				srv.Kill()
			}
			// Down for longer than the request timeout and the lease's TTL.
			time.Sleep(3 * time.Second) // lets time pass
			select {
			case r := <-done:
				t.Fatalf("Wait ended while etcd was down: %+v, %v", r.rec, r.err)
			default:
			}
			srv.Restart(t)
			select {
			case r := <-done:
				t.Fatalf("Wait ended at the restart, before any publish: %+v, %v", r.rec, r.err)
			default:
			}

			// The client reconnects within its backoff (at most DialTimeout).
			var second store.Record
			poll.Within(15*time.Second, func() bool {
				second, err = s.Publish(ctx, eslot("job/k"), record("p", "n2"))
				return err == nil
			})
			if err != nil {
				t.Fatalf("Publish after the restart: %v", err)
			}
			select {
			case r := <-done:
				if r.err != nil || r.rec.Generation != second.Generation || r.rec.Owner != "n2" {
					t.Fatalf("Wait = %+v, %v; want the publish after the restart %+v", r.rec, r.err, second)
				}
			case <-time.After(15 * time.Second):
				t.Fatalf("Wait did not wake on a publish after the restart")
			}

			// Twice the TTL later the registration is still there: the lease
			// was kept alive or the value put on a new one.
			time.Sleep(4 * time.Second) // lets time pass
			other := openEtcd(t, srv.Endpoints(), "/restart/", nil)
			if v, err := other.Get(ctx, "job/nodes/n1"); err != nil || string(v) != "n1" {
				t.Fatalf("registration after the restart = %q, %v", v, err)
			}
		})
	}
}

// While etcd is down, calls fail within the request timeout (or the
// caller's shorter deadline) instead of hanging, and a Wait keeps waiting
// until its own deadline.
func TestEtcdCallsFailWhileDown(t *testing.T) {
	srv := etcdtest.Start(t)
	const timeout = time.Second
	s := openEtcd(t, srv.Endpoints(), "/down/", func(c *etcd.Config) { c.RequestTimeout = timeout })
	ctx := testCtx(t)
	srv.Stop()

	calls := map[string]func(context.Context) error{
		"Publish": func(ctx context.Context) error { _, err := s.Publish(ctx, eslot("k"), record("p", "n1")); return err },
		"Lookup":  func(ctx context.Context) error { _, err := s.Lookup(ctx, eslot("k")); return err },
		"Remove": func(ctx context.Context) error {
			_, err := s.Remove(ctx, eslot("k"), store.RemoveCond{Owner: "n1"})
			return err
		},
		"Register": func(ctx context.Context) error {
			return s.Register(ctx, "nodes/n1", []byte("x"), 5*time.Second, nil)
		},
		"Get":         func(ctx context.Context) error { _, err := s.Get(ctx, "secret"); return err },
		"PutIfAbsent": func(ctx context.Context) error { _, err := s.PutIfAbsent(ctx, "secret", []byte("x")); return err },
	}
	t.Run("Calls", func(t *testing.T) {
		for name, call := range calls {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				start := time.Now()
				err := call(ctx)
				took := time.Since(start)
				if !errors.Is(err, store.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("%s while etcd is down: %v; want ErrUnavailable and DeadlineExceeded", name, err)
				}
				if took > timeout+time.Second {
					t.Fatalf("%s took %v to fail, request timeout %v", name, took, timeout)
				}
				t.Logf("after %v: %v", took.Round(time.Millisecond), err)

				// A caller's shorter deadline wins, and is the caller's error.
				sctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
				defer cancel()
				start = time.Now()
				err = call(sctx)
				if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, store.ErrUnavailable) || time.Since(start) > timeout {
					t.Fatalf("%s with a 200ms deadline: %v after %v; want the caller's deadline", name, err, time.Since(start))
				}
			})
		}
	})

	t.Run("Wait", func(t *testing.T) {
		// Three request timeouts pass without an answer; the wait goes on
		// until its own deadline.
		wctx, cancel := context.WithTimeout(ctx, 3*timeout+500*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err := s.Wait(wctx, eslot("k"), 0)
		if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, store.ErrUnavailable) || time.Since(start) < 3*timeout {
			t.Fatalf("Wait while etcd is down: %v after %v; want its own deadline", err, time.Since(start))
		}
	})

	t.Run("CloseEndsWait", func(t *testing.T) {
		s2 := openEtcdDown(t, srv)
		done := waitAsync(ctx, s2, eslot("k"), 0)
		time.Sleep(100 * time.Millisecond) // lets time pass: the wait is under way, on a store that is down
		start := time.Now()
		s2.Close()
		select {
		case r := <-done:
			if !errors.Is(r.err, store.ErrClosed) {
				t.Fatalf("Wait after Close: %v, want ErrClosed", r.err)
			}
		case <-time.After(3 * time.Second):
			t.Fatalf("Wait still pending 3s after Close")
		}
		t.Logf("Close and the end of the wait took %v", time.Since(start).Round(time.Millisecond))
	})
}

// openEtcdDown opens a store while srv is down: it starts srv for the
// reachability check, then stops it again.
func openEtcdDown(t *testing.T, srv *etcdtest.Server) *etcd.Store {
	srv.Restart(t)
	s := openEtcd(t, srv.Endpoints(), "/down/", nil)
	srv.Stop()
	return s
}

// A registered value disappears at once when its store closes.
func TestEtcdRegisterWithdrawnOnClose(t *testing.T) {
	srv := etcdtest.Start(t)
	ctx := testCtx(t)
	a := openEtcd(t, srv.Endpoints(), "/dyadfs/", nil)
	b := openEtcd(t, srv.Endpoints(), "/dyadfs/", nil)
	if err := a.Register(ctx, "job/nodes/a", []byte("addr-a"), 30*time.Second, nil); err != nil {
		t.Fatal(err)
	}
	// Registering again replaces the value, on a new lease.
	if err := a.Register(ctx, "job/nodes/a", []byte("addr-a2"), 30*time.Second, nil); err != nil {
		t.Fatal(err)
	}
	if v, err := b.Get(ctx, "job/nodes/a"); err != nil || string(v) != "addr-a2" {
		t.Fatalf("Get = %q, %v; want addr-a2", v, err)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if v, err := b.Get(ctx, "job/nodes/a"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Get right after Close = %q, %v; want ErrNotFound", v, err)
	}
	if err := a.Register(ctx, "job/nodes/a", []byte("x"), time.Second, nil); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("Register after Close: %v, want ErrClosed", err)
	}
	if err := b.Register(ctx, "job/nodes/b", []byte("x"), 0, nil); err == nil {
		t.Fatalf("Register with ttl 0 succeeded")
	}
}

// What etcd 3.4 makes of short TTLs: it raises them to its minimum,
// ceil(1.5 x election timeout), 2 s with the default election timeout.
func TestEtcdRegisterTTL(t *testing.T) {
	srv := etcdtest.Start(t)
	ctx := testCtx(t)
	s := openEtcd(t, srv.Endpoints(), "/ttl/", nil)
	raw := rawClient(t, srv.Endpoints())
	for _, tc := range []struct {
		ttl  time.Duration
		want int64
	}{{time.Millisecond, 2}, {time.Second, 2}, {2 * time.Second, 2}, {2500 * time.Millisecond, 3}, {3 * time.Second, 3}, {time.Minute, 60}} {
		key := fmt.Sprintf("nodes/%v", tc.ttl)
		if err := s.Register(ctx, key, []byte("x"), tc.ttl, nil); err != nil {
			t.Fatalf("Register ttl %v: %v", tc.ttl, err)
		}
		resp, err := raw.Get(ctx, "/ttl/val/"+key)
		if err != nil || len(resp.Kvs) != 1 || resp.Kvs[0].Lease == 0 {
			t.Fatalf("raw Get of %s = %v, %v; want a key on a lease", key, resp, err)
		}
		ttl, err := raw.TimeToLive(ctx, clientv3.LeaseID(resp.Kvs[0].Lease))
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("ttl %v: etcd granted %ds", tc.ttl, ttl.GrantedTTL)
		if ttl.GrantedTTL != tc.want {
			t.Errorf("ttl %v: granted %ds, want %ds", tc.ttl, ttl.GrantedTTL, tc.want)
		}
	}
}

const childEnv = "DYADFS_ETCD_REGISTER_CHILD"

// TestEtcdRegisterChild is not a test: TestEtcdRegisterExpiresWhenProcessDies
// runs the test binary again as a daemon that registers and is then killed.
func TestEtcdRegisterChild(t *testing.T) {
	endpoint := os.Getenv(childEnv)
	if endpoint == "" {
		t.Skip("helper process of TestEtcdRegisterExpiresWhenProcessDies")
	}
	s, err := etcd.Open(context.Background(), etcd.DefaultConfig(endpoint))
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	if err := s.Register(context.Background(), "job/nodes/child", []byte("child"), 2*time.Second, nil); err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	fmt.Println("registered")
	time.Sleep(time.Minute) // until killed
	os.Exit(1)
}

// A daemon that dies without closing its store leaves its registration
// behind until the TTL runs out, not forever.
func TestEtcdRegisterExpiresWhenProcessDies(t *testing.T) {
	srv := etcdtest.Start(t)
	ctx := testCtx(t)
	s := openEtcd(t, srv.Endpoints(), etcd.DefaultPrefix, nil)
	raw := rawClient(t, srv.Endpoints())

	child := exec.Command(os.Args[0], "-test.run=^TestEtcdRegisterChild$", "-test.timeout=2m")
	child.Env = append(os.Environ(), childEnv+"="+srv.Endpoints())
	child.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	child.Stderr = os.Stderr
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		child.Process.Kill()
		child.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if strings.TrimSpace(line) != "registered" {
		t.Fatalf("child said %q, %v", line, err)
	}
	go io.Copy(io.Discard, out)

	resp, err := raw.Get(ctx, etcd.DefaultPrefix+"val/job/nodes/child")
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("raw Get of the registration = %v, %v", resp, err)
	}
	// Watch for the deletion from now on.
	wch := raw.Watch(ctx, etcd.DefaultPrefix+"val/job/nodes/child", clientv3.WithRev(resp.Header.Revision+1))

	// Let a few renewals pass, then kill the daemon.
	time.Sleep(2 * time.Second) // lets time pass
	if err := child.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	child.Wait()
	killed := time.Now()
	if v, err := s.Get(ctx, "job/nodes/child"); err != nil || string(v) != "child" {
		t.Fatalf("registration right after the kill = %q, %v; want it to last until the TTL", v, err)
	}
	select {
	case wr := <-wch:
		took := time.Since(killed)
		if len(wr.Events) != 1 || wr.Events[0].Type != clientv3.EventTypeDelete {
			t.Fatalf("watch = %+v, %v; want the deletion", wr.Events, wr.Err())
		}
		// The last renewal was at most TTL/3 before the kill; the server
		// looks for expired leases every 500 ms.
		t.Logf("registration expired %v after the daemon was killed (TTL 2s)", took.Round(10*time.Millisecond))
		if took < time.Second {
			t.Fatalf("registration gone %v after the kill, before its TTL of 2s could have run out", took)
		}
	case <-time.After(6 * time.Second):
		t.Fatalf("registration still there 6s after the daemon was killed (TTL 2s)")
	}
	if _, err := s.Get(ctx, "job/nodes/child"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Get after expiry: %v, want ErrNotFound", err)
	}
}

// cutProxy forwards TCP connections to target until cut, when it drops them
// all and refuses new ones until healed: a network partition.
type cutProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	cut    bool
	conns  map[net.Conn]struct{}
}

func startProxy(t *testing.T, target string) *cutProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, target: target, conns: make(map[net.Conn]struct{})}
	t.Cleanup(func() {
		ln.Close()
		p.Cut()
	})
	go p.serve()
	return p
}

func (p *cutProxy) Addr() string { return p.ln.Addr().String() }

func (p *cutProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.forward(c)
	}
}

func (p *cutProxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		return false
	}
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
	return true
}

func (p *cutProxy) forward(c net.Conn) {
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	if !p.track(c, up) {
		c.Close()
		up.Close()
		return
	}
	go func() { io.Copy(up, c); up.Close() }()
	io.Copy(c, up)
	c.Close()
}

func (p *cutProxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for c := range p.conns {
		c.Close()
	}
	clear(p.conns)
}

func (p *cutProxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = false
}

// A wait cut off from etcd while its key is written and the history
// compacted resumes its watch from a compacted revision: it reads the key
// again and returns the record.
func TestEtcdWaitAfterCompaction(t *testing.T) {
	srv := etcdtest.Start(t)
	ctx := testCtx(t)
	proxy := startProxy(t, srv.Endpoints())
	s := openEtcd(t, proxy.Addr(), "/compact/", nil)
	direct := openEtcd(t, srv.Endpoints(), "/compact/", nil)

	first, err := direct.Publish(ctx, eslot("k"), record("p", "n1"))
	if err != nil {
		t.Fatal(err)
	}
	done := waitAsync(ctx, s, eslot("k"), first.Generation)
	srv.WaitWatchers(t, 1)
	proxy.Cut()

	second, err := direct.Publish(ctx, eslot("k"), record("p", "n2"))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if _, err := direct.Publish(ctx, eslot("other"), record("o", "n2")); err != nil {
			t.Fatal(err)
		}
	}
	raw := rawClient(t, srv.Endpoints())
	resp, err := raw.Get(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := raw.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		t.Fatalf("Wait ended while cut off: %+v, %v", r.rec, r.err)
	default:
	}
	proxy.Heal()
	select {
	case r := <-done:
		if r.err != nil || r.rec.Generation != second.Generation || r.rec.Owner != "n2" {
			t.Fatalf("Wait = %+v, %v; want %+v", r.rec, r.err, second)
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("Wait did not return after the partition healed")
	}
}

// An owner's Remove racing with another owner's Publish never deletes the
// newer record.
func TestEtcdRemoveRacesPublish(t *testing.T) {
	srv := etcdtest.Start(t)
	ctx := testCtx(t)
	a := openEtcd(t, srv.Endpoints(), "/race/", nil)
	b := openEtcd(t, srv.Endpoints(), "/race/", nil)
	for i := 0; i < 50; i++ {
		key := fmt.Sprintf("k%d", i)
		if _, err := a.Publish(ctx, eslot(key), record("p", "nA")); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		wg.Add(2)
		go func() {
			defer wg.Done()
			if _, err := a.Remove(ctx, eslot(key), store.RemoveCond{Owner: "nA"}); err != nil && !errors.Is(err, store.ErrNotFound) && !errors.Is(err, store.ErrConflict) {
				t.Errorf("Remove: %v", err)
			}
		}()
		go func() {
			defer wg.Done()
			if _, err := b.Publish(ctx, eslot(key), record("p", "nB")); err != nil {
				t.Errorf("Publish: %v", err)
			}
		}()
		wg.Wait()
		if got, err := a.Lookup(ctx, eslot(key)); err != nil || got.Owner != "nB" {
			t.Fatalf("round %d: Lookup = %+v, %v; want nB's record", i, got, err)
		}
	}
}

// Two jobs sharing one etcd never see each other's records, members or
// secrets.
func TestEtcdNamespacesApart(t *testing.T) {
	srv := etcdtest.Start(t)
	ctx := testCtx(t)
	job := func(ns string) (*hfl.Locator, store.Store) {
		cfg := hfl.DefaultLocatorConfig()
		cfg.Namespace = ns
		s := openEtcd(t, srv.Endpoints(), etcd.DefaultPrefix, nil)
		loc, err := hfl.NewLocator(cfg, s, nil, hfl.SingleNode)
		if err != nil {
			t.Fatal(err)
		}
		return loc, s
	}
	a, storeA := job("jobA")
	b, storeB := job("jobB")
	const path = "run1/step7.dat"
	if a.Key(path) == b.Key(path) {
		t.Fatalf("both namespaces key %s as %s", path, a.Key(path))
	}

	recA, err := a.Publish(ctx, record(path, "nodeA"), hfl.PublishOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.Locate(ctx, path); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("jobB found jobA's record: %v", err)
	}
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if _, err := b.Wait(wctx, path, 0); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("jobB's wait ended on jobA's record: %v", err)
	}

	done := waitAsync(ctx, storeA, a.Slot(path), recA.Generation)
	srv.WaitWatchers(t, 1)
	recB, err := b.Publish(ctx, record(path, "nodeB"), hfl.PublishOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := a.Published(ctx, path); err != nil || got != recA {
		t.Fatalf("jobA's record after jobB's publish = %+v, %v; want %+v", got, err, recA)
	}
	if got, err := b.Published(ctx, path); err != nil || got != recB {
		t.Fatalf("jobB's record = %+v, %v; want %+v", got, err, recB)
	}
	select {
	case r := <-done:
		t.Fatalf("jobA's wait woke on jobB's publish: %+v, %v", r.rec, r.err)
	case <-time.After(200 * time.Millisecond):
	}

	if err := a.Register(ctx, hfl.Member{Node: "n1", Transport: "tcp", Addr: "a:1"}, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Member(ctx, "n1"); !errors.Is(err, hfl.ErrNotRunning) {
		t.Fatalf("jobB sees jobA's member: %v", err)
	}
	if m, err := a.Member(ctx, "n1"); err != nil || m.Addr != "a:1" {
		t.Fatalf("jobA's member = %+v, %v", m, err)
	}
	// The node id is taken in jobA by a daemon at another address; jobB
	// may use it; the same address (a restart) may register again.
	if err := a.Register(ctx, hfl.Member{Node: "n1", Transport: "tcp", Addr: "b:1"}, 5*time.Second); !errors.Is(err, hfl.ErrNodeInUse) || !strings.Contains(err.Error(), "a:1") {
		t.Fatalf("second daemon as n1 at another address: %v, want ErrNodeInUse naming a:1", err)
	}
	if err := b.Register(ctx, hfl.Member{Node: "n1", Transport: "tcp", Addr: "b:1"}, 5*time.Second); err != nil {
		t.Fatalf("n1 in another namespace: %v", err)
	}
	if err := a.Register(ctx, hfl.Member{Node: "n1", Transport: "tcp", Addr: "a:1"}, 5*time.Second); err != nil {
		t.Fatalf("n1 registering again at its own address: %v", err)
	}
	sa, err := hfl.JobSecret(ctx, storeA, "jobA")
	if err != nil {
		t.Fatal(err)
	}
	sb, err := hfl.JobSecret(ctx, storeB, "jobB")
	if err != nil {
		t.Fatal(err)
	}
	if string(sa) == string(sb) {
		t.Fatalf("both jobs got the same secret")
	}
	if sa2, err := hfl.JobSecret(ctx, storeA, "jobA"); err != nil || string(sa2) != string(sa) {
		t.Fatalf("jobA's secret changed: %v", err)
	}
}

// Waits that end by their deadline or cancellation leave no watch behind on
// the server.
func TestEtcdAbandonedWaitsLeaveNoWatchers(t *testing.T) {
	srv := etcdtest.Start(t)
	s := openEtcd(t, srv.Endpoints(), "/abandon/", nil)
	var wg sync.WaitGroup
	for i := 0; i < 100; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			if _, err := s.Wait(ctx, eslot(fmt.Sprintf("never/%d", i%10)), 0); !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Wait: %v, want DeadlineExceeded", err)
			}
		}()
	}
	wg.Wait()
	// The client cancels watches on the server asynchronously.
	poll.Until(t, 10*time.Second, "no watcher left on the server after every wait ended", func() bool {
		n, err := srv.Watchers()
		return err == nil && n == 0
	})
}

// Two daemons (each with its own client) started at once with the same node
// id at different addresses: exactly one registers, the other is refused
// with ErrNodeInUse naming the winner's address.
func TestEtcdSameNodeIDAtOnce(t *testing.T) {
	srv := etcdtest.Start(t)
	ctx := testCtx(t)
	daemon := func() *hfl.Locator {
		cfg := hfl.DefaultLocatorConfig()
		cfg.Namespace = "job"
		loc, err := hfl.NewLocator(cfg, openEtcd(t, srv.Endpoints(), etcd.DefaultPrefix, nil), nil, hfl.SingleNode)
		if err != nil {
			t.Fatal(err)
		}
		return loc
	}
	a, b := daemon(), daemon()
	for round := 0; round < 10; round++ {
		node := fmt.Sprintf("n%d", round)
		errs := make([]error, 2)
		var wg sync.WaitGroup
		for i, loc := range []*hfl.Locator{a, b} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = loc.Register(ctx, hfl.Member{Node: node, Transport: "tcp", Addr: fmt.Sprintf("addr-%d:1", i)}, 5*time.Second)
			}()
		}
		wg.Wait()
		won := -1
		for i, err := range errs {
			switch {
			case err == nil && won < 0:
				won = i
			case err == nil:
				t.Fatalf("round %d: both daemons registered as %s", round, node)
			case !errors.Is(err, hfl.ErrNodeInUse):
				t.Fatalf("round %d: Register: %v, want nil or ErrNodeInUse", round, err)
			}
		}
		if won < 0 {
			t.Fatalf("round %d: neither daemon registered: %v", round, errs)
		}
		if lost := errs[1-won]; !strings.Contains(lost.Error(), fmt.Sprintf("addr-%d:1", won)) {
			t.Fatalf("round %d: refusal %q does not name the winner's address", round, lost)
		}
		if m, err := a.Member(ctx, node); err != nil || m.Addr != fmt.Sprintf("addr-%d:1", won) {
			t.Fatalf("round %d: member = %+v, %v; want the winner's", round, m, err)
		}
	}
}

// TestEtcdFullRefusesWrites: an etcd over its quota refuses a publish with
// store.ErrNoSpace (at once, not as unreachable), says so in Health, and
// still lets Forget delete a namespace; once an operator compacted,
// defragmented and disarmed it, publishes land again.
func TestEtcdFullRefusesWrites(t *testing.T) {
	srv := etcdtest.StartWith(t, "--quota-backend-bytes", "8388608")
	ctx := testCtx(t)
	s := openEtcd(t, srv.Endpoints(), etcd.DefaultPrefix, nil)
	if _, err := s.Publish(ctx, eslot("job/a"), record("a", "n1")); err != nil {
		t.Fatal(err)
	}
	if n, err := etcdtest.Fill(ctx, srv.Endpoints(), etcd.DefaultPrefix+"val/junk/"); err != nil || n == 0 {
		t.Fatalf("fill: %d values, %v", n, err)
	}
	start := time.Now()
	_, err := s.Publish(ctx, eslot("job/b"), record("b", "n1"))
	if !errors.Is(err, store.ErrNoSpace) || errors.Is(err, store.ErrUnavailable) || time.Since(start) > time.Second {
		t.Fatalf("publish into a full etcd: %v after %v; want store.ErrNoSpace at once", err, time.Since(start))
	}
	h, err := s.Health(ctx, "job")
	if err != nil || !slices.Contains(h.Alarms, "NOSPACE") || h.Bytes < 4<<20 || h.Records != 1 {
		t.Fatalf("Health of a full etcd: %+v, %v; want the NOSPACE alarm, its size and 1 record", h, err)
	}
	if n, err := s.Forget(ctx, "junk", 0, nil); err != nil || n == 0 {
		t.Fatalf("Forget in a full etcd: %d keys, %v", n, err)
	}
	if err := etcdtest.Reclaim(ctx, srv.Endpoints()); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Publish(ctx, eslot("job/b"), record("b", "n1")); err != nil {
		t.Fatalf("publish once etcd was reclaimed: %v", err)
	}
	if h, err := s.Health(ctx, "job"); err != nil || len(h.Alarms) != 0 || h.Records != 2 {
		t.Fatalf("Health once reclaimed: %+v, %v", h, err)
	}
}

// TestEtcdDeniedWrite: an etcd that requires authentication refuses a
// client without credentials with store.ErrDenied, at once.
func TestEtcdDeniedWrite(t *testing.T) {
	srv := etcdtest.Start(t)
	ctx := testCtx(t)
	s := openEtcd(t, srv.Endpoints(), etcd.DefaultPrefix, nil)
	raw := rawClient(t, srv.Endpoints())
	if _, err := raw.UserAdd(ctx, "root", "secret-password"); err != nil {
		t.Fatal(err)
	}
	if _, err := raw.UserGrantRole(ctx, "root", "root"); err != nil {
		t.Fatal(err)
	}
	if _, err := raw.AuthEnable(ctx); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err := s.Publish(ctx, eslot("job/a"), record("a", "n1"))
	if !errors.Is(err, store.ErrDenied) || time.Since(start) > 5*time.Second {
		t.Fatalf("publish without credentials: %v after %v; want store.ErrDenied at once", err, time.Since(start))
	}
}
