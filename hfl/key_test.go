package hfl

import (
	"strconv"
	"strings"
	"testing"
)

// maxBins is MaxKeyBins as an int, converted at run time so that the test
// still compiles where int has 32 bits (where the value is unused).
var maxBins = func() int { var m uint64 = MaxKeyBins; return int(m) }()

// Expected keys below were produced by DYAD's own gen_path_key
// (src/dyad/client/dyad_client.c) and MurmurHash3_x64_128
// (src/dyad/utils/murmur3.c) from flux-framework/dyad at commit 1a99c31a,
// compiled with gcc on this machine (x86-64) with a tiny driver that calls
// gen_path_key(path, topic, PATH_MAX, depth, bins) the way publish_via_flux
// does. For long paths only the hashed bin prefix is recorded; the full key
// is that prefix followed by the path.

var (
	path127 = "long/" + strings.Repeat("x", 122) // padded with one '@'
	path128 = "long/" + strings.Repeat("x", 123) // exactly 128: hashed as is
	path129 = "long/" + strings.Repeat("x", 124) // 16n+1 tail
	path137 = "long/" + strings.Repeat("x", 132) // 16n+9 tail
	path140 = "long/" + strings.Repeat("x", 135) // 16n+12 tail
	pathU   = strings.Repeat("ü/", 100)          // 300 bytes, 16n+12
)

func TestDYADKeyMatchesDYAD(t *testing.T) {
	cases := []struct {
		name        string
		path        string
		depth, bins int
		want        string
	}{
		{"short", "a.txt", 3, 1024, "7f.70.5d.a.txt"},
		{"short depth 1", "a.txt", 1, 1024, "7f.a.txt"},
		{"nested", "dir1/dir2/file_0001.npz", 3, 1024, "28.82.6d.dir1/dir2/file_0001.npz"},
		{"nested depth 1", "dir1/dir2/file_0001.npz", 1, 1024, "28.dir1/dir2/file_0001.npz"},
		{"nested depth 2 bins 256", "dir1/dir2/file_0001.npz", 2, 256, "28.82.dir1/dir2/file_0001.npz"},
		{"dataset depth 3 bins 1024", "data/train/img_000042.png", 3, 1024, "185.241.1a9.data/train/img_000042.png"},
		{"dataset depth 2 bins 256", "data/train/img_000042.png", 2, 256, "85.41.data/train/img_000042.png"},
		{"depth 4 bins 65536", "checkpoints/epoch-7/model.pt", 4, 65536, "b53.e760.9fcb.1992.checkpoints/epoch-7/model.pt"},
		{"one bin", "a.txt", 3, 1, "0.0.0.a.txt"},
		{"max bins", "a.txt", 3, maxBins, "efe2287f.203c8070.1c42185d.a.txt"},
		{"depth 12 cycles the seed table", "a.txt", 12, 7, "5.6.6.3.6.4.2.5.3.1.2.0.a.txt"},
		{"depth 0 is the bare path", "a.txt", 0, 0, "a.txt"},
		{"unicode", "données/日本語/ファイル.h5", 3, 1024, "159.376.af.données/日本語/ファイル.h5"},
		{"unicode depth 2 bins 256", "données/日本語/ファイル.h5", 2, 256, "59.76.données/日本語/ファイル.h5"},
		{"unicode emoji and space", "🚀/émoji file.bin", 3, 1024, "92.2d5.13e.🚀/émoji file.bin"},
		// '@' padding makes these hash alike; only the path suffix differs.
		{"x", "x", 3, 1024, "30b.139.ff.x"},
		{"x@", "x@", 3, 1024, "30b.139.ff.x@"},
		{"x@@", "x@@", 3, 1024, "30b.139.ff.x@@"},
		// Around and over the 128-byte padding length.
		{"127 bytes", path127, 3, 1024, "38b.3ae.1db." + path127},
		{"128 bytes", path128, 3, 1024, "37.f5.86." + path128},
		{"128 bytes depth 2 bins 256", path128, 2, 256, "37.f5." + path128},
		{"128 bytes depth 1", path128, 1, 1024, "37." + path128},
		{"129 bytes", path129, 3, 1024, "3ba.a7.121." + path129},
		{"129 bytes, last byte changed", path128 + "y", 3, 1024, "1a6.34f.6a." + path128 + "y"},
		{"137 bytes", path137, 3, 1024, "2b6.266.ba." + path137},
		{"137 bytes, last byte changed", path137[:136] + "y", 3, 1024, "95.28f.3bb." + path137[:136] + "y"},
		// DYAD's murmur3.c drops tail bytes 0..7 of a 9-byte tail and the
		// whole of a 12-byte tail, so these share their bins with the
		// paths above.
		{"137 bytes, dropped tail bytes changed", path128 + "yyyyyyyyx", 3, 1024, "2b6.266.ba." + path128 + "yyyyyyyyx"},
		{"140 bytes", path140, 3, 1024, "40.2db.38c." + path140},
		{"140 bytes, dropped tail changed", path128 + "yyyyyyyyyyyy", 3, 1024, "40.2db.38c." + path128 + "yyyyyyyyyyyy"},
		{"300 bytes unicode", pathU, 3, 1024, "357.a2.288." + pathU},
		{"300 bytes unicode depth 2 bins 256", pathU, 2, 256, "57.a2." + pathU},
		{"4085 bytes", strings.Repeat("dir/", 1020) + "f.txt", 3, 1024, "1d4.7b.56." + strings.Repeat("dir/", 1020) + "f.txt"},
	}
	for _, c := range cases {
		if c.bins == maxBins && strconv.IntSize < 64 {
			continue
		}
		if got := DYADKey(c.path, c.depth, c.bins); got != c.want {
			t.Errorf("%s: DYADKey(%q, %d, %d) = %q, want %q", c.name, c.path, c.depth, c.bins, got, c.want)
		}
	}
}

