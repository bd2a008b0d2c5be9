package store

import (
	"errors"
	"hash/fnv"
	"path"

	"github.com/dyadfs/dyadfs/internal/digest"
)

// Record is what a producer publishes about a complete file.
type Record struct {
	// Path is the file's path relative to the managed directory,
	// slash-separated and clean (see CleanPath).
	Path string `json:"path"`
	// Owner is the node id of the daemon whose backing store holds the file.
	Owner string `json:"owner"`
	// Size, Mode (with the type bits: a regular file, a directory or a
	// symbolic link), Uid, Gid and MtimeNs are its attributes at publish
	// time.
	Size    int64  `json:"size"`
	Mode    uint32 `json:"mode"`
	Uid     uint32 `json:"uid"`
	Gid     uint32 `json:"gid"`
	MtimeNs int64  `json:"mtime_ns"`
	// Target is a symbolic link's target.
	Target string `json:"target,omitempty"`
	// Alloc is, for a sparse file (one whose data takes less space than
	// its size), the bytes its data takes, at least 1; 0 otherwise. A
	// consumer checks that much free space before fetching it.
	Alloc int64 `json:"alloc,omitempty"`
	// Sum is a regular file's checksum (see internal/digest), computed by
	// Owner when it published: a consumer checks its copy against it.
	// Zero when none was computed.
	Sum digest.Sum `json:"sum,omitzero"`
	// Ino is the file's inode number on every node: given when the file
	// was born (a new name created on a node, see FileIno) and kept by
	// every version written in place, wherever written, as a local
	// filesystem keeps a file's inode; a rename takes it along. 0 in
	// records of earlier releases (see InodeNumber).
	Ino uint64 `json:"ino,omitempty"`
	// Writing says that Owner is changing a file that was published
	// before: its attributes are those of the last complete version, and
	// readers wait for the next publish.
	Writing bool `json:"writing,omitempty"`
	// Generation is assigned by the store on publish; it grows with every
	// publish of the same key and is never reused.
	Generation uint64 `json:"gen"`
	// Provisional marks a record an owner sends ahead of its publish, while
	// the store is still committing it: it has no generation yet, the
	// owner serves the file it describes, and no store or cache keeps it.
	Provisional bool `json:"prov,omitempty"`
	// Inline is a small file's content, sent with the notices of its
	// publish so that a consumer needs no transfer. No store or cache
	// keeps it.
	Inline *Inline `json:"-"`
}

// ErrNotFound means the store holds no record under the key.
var ErrNotFound = errors.New("no such record")

// ErrClosed means the store was closed while the call was in progress.
var ErrClosed = errors.New("metadata store closed")

// ErrConflict means a record is there that a conditional removal may not
// delete: it was published again, or by another owner.
var ErrConflict = errors.New("record changed since it was seen")

// Type bits of Record.Mode.
const (
	modeType    = 0o170000
	modeDir     = 0o040000
	modeRegular = 0o100000
	modeSymlink = 0o120000
)

// IsDir reports whether the record describes a directory.
func (r Record) IsDir() bool { return r.Mode&modeType == modeDir }

// IsRegular reports whether the record describes a regular file.
func (r Record) IsRegular() bool { return r.Mode&modeType == modeRegular }

// IsSymlink reports whether the record describes a symbolic link.
func (r Record) IsSymlink() bool { return r.Mode&modeType == modeSymlink }

// InodeNumber is the inode number every node shows for the file: Ino, or
// for a record without one, a number derived from its owner and path.
func (r Record) InodeNumber() uint64 {
	if r.Ino != 0 {
		return r.Ino
	}
	h := fnv.New64a()
	h.Write([]byte(r.Path))
	return FileIno(r.Owner, h.Sum64(), 0)
}

// FileIno is the inode number of a file born on node as its local inode
// ino, at time birth (ns; 0 if unknown): a hash of the three, so that
// files born on different nodes, or in one inode a filesystem reused, do
// not share numbers, with the top bit clear (go-fuse numbers the inodes
// it makes up from 2^63) and never one of the numbers FUSE reserves (0,
// 1).
func FileIno(node string, ino, birth uint64) uint64 {
	const offset, prime = 14695981039346656037, 1099511628211
	h := uint64(offset)
	for i := 0; i < len(node); i++ {
		h = (h ^ uint64(node[i])) * prime
	}
	h *= prime // a NUL byte between the node and the numbers
	for _, x := range [2]uint64{ino, birth} {
		for i := 0; i < 8; i++ {
			h = (h ^ (x >> (8 * i) & 0xff)) * prime
		}
	}
	h &^= 1 << 63
	if h < 2 {
		h += 2
	}
	return h
}

// Name returns the last element of the record's path.
func (r Record) Name() string { return path.Base(r.Path) }

// Inline is a small file's content at publish time. In a notice the bytes
// follow the JSON header; the JSON only says they are there.
type Inline struct {
	Data []byte `json:"-"`
}
