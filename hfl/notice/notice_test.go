package notice

import (
	"context"
	"errors"
	"fmt"
	"github.com/dyadfs/dyadfs/hfl"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dyadfs/dyadfs/internal/poll"

	"github.com/dyadfs/dyadfs/hfl/store/embedded"
)

// slowStore is a shared store whose waits never end on their own and whose
// calls are counted: what reaches a consumer early came by notice.
type slowStore struct {
	hfl.Store
	lookups, waits atomic.Int64
	blockWaits     bool
}

func (s *slowStore) Lookup(ctx context.Context, slot hfl.Slot) (hfl.Record, error) {
	s.lookups.Add(1)
	return s.Store.Lookup(ctx, slot)
}

func (s *slowStore) Wait(ctx context.Context, slot hfl.Slot, after uint64) (hfl.Record, error) {
	s.waits.Add(1)
	if s.blockWaits {
		<-ctx.Done()
		return hfl.Record{}, ctx.Err()
	}
	return s.Store.Wait(ctx, slot, after)
}

// memPeers routes notices between locators in this process; a node in down
// cannot be reached.
type memPeers struct {
	from string
	net  *memNet
}

type memNet struct {
	mu   sync.Mutex
	locs map[string]*node // by address
	down map[string]bool  // by node
	// delay is how long a message takes, as over a network; slow, how
	// long more one takes to reach the node.
	delay time.Duration
	slow  map[string]time.Duration
	// lose, if set, says which messages are lost (the sender is told the
	// node cannot be reached).
	lose func(from, node string, msg []byte) bool
}

func (p *memPeers) Message(ctx context.Context, addr, node string, msg []byte) ([]byte, error) {
	p.net.mu.Lock()
	l, down, delay := p.net.locs[addr], p.net.down[node] || p.net.down[p.from], p.net.delay+p.net.slow[node]
	if lose := p.net.lose; lose != nil && lose(p.from, node, msg) {
		down = true
	}
	p.net.mu.Unlock()
	if delay > 0 {
		time.Sleep(delay)
	}
	if l == nil || down {
		return nil, errors.New("unreachable")
	}
	return l.HandleMessage(ctx, p.from, msg)
}

// node is a locator of a notice cluster, with its protocol.
type node struct {
	*hfl.Locator
	n *Protocol
}

// newNode makes a locator over store whose notices go through peers.
func newNode(t testing.TB, ctx context.Context, store hfl.Store, local hfl.LocalIndex, peers Peers) *node {
	t.Helper()
	nd := &node{}
	l, err := hfl.NewLocator(hfl.DefaultLocatorConfig(), store, local, func(env hfl.NoticeEnv) hfl.Notices {
		nd.n = New(ctx, env, peers, nil)
		return nd.n
	})
	if err != nil {
		t.Fatal(err)
	}
	nd.Locator = l
	return nd
}

// noticeCluster makes n locators sharing one store, with notices on.
func noticeCluster(t *testing.T, n int, store *slowStore) ([]*node, *memNet) {
	t.Helper()
	return noticeClusterOver(t, n, store)
}

func noticeClusterOver(t *testing.T, n int, store hfl.Store) ([]*node, *memNet) {
	t.Helper()
	return noticeClusterWith(t, n, store, func(int) hfl.LocalIndex { return nil })
}

// noticeClusterWith is noticeClusterOver with each node's first level.
func noticeClusterWith(t *testing.T, n int, store hfl.Store, local func(i int) hfl.LocalIndex) ([]*node, *memNet) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	net := &memNet{locs: map[string]*node{}, down: map[string]bool{}}
	var locs []*node
	var members []hfl.Member
	for i := 0; i < n; i++ {
		l := newNode(t, ctx, store, local(i), &memPeers{from: fmt.Sprintf("n%d", i), net: net})
		node, addr := fmt.Sprintf("n%d", i), fmt.Sprintf("10.0.0.%d:7447", i+1)
		m := hfl.Member{Node: node, Transport: "mem", Addr: addr, Started: time.Now()}
		if err := l.Register(ctx, m, time.Minute); err != nil {
			t.Fatal(err)
		}
		members = append(members, m)
		net.locs[addr] = l
		locs = append(locs, l)
	}
	for i, l := range locs {
		if err := l.StartNotices(ctx, members[i]); err != nil {
			t.Fatal(err)
		}
	}
	return locs, net
}

