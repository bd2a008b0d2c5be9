package test

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestBackendsNotBuilt: a build without the optional backends (no Flux, no
// UCX) builds, and a mount asking for one says what is missing.
func TestBackendsNotBuilt(t *testing.T) {
	requireEnv(t)
	bin := filepath.Join(t.TempDir(), "dyadfs-plain")
	if out, err := runOut("go", "build", "-o", bin, "github.com/dyadfs/dyadfs/cmd/dyadfs"); err != nil {
		t.Fatalf("build without tags: %v\n%s", err, out)
	}
	for _, c := range []struct {
		flags []string
		want  string
	}{
		{[]string{"--store", "flux://"}, "built without Flux"},
		{[]string{"--dtl", "flux", "--store", "etcd://127.0.0.1:1"}, "built without Flux"},
		{[]string{"--dtl", "ucx", "--store", "etcd://127.0.0.1:1"}, "built without UCX"},
	} {
		_, mnt, backing := mountDirs(t)
		args := append([]string{"mount", "-f"}, c.flags...)
		out, err := runOut(bin, append(args, "--backing", backing, mnt)...)
		if err == nil || !strings.Contains(out, c.want) {
			t.Errorf("%s in a plain build: %v\n%s", strings.Join(c.flags, " "), err, out)
		}
	}
}
