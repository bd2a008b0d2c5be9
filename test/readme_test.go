package test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
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
		`ip link set lo up && bash -e "$0"; rc=$?; pkill -f "^etcd --data-dir /tmp/try/etcd"; exit $rc`, script)
	cmd.Env = append(os.Environ(), "PATH="+filepath.Dir(dyadfsBin)+":"+os.Getenv("PATH"))
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "hello") {
		t.Fatalf("the README's recipe: %v\n%s\nscript:\n%s", err, out, block)
	}
}
