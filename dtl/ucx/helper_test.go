//go:build ucx

package ucx

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dyadfs/dyadfs/dtl"
	"github.com/dyadfs/dyadfs/dtl/dtltest"
	"github.com/dyadfs/dyadfs/dtl/tcp"
)

// Owners in other processes: the test binary runs itself as one
// (TestMain), so that a test can kill a peer outright or put it in another
// network namespace.

const helperEnv = "DYADFS_UCX_TEST_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(helperMain())
	}
	os.Exit(m.Run())
}

// helperMain serves a directory until its stdin closes. Its environment
// says what: DYADFS_UCX_TEST_HELPER=dir,hex secret,listen address[,tcp]
// (tcp: the TCP transport serves instead of UCX), and UCX's own variables
// (UCX_TLS, UCX_NET_DEVICES) pass through to UCX. It prints "addr ADDR"
// once it serves, and "streaming" once a fetch of "slow" has begun and 4
// MiB of it were written; it answers messages with their own bytes. A
// line "publish P" on its stdin records P's checksum, as a producer's
// publish does; it answers "published".
func helperMain() int {
	args := strings.Split(os.Getenv(helperEnv), ",")
	if len(args) != 3 && (len(args) != 4 || args[3] != "tcp") {
		fmt.Fprintln(os.Stderr, "helper: bad arguments")
		return 2
	}
	secret, err := hex.DecodeString(args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 2
	}
	cfg := dtl.DefaultConfig()
	cfg.Node, cfg.Listen, cfg.Secret = "helper", args[2], secret
	cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	var tr dtl.Transport
	if len(args) == 4 {
		tr, err = tcp.New(cfg)
	} else {
		tr, err = New(cfg)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 1
	}
	defer tr.Close()
	src := dtltest.NewSource(args[0])
	writers := src.Stream("slow", 1<<30)
	go func() {
		var open []*os.File // kept open (and referenced) until the end
		for w := range writers {
			open = append(open, w)
			w.Write(make([]byte, 4<<20))
			fmt.Println("streaming")
		}
	}()
	if err := tr.Serve(echoing{src}); err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 1
	}
	fmt.Println("addr", tr.Addr())
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		if p, ok := strings.CutPrefix(sc.Text(), "publish "); ok {
			if err := src.Publish(p); err != nil {
				fmt.Fprintln(os.Stderr, "helper:", err)
				return 1
			}
			fmt.Println("published")
		}
	}
	return 0
}

// helper is an owner in a process of its own.
type helper struct {
	cmd   *exec.Cmd
	lines <-chan string
	addr  string
	dir   string
	stdin io.WriteCloser
}

// startHelper runs an owner serving a new directory on listen, with env
// added to its environment; prefix runs it under another command (ip
// netns exec ...).
func startHelper(t testing.TB, secret []byte, listen string, env []string, prefix ...string) *helper {
	t.Helper()
	return startOwner(t, secret, listen, "", env, prefix...)
}

// startOwner is startHelper with the transport to serve with: "" for UCX,
// "tcp" for the TCP transport.
func startOwner(t testing.TB, secret []byte, listen, transport string, env []string, prefix ...string) *helper {
	t.Helper()
	dir := t.TempDir()
	argv := append(prefix, os.Args[0], "-test.run=^$")
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	arg := dir + "," + hex.EncodeToString(secret) + "," + listen
	if transport != "" {
		arg += "," + transport
	}
	cmd.Env = append(cmd.Env, helperEnv+"="+arg)
	stderr := &dtltest.LogBuf{}
	cmd.Stderr = stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	h := &helper{cmd: cmd, lines: lines, dir: dir, stdin: stdin}
	t.Cleanup(func() {
		stdin.Close()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("helper's log:\n%s", stderr)
		}
	})
	line := h.expect(t, "addr ")
	h.addr = strings.TrimPrefix(line, "addr ")
	return h
}

// expect waits for the helper's next line, which must begin with prefix.
func (h *helper) expect(t testing.TB, prefix string) string {
	t.Helper()
	select {
	case line, ok := <-h.lines:
		if !ok || !strings.HasPrefix(line, prefix) {
			t.Fatalf("helper said %q (open %v), want %q...", line, ok, prefix)
		}
		return line
	case <-time.After(30 * time.Second):
		t.Fatalf("helper did not say %q", prefix)
	}
	return ""
}

// publish has the helper record p's checksum.
func (h *helper) publish(t testing.TB, p string) {
	t.Helper()
	if _, err := fmt.Fprintln(h.stdin, "publish", p); err != nil {
		t.Fatal(err)
	}
	h.expect(t, "published")
}

// TestPeerKilled: an owner killed outright in the middle of transfers
// (no close, no goodbye) fails every one of them at once, not as a
// refusal; the consumer's buffers come back and the next transfer, to a
// new owner at the same address, succeeds.
func TestPeerKilled(t *testing.T) {
	onEachWire(t, func(t *testing.T, tls string) {
		s := dtltest.NewSecret()
		env := []string{"UCX_TLS=" + tls}
		h := startHelper(t, s, "127.0.0.1:0", env)
		data := make([]byte, 256<<20)
		rand.Read(data)
		if err := os.WriteFile(filepath.Join(h.dir, "big"), data, 0o644); err != nil {
			t.Fatal(err)
		}
		client, _ := testTransport(t, s, opts{tls: tls, tune: func(tun *tuning) { tun.window = 2 }})
		ctx := ctxFor(t)
		done := dtltest.FetchAllAsync(t, ctx, client, h.addr, "slow", "slow", "slow", "big")
		for range 3 {
			h.expect(t, "streaming")
		}
		killed := time.Now()
		h.cmd.Process.Signal(syscall.SIGKILL)
		for range 4 {
			select {
			case err := <-done:
				var re *dtl.RemoteError
				if err == nil {
					t.Error("a transfer from a killed owner succeeded")
				} else if errors.As(err, &re) {
					t.Errorf("a transfer from a killed owner failed as a refusal: %v", err)
				}
				t.Logf("cut after %v: %v", time.Since(killed).Round(time.Millisecond), err)
			case <-time.After(30 * time.Second):
				t.Fatal("a transfer did not end")
			}
		}
		if took := time.Since(killed); took > prompt {
			t.Errorf("transfers ended %v after the owner died", took)
		}
		poolsFull(t, client)

		h.cmd.Wait()
		again := startHelper(t, s, h.addr, env)
		os.WriteFile(filepath.Join(again.dir, "big"), data, 0o644)
		dst := dtltest.Dst(t)
		if _, err := client.Fetch(ctx, again.addr, dtl.Request{Path: "big"}, dtl.NewSink(dst)); err != nil {
			t.Fatalf("fetch from the restarted owner: %v", err)
		}
		dtltest.SameContent(t, dst.Name(), filepath.Join(h.dir, "big"))
		poolsFull(t, client)
	})
}

// echoing is the helper's Source: it also answers every message with the
// message itself.
type echoing struct{ *dtltest.Source }

func (echoing) HandleMessage(ctx context.Context, from string, msg []byte) ([]byte, error) {
	return msg, nil
}
