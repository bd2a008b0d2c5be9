package wire

import "testing"

func TestCheckPath(t *testing.T) {
	for _, p := range []string{"a", "a/b", "a..b", "..a", "a/.b", "a b/c"} {
		if err := CheckPath(p); err != nil {
			t.Errorf("%q: %v", p, err)
		}
	}
	for _, p := range []string{"", ".", "..", "../a", "a/..", "a/../b", "/a", "a//b", "a/", "./a", "a/./b", "a\x00"} {
		if err := CheckPath(p); err == nil {
			t.Errorf("%q accepted", p)
		}
	}
}
