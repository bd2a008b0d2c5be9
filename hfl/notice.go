package hfl

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// Notices tell waiting consumers of a publish without a round trip through
// the global store. Every path has a home: the live member of the job that
// scores highest for the path's key (rendezvous hashing), so that the work
// spreads over the nodes and every node that sees the same members picks
// the same home. An owner that published a record sends it to the path's
// home; a consumer asks the home before the global store, and a waiting
// consumer subscribes there, to be sent the record as soon as it arrives.
//
// The global store stays the authority. A notice is only a shortcut: a
// lost one (the home died, a node joined and the members disagree for a
// moment) costs a waiting consumer noticeGrace, after which it waits on
// the store as well. Records come from peers that proved they hold the
// job's secret, as anyone who can write the store can.

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
	// resubscribe: a long wait renews its subscription this often, and a
	// home forgets subscriptions older than subscriptionTTL.
	resubscribe     = 30 * time.Second
	subscriptionTTL = 3 * resubscribe
	// noticeTimeout bounds one message to a peer.
	noticeTimeout = 5 * time.Second
	// membersRefresh is how often the list of live members is read again;
	// a peer that cannot be reached makes it read at once (at most every
	// membersRetry).
	membersRefresh = 5 * time.Second
	membersRetry   = 200 * time.Millisecond
)

// maxSubscriptions bounds the subscriptions a home keeps.
const maxSubscriptions = 1 << 16

// A home keeps provisional records (sent ahead of their publish) until the
// committed record follows, for consumers that start waiting in between:
// at most maxAhead of them, none older than aheadTTL.
const (
	maxAhead = 4096
	aheadTTL = 10 * time.Second
)

// NoticeStats counts notices.
type NoticeStats struct {
	Members    int    `json:"members"`
	Sent       uint64 `json:"sent"`
	Received   uint64 `json:"received"`
	Failed     uint64 `json:"failed"`
	Pushed     uint64 `json:"pushed"`
	WokenBy    uint64 `json:"waits_woken_by_notice"`
	StoreWaits uint64 `json:"waits_on_store"`
}

// A notice message. Kind says which fields count.
type notice struct {
	Kind string  `json:"k"`
	Rec  *Record `json:"rec,omitempty"`
	// Member is a joining daemon's registration.
	Member *Member `json:"member,omitempty"`
	Path   string  `json:"path,omitempty"`
	Owner  string  `json:"owner,omitempty"`
	After  uint64  `json:"after,omitempty"`
	// Subscribe: an ask that finds nothing newer leaves a subscription.
	Subscribe bool `json:"sub,omitempty"`
	// Ahead: a provisional record answers the ask too.
	Ahead bool `json:"ahead,omitempty"`
	// Inline is Rec's bytes, for a small file.
	Inline *Inline `json:"inline,omitempty"`
	// Publish numbers an owner's publishes: its provisional and its
	// committed notice of one publish carry the same number.
	Publish uint64 `json:"pn,omitempty"`
}

const (
	kindPublished   = "pub"   // owner → home, home → subscriber: Rec
	kindUnpublished = "unpub" // owner → home: Path, Owner
	kindAsk         = "ask"   // consumer → home: Path, After, Subscribe
	kindJoin        = "join"  // a starting daemon → every member: Member
)

// askReply answers an ask.
type askReply struct {
	Rec    *Record `json:"rec,omitempty"`
	Inline *Inline `json:"inline,omitempty"`
}

// publishedNotice is the notice of rec, with its bytes if it has them.
func publishedNotice(rec Record, publish uint64) notice {
	return notice{Kind: kindPublished, Rec: &rec, Inline: rec.Inline, Publish: publish}
}

// encodeNotice encodes a notice or a reply: JSON, followed, when it
// carries a small file's bytes, by a NUL byte and the bytes. (JSON text
// never holds a raw NUL, and decoding the JSON does not scan the bytes.)
func encodeNotice(v any, in *Inline) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil || in == nil {
		return b, err
	}
	b = append(b, 0)
	return append(b, in.Data...), nil
}

// decodeNotice decodes what encodeNotice encoded into v, and sets
// *inline's bytes: a copy, since msg is the transport's. An inline without
// bytes, or bytes without an inline, is an error.
func decodeNotice(msg []byte, v any, inline **Inline) error {
	head, data, withData := msg, []byte(nil), false
	if i := bytes.IndexByte(msg, 0); i >= 0 {
		head, data, withData = msg[:i], msg[i+1:], true
	}
	if err := json.Unmarshal(head, v); err != nil {
		return err
	}
	if (*inline != nil) != withData {
		return errors.New("bytes and their description do not go together")
	}
	if withData {
		(*inline).Data = bytes.Clone(data)
	}
	return nil
}

