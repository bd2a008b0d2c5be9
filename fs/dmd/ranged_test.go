package dmd

import (
	"bytes"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"

	"github.com/dyadfs/dyadfs/dtl"
	"github.com/dyadfs/dyadfs/hfl"
	"github.com/dyadfs/dyadfs/internal/digest"
)

// rangedMetaOf describes content as version 7 of rel, owned by n2.
func rangedMetaOf(rel string, content []byte) rangedMeta {
	n := digest.NumBlocks(int64(len(content)))
	blocks := make([]uint64, n)
	for i := range n {
		l := digest.BlockLen(i, int64(len(content)))
		blocks[i] = digest.Block(content[i*digest.BlockSize : i*digest.BlockSize+l])
	}
	return rangedMeta{Path: rel, Owner: "n2", Gen: 7, Size: int64(len(content)), Mode: syscall.S_IFREG | 0o644,
		Uid: uint32(os.Getuid()), Gid: uint32(os.Getgid()), Sum: digest.Combine(blocks), Ino: 1234, Blocks: blocks}
}

// TestRangedFilesOfOneVersionApart: two files of one version read in
// ranges (one dropped while still open, and the next) have files of
// their own: removing the first's leaves the second's.
func TestRangedFilesOfOneVersionApart(t *testing.T) {
	fx := newFixture(t, nil)
	meta := rangedMetaOf("a/big", bytes.Repeat([]byte{1}, 3<<20))
	f1, err := fx.d.createRanged(meta)
	if err != nil {
		t.Fatal(err)
	}
	f2, err := fx.d.createRanged(meta)
	if err != nil {
		t.Fatal(err)
	}
	f1.drop()
	base := filepath.Join(fx.d.rangedDir(), f2.key)
	for _, ext := range []string{"", ".map", ".json"} {
		if _, err := os.Stat(base + ext); err != nil {
			t.Errorf("the second file's %q went with the first: %v", ext, err)
		}
	}
}

// TestRangedRecheckLosesABlockOnce: two readers that check the same block
// after a restart, and find its bytes lost, count it lost once.
func TestRangedRecheckLosesABlockOnce(t *testing.T) {
	fx := newFixture(t, nil)
	f, err := fx.d.createRanged(rangedMetaOf("b", bytes.Repeat([]byte{1}, 3<<20)))
	if err != nil {
		t.Fatal(err)
	}
	for i := range f.state { // as taken up after a crash: here, unchecked, zeros
		f.state[i] = blockHere
	}
	f.here = int64(len(f.state))
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() { f.recheck(0) })
	}
	wg.Wait()
	if f.here != int64(len(f.state))-1 || f.state[0] != blockMissing {
		t.Fatalf("%d blocks here after one was lost, want %d", f.here, len(f.state)-1)
	}
}

// TestRangedNotInstalledUnchecked: after a restart, blocks the map says
// are here but whose bytes were lost are checked before the file is
// installed: it is not, and they are fetched again.
func TestRangedNotInstalledUnchecked(t *testing.T) {
	fx := newFixture(t, nil)
	content := bytes.Repeat([]byte{7}, 3<<20)
	meta := rangedMetaOf("c", content)
	f, err := fx.d.createRanged(meta)
	if err != nil {
		t.Fatal(err)
	}
	f.rec = hfl.Record{Path: meta.Path, Owner: meta.Owner, Generation: meta.Gen, Size: meta.Size, Mode: meta.Mode, Sum: meta.Sum}
	f.opens = 1
	f.state[0], f.state[1] = blockHere, blockHere // their bytes never reached the disk
	f.here = 2
	f.data.WriteAt(content[2<<20:], 2<<20) // block 2 arrives, verified
	f.claimLocked(2, 3)
	f.unclaim(2, 3, []bool{true})
	fx.d.ranged.wg.Wait()
	if _, err := os.Stat(filepath.Join(fx.dir, "c")); err == nil {
		t.Fatal("installed a file whose blocks were not checked")
	}
	if f.here != 1 || f.state[0] != blockMissing || f.state[1] != blockMissing {
		t.Fatalf("after the check, %d blocks here (map %v), want only block 2", f.here, f.state)
	}
}

