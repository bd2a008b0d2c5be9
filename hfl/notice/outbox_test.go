package notice

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dyadfs/dyadfs/hfl"
	"github.com/dyadfs/dyadfs/hfl/store/embedded"
)

// TestOutboxBatches: questions asked at once of one home go in fewer
// messages than there are questions, and each gets its own answer.
func TestOutboxBatches(t *testing.T) {
	store := &slowStore{Store: embedded.New()}
	locs, net := noticeCluster(t, 2, store)
	ctx := testContext(t)
	// One directory: one home. Ask from the node that is not its home.
	dir := "batch"
	asker := locs[0]
	if asker.HomeOf(dir+"/x") == "n0" {
		asker = locs[1]
	}
	const files = 200
	for i := range files {
		if _, err := locs[0].Publish(ctx, hfl.Record{Path: fmt.Sprintf("%s/f%d", dir, i), Owner: "n0", Size: int64(i)}, told); err != nil {
			t.Fatal(err)
		}
	}
	net.mu.Lock()
	net.delay = time.Millisecond // messages overlap, as over a network
	net.mu.Unlock()
	before := asker.n.sent.Load()
	var wg sync.WaitGroup
	for i := range files {
		wg.Go(func() {
			// Ask the home itself, as a lookup that knows nothing does.
			p := fmt.Sprintf("%s/f%d", dir, i)
			a := asker.n.ask(ctx, p, 0, false)
			a.endFlight()
			if !a.answered || !a.exists || a.rec.Size != int64(i) {
				t.Errorf("%s: answered %v, exists %v, %+v; want size %d", p, a.answered, a.exists, a.rec, i)
			}
			missing := fmt.Sprintf("%s/none%d", dir, i)
			m := asker.n.ask(ctx, missing, 0, false)
			m.endFlight()
			if m.answered && m.exists {
				t.Errorf("%s: the home says it exists", missing)
			}
		})
	}
	wg.Wait()
	sent := asker.n.sent.Load() - before
	if sent > files {
		t.Errorf("%d questions took %d messages: few went together", 2*files, sent)
	}
	t.Logf("%d questions in %d messages (%d in batches)", 2*files, sent, asker.n.batched.Load())
}

// TestBatchAnswersEachNotice: a batch's notices are answered one by one:
// a bad one is refused alone, and a notice that may wait for other nodes
// is refused in a batch.
func TestBatchAnswersEachNotice(t *testing.T) {
	store := &slowStore{Store: embedded.New()}
	locs, _ := noticeCluster(t, 1, store)
	ctx := testContext(t)
	msgs := [][]byte{
		encodeNotice(notice{Kind: kindAsk, Path: "a"}),
		encodeNotice(notice{Kind: kindAsk, Path: "/abs"}),
		encodeNotice(notice{Kind: kindPublished, Rec: &hfl.Record{Path: "b", Owner: "n9", Generation: 3}, Sync: true}),
	}
	rb, err := locs[0].HandleMessage(ctx, "n9", encodeBatch(msgs))
	if err != nil {
		t.Fatal(err)
	}
	replies, err := decodeBatchReply(rb, len(msgs))
	if err != nil {
		t.Fatal(err)
	}
	if replies[0].err != nil {
		t.Errorf("a good question was refused: %v", replies[0].err)
	}
	if _, err := decodeReply(replies[0].b); err != nil {
		t.Errorf("its reply: %v", err)
	}
	for i, what := range []string{"a bad path", "a notice told before it returns"} {
		if replies[i+1].err == nil {
			t.Errorf("%s in a batch was taken", what)
		}
	}
	for _, bad := range [][]byte{encodeBatch(nil)[:2], append(encodeBatch(msgs[:1]), 0), encodeBatch(make([][]byte, maxBatch+1))} {
		if _, err := locs[0].HandleMessage(ctx, "n9", bad); err == nil {
			t.Errorf("batch %q was taken", bad)
		}
	}
}

// TestBatchReplyStaysWithinAMessage: however large its replies, a batch's
// reply fits in one message; replies past the room left become errors
// (their askers read the store), small files' bytes go first.
func TestBatchReplyStaysWithinAMessage(t *testing.T) {
	long := strings.Repeat("t", 3000)
	replies := make([]batchReply, maxBatch)
	for i := range replies {
		rec := hfl.Record{Path: fmt.Sprintf("d/%s%d", strings.Repeat("p", 400), i), Owner: "n1", Target: long, Generation: 5}
		replies[i].b = encodeReply(reply{Rec: &rec, Inline: &hfl.Inline{Data: make([]byte, hfl.InlineMax)}, Known: true, Gen: 5})
	}
	replies[3].err = errors.New(strings.Repeat("refused ", 100))
	b := encodeBatchReply(replies)
	if len(b) > maxReplyBytes {
		t.Fatalf("a batch's reply of %d bytes; at most %d fit", len(b), maxReplyBytes)
	}
	got, err := decodeBatchReply(b, len(replies))
	if err != nil {
		t.Fatal(err)
	}
	if got[0].err != nil || got[3].err == nil || got[len(got)-1].err == nil {
		t.Fatalf("first reply %v, the refused one %v, the last %v: want a reply, an error, an error", got[0].err, got[3].err, got[len(got)-1].err)
	}
	withBytes := 0
	for _, r := range got {
		if r.err == nil {
			rep, err := decodeReply(r.b)
			if err != nil {
				t.Fatal(err)
			}
			if rep.Inline != nil {
				withBytes++
			}
		}
	}
	if withBytes == 0 || withBytes > bytesInReplies/hfl.InlineMax+1 {
		t.Errorf("%d replies kept their bytes", withBytes)
	}
}

// silentPeer never answers: each message lasts until its deadline.
type silentPeer struct{ calls atomic.Int64 }

func (p *silentPeer) Message(ctx context.Context, addr, node string, msg []byte) ([]byte, error) {
	p.calls.Add(1)
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestOutboxGivesUpOnSilentNode: when a node does not answer in time,
// every notice queued for it fails then, not one timeout after another.
func TestOutboxGivesUpOnSilentNode(t *testing.T) {
	old := noticeTimeout
	noticeTimeout = 200 * time.Millisecond
	t.Cleanup(func() { noticeTimeout = old })
	ctx := testContext(t)
	peer := &silentPeer{}
	n := New(ctx, hfl.NoticeEnv{}, peer, nil)
	m := hfl.Member{Node: "n1", Addr: "10.0.0.2:1"}
	start := time.Now()
	var wg sync.WaitGroup
	for i := range 3 * maxBatch {
		wg.Go(func() {
			if _, err := n.send(ctx, m, notice{Kind: kindAsk, Path: fmt.Sprintf("d/f%d", i)}); err == nil {
				t.Error("a notice to a silent node was answered")
			}
		})
	}
	wg.Wait()
	if took := time.Since(start); took > 5*noticeTimeout {
		t.Errorf("%d notices to a silent node took %v to fail (%d messages)", 3*maxBatch, took, peer.calls.Load())
	}
}