type aheadRecord struct {
	rec Record
	at  time.Time
}

type subscription struct {
	node  string
	after uint64
	since time.Time
}

// notices is the locator's part that sends and answers notices.
type notices struct {
	l     *Locator
	self  string
	peers Peers
	log   *slog.Logger
	ctx   context.Context // ends when the daemon stops

	mu      sync.Mutex
	members []Member // live members, this node included, sorted by node
	subs    map[string][]subscription
	nsubs   int
	ahead   map[string]aheadRecord
	held    *heldData
	publish atomic.Uint64 // numbers this owner's publishes
	// waits holds, per path, a channel closed when a notice of the path
	// arrives here, and how many waits use it.
	waits map[string]*noticeWait

	refreshNow chan struct{}
	lastFail   atomic.Int64 // unix ns of the last forced refresh

	sent, received, failed, pushed, woken, storeWaits atomic.Uint64
}

// EnableNotices makes the locator send and answer notices through peers, as
// node self; it reads the members of the job now and again until ctx ends.
// HandleMessage must receive the messages peers send.
func (l *Locator) EnableNotices(ctx context.Context, self string, peers Peers, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	n := &notices{l: l, self: self, peers: peers, log: log, ctx: ctx,
		subs: make(map[string][]subscription), ahead: make(map[string]aheadRecord), held: newHeldData(), waits: make(map[string]*noticeWait), refreshNow: make(chan struct{}, 1)}
	n.publish.Store(uint64(time.Now().UnixNano()))
	if err := n.refresh(ctx); err != nil {
		return err
	}
	l.notices.Store(n)
	go n.keepMembers()
	// Members read the list only now and again: tell them at once that
	// this node is here, so that they count it in when choosing homes.
	n.mu.Lock()
	var me Member
	others := make([]Member, 0, len(n.members))
	for _, m := range n.members {
		if m.Node == n.self {
			me = m
		} else {
			others = append(others, m)
		}
	}
	n.mu.Unlock()
	if me.Node != "" {
		for _, m := range others {
			n.sendAside(m, notice{Kind: kindJoin, Member: &me})
		}
	}
	return nil
}

// joined adds or updates a member that announced itself.
func (n *notices) joined(m Member) {
	n.mu.Lock()
	defer n.mu.Unlock()
	i := sort.Search(len(n.members), func(i int) bool { return n.members[i].Node >= m.Node })
	if i < len(n.members) && n.members[i].Node == m.Node {
		n.members[i] = m
		return
	}
	n.members = append(n.members, Member{})
	copy(n.members[i+1:], n.members[i:])
	n.members[i] = m
}

// refresh reads the live members.
func (n *notices) refresh(ctx context.Context) error {
	vals, err := n.l.store.List(ctx, memberKey(n.l.cfg.Namespace, ""))
	if err != nil {
		return fmt.Errorf("list the members of namespace %s: %w", n.l.cfg.Namespace, err)
	}
	ms := make([]Member, 0, len(vals))
	for _, v := range vals {
		var m Member
		if json.Unmarshal(v, &m) == nil && m.Node != "" {
			ms = append(ms, m)
		}
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].Node < ms[j].Node })
	n.mu.Lock()
	n.members = ms
	n.mu.Unlock()
	return nil
}

func (n *notices) keepMembers() {
	t := time.NewTicker(membersRefresh)
	defer t.Stop()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-t.C:
		case <-n.refreshNow:
		}
		ctx, cancel := context.WithTimeout(n.ctx, noticeTimeout)
		if err := n.refresh(ctx); err != nil && n.ctx.Err() == nil {
			n.log.Warn("cannot read the job's members; notices go to the members known", "err", err)
		}
		cancel()
	}
}

// peerFailed notes that a peer could not be reached: the members are read
// again soon.
func (n *notices) peerFailed() {
	n.failed.Add(1)
	now := time.Now().UnixNano()
	if last := n.lastFail.Load(); now-last < int64(membersRetry) || !n.lastFail.CompareAndSwap(last, now) {
		return
	}
	select {
	case n.refreshNow <- struct{}{}:
	default:
	}
}

// home returns the member that is path's home.
func (n *notices) home(path string) (Member, bool) {
	key := n.l.Key(path)
	n.mu.Lock()
	defer n.mu.Unlock()
	var best Member
	var bestScore uint64
	found := false
	for _, m := range n.members {
		if s := homeScore(m.Node, key); !found || s > bestScore {
			best, bestScore, found = m, s, true
		}
	}
	return best, found
}