// awaitHolder waits until path's home counts node among the holders of
// path: a waiter of node has subscribed there.
func awaitHolder(t *testing.T, locs []*node, path, node string) {
	t.Helper()
	dir, name := hfl.SplitPath(path)
	poll.Until(t, 5*time.Second, path+": "+node+" registered at its home", func() bool {
		for _, l := range locs {
			h := l.n.home
			h.mu.Lock()
			var held bool
			if d := h.dirs[dir]; d != nil {
				if e := d.entries[name]; e != nil {
					_, held = e.holders[node]
				}
			}
			h.mu.Unlock()
			if held {
				return true
			}
		}
		return false
	})
}

func setNoticeGrace(t *testing.T, d time.Duration) {
	old := noticeGrace
	noticeGrace = d
	t.Cleanup(func() { noticeGrace = old })
}

func TestNoticeWakesWaiterWithoutStore(t *testing.T) {
	setNoticeGrace(t, time.Hour)
	store := &slowStore{Store: embedded.New(), blockWaits: true}
	locs, _ := noticeCluster(t, 3, store)
	producer, consumer := locs[0], locs[1]
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Twenty paths: their homes are spread over the three nodes.
	for i := 0; i < 20; i++ {
		path := fmt.Sprintf("run/f%d", i)
		got := make(chan error, 1)
		var rec hfl.Record
		go func() {
			var err error
			rec, err = consumer.Wait(ctx, path, 0)
			got <- err
		}()
		// The consumer subscribes first, as a consumer that waits
		// before the producer starts does.
		awaitHolder(t, locs, path, "n1")
		pub, err := producer.Publish(ctx, hfl.Record{Path: path, Owner: "n0", Size: int64(i)}, aside)
		if err != nil {
			t.Fatal(err)
		}
		if err := <-got; err != nil {
			t.Fatalf("%s: wait: %v", path, err)
		}
		// Told ahead of the store's commit (provisional, no generation
		// yet) or after it.
		if rec.Owner != "n0" || rec.Size != int64(i) || (rec.Provisional != (rec.Generation == 0)) ||
			(!rec.Provisional && rec.Generation != pub.Generation) {
			t.Fatalf("%s: woke with %+v, want %+v", path, rec, pub)
		}
		// Only committed records are kept.
		for _, l := range locs {
			if got, exists, _, ok := l.n.holder.lookup(path); ok && exists && got.Provisional {
				t.Fatalf("%s: a node keeps a provisional record", path)
			}
		}
	}
	if n := store.waits.Load(); n != 0 {
		t.Errorf("the store was waited on %d times; notices alone should have woken the consumer", n)
	}
	if st := consumer.Stats().Notices; st == nil || st.Members != 3 || st.WokenBy == 0 {
		t.Errorf("consumer's notice stats %+v: want 3 members and waits woken by notices", st)
	}
}

func TestNoticeAnswersLookupsFromHome(t *testing.T) {
	store := &slowStore{Store: embedded.New()}
	locs, _ := noticeCluster(t, 2, store)
	ctx := context.Background()
	for i := 0; i < 20; i++ {
		path := fmt.Sprintf("d%d/f", i)
		pub, err := locs[0].Publish(ctx, hfl.Record{Path: path, Owner: "n0"}, aside)
		if err != nil {
			t.Fatal(err)
		}
		// The committed notice reaches the home aside: once it is there,
		// the home answers, without a store lookup.
		poll.Until(t, 5*time.Second, path+": answered by its home", func() bool {
			locs[1].Forget(path)
			before := store.lookups.Load()
			rec, lv, err := locs[1].Record(ctx, path)
			if err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			if rec.Generation != pub.Generation {
				t.Fatalf("%s: got generation %d, want %d", path, rec.Generation, pub.Generation)
			}
			if lv == hfl.LevelCache {
				t.Fatalf("%s: found in a cache that was just emptied", path)
			}
			if lv == hfl.LevelHome && store.lookups.Load() != before {
				t.Fatalf("%s: answered by the home after a store lookup", path)
			}
			return lv == hfl.LevelHome
		})
	}
	if locs[1].Stats().Hits["home"] == 0 {
		t.Errorf("home hits not counted: %+v", locs[1].Stats())
	}
}

