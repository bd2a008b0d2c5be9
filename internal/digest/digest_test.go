package digest

import (
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
)

var sizes = []int64{0, 1, 4096, BlockSize - 1, BlockSize, BlockSize + 1, 3*BlockSize + BlockSize/2}

func content(size int64, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, uint64(size)))
	p := make([]byte, size)
	for i := range p {
		p[i] = byte(r.Uint32())
	}
	return p
}

// writeFile writes p to a new file, leaving the zero runs in holes as a
// sparse file has them.
func writeFile(t testing.TB, p []byte, holes [][2]int64) *os.File {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "f"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	var off int64
	for _, h := range append(holes, [2]int64{int64(len(p)), int64(len(p))}) {
		if h[0] > off {
			if _, err := f.WriteAt(p[off:h[0]], off); err != nil {
				t.Fatal(err)
			}
		}
		off = h[1]
	}
	if err := f.Truncate(int64(len(p))); err != nil {
		t.Fatal(err)
	}
	return f
}

func TestFileMatchesBytes(t *testing.T) {
	for _, size := range sizes {
		p := content(size, 1)
		f := writeFile(t, p, nil)
		got, err := File(f, size)
		if err != nil {
			t.Fatal(err)
		}
		if want := Bytes(p); got != want || got.IsZero() {
			t.Errorf("size %d: File %v, Bytes %v", size, got, want)
		}
	}
}

func TestSparseFile(t *testing.T) {
	size := int64(5*BlockSize + 100)
	p := content(size, 2)
	holes := [][2]int64{{100, 2*BlockSize + 300}, {4 * BlockSize, 5 * BlockSize}}
	for _, h := range holes {
		clear(p[h[0]:h[1]])
	}
	f := writeFile(t, p, holes)
	got, err := File(f, size)
	if err != nil {
		t.Fatal(err)
	}
	if want := Bytes(p); got != want {
		t.Errorf("sparse file: %v, its bytes %v", got, want)
	}
}

func TestShortFile(t *testing.T) {
	f := writeFile(t, content(100, 3), nil)
	if _, err := File(f, 200); err == nil {
		t.Error("a file shorter than the size hashed without error")
	}
}

func TestFlippedByteDiffers(t *testing.T) {
	p := content(2*BlockSize, 4)
	want := Bytes(p)
	for _, at := range []int{0, BlockSize - 1, BlockSize, len(p) - 1} {
		q := append([]byte(nil), p...)
		q[at] ^= 1
		if Bytes(q) == want {
			t.Errorf("byte %d flipped: same checksum", at)
		}
	}
	if Bytes(p[:len(p)-1]) == want || Bytes(append(p, 0)) == want {
		t.Error("a shorter or longer content has the same checksum")
	}
}

// receive writes p into a new file in the given pieces, through a Tracker,
// and returns its sum and the bytes read back.
func receive(t *testing.T, p []byte, pieces [][2]int64, inOrder bool) (Sum, int64) {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "copy"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := Tracker{InOrder: inOrder}
	for _, pc := range pieces {
		if _, err := f.WriteAt(p[pc[0]:pc[1]], pc[0]); err != nil {
			t.Fatal(err)
		}
		tr.Wrote(p[pc[0]:pc[1]], pc[0])
	}
	if err := f.Truncate(int64(len(p))); err != nil {
		t.Fatal(err)
	}
	s, err := tr.Sum(f, int64(len(p)))
	if err != nil {
		t.Fatal(err)
	}
	return s, tr.Reread
}

func chunks(size, chunk int64) [][2]int64 {
	var out [][2]int64
	for off := int64(0); off < size; off += chunk {
		out = append(out, [2]int64{off, min(off+chunk, size)})
	}
	return out
}