// homeScore is node's rendezvous score for key: 64-bit FNV-1a of node, a
// NUL byte and key (computed in place: it runs for every member on every
// publish and lookup).
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

func (n *notices) member(node string) (Member, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	i := sort.Search(len(n.members), func(i int) bool { return n.members[i].Node >= node })
	if i < len(n.members) && n.members[i].Node == node {
		return n.members[i], true
	}
	return Member{}, false
}

// send delivers a notice to m and returns the reply.
func (n *notices) send(ctx context.Context, m Member, msg notice) ([]byte, error) {
	b, err := encodeNotice(msg, msg.Inline)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, noticeTimeout)
	defer cancel()
	n.sent.Add(1)
	reply, err := n.peers.Message(ctx, m.Addr, m.Node, b)
	if err != nil {
		if ctx.Err() == nil || errors.Is(ctx.Err(), context.DeadlineExceeded) {
			n.peerFailed()
		}
		return nil, err
	}
	return reply, nil
}

// sendAside sends a notice without waiting for it; failures only count.
func (n *notices) sendAside(m Member, msg notice) {
	n.sendAfter(m, msg, nil)
}

// sendAfter sends a notice without waiting for it, once after is closed (if
// not nil); the channel it returns is closed when the notice was delivered
// or failed.
func (n *notices) sendAfter(m Member, msg notice, after <-chan struct{}) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		if after != nil {
			select {
			case <-after:
			case <-n.ctx.Done():
				return
			}
		}
		if _, err := n.send(n.ctx, m, msg); err != nil && n.ctx.Err() == nil {
			n.log.Debug("notice not delivered", "to", m.Node, "kind", msg.Kind, "path", msg.Path, "err", err)
		}
	}()
	return done
}

