package pagecache

import (
	"bytes"
	"errors"
	"testing"
)

// recorder keeps what it is asked to write, and where.
type recorder struct {
	data   []byte
	writes [][2]int64 // offset, length
	failAt int        // the write number that fails (0: none)
}

func (r *recorder) WriteAt(p []byte, off int64) (int, error) {
	r.writes = append(r.writes, [2]int64{off, int64(len(p))})
	if len(r.writes) == r.failAt {
		return len(p) / 2, errors.New("disk full")
	}
	if need := int(off) + len(p); need > len(r.data) {
		r.data = append(r.data, make([]byte, need-len(r.data))...)
	}
	copy(r.data[off:], p)
	return len(p), nil
}

func TestWriteAtPieces(t *testing.T) {
	p := make([]byte, 3*Piece+100)
	for i := range p {
		p[i] = byte(i * 7)
	}
	for _, off := range []int64{0, 1, Piece - 1, Piece, 5*Piece + 12345} {
		var r recorder
		n, err := WriteAt(&r, p, off)
		if n != len(p) || err != nil {
			t.Fatalf("at %d: wrote %d, %v", off, n, err)
		}
		if !bytes.Equal(r.data[off:], p) {
			t.Fatalf("at %d: the bytes differ", off)
		}
		for i, w := range r.writes {
			if w[1] > Piece || (i < len(r.writes)-1 && (w[0]+w[1])%Piece != 0) {
				t.Fatalf("at %d: write %d of %d bytes at %d", off, i, w[1], w[0])
			}
		}
	}
}

func TestWriteAtStopsAtAnError(t *testing.T) {
	r := recorder{failAt: 2}
	n, err := WriteAt(&r, make([]byte, 3*Piece), 0)
	if err == nil || n != Piece+Piece/2 || len(r.writes) != 2 {
		t.Fatalf("wrote %d in %d writes, %v; want %d in 2 and the error", n, len(r.writes), err, Piece+Piece/2)
	}
}

func TestWriteAtEmpty(t *testing.T) {
	var r recorder
	if n, err := WriteAt(&r, nil, 7); n != 0 || err != nil || len(r.writes) != 0 {
		t.Fatalf("wrote %d in %d writes, %v", n, len(r.writes), err)
	}
}
