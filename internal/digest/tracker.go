package digest

import (
	"fmt"
	"os"
	"sync"

	"github.com/zeebo/xxh3"
)

// Tracker hashes a file's bytes as they are written into it, so that the
// checksum of a received copy is known when its last byte is in, without
// reading the file again. Writes may come in any order of blocks; within
// a block, bytes hashed as they come must come in order. A block whose
// bytes come otherwise (a chunk that overtook the one before it inside
// the block, an overwrite) is read back from the file once, at Sum. Bytes
// never written are holes, zeros.
//
// A Tracker is used by one goroutine at a time.
type Tracker struct {
	// InOrder says the writes come in increasing order of offset, a gap
	// between two being a hole: the gap is hashed as zeros and nothing
	// is read back (TCP, Flux). Without it a gap inside a block makes
	// the block read back at Sum.
	InOrder bool

	blocks map[int64]*block
	// Reread counts the bytes Sum read back.
	Reread int64
}

type block struct {
	h         *xxh3.Hasher
	next      int64 // bytes of the block hashed, from its start
	sum       uint64
	done      bool // sum is the hash of a whole block
	irregular bool // read back at Sum
}

var hashers = sync.Pool{New: func() any { return xxh3.New() }}

func (b *block) drop() {
	if b.h != nil {
		hashers.Put(b.h)
		b.h = nil
	}
}

// Wrote records that p was written at off.
func (t *Tracker) Wrote(p []byte, off int64) {
	if t.blocks == nil {
		t.blocks = make(map[int64]*block)
	}
	for len(p) > 0 {
		i, o := off/BlockSize, off%BlockSize
		n := min(int64(len(p)), BlockSize-o)
		t.piece(i, o, p[:n])
		p, off = p[n:], off+n
	}
}

// piece hashes p, at offset o of block i.
func (t *Tracker) piece(i, o int64, p []byte) {
	b := t.blocks[i]
	if b == nil {
		b = &block{}
		t.blocks[i] = b
	}
	if b.irregular {
		return
	}
	if b.done || o < b.next || (o > b.next && !t.InOrder) {
		b.irregular = true
		b.drop()
		return
	}
	if b.h == nil {
		b.h = hashers.Get().(*xxh3.Hasher)
		b.h.Reset()
	}
	if o > b.next {
		b.h.Write(zeros[:o-b.next])
	}
	b.h.Write(p)
	b.next = o + int64(len(p))
	if b.next == BlockSize {
		b.sum, b.done = b.h.Sum64(), true
		b.drop()
	}
}

// Sum returns the checksum of f, size bytes long, into which every write
// was recorded. It reads back only the blocks written out of order.
func (t *Tracker) Sum(f *os.File, size int64) (Sum, error) {
	n := numBlocks(size)
	hashes := make([]uint64, n)
	var buf []byte
	for i := range n {
		l := blockLen(i, size)
		b := t.blocks[i]
		switch {
		case b == nil:
			hashes[i] = zeroHash(l)
		case !b.irregular && b.done && l == BlockSize:
			hashes[i] = b.sum
		case !b.irregular && !b.done && b.next <= l:
			// The rest of the block was never written: a hole.
			h := b.h
			if h == nil {
				h = hashers.Get().(*xxh3.Hasher)
				h.Reset()
			}
			h.Write(zeros[:l-b.next])
			hashes[i] = h.Sum64()
			hashers.Put(h)
			b.h = nil
		default:
			if buf == nil {
				buf = make([]byte, BlockSize)
			}
			h, err := hashBlock(f, i, size, buf)
			if err != nil {
				return Sum{}, fmt.Errorf("checksum of the copy: %w", err)
			}
			hashes[i] = h
			t.Reread += l
		}
	}
	for i, b := range t.blocks {
		b.drop()
		delete(t.blocks, i)
	}
	return combine(hashes), nil
}
