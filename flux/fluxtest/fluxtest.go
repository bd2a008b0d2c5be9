// Package fluxtest starts Flux test instances for dyadfs's tests: `flux
// start --test-size=N`, N brokers on this machine, each with its own URI.
// Tests that need one skip, saying what is missing, where Flux is not
// installed (../shared/flux/install.sh installs it under /opt/flux-core).
package fluxtest

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dyadfs/dyadfs/flux"
)

// Binary is the flux command, found on PATH or where install.sh puts it.
func Binary() (string, error) {
	if p, err := exec.LookPath("flux"); err == nil {
		return p, nil
	}
	const p = "/opt/flux-core/bin/flux"
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("flux is not installed (no flux on PATH, no %s): run ../shared/flux/install.sh", p)
	}
	return p, nil
}

// Instance is a running test instance.
type Instance struct {
	// URIs are the brokers' FLUX_URIs, by rank.
	URIs []string
	cmd  *exec.Cmd
}

// Start starts an instance of size brokers, stopped when the test ends.
func Start(t testing.TB, size int) *Instance {
	t.Helper()
	bin, err := Binary()
	if err != nil {
		t.Skipf("skipping: %v", err)
	}
	dir := t.TempDir()
	uris := filepath.Join(dir, "uris")
	ready := filepath.Join(dir, "ready")
	// The initial program lives while this process does: the instance
	// ends with it even when it is killed and its cleanups cannot run.
	script := fmt.Sprintf(`for r in $(seq 0 %d); do flux exec -r $r printenv FLUX_URI; done > %s.tmp && mv %s.tmp %s && touch %s && while kill -0 %d 2>/dev/null; do sleep 1; done`,
		size-1, uris, uris, uris, ready, os.Getpid())
	// flux start leaves its socket's directory (flux-XXXXXX) in TMPDIR
	// when it is stopped: it gets a directory of its own, removed after.
	// A short path: the brokers' sockets go below it too.
	tmp, err := os.MkdirTemp("", "fx")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "start", fmt.Sprintf("--test-size=%d", size), "bash", "-c", script)
	cmd.Env = append(os.Environ(), "PATH="+filepath.Dir(bin)+":"+os.Getenv("PATH"), "TMPDIR="+tmp)
	logf, err := os.Create(filepath.Join(dir, "flux.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		os.RemoveAll(tmp)
		t.Fatalf("flux start: %v", err)
	}
	in := &Instance{cmd: cmd}
	exited := make(chan struct{})
	go func() { cmd.Wait(); logf.Close(); close(exited) }()
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
		// A broker can outlive flux start (CI once found one still
		// shutting down minutes later): none is left behind.
		killBelow(t, tmp)
		os.RemoveAll(tmp)
	})
	deadline := time.After(60 * time.Second)
	for {
		if _, err := os.Stat(ready); err == nil {
			break
		}
		select {
		case <-exited:
			b, _ := os.ReadFile(filepath.Join(dir, "flux.log"))
			t.Fatalf("flux start exited before it was ready:\n%s", b)
		case <-deadline:
			t.Fatal("flux start not ready after 60 s")
		case <-time.After(20 * time.Millisecond):
		}
	}
	f, err := os.Open(uris)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if u := strings.TrimSpace(sc.Text()); u != "" {
			in.URIs = append(in.URIs, u)
		}
	}
	if len(in.URIs) != size {
		t.Fatalf("flux start: %d URIs for %d brokers", len(in.URIs), size)
	}
	return in
}

// killBelow kills the processes whose command line names a path below
// dir (the brokers' run directories are there), and waits until they are
// gone, at most 10 s.
func killBelow(t testing.TB, dir string) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		pids := processesNaming(dir + "/")
		if len(pids) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("processes of the Flux instance still running after SIGKILL: %v", pids)
			return
		}
		for _, pid := range pids {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// processesNaming returns the processes whose command line contains s.
func processesNaming(s string) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && strings.Contains(string(b), s) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// Open opens a handle on the broker of rank, closed when the test ends.
func (in *Instance) Open(t testing.TB, rank int) *flux.Handle {
	t.Helper()
	h, err := flux.Open(in.URIs[rank])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}
