package hfl

// DYAD's scalable hierarchical metadata key, reproduced bit for bit.
//
// What DYAD does (read from flux-framework/dyad at commit 1a99c31a, 2026-01;
// the padding, hashing and format have been unchanged since commit 8f49ec3,
// 2024-02-14, "redo the minimum hashable string length"; later commits only
// moved the function and its padding buffer and changed error returns):
//
//   - Key function: gen_path_key(str, path_key, len, depth, width) in
//     src/dyad/client/dyad_client.c. Producers call it from
//     publish_via_flux (dyad_commit) and consumers from dyad_fetch_metadata
//     (dyad_consume) and dyad_get_metadata, always with a PATH_MAX (4096)
//     byte output buffer, ctx->key_depth as depth and ctx->key_bins as
//     width. The resulting string is the Flux KVS key (in
//     ctx->kvs_namespace) whose value is the producer's broker rank.
//   - Input string: the path relative to the managed directory ("upath").
//     dyad_commit, dyad_consume and dyad_get_metadata compute it with
//     cmp_canonical_path_prefix -> extract_user_path (src/dyad/utils/utils.c):
//     the managed prefix (the configured path, else its realpath; a trailing
//     "/" on the prefix is disregarded) plus one "/" is cut from the front
//     of the file's path (as given, else its realpath), leaving e.g.
//     "a/b.txt" with no leading slash. The remainder is not cleaned any
//     further. With DYAD_PATH_RELATIVE set, a name not starting with
//     "/" is taken as the relative path verbatim. dyadfs passes the
//     CleanPath form, which is the same string for any already-clean path.
//   - Padding: if strlen(str) < 128, the bytes hashed are str followed by
//     '@' bytes up to exactly 128 bytes (a 256-byte stack buffer "buf";
//     memset with '@'). If strlen(str) >= 128 the string itself, all of it,
//     is hashed; nothing is truncated. (So "x" and "x@" hash identically,
//     and only the appended path tells their keys apart.)
//   - Seeds: seed starts at 57u; before level d it is increased by
//     seeds[d % 10] with seeds = {104677, 104681, 104683, 104693, 104701,
//     104707, 104711, 104717, 104723, 104729} (uint32 arithmetic), so the
//     levels use 104734, 209415, 314098, ...
//   - Hash: MurmurHash3_x64_128(str_long, str_len, seed, hash) from
//     src/dyad/utils/murmur3.c into uint32_t hash[4]; the level's bin is
//     (hash[0] ^ hash[1] ^ hash[2] ^ hash[3]) % width. DYAD's murmur3.c has
//     a non-falling-through tail switch (see murmur3.go); it only matters
//     for paths of 128 bytes or more whose length is not 16n or 16n+1.
//   - Format: each level is snprintf(path_key + cx, len - cx, "%x.", bin):
//     lower-case hex, no zero padding, followed by '.'. After the last level
//     the relative path itself is appended with "%s". Key =
//     "<bin0>.<bin1>.....<bin(depth-1)>.<relpath>", e.g. "7f.70.5d.a.txt"
//     for "a.txt" with depth 3 and 1024 bins. Because '.' is Flux KVS's
//     directory separator, the bins become nested KVS directories.
//   - Edge cases in DYAD: an empty string returns -1 (no key). depth 0
//     gives the bare path (DYAD's unit test tests/unit/dyad_core/
//     core_functions.cpp calls gen_path_key(..., 0, 0)). width 0 with
//     depth > 0 divides by zero. A key longer than PATH_MAX-1 = 4095 bytes
//     is silently truncated by snprintf and gen_path_key still returns 0
//     (the source carries "FIXME: cx + n >= len fails for str_len > 256").
//   - Defaults: src/dyad/core/dyad_ctx.c sets key_depth = 3 and
//     key_bins = 1024 (the static default context, and dyad_init_env when
//     DYAD_KEY_DEPTH / DYAD_KEY_BINS, named in include/dyad/common/
//     dyad_envs.h, are unset); docs/getting_started.rst and pydyad agree.
//     DYAD parses the variables with atoi into unsigned int and validates
//     nothing.
//   - History: DYAD v0.1.0/v0.1.1 hashed the unpadded path with a correct
//     MurmurHash3; keys from those releases differ from today's.
//
// dyadfs's code below is an independent implementation of that behaviour.

import (
	"fmt"
	"path"
	"strconv"
	"strings"
)

const (
	// DefaultKeyDepth and DefaultKeyBins are DYAD's source defaults
	// (src/dyad/core/dyad_ctx.c: key_depth 3, key_bins 1024). The dyadfs
	// seed design document says 2 and 256, but dyadfs follows DYAD's
	// source so that its keys match those of a DYAD deployment left at
	// its defaults.
	DefaultKeyDepth = 3
	DefaultKeyBins  = 1024

	// MaxKeyDepth is dyadfs's upper bound on the key depth. DYAD itself
	// has none; each level costs one hash of at least 128 bytes and adds
	// up to 9 bytes and one KVS directory level to the key, and DYAD's
	// seed table has 10 entries (deeper levels still get distinct,
	// accumulated seeds).
	MaxKeyDepth = 16

	// MaxKeyBins is the largest bin count: DYAD keeps it in a uint32_t.
	MaxKeyBins = 1<<32 - 1

	// dyadKeyPadLen is the length DYAD pads short paths to, with '@'.
	dyadKeyPadLen  = 128
	dyadKeyPadByte = '@'
	// dyadKeySeedBase is the seed before the first level's increment.
	dyadKeySeedBase uint32 = 57
)

