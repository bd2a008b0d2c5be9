package fs

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// The counting wrapper is generated from go-fuse's RawFileSystem: it must
// be regenerated (go generate ./fs) when go-fuse changes.
func TestOpStatsGenerated(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("go is not on PATH")
	}
	out := filepath.Join(t.TempDir(), "gen.go")
	cmd := exec.Command("go", "run", "./internal/opgen", "-o", out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("opgen: %v\n%s", err, b)
	}
	want, _ := os.ReadFile(out)
	got, _ := os.ReadFile("opstats_gen.go")
	if !bytes.Equal(got, want) {
		t.Fatal("opstats_gen.go is stale: run go generate ./fs")
	}
}