func TestNoticeFallsBackOnStore(t *testing.T) {
	setNoticeGrace(t, 20*time.Millisecond)
	store := &slowStore{Store: embedded.New()}
	locs, net := noticeCluster(t, 2, store)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := 0; i < 10; i++ {
		path := fmt.Sprintf("x/f%d", i)
		// The producer reaches nobody: no home hears of its publish.
		net.mu.Lock()
		net.down["n0"] = true
		net.mu.Unlock()
		got := make(chan error, 1)
		go func() {
			_, err := locs[1].Wait(ctx, path, 0)
			got <- err
		}()
		poll.Until(t, 5*time.Second, path+": waiting", func() bool { return locs[1].WaitingPaths() > 0 })
		if _, err := locs[0].Publish(ctx, hfl.Record{Path: path, Owner: "n0"}, aside); err != nil {
			t.Fatal(err)
		}
		if err := <-got; err != nil {
			t.Fatalf("%s: wait: %v", path, err)
		}
		net.mu.Lock()
		net.down["n0"] = false
		net.mu.Unlock()
	}
	if st := locs[1].Stats().Notices; st.StoreWaits == 0 {
		t.Errorf("no wait fell back on the store: %+v", st)
	}
}

func TestNoticeUnpublishForgetsAtHome(t *testing.T) {
	store := &slowStore{Store: embedded.New()}
	locs, _ := noticeCluster(t, 2, store)
	ctx := context.Background()
	for i := 0; i < 10; i++ {
		path := fmt.Sprintf("u/f%d", i)
		if _, err := locs[0].Publish(ctx, hfl.Record{Path: path, Owner: "n0"}, aside); err != nil {
			t.Fatal(err)
		}
		if err := locs[0].Unpublish(ctx, path, hfl.RemoveCond{Owner: "n0"}, false); err != nil {
			t.Fatal(err)
		}
		// Sent aside: the home forgets soon.
		poll.Until(t, 5*time.Second, path+": gone after unpublish", func() bool {
			locs[1].Forget(path)
			_, _, err := locs[1].Record(ctx, path)
			return errors.Is(err, hfl.ErrNotFound)
		})
	}
}

func TestNoticeWaitEndsWithContext(t *testing.T) {
	setNoticeGrace(t, time.Hour)
	store := &slowStore{Store: embedded.New(), blockWaits: true}
	locs, _ := noticeCluster(t, 2, store)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	for i := 0; i < 4; i++ {
		_, err := locs[1].Wait(ctx, fmt.Sprintf("never/f%d", i), 0)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("wait: %v, want the context's deadline", err)
		}
	}
	h := locs[1].n.holder
	h.mu.Lock()
	left := len(h.flights)
	h.mu.Unlock()
	left += locs[1].WaitingPaths()
	if left != 0 {
		t.Errorf("%d abandoned waits left behind", left)
	}
}

func TestHandleMessageRefusesBadNotices(t *testing.T) {
	store := &slowStore{Store: embedded.New()}
	locs, _ := noticeCluster(t, 1, store)
	ctx := context.Background()
	pub := func(rec hfl.Record) []byte { return encodeNotice(notice{Kind: kindPublished, Rec: &rec}) }
	good := encodeNotice(notice{Kind: kindAsk, Path: "a"})
	for _, msg := range [][]byte{
		nil, {codecVersion}, {codecVersion + 1, byte(kindAsk), 1, 1, 'a'}, good[:len(good)-1], append(good, 0),
		encodeNotice(notice{Kind: 99}), encodeNotice(notice{Kind: kindPublished}),
		pub(hfl.Record{Path: "../etc/passwd", Owner: "n9", Generation: 5}),
		pub(hfl.Record{Path: "a", Generation: 5}),
		pub(hfl.Record{Path: "a", Owner: "n9"}),
		encodeNotice(notice{Kind: kindAsk, Path: "/abs"}),
	} {
		if _, err := locs[0].HandleMessage(ctx, "n9", msg); err == nil {
			t.Errorf("notice %q was taken", msg)
		}
	}
	if _, err := locs[0].HandleMessage(ctx, "n9", good); err != nil {
		t.Errorf("a good notice was refused: %v", err)
	}
	off, _ := hfl.NewLocator(hfl.DefaultLocatorConfig(), store, nil, hfl.SingleNode)
	if _, err := off.HandleMessage(ctx, "n9", good); err == nil {
		t.Error("a locator without notices answered one")
	}
}

