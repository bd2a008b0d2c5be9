package notice

import (
	"fmt"
	"sync"
	"testing"

	"github.com/dyadfs/dyadfs/hfl"
	"github.com/dyadfs/dyadfs/hfl/store/embedded"
)

// TestOutboxBatches: questions asked at once of one home go in fewer
// messages than there are questions, and each gets its own answer.
func TestOutboxBatches(t *testing.T) {
	store := &slowStore{Store: embedded.New()}
	locs, _ := noticeCluster(t, 2, store)
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
	if sent >= 2*files {
		t.Errorf("%d questions took %d messages: none went together", 2*files, sent)
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
