package etcdtest

import (
	"bytes"
	"net/http"
	"os"
	"syscall"
	"testing"
)

// put and get use etcd's JSON gateway (keys and values in base64).
func put(t *testing.T, s *Server, kv string) {
	t.Helper()
	resp, err := http.Post("http://"+s.Endpoints()+"/v3/kv/put", "application/json",
		bytes.NewBufferString(`{"key":"`+kv+`","value":"`+kv+`"}`))
	if err != nil {
		t.Fatalf("put: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("put: %s", resp.Status)
	}
}

func has(t *testing.T, s *Server, k string) bool {
	t.Helper()
	resp, err := http.Post("http://"+s.Endpoints()+"/v3/kv/range", "application/json",
		bytes.NewBufferString(`{"key":"`+k+`"}`))
	if err != nil {
		t.Fatalf("range: %v", err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	b.ReadFrom(resp.Body)
	return bytes.Contains(b.Bytes(), []byte(`"kvs"`))
}

// alive reports whether pid exists, as a process or an unreaped zombie.
func alive(pid int) bool {
	return syscall.Kill(pid, 0) == nil
}

func TestStartRestartCleanup(t *testing.T) {
	var pid int
	var dir string
	t.Run("server", func(t *testing.T) {
		s := Start(t)
		pid, dir = s.proc.Pid, s.dir
		put(t, s, "a2V5") // "key"
		s.Stop()
		if alive(pid) {
			t.Fatalf("etcd pid %d alive after Stop", pid)
		}
		s.Restart(t)
		if !has(t, s, "a2V5") {
			t.Fatalf("key lost across a restart")
		}
		s.Kill()
		s.Restart(t)
		if !has(t, s, "a2V5") {
			t.Fatalf("key lost across a kill and restart")
		}
		if n, err := s.Watchers(); err != nil || n != 0 {
			t.Fatalf("Watchers = %d, %v; want 0", n, err)
		}
		pid = s.proc.Pid
	})
	if pid == 0 {
		t.Skip("no server ran")
	}
	if alive(pid) {
		t.Errorf("etcd pid %d outlived its test", pid)
		syscall.Kill(pid, syscall.SIGKILL)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("data dir %s outlived its test: %v", dir, err)
	}
}