func FuzzHandleMessage(f *testing.F) {
	for _, msg := range []notice{
		{Kind: kindPublished, Rec: &hfl.Record{Path: "a/b", Owner: "n1", Generation: 7}},
		{Kind: kindAsk, Path: "a/b", After: 3, Ahead: true},
		{Kind: kindUnpublished, Path: "a/b", Gen: 9, Sync: true},
		{Kind: kindList, Path: "a"},
		{Kind: kindBreak, Path: "a/b", Rec: &hfl.Record{Path: "a/b", Owner: "n1", Generation: 8}, Listing: true},
		{Kind: kindPublished, Rec: &hfl.Record{Path: "a/b", Owner: "n1", Size: 2, Provisional: true}, Inline: &hfl.Inline{Data: []byte("ab")}, Publish: 3},
	} {
		f.Add(encodeNotice(msg))
	}
	f.Add(encodeBatch([][]byte{encodeNotice(notice{Kind: kindAsk, Path: "a/b"}), encodeNotice(notice{Kind: kindList, Path: "a"})}))
	store := embedded.New()
	ctx, cancel := context.WithCancel(context.Background())
	f.Cleanup(cancel)
	l := newNode(f, ctx, store, nil, &memPeers{from: "n0", net: &memNet{locs: map[string]*node{}, down: map[string]bool{}}})
	if err := l.StartNotices(ctx, hfl.Member{Node: "n0"}); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, msg []byte) {
		l.HandleMessage(ctx, "n1", msg) // must not panic or hang
	})
}

// joinNode starts one more node of a notice cluster, at addr.
func joinNode(t *testing.T, ctx context.Context, store hfl.Store, net *memNet, name, addr string) *node {
	t.Helper()
	l := newNode(t, ctx, store, nil, &memPeers{from: name, net: net})
	m := hfl.Member{Node: name, Transport: "mem", Addr: addr, Started: time.Now()}
	if err := l.Register(ctx, m, time.Minute); err != nil {
		t.Fatal(err)
	}
	net.mu.Lock()
	net.locs[addr] = l
	net.mu.Unlock()
	if err := l.StartNotices(ctx, m); err != nil {
		t.Fatal(err)
	}
	return l
}

func TestNoticeJoinAnnouncesNewMember(t *testing.T) {
	store := &slowStore{Store: embedded.New()}
	locs, net := noticeCluster(t, 2, store)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	joinNode(t, ctx, store, net, "n2", "10.0.0.3:7447")
	// Well before the members are read again (membersRefresh).
	for _, old := range locs {
		poll.Until(t, membersRefresh/2, "a member learns of the new one", func() bool { return old.Stats().Notices.Members == 3 })
	}
	if _, err := locs[0].HandleMessage(ctx, "n1", encodeNotice(notice{Kind: kindJoin, Member: &hfl.Member{Node: "n2", Addr: "x:1"}})); err == nil {
		t.Error("a join naming another node was taken")
	}
}

// The publishes of the locator's users, as options.
var (
	aside     = hfl.PublishOptions{Ahead: true}
	closeTold = hfl.PublishOptions{Ahead: true, Tell: hfl.TellOnce}
	told      = hfl.PublishOptions{Tell: hfl.TellSure}
	claiming  = hfl.PublishOptions{Tell: hfl.TellSure, Claim: true}
)
