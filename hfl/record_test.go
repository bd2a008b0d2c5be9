package hfl

import (
	"errors"
	"testing"
)

// TestCleanPath: a path of the namespace is relative, names no parent and
// no NUL, and is returned clean.
func TestCleanPath(t *testing.T) {
	for in, want := range map[string]string{
		"a":          "a",
		"a/b/c":      "a/b/c",
		"a//b/./c/":  "a/b/c",
		"./a":        "a",
		"a..b/..c":   "a..b/..c",
		"...":        "...",
		"a/b/c.d/e.": "a/b/c.d/e.",
	} {
		if got, err := CleanPath(in); err != nil || got != want {
			t.Errorf("CleanPath(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "/a", "..", "a/..", "../a", "a/../b", "a/b/..", ".", "./", "a\x00b"} {
		if got, err := CleanPath(in); !errors.Is(err, ErrBadPath) {
			t.Errorf("CleanPath(%q) = %q, %v; want ErrBadPath", in, got, err)
		}
	}
	if n := testing.AllocsPerRun(100, func() { CleanPath("dir/sub/file.h5") }); n != 0 {
		t.Errorf("CleanPath of a clean path allocates %v times", n)
	}
}
