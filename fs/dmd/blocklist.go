package dmd

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/dyadfs/dyadfs/dtl"
	"github.com/dyadfs/dyadfs/internal/digest"
)

// A node that reads a large file in ranges checks each block it receives
// against the block's hash (see internal/digest): the owner sends the list
// of block hashes in messages, and the reader checks the list against the
// checksum the record carries before it trusts any of it.

// blockListMsg is the first byte of a request for block hashes: notices
// start with their codec's version (1), so the two never meet.
const blockListMsg = 0xB1

// blockListLater, as a reply's Total, says the owner is computing the
// list (the file is large and its list was not kept): ask again shortly.
const blockListLater = ^uint32(0)

// blockListsInline is the largest file whose list an owner computes while
// the request waits; a larger one's is computed aside.
const blockListsInline = 256 << 20

// blockListMax is how many hashes one reply carries (a reply is at most
// dtl.MaxMessage bytes).
const blockListMax = 7000

// blockListsMin is the smallest file whose block hashes the owner keeps
// when it publishes it: smaller files are not read in ranges.
const blockListsMin = 8 << 20

// blockListsBytes bounds the memory the kept lists take.
const blockListsBytes = 32 << 20

// blockLists keeps the block hashes of large files computed to publish
// them, by the checksum they make, so that a reader's request for them
// does not read the file again. (The stamp of the file would not do: the
// publish itself changes its ctime, marking it.)
type blockLists struct {
	mu    sync.Mutex
	m     map[digest.Sum][]uint64
	bytes int
	// computing holds the checksums whose lists are being computed
	// aside; failed, those whose files no longer make them.
	computing map[digest.Sum]bool
	failed    map[digest.Sum]error
}

// begin reports whether the caller is to compute sum's list (nobody is),
// or the error a computation met.
func (b *blockLists) begin(sum digest.Sum) (bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.failed[sum]; err != nil {
		delete(b.failed, sum) // the next request tries again
		return false, err
	}
	if b.computing[sum] {
		return false, nil
	}
	if b.computing == nil {
		b.computing = make(map[digest.Sum]bool)
	}
	b.computing[sum] = true
	return true, nil
}

// end ends the computation of sum's list.
func (b *blockLists) end(sum digest.Sum, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.computing, sum)
	if err != nil {
		if b.failed == nil || len(b.failed) > 64 {
			b.failed = make(map[digest.Sum]error)
		}
		b.failed[sum] = err
	}
}

func (b *blockLists) get(sum digest.Sum) ([]uint64, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	blocks, ok := b.m[sum]
	return blocks, ok
}

func (b *blockLists) put(blocks []uint64) {
	sum := digest.Combine(blocks)
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.m[sum]; ok {
		return
	}
	if b.m == nil || b.bytes+8*len(blocks) > blockListsBytes {
		b.m, b.bytes = make(map[digest.Sum][]uint64), 0
	}
	b.m[sum] = blocks
	b.bytes += 8 * len(blocks)
}

// blockListReq asks for the hashes of blocks [First, First+blockListMax)
// of version Gen of Path.
type blockListReq struct {
	Gen   uint64
	First uint32
	Path  string
}

func encodeBlockListReq(r blockListReq) []byte {
	b := []byte{blockListMsg}
	b = binary.BigEndian.AppendUint64(b, r.Gen)
	b = binary.BigEndian.AppendUint32(b, r.First)
	return append(b, r.Path...)
}

func decodeBlockListReq(b []byte) (blockListReq, error) {
	if len(b) < 14 || b[0] != blockListMsg {
		return blockListReq{}, fmt.Errorf("%w: short block list request", dtl.ErrProtocol)
	}
	return blockListReq{Gen: binary.BigEndian.Uint64(b[1:]), First: binary.BigEndian.Uint32(b[9:]), Path: string(b[13:])}, nil
}

// blockListReply: the version's generation and size, how many blocks the
// file has, and the hashes from the first asked for.
type blockListReply struct {
	Gen    uint64
	Size   int64
	Total  uint32
	First  uint32
	Hashes []uint64
}

func encodeBlockListReply(r blockListReply) []byte {
	b := make([]byte, 0, 24+8*len(r.Hashes))
	b = binary.BigEndian.AppendUint64(b, r.Gen)
	b = binary.BigEndian.AppendUint64(b, uint64(r.Size))
	b = binary.BigEndian.AppendUint32(b, r.Total)
	b = binary.BigEndian.AppendUint32(b, r.First)
	for _, h := range r.Hashes {
		b = binary.BigEndian.AppendUint64(b, h)
	}
	return b
}

func decodeBlockListReply(b []byte) (blockListReply, error) {
	if len(b) < 24 || (len(b)-24)%8 != 0 {
		return blockListReply{}, fmt.Errorf("%w: block list reply of %d bytes", dtl.ErrProtocol, len(b))
	}
	r := blockListReply{Gen: binary.BigEndian.Uint64(b), Size: int64(binary.BigEndian.Uint64(b[8:])),
		Total: binary.BigEndian.Uint32(b[16:]), First: binary.BigEndian.Uint32(b[20:])}
	for p := b[24:]; len(p) > 0; p = p[8:] {
		r.Hashes = append(r.Hashes, binary.BigEndian.Uint64(p))
	}
	return r, nil
}