// dyadKeyLevelSeeds are the per-level seed increments of gen_path_key.
var dyadKeyLevelSeeds = [10]uint32{104677, 104681, 104683, 104693, 104701, 104707, 104711, 104717, 104723, 104729}

// ValidateKeyShape reports whether depth and bins are a key shape dyadfs
// accepts: 1 <= depth <= MaxKeyDepth and 1 <= bins <= MaxKeyBins. DYAD
// would also run with depth 0 (the key is then the bare path, without any
// hashed levels), but that defeats the hierarchy and dyadfs refuses it;
// bins 0 would make DYAD divide by zero.
func ValidateKeyShape(depth, bins int) error {
	if depth < 1 || depth > MaxKeyDepth {
		return fmt.Errorf("key depth %d out of range [1, %d]", depth, MaxKeyDepth)
	}
	if bins < 1 || uint64(bins) > MaxKeyBins {
		return fmt.Errorf("key bins %d out of range [1, %d]", bins, uint64(MaxKeyBins))
	}
	return nil
}

// DYADKey returns the Flux KVS key DYAD's gen_path_key generates for relPath
// (the file's path relative to the managed directory, without a leading
// slash) with depth levels of bins bins each: depth lower-case hex bin
// numbers, each followed by '.', then relPath itself, e.g.
// DYADKey("a.txt", 3, 1024) == "7f.70.5d.a.txt". See the comment at the top
// of this file for the exact algorithm.
//
// Like DYAD, it treats relPath as a C string: anything from the first NUL
// byte on is ignored, and an empty path has no key (DYADKey returns "").
// depth 0 returns relPath unchanged, as DYAD does. DYADKey panics if depth
// is negative, or if depth > 0 and bins is outside [1, MaxKeyBins]; check
// configuration with ValidateKeyShape first.
//
// One deliberate difference: DYAD writes the key into a PATH_MAX buffer and
// silently truncates keys longer than 4095 bytes (only possible for relative
// paths within a few dozen bytes of PATH_MAX), which would make distinct
// paths share a key. DYADKey never truncates, so for those paths its key
// is DYAD's truncated key plus the rest of the path.
func DYADKey(relPath string, depth, bins int) string {
	if i := strings.IndexByte(relPath, 0); i >= 0 {
		relPath = relPath[:i]
	}
	if depth < 0 {
		panic(fmt.Sprintf("hfl.DYADKey: negative key depth %d", depth))
	}
	if depth > 0 && (bins < 1 || uint64(bins) > MaxKeyBins) {
		panic(fmt.Sprintf("hfl.DYADKey: key bins %d out of range [1, %d]", bins, uint64(MaxKeyBins)))
	}
	if relPath == "" {
		return ""
	}
	if depth == 0 {
		return relPath
	}

	var padded [dyadKeyPadLen]byte
	var in []byte
	if len(relPath) < dyadKeyPadLen {
		n := copy(padded[:], relPath)
		for i := n; i < dyadKeyPadLen; i++ {
			padded[i] = dyadKeyPadByte
		}
		in = padded[:]
	} else {
		in = []byte(relPath)
	}

	var b strings.Builder
	b.Grow(depth*9 + len(relPath))
	var hex [16]byte
	seed := dyadKeySeedBase
	for d := 0; d < depth; d++ {
		seed += dyadKeyLevelSeeds[d%len(dyadKeyLevelSeeds)]
		bin := Fold128To32(DYADMurmurHash3x64_128(in, seed)) % uint32(bins)
		b.Write(strconv.AppendUint(hex[:0], uint64(bin), 16))
		b.WriteByte('.')
	}
	b.WriteString(relPath)
	return b.String()
}

// Keyspace names where a job's records live in the store.
type Keyspace struct {
	// Namespace scopes every key, so that jobs sharing a store never see
	// each other's files.
	Namespace string
	// Depth and Bins shape the hashed hierarchical key (DYAD's
	// DYAD_KEY_DEPTH and DYAD_KEY_BINS).
	Depth, Bins int
}

// Key returns the store key of a clean relative path: the job namespace,
// then DYAD's hashed hierarchical key of the path.
func (k Keyspace) Key(path string) string {
	return k.Namespace + "/" + DYADKey(path, k.Depth, k.Bins)
}

// Slot returns where the record of a clean relative path lives.
func (k Keyspace) Slot(p string) Slot {
	dir, name := SplitPath(p)
	return Slot{Key: k.Key(p), Dir: k.DirIndex(dir), Name: name}
}

// DirIndex names the store's index of directory dir ("" for the top).
func (k Keyspace) DirIndex(dir string) string { return k.Namespace + "/" + dir }

// SplitPath splits a clean relative path into its directory ("" for the
// top) and its name.
func SplitPath(p string) (dir, name string) {
	dir, name = path.Split(p)
	if dir != "" {
		dir = dir[:len(dir)-1]
	}
	return dir, name
}
