package backing

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

func open(t *testing.T) (*Dir, string) {
	t.Helper()
	dir := t.TempDir()
	d, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d, dir
}

// TestLongPaths: paths longer than PATH_MAX below the backing directory
// (and so the backing directory's path plus them) work, a piece at a
// time.
func TestLongPaths(t *testing.T) {
	d, _ := open(t)
	name := strings.Repeat("d", 200)
	rel := name
	for range 30 { // 30 x 201 bytes: more than PATH_MAX
		if err := d.Mkdir(rel, 0o755); err != nil {
			t.Fatalf("mkdir at depth %d bytes: %v", len(rel), err)
		}
		rel += "/" + name
	}
	file := rel[:strings.LastIndexByte(rel, '/')] + "/f"
	fd, err := d.OpenFile(file, unix.O_CREAT|unix.O_WRONLY, 0o600)
	if err != nil {
		t.Fatalf("create at %d bytes: %v", len(file), err)
	}
	unix.Close(fd)
	var st syscall.Stat_t
	if err := d.Lstat(file, &st); err != nil || st.Mode&0o777 != 0o600 {
		t.Fatalf("lstat at %d bytes: %v, mode %o", len(file), err, st.Mode)
	}
	if err := d.Rename(file, file+"2", 0); err != nil {
		t.Fatalf("rename: %v", err)
	}
	if err := d.Unlink(file + "2"); err != nil {
		t.Fatalf("unlink: %v", err)
	}
}

// TestNothingOutside: a symbolic link on the way, or one at the end,
// never makes an operation act outside the backing directory.
func TestNothingOutside(t *testing.T) {
	d, dir := open(t)
	outside := t.TempDir()
	os.WriteFile(filepath.Join(outside, "secret"), []byte("s"), 0o644)
	os.Symlink(outside, filepath.Join(dir, "esc"))
	os.Symlink(filepath.Join(outside, "secret"), filepath.Join(dir, "link"))
	if _, err := d.OpenFile("esc/secret", unix.O_RDONLY, 0); !errors.Is(err, unix.ELOOP) && !errors.Is(err, unix.EXDEV) {
		t.Fatalf("open through a link to outside: %v", err)
	}
	if err := d.Mkdir("esc/new", 0o755); err == nil {
		t.Fatal("mkdir through a link to outside succeeded")
	}
	if _, err := d.OpenFile("link", unix.O_RDONLY, 0); !errors.Is(err, unix.ELOOP) {
		t.Fatalf("open of a link at the end: %v, want ELOOP", err)
	}
	if err := d.Chmod("link", 0o600); !errors.Is(err, unix.EOPNOTSUPP) {
		t.Fatalf("chmod of a link: %v, want EOPNOTSUPP", err)
	}
	if err := d.Truncate("link", 0); err == nil {
		t.Fatal("truncate of a link reached its target")
	}
	if b, _ := os.ReadFile(filepath.Join(outside, "secret")); string(b) != "s" {
		t.Fatalf("the file outside changed: %q", b)
	}
	var st syscall.Stat_t
	if err := d.Lstat("link", &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFLNK {
		t.Fatalf("lstat of a link: %v %o", err, st.Mode)
	}
	if target, err := d.Readlink("link"); err != nil || target != filepath.Join(outside, "secret") {
		t.Fatalf("readlink: %q %v", target, err)
	}
}