// TestReadCursorReadsAheadOnlyInOrder: reads at random fetch only what
// they touch; once reads reach two new blocks in order, the window of
// blocks fetched ahead grows, up to its bound, and a jump ends it.
func TestReadCursorReadsAheadOnlyInOrder(t *testing.T) {
	var cur ReadCursor
	steps := []struct {
		first, last, want int64
	}{
		{100, 100, 0}, // at random
		{100, 100, 0}, // the rest of that block
		{101, 101, 0}, // the next block: one in order
		{102, 102, 2}, // two: read ahead
		{102, 102, 2}, // within the block: keeps the window
		{103, 103, 4},
		{104, 104, 8},
		{105, 106, 8}, // bounded
		{500, 500, 0}, // a jump
		{501, 501, 0},
	}
	for i, s := range steps {
		if got := cur.advance(s.first, s.last, 8); got != s.want {
			t.Fatalf("step %d (blocks %d-%d): reads %d blocks ahead, want %d", i, s.first, s.last, got, s.want)
		}
	}
}

// TestClaimAheadKeepsHalfTheWindow: blocks are claimed ahead in runs, only
// once fewer than half of the window are here or on their way, and never
// twice.
func TestClaimAheadKeepsHalfTheWindow(t *testing.T) {
	f := &RangedFile{state: make([]byte, 20), checked: make([]bool, 20), inflight: make(map[int64]chan struct{})}
	f.state[3] = blockHere
	if r := f.claimAheadLocked(0, 8); r != [2]int64{0, 3} {
		t.Fatalf("first claim %v, want blocks 0-2 (3 is here)", r)
	}
	if r := f.claimAheadLocked(1, 6); r != [2]int64{1, 1} {
		t.Fatalf("with half the window covered, claimed %v", r)
	}
	if r := f.claimAheadLocked(4, 8); r != [2]int64{4, 12} {
		t.Fatalf("claim past what is covered %v, want 4-11", r)
	}
	if r := f.claimAheadLocked(18, 8); r != [2]int64{18, 20} {
		t.Fatalf("claim at the end %v, want 18-19", r)
	}
	for i := range int64(20) {
		claimed := f.inflight[i] != nil
		if want := i != 3 && (i < 12 || i >= 18); claimed != want {
			t.Fatalf("block %d claimed: %v, want %v", i, claimed, want)
		}
	}
}

// TestBlockListCodec: requests and replies for block hashes decode to what
// was encoded, and short or ragged messages are refused.
func TestBlockListCodec(t *testing.T) {
	req := blockListReq{Gen: 1<<63 + 3, First: 7000, Path: "a/b c/d"}
	got, err := decodeBlockListReq(encodeBlockListReq(req))
	if err != nil || got != req {
		t.Fatalf("request %+v decodes to %+v, %v", req, got, err)
	}
	rep := blockListReply{Gen: 9, Size: 5<<30 + 1, Total: 5121, First: 7, Hashes: []uint64{1, 1 << 63, 42}}
	gotRep, err := decodeBlockListReply(encodeBlockListReply(rep))
	if err != nil || gotRep.Gen != rep.Gen || gotRep.Size != rep.Size || gotRep.Total != rep.Total || gotRep.First != rep.First || len(gotRep.Hashes) != 3 || gotRep.Hashes[1] != 1<<63 {
		t.Fatalf("reply %+v decodes to %+v, %v", rep, gotRep, err)
	}
	if _, err := decodeBlockListReq([]byte{blockListMsg, 1, 2}); err == nil {
		t.Fatal("a short request decoded")
	}
	if _, err := decodeBlockListReply(make([]byte, 27)); err == nil {
		t.Fatal("a ragged reply decoded")
	}
	if len(encodeBlockListReply(blockListReply{Hashes: make([]uint64, blockListMax)})) > dtl.MaxMessage {
		t.Fatal("a full reply is longer than a message may be")
	}
}
