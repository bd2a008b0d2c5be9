package notice

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dyadfs/dyadfs/hfl"
	"github.com/dyadfs/dyadfs/internal/every"
	"github.com/dyadfs/dyadfs/internal/workers"
)

// Notices keep every node's view of the namespace coherent without a round
// trip through the global store on every open, as AFS's callbacks do.
//
// Every directory has a home: the live member of the job that scores
// highest for the directory's key (rendezvous hashing), so that the work
// spreads over the nodes and every node that sees the same members picks
// the same home. The home of a path is the home of its directory. Every
// change of a path (a publish, a rewrite starting, a removal) is told to
// its home, which passes it on to the nodes that hold a promise for the
// path: they asked about it (and may hold a copy, or a negative answer), or
// wait for it, or published it. A node that read a directory's whole
// listing holds a promise for the listing, broken at the first change.
//
// So a node answers from what it knows as long as its promise holds: a
// promise comes from the home in the node's own view of the members, and
// lasts promiseTTL. A node that knows nothing asks the home first (which
// registers it) and reads the global store after, so that whatever
// changes after the store's answer is told to it. The global store stays
// the authority: a notice a home could not pass on only costs the holders
// their promises (they expire, or the home's death voids them), and a
// waiting open also waits on the store after noticeGrace.
//
// Records come from peers that proved they hold the job's secret, as
// anyone who can write the store can.

// Peers carries notices between daemons (the data transport's messages).
type Peers interface {
	// Message sends msg to the daemon of node at addr and returns its reply.
	Message(ctx context.Context, addr, node string, msg []byte) ([]byte, error)
}

// Timing of notices; variables so that tests can shorten them.
var (
	// noticeGrace is how long a waiting consumer relies on notices alone
	// before it also waits on the global store.
	noticeGrace = 250 * time.Millisecond
	// resubscribe: a long wait asks its home again this often.
	resubscribe = 30 * time.Second
	// promiseTTL is how long a home keeps a holder, and promiseMargin how
	// much earlier a holder stops trusting it (the two clocks start a
	// message apart).
	promiseTTL    = 60 * time.Second
	promiseMargin = 5 * time.Second
	// noticeTimeout bounds one message to a peer.
	noticeTimeout = 5 * time.Second
	// membersRefresh is how often the list of live members is read again;
	// a peer that cannot be reached makes it read at once (at most every
	// membersRetry).
	membersRefresh = 5 * time.Second
	membersRetry   = 200 * time.Millisecond
	// handoff is how long a new member, when it is a path's home, also
	// passes changes to the home the others knew before it came: until
	// every node has read the members again.
	handoff = 2*membersRefresh + time.Second
	// holderSilence is how long a home waits for a holder to take a
	// change before it takes the holder for cut off: it drops every
	// promise the holder has from it, goes on, and tells the holder so
	// once it answers again (the holder then asks afresh). Well below the
	// time the node that made the change waits for the home's answer.
	holderSilence = time.Second
)

// timing is the values of the variables above when notices started: the
// goroutines of notices read them there, so that a test may change the
// variables for the next cluster it makes.
type timing struct {
	grace, resubscribe, promiseTTL, promiseMargin, timeout, refresh, retry, handoff, silence time.Duration
}

func currentTiming() timing {
	return timing{grace: noticeGrace, resubscribe: resubscribe, promiseTTL: promiseTTL, promiseMargin: promiseMargin,
		timeout: noticeTimeout, refresh: membersRefresh, retry: membersRetry, handoff: handoff, silence: holderSilence}
}

// A notice message. Kind says which fields count.
type notice struct {
	Kind   kind
	Rec    *hfl.Record
	Member *hfl.Member
	// Path is the path a notice is about (a directory for kindList).
	Path  string
	After uint64
	// Gen is a removal's generation (kindUnpublished, kindBreak without
	// Rec).
	Gen uint64
	// Ahead: a provisional record answers the ask too.
	Ahead bool
	// Inline is Rec's bytes, for a small file.
	Inline *hfl.Inline
	// Publish numbers an owner's publishes: its provisional and its
	// committed notice of one publish carry the same number.
	Publish uint64
	// Sync: reply once every holder was told. In a break: the home gives
	// it a deadline (it is not batched).
	Sync bool
	// Listing: the holder holds the listing of the path's directory,
	// which the change is part of; ListingEnded: that promise ends.
	Listing      bool
	ListingEnded bool
	// Held: the home keeps the node a break goes to as a holder of the
	// path (its promise is renewed); without, it only held the listing.
	Held bool
	// Forwarded: a new home passing a change on to the previous one.
	Forwarded bool
	// Settle, with a provisional Rec: the hold of its publish (Publish)
	// ends without its commit. From the owner: the commit failed; from
	// the home, in a break: that, or the commit was overtaken by a newer
	// change (told apart). A committed record's break carries Publish,
	// which ends the hold of that publish too (see reply.Pending).
	Settle bool
}

