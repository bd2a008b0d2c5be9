// Package digest computes the checksum a published file's record carries
// of its content, and checks a copy against it while the copy's bytes
// arrive.
//
// The checksum is XXH3 in two levels: the file is cut in blocks of
// BlockSize bytes (the last one shorter), each block is hashed with
// XXH3-64, and the checksum is the XXH3-128 of those block hashes (8 bytes
// each, little endian, in file order). Two levels, and not one XXH3 over
// the whole file, because the bytes of a transfer do not always arrive in
// order (UCX completes chunks as they come) and holes are never sent: a
// block is hashed as soon as its own bytes are in, in any order of blocks,
// and a block that is all hole costs nothing. The producer hashes blocks
// on several cores.
//
// XXH3 is not a cryptographic hash: it finds corruption (a flipped bit on
// a disk, in memory, on a wire), not an attacker, who would have to hold
// the job secret to take part at all.
package digest

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"sync"

	"github.com/zeebo/xxh3"
	"golang.org/x/sys/unix"
)

// BlockSize is the size of the blocks hashed on their own.
const BlockSize = 1 << 20

// Sum is a file's checksum. The zero Sum means none was computed.
type Sum [16]byte

// prefix names the algorithm in the text form, so that another one can
// follow.
const prefix = "xxh3:"

// IsZero reports whether s is no checksum.
func (s Sum) IsZero() bool { return s == Sum{} }

// String returns "xxh3:" and 32 hex digits, or "" for the zero Sum.
func (s Sum) String() string {
	if s.IsZero() {
		return ""
	}
	return prefix + hex.EncodeToString(s[:])
}

// MarshalText implements encoding.TextMarshaler.
func (s Sum) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler; "" is the zero Sum.
func (s *Sum) UnmarshalText(b []byte) error {
	p, err := Parse(string(b))
	if err != nil {
		return err
	}
	*s = p
	return nil
}

// Parse reads the text form of a Sum.
func Parse(t string) (Sum, error) {
	var s Sum
	if t == "" {
		return s, nil
	}
	h, ok := strings.CutPrefix(t, prefix)
	if !ok || hex.DecodedLen(len(h)) != len(s) {
		return s, fmt.Errorf("checksum %q: want %s and %d hex digits", t, prefix, 2*len(s))
	}
	if _, err := hex.Decode(s[:], []byte(h)); err != nil {
		return s, fmt.Errorf("checksum %q: %w", t, err)
	}
	return s, nil
}

// combine makes the checksum from the block hashes.
func combine(blocks []uint64) Sum {
	b := make([]byte, 8*len(blocks))
	for i, h := range blocks {
		binary.LittleEndian.PutUint64(b[8*i:], h)
	}
	return Sum(xxh3.Hash128(b).Bytes())
}

// numBlocks is how many blocks a file of size bytes has.
func numBlocks(size int64) int64 { return (size + BlockSize - 1) / BlockSize }

// blockLen is the length of block i of a file of size bytes.
func blockLen(i, size int64) int64 { return min(BlockSize, size-i*BlockSize) }

var (
	zeros        = make([]byte, BlockSize)
	zeroFullOnce sync.Once
	zeroFull     uint64
)

// zeroHash is the hash of a block of n zero bytes.
func zeroHash(n int64) uint64 {
	if n == BlockSize {
		zeroFullOnce.Do(func() { zeroFull = xxh3.Hash(zeros) })
		return zeroFull
	}
	return xxh3.Hash(zeros[:n])
}

// Bytes returns the checksum of content held in memory.
func Bytes(p []byte) Sum {
	size := int64(len(p))
	blocks := make([]uint64, numBlocks(size))
	for i := range blocks {
		off := int64(i) * BlockSize
		blocks[i] = xxh3.Hash(p[off : off+blockLen(int64(i), size)])
	}
	return combine(blocks)
}

// ErrShort means a file ended before the size it was hashed for.
var ErrShort = errors.New("file is shorter than its size")

// File returns the checksum of the first size bytes of f, read with
// pread, on up to GOMAXPROCS goroutines. Blocks that are all hole (lseek
// SEEK_DATA) are not read; f's offset moves.
func File(f *os.File, size int64) (Sum, error) {
	blocks, err := FileBlocks(f, size)
	if err != nil {
		return Sum{}, err
	}
	return combine(blocks), nil
}

// Combine returns the checksum of a file whose block hashes are blocks:
// what a consumer that reads a file in ranges checks the owner's list of
// block hashes against.
func Combine(blocks []uint64) Sum { return combine(blocks) }

// Block returns the hash of one block's bytes (BlockSize of them, or
// fewer for a file's last block).
func Block(p []byte) uint64 { return xxh3.Hash(p) }

// NumBlocks is how many blocks a file of size bytes has.
func NumBlocks(size int64) int64 { return numBlocks(size) }

// BlockLen is the length of block i of a file of size bytes.
func BlockLen(i, size int64) int64 { return blockLen(i, size) }

// FileBlocks returns the hashes of the blocks of f's first size bytes, as
// File reads them.
func FileBlocks(f *os.File, size int64) ([]uint64, error) {
	n := numBlocks(size)
	blocks := make([]uint64, n)
	workers := int64(min(runtime.GOMAXPROCS(0), 4))
	if n < 2*workers {
		workers = 1
	}
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			buf := make([]byte, BlockSize)
			for i := w; i < n; i += workers {
				h, err := hashBlock(f, i, size, buf)
				if err != nil {
					errs[w] = err
					return
				}
				blocks[i] = h
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return blocks, nil
}

// hashBlock hashes block i of a file of size bytes, read from f into buf.
func hashBlock(f *os.File, i, size int64, buf []byte) (uint64, error) {
	off, l := i*BlockSize, blockLen(i, size)
	data, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
	if errors.Is(err, unix.ENXIO) || (err == nil && data >= off+l) {
		return zeroHash(l), nil // all hole
	}
	if _, err := io.ReadFull(io.NewSectionReader(f, off, l), buf[:l]); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			err = ErrShort
		}
		return 0, fmt.Errorf("hash %s at %d: %w", f.Name(), off, err)
	}
	return xxh3.Hash(buf[:l]), nil
}