// answerBlockList answers a reader's request for block hashes of a file
// this node published: the version asked for exactly (a reader in ranges
// cannot mix two), with a checksum, and hashes that make it.
func (d *DMD) answerBlockList(ctx context.Context, msg []byte) ([]byte, error) {
	req, err := decodeBlockListReq(msg)
	if err != nil {
		return nil, err
	}
	if req.Gen == 0 {
		return nil, fmt.Errorf("%s: %w: no generation asked for", req.Path, dtl.ErrProtocol)
	}
	f, info, err := d.OpenPublished(ctx, dtl.Request{Path: req.Path, Generation: req.Gen})
	if err != nil {
		return nil, err
	}
	keep := false
	defer func() {
		if !keep {
			f.Close()
		}
	}()
	if info.Generation != req.Gen {
		return nil, fmt.Errorf("%s: generation %d asked for, %d published: %w", req.Path, req.Gen, info.Generation, dtl.ErrNotPublished)
	}
	if info.Checksum.IsZero() {
		return nil, fmt.Errorf("%s was published without a checksum: %w", req.Path, dtl.ErrUnreadable)
	}
	blocks, ok := d.blockLists.get(info.Checksum)
	if !ok && info.Size > blockListsInline {
		// Computed aside, for every reader that asks meanwhile: the
		// request must not wait as long as reading the file takes.
		start, err := d.blockLists.begin(info.Checksum)
		if err != nil {
			return nil, err
		}
		if start {
			keep = true
			go func() {
				_, err := d.blocksOf(f, info)
				f.Close()
				d.blockLists.end(info.Checksum, err)
			}()
		}
		return encodeBlockListReply(blockListReply{Gen: info.Generation, Size: info.Size, Total: blockListLater}), nil
	}
	if !ok {
		if blocks, err = d.blocksOf(f, info); err != nil {
			return nil, err
		}
	}
	total := uint32(len(blocks))
	if req.First > total {
		return nil, fmt.Errorf("%w: block %d of a %d-block file", dtl.ErrProtocol, req.First, total)
	}
	end := min(total, req.First+blockListMax)
	return encodeBlockListReply(blockListReply{Gen: info.Generation, Size: info.Size, Total: total, First: req.First, Hashes: blocks[req.First:end]}), nil
}

// blocksOf returns the block hashes of f, the published file info
// describes: kept from its publish (the hashes of what was published: a
// block whose bytes changed on the disk since fails its reader's check),
// or computed again and checked against its checksum (a file whose bytes
// changed since is unreadable).
func (d *DMD) blocksOf(f *os.File, info dtl.FileInfo) ([]uint64, error) {
	if blocks, ok := d.blockLists.get(info.Checksum); ok {
		return blocks, nil
	}
	blocks, err := digest.FileBlocks(f, info.Size)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", dtl.ErrUnreadable, err)
	}
	if digest.Combine(blocks) != info.Checksum {
		return nil, fmt.Errorf("%s does not match its published checksum: %w", f.Name(), dtl.ErrUnreadable)
	}
	d.blockLists.put(blocks)
	return blocks, nil
}

// fetchBlockList asks v's owner for the hashes of all its blocks and
// checks them against v's checksum.
func (d *DMD) fetchBlockList(ctx context.Context, v dtl.Version) ([]uint64, error) {
	n := digest.NumBlocks(v.Info.Size)
	blocks := make([]uint64, 0, n)
	for int64(len(blocks)) < n || n == 0 {
		msg := encodeBlockListReq(blockListReq{Gen: v.Info.Generation, First: uint32(len(blocks)), Path: v.Path})
		b, err := d.fetcher.Message(ctx, v.Owner, msg)
		if err != nil {
			return nil, fmt.Errorf("block hashes of %s from %s: %w", v.Path, v.Owner, err)
		}
		r, err := decodeBlockListReply(b)
		if err != nil {
			return nil, err
		}
		if r.Total == blockListLater {
			t := time.NewTimer(100 * time.Millisecond)
			select {
			case <-t.C:
				continue
			case <-ctx.Done():
				t.Stop()
				return nil, ctx.Err()
			}
		}
		if r.Gen != v.Info.Generation || r.Size != v.Info.Size || int64(r.Total) != n || int(r.First) != len(blocks) || len(r.Hashes) == 0 && n > 0 {
			return nil, fmt.Errorf("block hashes of %s from %s: generation %d, %d bytes, %d blocks from %d; asked for generation %d, %d bytes: %w",
				v.Path, v.Owner, r.Gen, r.Size, r.Total, r.First, v.Info.Generation, v.Info.Size, dtl.ErrStale)
		}
		blocks = append(blocks, r.Hashes...)
		if n == 0 {
			break
		}
	}
	if int64(len(blocks)) != n || digest.Combine(blocks) != v.Info.Checksum {
		return nil, fmt.Errorf("block hashes of %s from %s: %w", v.Path, v.Owner, dtl.ErrCorrupt)
	}
	return blocks, nil
}

// errNoRanges: a file that is not read in ranges after all.
var errNoRanges = errors.New("not read in ranges")