// kind is what a notice says.
type kind byte

const (
	kindPublished   kind = iota + 1 // owner → home: Rec (provisional, committed or writing)
	kindUnpublished                 // remover → home: Path, Gen
	kindAsk                         // node → home: Path, After, Ahead; registers the asker
	kindList                        // node → home: Path (a directory); registers the asker for the listing
	kindBreak                       // home → holder: Path, Rec or Gen, Listing
	kindJoin                        // a starting daemon → every member: Member
	kindRevoke                      // home → holder it took for cut off: its promises from the home are void
	kindBatch                       // notices sent together (see outbox)
)

var kindNames = [...]string{kindPublished: "pub", kindUnpublished: "unpub", kindAsk: "ask", kindList: "list",
	kindBreak: "brk", kindJoin: "join", kindRevoke: "rvk", kindBatch: "batch"}

func (k kind) String() string {
	if int(k) < len(kindNames) && kindNames[k] != "" {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", byte(k))
}

// reply answers a notice. Home is the answering home's incarnation, so
// that a holder's promise names the daemon that made it.
type reply struct {
	Rec    *hfl.Record
	Inline *hfl.Inline
	// Known: the home knows the path's state (Rec, or Gen of its removal);
	// if not, the asker reads the store.
	Known bool
	Gen   uint64
	Home  time.Time
	// NoPromise: the home keeps too many holders to register one more,
	// or it holds its promises on the path back (see Pending).
	NoPromise bool
	// Pending answers a record sent ahead with Sync: the home told every
	// holder of the path, and every lister of its directory, that its
	// commit is coming, and holds the path back until the commit is told
	// (see homeEntry.pendingUntil). The owner's waiting close then need
	// not wait for the home once its commit is done. To a question, it
	// says that the path is held back for PendingOwner's publish
	// PendingPublish: the asker waits for its commit's notice.
	Pending        bool
	PendingOwner   string
	PendingPublish uint64
}

// Protocol sends and answers notices for one node: the members, the home
// side and the holder side, and the calls of its locator (client.go).
type Protocol struct {
	env   hfl.NoticeEnv
	peers Peers
	log   *slog.Logger
	ctx   context.Context // ends when the daemon stops
	t     timing

	// started is set once the node takes part (Start, self set) and has
	// read the members: only then does it answer other nodes.
	started atomic.Bool
	self    hfl.Member

	mu      sync.Mutex
	members []hfl.Member // live members, this node included, sorted by node
	epoch   uint64       // grows with every change of members
	// since is when each member was first seen, for the handoff.
	since map[string]time.Time

	home   *homeSide
	holder *holderSide

	publish    atomic.Uint64 // numbers this owner's publishes
	refreshNow chan struct{}
	lastFail   atomic.Int64 // unix ns of the last forced refresh

	// seen is every member this node saw, by node: where to tell a
	// holder that left the members meanwhile that its promises are void.
	seen map[string]hfl.Member

	// outboxes queue the notices to each node (see outbox).
	outMu    sync.Mutex
	outboxes map[outboxKey]*outbox

	sent, received, failed, breaks, broken, asked, woken, storeWaits, homeWaits, silent, revoked, batched atomic.Uint64
	heldLookups, heldRunOut                                                                               atomic.Uint64
}

// Over returns the notices of a node that exchanges them with the other
// nodes of its job through peers (the transport's messages), for as long
// as ctx lasts: what hfl.NewLocator takes.
func Over(ctx context.Context, peers Peers, log *slog.Logger) hfl.NewNotices {
	return func(env hfl.NoticeEnv) hfl.Notices { return New(ctx, env, peers, log) }
}

// New returns the protocol of a locator whose parts env names. Until
// Start, it knows no members: every question goes to the store.
func New(ctx context.Context, env hfl.NoticeEnv, peers Peers, log *slog.Logger) *Protocol {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	n := &Protocol{env: env, peers: peers, log: log, ctx: ctx, t: currentTiming(),
		since: make(map[string]time.Time), refreshNow: make(chan struct{}, 1), outboxes: make(map[outboxKey]*outbox)}
	n.home = newHomeSide(n)
	n.holder = newHolderSide(n)
	// Publish numbers start from the clock, so that they are not reused
	// when the daemon restarts.
	n.publish.Store(uint64(time.Now().UnixNano()))
	return n
}

// Start takes part in the job as the member self (whose Started tells its
// incarnation): it reads the members now, and again now and then until
// ctx ends, and tells the others it is here. A failure to read them is
// returned, and reading goes on: the notices begin once the store answers.
func (n *Protocol) Start(ctx context.Context, self hfl.Member) error {
	n.self = self
	err := n.refresh(ctx)
	go n.keepMembers(ctx)
	go n.home.sweep(ctx)
	// Members read the list only now and again: tell them at once that
	// this node is here, so that they count it in when choosing homes.
	for _, m := range n.others() {
		n.sendAside(m, notice{Kind: kindJoin, Member: &n.self})
	}
	return err
}

// others returns the members but this node.
func (n *Protocol) others() []hfl.Member {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]hfl.Member, 0, len(n.members))
	for _, m := range n.members {
		if m.Node != n.self.Node {
			out = append(out, m)
		}
	}
	return out
}

