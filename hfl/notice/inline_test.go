package notice

import (
	"bytes"
	"context"
	"fmt"
	"github.com/dyadfs/dyadfs/hfl"
	"hash/fnv"
	"strings"
	"testing"
	"time"

	"github.com/dyadfs/dyadfs/internal/poll"

	"github.com/dyadfs/dyadfs/hfl/store/embedded"
)

func inlineRec(path string, data []byte) hfl.Record {
	return hfl.Record{Path: path, Owner: "n0", Size: int64(len(data)), MtimeNs: 42, Uid: 7, Gid: 8, Inline: &hfl.Inline{Data: data}}
}

// TestHeldDataVersions: a home gives bytes only the generation of the
// publish they came with, whatever order the notices arrive in.
func TestHeldDataVersions(t *testing.T) {
	h := newHeldData()
	first, second := inlineRec("p", []byte("one")), inlineRec("p", []byte("two"))
	first.Provisional, second.Provisional = true, true
	committed := func(gen uint64) hfl.Record {
		return hfl.Record{Path: "p", Owner: "n0", Size: 3, MtimeNs: 42, Generation: gen}
	}

	// In order: provisional, committed.
	h.put(first, 1)
	if got := h.attach(first); got.Inline == nil || string(got.Inline.Data) != "one" {
		t.Fatalf("provisional record: bytes %+v, want one", got.Inline)
	}
	h.commit(committed(5), 1)
	if got := h.attach(committed(5)); got.Inline == nil || string(got.Inline.Data) != "one" {
		t.Fatalf("committed record: bytes %+v, want one", got.Inline)
	}
	if got := h.attach(committed(6)); got.Inline != nil {
		t.Fatalf("another generation got bytes %q", got.Inline.Data)
	}

	// Out of order: the second publish's bytes, then the first's arriving
	// late, then the second's commit, which must not take the first's.
	h.put(second, 2)
	h.put(first, 1)
	h.commit(committed(6), 2)
	if got := h.attach(committed(6)); got.Inline != nil {
		t.Fatalf("generation 6 got the bytes %q of another publish", got.Inline.Data)
	}

	// Another owner's unpublish leaves them; the owner's drops them.
	h.drop("p", "n9")
	if len(h.byPath) != 1 {
		t.Fatal("another owner dropped the bytes")
	}
	h.drop("p", "n0")
	if len(h.byPath) != 0 || h.bytes != 0 {
		t.Fatalf("after drop: %d entries, %d bytes", len(h.byPath), h.bytes)
	}
}

// TestHeldDataBound: the bytes held stay within maxHeldBytes, the oldest
// going first, and the table's bookkeeping does not grow with rewrites.
func TestHeldDataBound(t *testing.T) {
	h := newHeldData()
	data := make([]byte, hfl.InlineMax)
	n := 2 * maxHeldBytes / hfl.InlineMax
	for i := 0; i < n; i++ {
		h.put(inlineRec(fmt.Sprintf("f%d", i), data), uint64(i+1))
		if h.bytes > maxHeldBytes {
			t.Fatalf("after %d files: %d bytes held, bound %d", i+1, h.bytes, maxHeldBytes)
		}
	}
	if _, ok := h.byPath["f0"]; ok {
		t.Error("the oldest file is still held")
	}
	if _, ok := h.byPath[fmt.Sprintf("f%d", n-1)]; !ok {
		t.Error("the newest file is not held")
	}
	for i := 0; i < 10000; i++ {
		h.put(inlineRec("same", []byte("x")), uint64(n+i))
	}
	if len(h.order) > 2*len(h.byPath)+64 {
		t.Errorf("%d order entries for %d files", len(h.order), len(h.byPath))
	}
}

