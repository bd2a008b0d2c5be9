package caller

import (
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/dyadfs/dyadfs/internal/poll"
)

func TestDecideRole(t *testing.T) {
	const target = "/mnt/dmd/run1/f"
	for _, c := range []struct {
		env  map[string]string
		cwd  string
		want Role
	}{
		{nil, "", RoleDefault},
		{map[string]string{EnvWait: "0"}, "", RoleNoWait},
		{map[string]string{EnvWait: "no"}, "", RoleNoWait},
		{map[string]string{EnvWait: "ON"}, "", RoleWait},
		{map[string]string{EnvWait: "maybe"}, "", RoleDefault},
		{map[string]string{EnvProducer: "/mnt/dmd"}, "", RoleNoWait},
		{map[string]string{EnvProducer: "/mnt/dmd/"}, "", RoleNoWait},
		{map[string]string{EnvProducer: "/mnt/dmd/run1/f"}, "", RoleNoWait},
		{map[string]string{EnvProducer: "/mnt/dm"}, "", RoleDefault}, // not a prefix of whole names
		{map[string]string{EnvProducer: "/other"}, "", RoleDefault},
		{map[string]string{EnvConsumer: "/mnt/dmd", EnvProducer: "/mnt/dmd"}, "", RoleWait},
		{map[string]string{EnvWait: "1", EnvProducer: "/mnt/dmd"}, "", RoleWait},
		{map[string]string{EnvWait: "0", EnvConsumer: "/mnt/dmd"}, "", RoleNoWait},
		{map[string]string{EnvProducer: "."}, "/mnt/dmd", RoleNoWait},
		{map[string]string{EnvProducer: "run1"}, "/mnt/dmd", RoleNoWait},
		{map[string]string{EnvProducer: "."}, "", RoleDefault}, // relative, working directory unknown
	} {
		if got := decideRole(c.env, c.cwd, target); got != c.want {
			t.Errorf("decideRole(%v, %q) = %v, want %v", c.env, c.cwd, got, c.want)
		}
	}
}

func TestParseEnviron(t *testing.T) {
	env := parseEnviron([]byte("PATH=/bin\x00DYADFS_WAIT=0\x00DYAD_PATH_PRODUCER=/a=b\x00junk\x00"))
	if len(env) != 2 || env[EnvWait] != "0" || env[EnvProducer] != "/a=b" {
		t.Fatalf("parseEnviron = %v", env)
	}
}

// TestRoleOfProcess reads the role of a real process from its environment.
func TestRoleOfProcess(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	cmd.Env = append(os.Environ(), EnvProducer+"=/mnt/dmd")
	if err := cmd.Start(); err != nil {
		t.Skipf("skipping: cannot start sleep: %v", err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	poll.Until(t, 5*time.Second, "the producer's environment is read", func() bool {
		return RoleOf(uint32(cmd.Process.Pid), "/mnt/dmd/x") == RoleNoWait
	})
	if got := RoleOf(uint32(os.Getpid()), "/mnt/dmd/x"); got != RoleDefault && os.Getenv(EnvProducer) == "" && os.Getenv(EnvWait) == "" && os.Getenv(EnvConsumer) == "" {
		t.Errorf("this process said nothing, yet RoleOf = %v", got)
	}
	if got := Comm(uint32(cmd.Process.Pid)); got != "sleep" {
		t.Errorf("Comm = %q, want sleep", got)
	}
}