// setMembersLocked replaces the members, counting a change.
func (n *Protocol) setMembersLocked(ms []hfl.Member) {
	if sameMembers(n.members, ms) {
		return
	}
	now := time.Now()
	seen := make(map[string]time.Time, len(ms))
	for _, m := range ms {
		if t, ok := n.since[m.Node]; ok && n.memberLocked(m.Node).Started.Equal(m.Started) {
			seen[m.Node] = t
		} else {
			seen[m.Node] = now
		}
	}
	n.since = seen
	n.members = ms
	n.epoch++
	if n.seen == nil {
		n.seen = make(map[string]hfl.Member)
	}
	for _, m := range ms {
		n.seen[m.Node] = m
	}
}

func sameMembers(a, b []hfl.Member) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Node != b[i].Node || a[i].Addr != b[i].Addr || !a[i].Started.Equal(b[i].Started) {
			return false
		}
	}
	return true
}

// joined adds or updates a member that announced itself.
func (n *Protocol) joined(m hfl.Member) {
	n.mu.Lock()
	defer n.mu.Unlock()
	ms := append([]hfl.Member(nil), n.members...)
	i := sort.Search(len(ms), func(i int) bool { return ms[i].Node >= m.Node })
	if i < len(ms) && ms[i].Node == m.Node {
		ms[i] = m
	} else {
		ms = append(ms, hfl.Member{})
		copy(ms[i+1:], ms[i:])
		ms[i] = m
	}
	n.setMembersLocked(ms)
}

// refresh reads the live members.
func (n *Protocol) refresh(ctx context.Context) error {
	ms, err := hfl.LiveMembers(ctx, n.env.Store, n.env.Keys.Namespace)
	if err != nil {
		return err
	}
	n.mu.Lock()
	n.setMembersLocked(ms)
	n.mu.Unlock()
	// Only a node that knows the homes answers others: it would not tell
	// the homes of its own changes, and the promises it made would not
	// hold.
	n.started.Store(true)
	return nil
}

// keepMembers reads the members now and then, and at once when a peer
// failed (see peerFailed), until ctx ends.
func (n *Protocol) keepMembers(ctx context.Context) {
	every.Run(ctx, n.t.refresh, n.refreshNow, func() {
		rctx, cancel := context.WithTimeout(ctx, n.t.timeout)
		defer cancel()
		if err := n.refresh(rctx); err != nil && ctx.Err() == nil {
			n.log.Warn("cannot read the job's members; notices go to the members known", "err", err)
		}
	})
}

// peerFailed notes that a peer could not be reached: the members are read
// again soon.
func (n *Protocol) peerFailed() {
	n.failed.Add(1)
	now := time.Now().UnixNano()
	if last := n.lastFail.Load(); now-last < int64(n.t.retry) || !n.lastFail.CompareAndSwap(last, now) {
		return
	}
	select {
	case n.refreshNow <- struct{}{}:
	default:
	}
}

// dirKey is the key a directory's home is chosen by.
func (n *Protocol) dirKey(dir string) string {
	if dir == "" {
		return n.env.Keys.Namespace + "/"
	}
	return n.env.Keys.Key(dir)
}

