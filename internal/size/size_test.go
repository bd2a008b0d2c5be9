package size

import "testing"

func TestParse(t *testing.T) {
	for in, want := range map[string]int64{
		"4096": 4096, "64MiB": 64 << 20, "64M": 64 << 20, "64mb": 64e6, "1.5G": 3 << 29,
		"2 GiB": 2 << 30, "10k": 10 << 10, "1B": 1, "0": 0, " 3T ": 3 << 40,
	} {
		got, err := Parse(in)
		if err != nil || got != want {
			t.Errorf("Parse(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "MiB", "12 parsecs", "-1", "1e3", "99999999P"} {
		if got, err := Parse(in); err == nil {
			t.Errorf("Parse(%q) = %d, want an error", in, got)
		}
	}
}

func TestFormat(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1024: "1.00 KiB", 64 << 20: "64.0 MiB", 300 << 30: "300 GiB"} {
		if got := Format(n); got != want {
			t.Errorf("Format(%d) = %q, want %q", n, got, want)
		}
	}
}