// TestNoticeCarriesSmallFiles: a small file's bytes reach a waiting
// consumer with the notice, and a consumer that asks later gets them from
// the home with the committed record; neither the store nor any cache
// keeps them.
func TestNoticeCarriesSmallFiles(t *testing.T) {
	setNoticeGrace(t, time.Hour)
	store := &slowStore{Store: embedded.New(), blockWaits: true}
	locs, _ := noticeCluster(t, 3, store)
	producer, waiter, later := locs[0], locs[1], locs[2]
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := 0; i < 20; i++ {
		path := fmt.Sprintf("s/f%d", i)
		data := bytes.Repeat([]byte{byte(i)}, i*100)
		got := make(chan hfl.Record, 1)
		go func() {
			rec, err := waiter.WaitAhead(ctx, path, 0)
			if err != nil {
				t.Error(err)
			}
			got <- rec
		}()
		awaitHolder(t, locs, path, "n1")
		pub, err := producer.Publish(ctx, inlineRec(path, data), aside)
		if err != nil {
			t.Fatal(err)
		}
		if pub.Inline != nil {
			t.Fatalf("%s: Publish returned bytes", path)
		}
		if rec := <-got; rec.Inline == nil || !bytes.Equal(rec.Inline.Data, data) || rec.Uid != 7 || rec.Gid != 8 {
			t.Fatalf("%s: the waiter got %+v, want the %d bytes published", path, rec.Inline, len(data))
		}
		// The committed notice reaches the home aside: ask until the
		// home answers with the committed record.
		poll.Until(t, 5*time.Second, path+": the later consumer gets the bytes", func() bool {
			later.Forget(path)
			rec, _, err := later.Record(ctx, path)
			if err != nil {
				t.Fatal(err)
			}
			if rec.Generation == pub.Generation && rec.Inline != nil && !bytes.Equal(rec.Inline.Data, data) {
				t.Fatalf("%s: the later consumer got other bytes", path)
			}
			return rec.Generation == pub.Generation && rec.Inline != nil
		})
		if rec, err := store.Lookup(ctx, producer.Slot(path)); err != nil || rec.Inline != nil {
			t.Fatalf("%s: the store's record %+v, %v: want one without bytes", path, rec, err)
		}
	}
}

// blockingLookups is a store whose lookups do not answer until their
// context ends.
type blockingLookups struct {
	hfl.Store
	started chan struct{}
}

func (s *blockingLookups) Lookup(ctx context.Context, slot hfl.Slot) (hfl.Record, error) {
	s.started <- struct{}{}
	<-ctx.Done()
	return hfl.Record{}, ctx.Err()
}

// TestLocateWaitingTakesNoticeDuringLookup: a publish that lands while the
// store is being asked ends LocateWaiting at once.
func TestLocateWaitingTakesNoticeDuringLookup(t *testing.T) {
	store := &blockingLookups{Store: embedded.New(), started: make(chan struct{}, 1)}
	locs, _ := noticeClusterOver(t, 2, store)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	type found struct {
		rec hfl.Record
		lv  hfl.Level
		err error
	}
	got := make(chan found, 1)
	go func() {
		w := locs[1].Watch("late/f")
		defer w.Close()
		rec, lv, err := locs[1].LocateWaiting(ctx, w, true)
		got <- found{rec, lv, err}
	}()
	select {
	case <-store.started:
	case <-ctx.Done():
		t.Fatal("the store was never asked")
	}
	go locs[0].Publish(ctx, inlineRec("late/f", []byte("data")), aside)
	f := <-got
	if f.err != nil || f.lv != hfl.LevelHome || f.rec.Owner != "n0" || f.rec.Inline == nil || string(f.rec.Inline.Data) != "data" {
		t.Fatalf("LocateWaiting: %+v at %v, %v; want n0's record and bytes from a notice", f.rec, f.lv, f.err)
	}
}

func TestHandleMessageRefusesBadBytes(t *testing.T) {
	store := &slowStore{Store: embedded.New()}
	locs, _ := noticeCluster(t, 1, store)
	ctx := context.Background()
	prov := func(size int64, data []byte) []byte {
		msg := notice{Kind: kindPublished, Rec: &hfl.Record{Path: "a", Owner: "n9", Size: size, Provisional: true}}
		if data != nil {
			msg.Inline = &hfl.Inline{Data: data}
		}
		return encodeNotice(msg)
	}
	for _, msg := range [][]byte{
		prov(3, []byte("ab")), // not the record's size
		prov(hfl.InlineMax+1, bytes.Repeat([]byte("x"), hfl.InlineMax+1)), // too large to travel
	} {
		if _, err := locs[0].HandleMessage(ctx, "n9", msg); err == nil {
			t.Errorf("notice %.80q was taken", msg)
		}
	}
	if _, err := locs[0].HandleMessage(ctx, "n9", prov(3, []byte("abc"))); err != nil {
		t.Errorf("a good notice was refused: %v", err)
	}
}

// TestHomeScoreIsFNV1a: the score computed in place is 64-bit FNV-1a of
// the node, a NUL byte and the key.
func TestHomeScoreIsFNV1a(t *testing.T) {
	for _, c := range [][2]string{{"n0", "job/1.2/a"}, {"", ""}, {"node-17", strings.Repeat("k", 300)}} {
		h := fnv.New64a()
		h.Write([]byte(c[0] + "\x00" + c[1]))
		if got, want := homeScore(c[0], c[1]), h.Sum64(); got != want {
			t.Errorf("homeScore(%q, %q) = %x, want %x", c[0], c[1], got, want)
		}
	}
}