// published tells path's home of rec, which this node just published as
// its publish number publish (see nextPublish), once after is closed (if
// not nil): the committed record follows the provisional one, so that the
// home, given both in order, keeps the bytes the first one carries. The
// channel returned is closed when the home was told (or could not be).
func (n *notices) published(rec Record, publish uint64, after <-chan struct{}) <-chan struct{} {
	h, ok := n.home(rec.Path)
	if !ok {
		return closedChan
	}
	if h.Node == n.self {
		n.arrived(rec, publish, true)
		return closedChan
	}
	return n.sendAfter(h, publishedNotice(rec, publish), after)
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// nextPublish numbers a publish of this node. Numbers start from the clock,
// so that they are not reused when the daemon restarts.
func (n *notices) nextPublish() uint64 { return n.publish.Add(1) }

// unpublished tells path's home that owner withdrew its record.
func (n *notices) unpublished(path, owner string) {
	if h, ok := n.home(path); ok && h.Node != n.self {
		n.sendAside(h, notice{Kind: kindUnpublished, Path: path, Owner: owner})
	}
}

// arrived takes in a record: the cache keeps it (unless provisional),
// local waits wake, and, if this node is its home (fromOwner), subscribers
// are sent it, and the home keeps its bytes.
func (n *notices) arrived(rec Record, publish uint64, fromOwner bool) {
	n.mu.Lock()
	if fromOwner {
		if rec.Inline != nil {
			n.held.put(rec, publish)
		} else if !rec.Provisional {
			n.held.commit(rec, publish)
			rec = n.held.attach(rec)
		}
	}
	if !rec.Provisional {
		n.l.cache.put(rec)
		delete(n.ahead, rec.Path)
	} else if fromOwner {
		n.keepAheadLocked(rec)
	}
	if w, ok := n.waits[rec.Path]; ok {
		w.rec = rec
		close(w.ch)
		delete(n.waits, rec.Path)
	}
	var to []subscription
	if fromOwner {
		keep := n.subs[rec.Path][:0]
		for _, s := range n.subs[rec.Path] {
			if s.after < rec.Generation || rec.Provisional {
				to = append(to, s)
			} else {
				keep = append(keep, s)
			}
		}
		n.nsubs -= len(to)
		if len(keep) == 0 {
			delete(n.subs, rec.Path)
		} else {
			n.subs[rec.Path] = keep
		}
	}
	n.mu.Unlock()
	for _, s := range to {
		if s.node == n.self {
			continue
		}
		if m, ok := n.member(s.node); ok {
			n.pushed.Add(1)
			n.sendAside(m, publishedNotice(rec, 0))
		}
	}
}

// withHeld returns rec with its bytes, if this node holds them.
func (n *notices) withHeld(rec Record) Record {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.held.attach(rec)
}

// keepAheadLocked keeps a provisional record for consumers that ask for it
// before its committed record arrives.
func (n *notices) keepAheadLocked(rec Record) {
	now := time.Now()
	if len(n.ahead) >= maxAhead {
		for path, a := range n.ahead {
			if now.Sub(a.at) >= aheadTTL {
				delete(n.ahead, path)
			}
		}
		if len(n.ahead) >= maxAhead {
			return // the consumers that ask now wait for the committed record
		}
	}
	rec.Inline = nil // held apart, within its own bound
	n.ahead[rec.Path] = aheadRecord{rec: rec, at: now}
}

// ask asks path's home for a record newer than after, subscribing there if
// it has none. asked is false when no home could be asked (then only the
// store can tell).
func (n *notices) ask(ctx context.Context, path string, after uint64, subscribe, ahead bool) (rec Record, found, asked bool) {
	h, ok := n.home(path)
	if !ok {
		return Record{}, false, false
	}
	if h.Node == n.self {
		rec, found := n.answer(n.self, path, after, false, ahead)
		return rec, found, true
	}
	b, err := n.send(ctx, h, notice{Kind: kindAsk, Path: path, After: after, Subscribe: subscribe, Ahead: ahead})
	if err != nil {
		return Record{}, false, false
	}
	var r askReply
	if decodeNotice(b, &r, &r.Inline) != nil {
		return Record{}, false, false
	}
	if r.Rec == nil || r.Rec.Path != path {
		return Record{}, false, true
	}
	rec = *r.Rec
	if rec.Inline = r.Inline; !inlineFits(rec) {
		rec.Inline = nil // a transfer brings it
	}
	switch {
	case rec.Provisional:
		return rec, ahead, true
	case rec.Generation <= after:
		return Record{}, false, true
	}
	n.l.cache.put(rec)
	return rec, true, true
}

// answer answers an ask from node: the record known here if it is newer
// than after, or (withAhead, for a waiting consumer) one sent ahead of its
// publish, or else, if subscribe, a subscription.
func (n *notices) answer(node, path string, after uint64, subscribe, withAhead bool) (Record, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if rec, ok := n.l.cache.get(path); ok && rec.Generation > after {
		return n.held.attach(rec), true
	}
	if a, ok := n.ahead[path]; ok && withAhead && time.Since(a.at) < aheadTTL {
		return n.held.attach(a.rec), true
	}
	if !subscribe {
		return Record{}, false
	}
	now := time.Now()
	subs := n.subs[path]
	for i := range subs {
		if subs[i].node == node {
			subs[i].after, subs[i].since = after, now
			return Record{}, false
		}
	}
	if n.nsubs >= maxSubscriptions {
		n.expireLocked(now)
		if n.nsubs >= maxSubscriptions {
			return Record{}, false // the asker falls back on the store
		}
	}
	n.subs[path] = append(subs, subscription{node: node, after: after, since: now})
	n.nsubs++
	return Record{}, false
}

// expireLocked drops subscriptions older than subscriptionTTL.
func (n *notices) expireLocked(now time.Time) {
	for path, subs := range n.subs {
		keep := subs[:0]
		for _, s := range subs {
			if now.Sub(s.since) < subscriptionTTL {
				keep = append(keep, s)
			}
		}
		n.nsubs -= len(subs) - len(keep)
		if len(keep) == 0 {
			delete(n.subs, path)
		} else {
			n.subs[path] = keep
		}
	}
}

type noticeWait struct {
	ch    chan struct{}
	users int
	rec   Record // the notice's record, once ch is closed
}

// waitChannel returns what is closed when a notice of path arrives, and the
// function to call when done with it.
func (n *notices) waitChannel(path string) (*noticeWait, func()) {
	n.mu.Lock()
	defer n.mu.Unlock()
	w, ok := n.waits[path]
	if !ok {
		w = &noticeWait{ch: make(chan struct{})}
		n.waits[path] = w
	}
	w.users++
	return w, func() {
		n.mu.Lock()
		defer n.mu.Unlock()
		if w.users--; w.users == 0 && n.waits[path] == w {
			delete(n.waits, path)
		}
	}
}

// wait waits for a record of path newer than after: told by a notice, or,
// from noticeGrace on (at once if the home cannot be asked), by the store.
//
// With ahead, a provisional record (sent ahead of its publish) ends the
// wait too.
func (n *notices) wait(ctx context.Context, path string, after uint64, ahead bool) (Record, error) {
	var store chan error
	var storeRec Record
	storeCtx, stopStore := context.WithCancel(ctx)
	defer stopStore()
	startStore := func() {
		if store != nil {
			return
		}
		n.storeWaits.Add(1)
		store = make(chan error, 1)
		go func() {
			rec, err := n.l.store.Wait(storeCtx, n.l.Key(path), after)
			storeRec = rec
			store <- err
		}()
	}
	grace := time.NewTimer(noticeGrace)
	defer grace.Stop()
	renew := time.NewTicker(resubscribe)
	defer renew.Stop()
	for {
		// Take the channel before asking, so that a notice between the
		// answer and the wait is not missed.
		w, done := n.waitChannel(path)
		rec, found, asked := n.ask(ctx, path, after, true, ahead)
		if !found {
			rec, found = n.l.cache.get(path)
			found = found && rec.Generation > after
		}
		if found {
			done()
			return rec, nil
		}
		if !asked {
			startStore()
		}
		woken, storeErr, stored, err := n.waitOnce(ctx, w.ch, grace.C, renew.C, &store, startStore)
		done()
		switch {
		case woken:
			n.woken.Add(1)
			if (w.rec.Provisional && ahead) || w.rec.Generation > after {
				return w.rec, nil
			}
		case stored:
			return n.storeDone(storeRec, storeErr)
		case err != nil:
			return Record{}, err
		}
	}
}

// waitOnce waits for one of: a notice (woken), the store's answer
// (stored), a renewal, or the end of ctx (err). The grace timer starts the
// store's wait.
func (n *notices) waitOnce(ctx context.Context, ch <-chan struct{}, grace, renew <-chan time.Time, store *chan error, startStore func()) (woken bool, storeErr error, stored bool, err error) {
	for {
		select {
		case <-ch:
			return true, nil, false, nil
		case <-grace:
			startStore()
			grace = nil
		case e := <-*store:
			return false, e, true, nil
		case <-renew:
			return false, nil, false, nil
		case <-ctx.Done():
			return false, nil, false, ctx.Err()
		}
	}
}

func (n *notices) storeDone(rec Record, err error) (Record, error) {
	if err != nil {
		return Record{}, err
	}
	n.l.cache.put(rec)
	return rec, nil
}

// HandleMessage answers a notice from node from (the transport's message
// handler).
func (l *Locator) HandleMessage(ctx context.Context, from string, msg []byte) ([]byte, error) {
	n := l.notices.Load()
	if n == nil {
		return nil, errors.New("this node takes no notices")
	}
	var in notice
	if err := decodeNotice(msg, &in, &in.Inline); err != nil {
		return nil, fmt.Errorf("bad notice: %w", err)
	}
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
		if _, err := CleanPath(rec.Path); err != nil || rec.Owner == "" || (rec.Generation == 0) != rec.Provisional {
			return nil, fmt.Errorf("bad notice: record %+v", *in.Rec)
		}
		if !inlineFits(rec) {
			return nil, fmt.Errorf("bad notice: %d bytes sent with a record of %s of %d bytes", len(rec.Inline.Data), rec.Path, rec.Size)
		}
		// From the owner, this node is the home; otherwise it is a home
		// passing the record on to this subscriber.
		n.arrived(rec, in.Publish, rec.Owner == from)
		return nil, nil
	case kindUnpublished:
		n.mu.Lock()
		if rec, ok := l.cache.get(in.Path); ok && rec.Owner == in.Owner && in.Owner == from {
			l.cache.remove(in.Path)
		}
		if a, ok := n.ahead[in.Path]; ok && a.rec.Owner == in.Owner && in.Owner == from {
			delete(n.ahead, in.Path)
		}
		if in.Owner == from {
			n.held.drop(in.Path, in.Owner)
		}
		n.mu.Unlock()
		return nil, nil
	case kindAsk:
		if _, err := CleanPath(in.Path); err != nil {
			return nil, fmt.Errorf("bad notice: %w", err)
		}
		rec, found := n.answer(from, in.Path, in.After, in.Subscribe, in.Ahead)
		if !found {
			return json.Marshal(askReply{})
		}
		return encodeNotice(askReply{Rec: &rec, Inline: rec.Inline}, rec.Inline)
	}
	return nil, fmt.Errorf("bad notice: unknown kind %q", in.Kind)
}

func (n *notices) stats() NoticeStats {
	n.mu.Lock()
	members := len(n.members)
	n.mu.Unlock()
	return NoticeStats{Members: members, Sent: n.sent.Load(), Received: n.received.Load(), Failed: n.failed.Load(),
		Pushed: n.pushed.Load(), WokenBy: n.woken.Load(), StoreWaits: n.storeWaits.Load()}
}