// DYAD truncates keys longer than PATH_MAX-1 bytes; dyadfs does not. For
// this 4093-byte path DYAD's gen_path_key returned the first 4095 bytes of
// "16d.357.1d4." + path.
func TestDYADKeyOverDYADKeyBuffer(t *testing.T) {
	p := strings.Repeat("dir/", 1022) + "f.txt"
	got := DYADKey(p, 3, 1024)
	want := "16d.357.1d4." + p
	if got != want {
		t.Fatalf("DYADKey(4093-byte path) = %.40q..., want %.40q...", got, want)
	}
	if len(got) <= 4095 {
		t.Fatalf("key length %d, want the untruncated %d", len(got), len(want))
	}
}

func TestDYADKeyCStringEdges(t *testing.T) {
	if got := DYADKey("", 3, 1024); got != "" {
		t.Errorf(`DYADKey("") = %q, want ""`, got)
	}
	// Like DYAD's strlen, everything from the first NUL on is ignored.
	if got, want := DYADKey("a.txt\x00junk", 3, 1024), "7f.70.5d.a.txt"; got != want {
		t.Errorf("DYADKey with NUL = %q, want %q", got, want)
	}
	if got := DYADKey("\x00a", 3, 1024); got != "" {
		t.Errorf("DYADKey(leading NUL) = %q, want empty", got)
	}
}

// Bins for a divisor of the bin count are the larger count's bins reduced,
// so a 256-bin key is a 1024-bin key's bins mod 256 level by level.
func TestDYADKeyBinsConsistent(t *testing.T) {
	for _, p := range []string{"a", "b/c", path137, pathU, "données/日本語/ファイル.h5"} {
		k1024 := strings.SplitN(DYADKey(p, 3, 1024), ".", 4)
		k256 := strings.SplitN(DYADKey(p, 3, 256), ".", 4)
		for l := 0; l < 3; l++ {
			a, err := strconv.ParseUint(k1024[l], 16, 32)
			if err != nil {
				t.Fatal(err)
			}
			b, err := strconv.ParseUint(k256[l], 16, 32)
			if err != nil {
				t.Fatal(err)
			}
			if a%256 != b || a >= 1024 {
				t.Errorf("%q level %d: 1024-bin %x, 256-bin %x", p, l, a, b)
			}
		}
	}
}

func TestDYADKeyPanicsOnBadShape(t *testing.T) {
	for _, c := range []struct{ depth, bins int }{{-1, 1024}, {3, 0}, {1, -5}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("DYADKey(depth %d, bins %d) did not panic", c.depth, c.bins)
				}
			}()
			DYADKey("a.txt", c.depth, c.bins)
		}()
	}
}

func TestValidateKeyShape(t *testing.T) {
	ok := []struct{ depth, bins int }{
		{DefaultKeyDepth, DefaultKeyBins}, {1, 1}, {2, 256}, {MaxKeyDepth, 1 << 20},
	}
	if strconv.IntSize == 64 {
		ok = append(ok, struct{ depth, bins int }{MaxKeyDepth, maxBins})
	}
	for _, c := range ok {
		if err := ValidateKeyShape(c.depth, c.bins); err != nil {
			t.Errorf("ValidateKeyShape(%d, %d) = %v, want nil", c.depth, c.bins, err)
		}
	}
	bad := []struct{ depth, bins int }{
		{0, 1024}, {-1, 1024}, {MaxKeyDepth + 1, 1024}, {3, 0}, {3, -1},
	}
	if strconv.IntSize == 64 {
		bad = append(bad, struct{ depth, bins int }{3, maxBins + 1})
	}
	for _, c := range bad {
		if err := ValidateKeyShape(c.depth, c.bins); err == nil {
			t.Errorf("ValidateKeyShape(%d, %d) = nil, want an error", c.depth, c.bins)
		}
	}
	if DefaultKeyDepth != 3 || DefaultKeyBins != 1024 {
		t.Errorf("defaults %d/%d, want DYAD's 3/1024", DefaultKeyDepth, DefaultKeyBins)
	}
}

func BenchmarkDYADKey(b *testing.B) {
	for i := 0; i < b.N; i++ {
		DYADKey("data/train/img_000042.png", DefaultKeyDepth, DefaultKeyBins)
	}
}