// homeOf returns the home of directory dir and the members' epoch.
func (n *Protocol) homeOf(dir string) (hfl.Member, uint64, bool) {
	key := n.dirKey(dir)
	n.mu.Lock()
	defer n.mu.Unlock()
	m, ok := rendezvous(n.members, key, "")
	return m, n.epoch, ok
}

// previousHome returns, if the home of dir joined less than handoff ago,
// the home the others chose before it came. A node first seen after the
// home never was dir's home in any node's view (a view that holds it
// holds the home, which registered before), so nothing is passed on to
// it: the first node of a job, home of most directories at first, does
// not send every change twice while the others join.
func (n *Protocol) previousHome(dir string) (hfl.Member, bool) {
	key := n.dirKey(dir)
	n.mu.Lock()
	defer n.mu.Unlock()
	h, ok := rendezvous(n.members, key, "")
	if !ok || time.Since(n.since[h.Node]) >= n.t.handoff {
		return hfl.Member{}, false
	}
	prev, ok := rendezvous(n.members, key, h.Node)
	if !ok || n.since[prev.Node].After(n.since[h.Node]) {
		return hfl.Member{}, false
	}
	return prev, true
}

// rendezvous returns the member that scores highest for key, skipping the
// node skip.
func rendezvous(members []hfl.Member, key, skip string) (hfl.Member, bool) {
	var best hfl.Member
	var bestScore uint64
	found := false
	for _, m := range members {
		if m.Node == skip {
			continue
		}
		if s := homeScore(m.Node, key); !found || s > bestScore {
			best, bestScore, found = m, s, true
		}
	}
	return best, found
}

// homeScore is node's rendezvous score for key: 64-bit FNV-1a of node, a
// NUL byte and key (computed in place: it runs for every member whenever
// a home is chosen).
func homeScore(node, key string) uint64 {
	const offset, prime = 14695981039346656037, 1099511628211
	h := uint64(offset)
	for i := 0; i < len(node); i++ {
		h = (h ^ uint64(node[i])) * prime
	}
	h *= prime // the NUL byte: h ^ 0 == h
	for i := 0; i < len(key); i++ {
		h = (h ^ uint64(key[i])) * prime
	}
	return h
}

func (n *Protocol) member(node string) (hfl.Member, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	m := n.memberLocked(node)
	return m, m.Node != ""
}

// lastSeen returns node as this node last saw it among the members.
func (n *Protocol) lastSeen(node string) (hfl.Member, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	m, ok := n.seen[node]
	return m, ok
}

func (n *Protocol) memberLocked(node string) hfl.Member {
	i := sort.Search(len(n.members), func(i int) bool { return n.members[i].Node >= node })
	if i < len(n.members) && n.members[i].Node == node {
		return n.members[i]
	}
	return hfl.Member{}
}

// send delivers a notice to m and returns the reply. Notices to one node
// that are sent while one is on its way there go together in the next
// message (see outbox).
func (n *Protocol) send(ctx context.Context, m hfl.Member, msg notice) ([]byte, error) {
	b := encodeNotice(msg)
	if !batchable(msg) || len(b) > maxBatchBytes {
		return n.sendNow(ctx, m, b)
	}
	return n.outboxOf(m).send(ctx, b)
}

// sendNow sends one message, a notice or a batch of them, to m.
func (n *Protocol) sendNow(ctx context.Context, m hfl.Member, b []byte) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, n.t.timeout)
	defer cancel()
	n.sent.Add(1)
	rb, err := n.peers.Message(ctx, m.Addr, m.Node, b)
	if err != nil {
		if ctx.Err() == nil || errors.Is(ctx.Err(), context.DeadlineExceeded) {
			n.peerFailed()
		}
		return nil, err
	}
	return rb, nil
}

// sendAside sends a notice without waiting for it; failures only count.
func (n *Protocol) sendAside(m hfl.Member, msg notice) {
	workers.Go(func() {
		if _, err := n.send(n.ctx, m, msg); err != nil && n.ctx.Err() == nil {
			n.log.Debug("notice not delivered", "to", m.Node, "kind", msg.Kind, "path", msg.Path, "err", err)
		}
	})
}

// withBytes returns rec with a small file's bytes, if this node holds them
// as its home or was sent them.
func (n *Protocol) withBytes(rec hfl.Record) hfl.Record {
	if rec = n.home.withHeld(rec); rec.Inline == nil {
		rec = n.holder.attachBytes(rec)
	}
	return rec
}

// nextPublish numbers a publish of this node.
func (n *Protocol) nextPublish() uint64 { return n.publish.Add(1) }