func TestTracker(t *testing.T) {
	size := int64(4*BlockSize + 12345)
	p := content(size, 5)
	want := Bytes(p)
	shuffled := chunks(size, BlockSize)
	rand.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
	small := chunks(size, 256<<10)
	small[1], small[2] = small[2], small[1] // overtakes inside block 0
	for _, tc := range []struct {
		name       string
		pieces     [][2]int64
		inOrder    bool
		maxReread  int64
		minReread  int64
		flipAt     int64
		wantDiffer bool
	}{
		{name: "in order, odd pieces", pieces: chunks(size, 65537), maxReread: 0},
		{name: "whole blocks in any order", pieces: shuffled, maxReread: 0},
		{name: "a piece overtakes inside a block", pieces: small, minReread: BlockSize, maxReread: BlockSize},
		{name: "overwrite", pieces: append(chunks(size, BlockSize), [2]int64{10, 20}), minReread: BlockSize, maxReread: BlockSize},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, reread := receive(t, p, tc.pieces, tc.inOrder)
			if got != want {
				t.Errorf("sum %v, want %v", got, want)
			}
			if reread < tc.minReread || reread > tc.maxReread {
				t.Errorf("read back %d bytes, want %d to %d", reread, tc.minReread, tc.maxReread)
			}
		})
	}
}

func TestTrackerHoles(t *testing.T) {
	size := int64(6*BlockSize + 7)
	p := content(size, 6)
	holes := [][2]int64{{5000, BlockSize + 4096}, {3 * BlockSize, 5*BlockSize + 8192}}
	for _, h := range holes {
		clear(p[h[0]:h[1]])
	}
	want := Bytes(p)
	// Data extents only, in order, as TCP and Flux send them.
	data := [][2]int64{{0, 5000}, {BlockSize + 4096, 2 * BlockSize}, {2 * BlockSize, 3 * BlockSize}, {5*BlockSize + 8192, size}}
	got, reread := receive(t, p, data, true)
	if got != want || reread != 0 {
		t.Errorf("in order with holes: sum %v (want %v), read back %d bytes (want 0)", got, want, reread)
	}
	// The same extents in another order: the blocks with a hole at their
	// start are read back, and the sum is right.
	rev := [][2]int64{data[3], data[1], data[2], data[0]}
	got, reread = receive(t, p, rev, false)
	if got != want || reread == 0 || reread > 3*BlockSize {
		t.Errorf("out of order with holes: sum %v (want %v), read back %d bytes", got, want, reread)
	}
}

func TestTrackerSeesCorruption(t *testing.T) {
	p := content(3*BlockSize, 7)
	want := Bytes(p)
	q := append([]byte(nil), p...)
	q[BlockSize+17] ^= 0x40
	got, _ := receive(t, q, chunks(int64(len(q)), BlockSize), false)
	if got == want {
		t.Error("a copy with a flipped byte has the original's checksum")
	}
}

func TestText(t *testing.T) {
	s := Bytes([]byte("hello"))
	b, err := json.Marshal(struct {
		S Sum `json:"sum,omitzero"`
		Z Sum `json:"z,omitzero"`
	}{S: s})
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"sum":"` + s.String() + `"}`; string(b) != want {
		t.Errorf("json %s, want %s", b, want)
	}
	var back struct {
		S Sum `json:"sum"`
	}
	if err := json.Unmarshal(b, &back); err != nil || back.S != s {
		t.Errorf("round trip: %v %v", back.S, err)
	}
	for _, bad := range []string{"md5:00", "xxh3:zz", "xxh3:00"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) succeeded", bad)
		}
	}
}

func BenchmarkBytes4K(b *testing.B) {
	p := content(4096, 8)
	b.SetBytes(int64(len(p)))
	for b.Loop() {
		Bytes(p)
	}
}

func BenchmarkFile64M(b *testing.B) {
	p := content(64<<20, 9)
	f := writeFile(b, p, nil)
	b.SetBytes(int64(len(p)))
	for b.Loop() {
		if _, err := File(f, int64(len(p))); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkTracker64M(b *testing.B) {
	p := content(64<<20, 10)
	b.SetBytes(int64(len(p)))
	for b.Loop() {
		var tr Tracker
		for off := 0; off < len(p); off += 256 << 10 {
			tr.Wrote(p[off:off+256<<10], int64(off))
		}
		if _, err := tr.Sum(nil, int64(len(p))); err != nil {
			b.Fatal(err)
		}
	}
}
