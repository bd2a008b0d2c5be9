package hfl

import (
	"encoding/binary"
	"math/bits"
)

// This file implements MurmurHash3_x64_128 (Austin Appleby, public domain
// algorithm, as published with SMHasher) in pure Go, in two flavours:
//
//   - MurmurHash3x64_128 is the published algorithm.
//   - DYADMurmurHash3x64_128 is the variant that DYAD actually compiles and
//     uses for its metadata keys (src/dyad/utils/murmur3.c in
//     flux-framework/dyad). Since DYAD commit e43f65e ("changes to support
//     cpp-logger and dlio profiler", 2024-01-23) every case of the tail
//     switch in DYAD's MurmurHash3_x64_128 ends in `break` instead of
//     falling through to the next case. As a result only two tail shapes
//     reach the hash state: a 1-byte tail (byte 0 mixed into h1, exactly as
//     published) and a 9-byte tail (only byte 8 mixed into h2; bytes 0..7
//     are dropped). Tails of 2..8 and 10..15 bytes are ignored entirely
//     (their length still enters through the final `h ^= len`). For inputs
//     whose length is a multiple of 16, or 16n+1, both flavours agree.
//
// Both flavours read the 16-byte blocks as little-endian 64-bit words, which
// is what DYAD's native `(const uint64_t *)` reads give on every little-endian
// machine DYAD is deployed on (x86-64, aarch64, ppc64le). h1 and h2 are the
// two 64-bit words DYAD stores into its output buffer, in that order.

const (
	murmurC1 = 0x87c37b91114253d5
	murmurC2 = 0x4cf5ad432745937f
)

// MurmurHash3x64_128 returns the two 64-bit halves (h1, h2) of Austin
// Appleby's MurmurHash3_x64_128 of data with the given seed. Serialised as
// the reference implementation writes it on a little-endian machine, the
// 16-byte digest is h1 little-endian followed by h2 little-endian.
func MurmurHash3x64_128(data []byte, seed uint32) (h1, h2 uint64) {
	return murmur3x64_128(data, seed, false)
}

// DYADMurmurHash3x64_128 returns (h1, h2) of MurmurHash3_x64_128 exactly as
// DYAD's own murmur3.c computes it, including its non-falling-through tail
// switch (see the comment at the top of this file). This is the hash that
// DYAD's gen_path_key uses, so it is the one DYADKey must use to reproduce
// DYAD's keys bit for bit. It differs from MurmurHash3x64_128 only when
// len(data)%16 is neither 0 nor 1.
func DYADMurmurHash3x64_128(data []byte, seed uint32) (h1, h2 uint64) {
	return murmur3x64_128(data, seed, true)
}

// Fold128To32 is the 32-bit view DYAD takes of a 128-bit MurmurHash3
// result: DYAD passes a `uint32_t hash[4]` as the output buffer and XORs the
// four words, hash[0]^hash[1]^hash[2]^hash[3]. On a little-endian machine
// those words are the low and high halves of h1 and of h2; XOR does not
// depend on their order, so the fold is the XOR of the four 32-bit halves.
func Fold128To32(h1, h2 uint64) uint32 {
	x := h1 ^ h2
	return uint32(x) ^ uint32(x>>32)
}

func fmix64(k uint64) uint64 {
	k ^= k >> 33
	k *= 0xff51afd7ed558ccd
	k ^= k >> 33
	k *= 0xc4ceb9fe1a85ec53
	k ^= k >> 33
	return k
}

func mixK1(k1 uint64) uint64 {
	k1 *= murmurC1
	k1 = bits.RotateLeft64(k1, 31)
	k1 *= murmurC2
	return k1
}

func mixK2(k2 uint64) uint64 {
	k2 *= murmurC2
	k2 = bits.RotateLeft64(k2, 33)
	k2 *= murmurC1
	return k2
}

// murmur3x64_128 is the shared body; dyadTail selects DYAD's tail handling.
func murmur3x64_128(data []byte, seed uint32, dyadTail bool) (h1, h2 uint64) {
	n := len(data)
	h1, h2 = uint64(seed), uint64(seed)

	// Body: 16-byte blocks.
	nblocks := n / 16
	for i := 0; i < nblocks; i++ {
		b := data[i*16 : i*16+16]
		k1 := binary.LittleEndian.Uint64(b[0:8])
		k2 := binary.LittleEndian.Uint64(b[8:16])

		h1 ^= mixK1(k1)
		h1 = bits.RotateLeft64(h1, 27)
		h1 += h2
		h1 = h1*5 + 0x52dce729

		h2 ^= mixK2(k2)
		h2 = bits.RotateLeft64(h2, 31)
		h2 += h1
		h2 = h2*5 + 0x38495ab5
	}

	// Tail: the last len%16 bytes.
	tail := data[nblocks*16:]
	if dyadTail {
		switch len(tail) {
		case 1:
			h1 ^= mixK1(uint64(tail[0]))
		case 9:
			h2 ^= mixK2(uint64(tail[8]))
		}
	} else {
		var k1, k2 uint64
		if len(tail) > 8 {
			for i := len(tail) - 1; i >= 8; i-- {
				k2 ^= uint64(tail[i]) << (8 * uint(i-8))
			}
			h2 ^= mixK2(k2)
		}
		if len(tail) > 0 {
			m := min(len(tail), 8)
			for i := m - 1; i >= 0; i-- {
				k1 ^= uint64(tail[i]) << (8 * uint(i))
			}
			h1 ^= mixK1(k1)
		}
	}

	// Finalization.
	h1 ^= uint64(n)
	h2 ^= uint64(n)
	h1 += h2
	h2 += h1
	h1 = fmix64(h1)
	h2 = fmix64(h2)
	h1 += h2
	h2 += h1
	return h1, h2
}