// HandleMessage answers a notice from node from (the transport's message
// handler).
func (n *Protocol) HandleMessage(ctx context.Context, from string, msg []byte) ([]byte, error) {
	if !n.started.Load() {
		return nil, errors.New("this node takes no notices yet")
	}
	if isBatch(msg) {
		return n.handleBatch(ctx, from, msg)
	}
	in, err := decodeNotice(msg)
	if err != nil {
		return nil, fmt.Errorf("bad notice: %w", err)
	}
	return n.handle(ctx, from, in)
}

// handle answers notice in from node from.
func (n *Protocol) handle(ctx context.Context, from string, in notice) ([]byte, error) {
	n.received.Add(1)
	if _, known := n.member(from); !known && in.Kind != kindJoin {
		n.peerFailed() // a member this node has not heard of: read the list again
	}
	switch in.Kind {
	case kindJoin:
		if in.Member == nil || in.Member.Node != from || in.Member.Addr == "" {
			return nil, errors.New("bad notice: a join names another node")
		}
		n.joined(*in.Member)
		return nil, nil
	case kindPublished:
		if in.Rec == nil {
			return nil, errors.New("bad notice: no record")
		}
		rec := *in.Rec
		rec.Inline = in.Inline
		if _, err := hfl.CleanPath(rec.Path); err != nil || rec.Owner == "" || (rec.Owner != from && !in.Forwarded) || (rec.Generation == 0) != rec.Provisional {
			return nil, fmt.Errorf("bad notice: record %+v from %s", *in.Rec, from)
		}
		if !inlineFits(rec) {
			return nil, fmt.Errorf("bad notice: %d bytes sent with a record of %s of %d bytes", len(rec.Inline.Data), rec.Path, rec.Size)
		}
		r := n.home.published(ctx, from, rec, in.Publish, in.Sync, in.Forwarded, in.Settle)
		r.Inline = nil
		return encodeReply(r), nil
	case kindUnpublished:
		if _, err := hfl.CleanPath(in.Path); err != nil || in.Gen == 0 {
			return nil, fmt.Errorf("bad notice: removal of %q at generation %d", in.Path, in.Gen)
		}
		r := n.home.unpublished(ctx, from, in.Path, in.Gen, in.Sync, in.Forwarded)
		r.Inline = nil
		return encodeReply(r), nil
	case kindAsk:
		if _, err := hfl.CleanPath(in.Path); err != nil {
			return nil, fmt.Errorf("bad notice: %w", err)
		}
		r := n.home.ask(from, in.Path, in.After, in.Ahead)
		return encodeReply(r), nil
	case kindList:
		if in.Path != "" {
			if _, err := hfl.CleanPath(in.Path); err != nil {
				return nil, fmt.Errorf("bad notice: %w", err)
			}
		}
		r := n.home.list(from, in.Path)
		r.Inline = nil
		return encodeReply(r), nil
	case kindRevoke:
		n.holder.revoked(from)
		return nil, nil
	case kindBreak:
		if _, err := hfl.CleanPath(in.Path); err != nil {
			return nil, fmt.Errorf("bad notice: %w", err)
		}
		if in.Rec != nil {
			rec := *in.Rec
			rec.Inline = in.Inline
			if rec.Path != in.Path || !inlineFits(rec) {
				return nil, fmt.Errorf("bad notice: a break of %s with record %+v", in.Path, *in.Rec)
			}
			in.Rec, in.Gen = &rec, 0
		}
		n.holder.broken(from, in)
		return nil, nil
	}
	return nil, fmt.Errorf("bad notice: unknown kind %v", in.Kind)
}

func (n *Protocol) stats() hfl.NoticeStats {
	n.mu.Lock()
	members := len(n.members)
	n.mu.Unlock()
	return hfl.NoticeStats{Members: members, Sent: n.sent.Load(), Received: n.received.Load(), Failed: n.failed.Load(),
		Breaks: n.breaks.Load(), Broken: n.broken.Load(), Asked: n.asked.Load(), Holders: n.home.holders(), Promises: n.holder.promises(),
		WokenBy: n.woken.Load(), StoreWaits: n.storeWaits.Load(), HomeWaits: n.homeWaits.Load(),
		SilentHolders: n.silent.Load(), Revoked: n.revoked.Load(), Batched: n.batched.Load(),
		HeldLookups: n.heldLookups.Load(), HeldRunOut: n.heldRunOut.Load()}
}
