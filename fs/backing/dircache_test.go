package backing

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
)

// TestCachedParentsFollowRenames: with the parents cached, an operation
// after a rename or removal of its directory acts on the directory now at
// the path, not on the one cached before.
func TestCachedParentsFollowRenames(t *testing.T) {
	d, root := open(t)
	d.CacheDirs()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	create := func(rel string) {
		t.Helper()
		fd, err := d.OpenFile(rel, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o644)
		must(err)
		syscall.Close(fd)
	}
	must(d.Mkdir("a", 0o755))
	create("a/f") // a is cached now
	must(d.Rename("a", "b", 0))
	must(d.Mkdir("a", 0o755))
	create("a/g")
	if _, err := os.Stat(filepath.Join(root, "a/g")); err != nil {
		t.Fatalf("a file made after its directory was renamed away and made again: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "b/g")); err == nil {
		t.Fatal("a file made in the directory renamed away (the cached one)")
	}
	// Removed and made again, by Rmdir.
	must(d.Unlink("a/g"))
	must(d.Rmdir("a"))
	must(d.Mkdir("a", 0o755))
	create("a/h")
	if _, err := os.Stat(filepath.Join(root, "a/h")); err != nil {
		t.Fatalf("a file made after its directory was removed and made again: %v", err)
	}
	// A directory changed by the caller itself (DirsChange).
	done := d.DirsChange()
	must(os.Rename(filepath.Join(root, "a"), filepath.Join(root, "c")))
	must(os.Mkdir(filepath.Join(root, "a"), 0o755))
	done()
	create("a/i")
	if _, err := os.Stat(filepath.Join(root, "a/i")); err != nil {
		t.Fatalf("a file made after DirsChange: %v", err)
	}
}

// TestCachedParentsBounded: many directories keep at most maxCachedDirs
// descriptors open, and concurrent use closes none in use.
func TestCachedParentsBounded(t *testing.T) {
	d, _ := open(t)
	d.CacheDirs()
	if err := d.Mkdir("d", 0o755); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3*maxCachedDirs; i++ {
		if err := d.Mkdir(fmt.Sprintf("d/%03d", i), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ents, _ := d.ReadDir("d")
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := 0; r < 5; r++ {
				for _, e := range ents {
					var st syscall.Stat_t
					if err := d.Lstat(filepath.Join("d", e.Name, "missing"), &st); !os.IsNotExist(err) {
						t.Errorf("lstat in %s: %v", e.Name, err)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	d.dirs.mu.Lock()
	n := len(d.dirs.m)
	d.dirs.mu.Unlock()
	if n > maxCachedDirs {
		t.Fatalf("%d directories cached, at most %d", n, maxCachedDirs)
	}
}
