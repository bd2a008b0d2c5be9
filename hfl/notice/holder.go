package notice

import (
	"container/list"
	"context"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/dyadfs/dyadfs/hfl"
	"github.com/dyadfs/dyadfs/internal/workers"
)

// The holder side of notices: what this node knows of paths and listings
// under a home's promise, the opens that wait for a notice, and what this
// node does when a home tells it of a change.

// maxPromises bounds the paths this node remembers; the oldest go first
// (a path forgotten is asked about again).
const maxPromises = 1 << 18

// maxListing bounds the entries of a listing a node keeps; a larger
// directory is read from the store page by page each time.
const maxListing = 1 << 16

// promise is a home's word to tell this node of any change of what it
// covers.
type promise struct {
	home    hfl.Member // the home, with its incarnation (Started)
	epoch   uint64     // the members' epoch it was last checked at
	expires time.Time
}

// known is what this node knows of one path.
type known struct {
	exists bool
	rec    hfl.Record
	gen    uint64 // of the record, or of its removal (0: never published)
	p      promise
	elem   *list.Element
}

// knownListing is a directory's whole listing.
type knownListing struct {
	p    promise
	recs map[string]hfl.Record // by name
	// sorted is recs in name order, made when a listing is read and
	// dropped when an entry changes.
	sorted []hfl.Record
}

// set changes one entry of the listing to rec, or removes it (at
// generation gen), unless the entry is newer: changes can be told out of
// order (this node's own publish returns after a newer one elsewhere was
// told).
func (l *knownListing) set(name string, rec hfl.Record, exists bool, gen uint64) {
	if old, ok := l.recs[name]; ok && old.Generation > gen {
		return
	}
	if exists {
		rec.Inline = nil
		l.recs[name] = rec
	} else {
		delete(l.recs, name)
	}
	l.sorted = nil
}

type holderSide struct {
	n *Protocol

	mu      sync.Mutex
	known   map[string]*known
	order   *list.List // of paths, front: most recently used
	lists   map[string]*knownListing
	flights map[string]*flight
	// misses counts, per directory, paths asked about there that were
	// missing; tooLarge, directories found too large to keep the listing
	// of (see wantListing).
	misses   map[string]missCount
	tooLarge map[string]time.Time
	// bytes keeps small files' bytes that answers and notices brought,
	// for the open that follows the lookup (oldest first out).
	bytes      map[string]hfl.Record
	bytesOrder []string
	nbytes     int
	// ahead keeps the records sent ahead of their commit that this node
	// was told as a lister, until the commit is told: a consumer that
	// starts waiting for the path meanwhile takes it (see aheadOf).
	ahead aheadRecords
	// marks holds the paths held back for a commit that is coming (see
	// holdMark), with how many of them each directory has; settled is
	// closed, and replaced, whenever a hold ends.
	marks      map[string]*holdMark
	markedDirs map[string]int
	settled    chan struct{}
}

// holdMark holds a path back for a publish whose commit its home told is
// coming (see reply.Pending): what this node knew of the path, under a
// promise or in its directory's listing, does not answer until the
// commit, or its failure, is told, or the hold runs out.
type holdMark struct {
	owner   string
	publish uint64
	// rec is the record sent ahead, with a small file's bytes, if told
	// (Path is empty if not).
	rec   hfl.Record
	until time.Time
	// overtaken: another change of the path was told meanwhile, so rec
	// may not be what the namespace shows once the hold ends.
	overtaken bool
}

// settleWait bounds how long a lookup of a path held back waits for the
// commit's notice before it reads the store.
const settleWait = time.Second

// maxHolderAhead bounds the records sent ahead that a holder keeps.
const maxHolderAhead = 256

// maxHolderBytes bounds the small files' bytes a holder keeps.
const maxHolderBytes = 8 << 20

// flight is a question to a home in progress: a change told meanwhile
// makes its answer unfit to keep (it may be older than the change).
type flight struct {
	users  int
	broken bool
	// ended are the holds (see holdMark) whose end was told meanwhile:
	// an answer that the path is held back for one of them is late.
	ended []holdKey
}

// maxFlightEnds bounds the holds' ends a flight notes (questions that
// keep overlapping keep it going): one not noted costs a wait.
const maxFlightEnds = 16

// holdKey names the publish a path is held back for.
type holdKey struct {
	owner   string
	publish uint64
}

func newHolderSide(n *Protocol) *holderSide {
	return &holderSide{n: n, known: make(map[string]*known), order: list.New(), lists: make(map[string]*knownListing),
		flights: make(map[string]*flight), bytes: make(map[string]hfl.Record), ahead: make(aheadRecords),
		misses: make(map[string]missCount), tooLarge: make(map[string]time.Time),
		marks: make(map[string]*holdMark), markedDirs: make(map[string]int), settled: make(chan struct{})}
}

// promiseFrom makes the promise of a reply from home m, sent at sent.
func (s *holderSide) promiseFrom(m hfl.Member, r reply, epoch uint64, sent time.Time) (promise, bool) {
	if r.NoPromise || !r.Home.Equal(m.Started) {
		return promise{}, false
	}
	return promise{home: m, epoch: epoch, expires: sent.Add(s.n.t.promiseTTL - s.n.t.promiseMargin)}, true
}

// validLocked reports whether p still holds for dir: not run out, and made
// by the home this node's view of the members names now.
func (s *holderSide) validLocked(p *promise, dir string, now time.Time) bool {
	if p.home.Node == "" || now.After(p.expires) {
		return false
	}
	n := s.n
	h, epoch, ok := n.homeOf(dir)
	if !ok {
		return false
	}
	if p.epoch == epoch {
		return true
	}
	if h.Node != p.home.Node || !h.Started.Equal(p.home.Started) {
		return false
	}
	p.epoch = epoch
	return true
}

// lookup returns what this node knows of p under a promise that holds:
// from the path's own promise, or from its directory's listing.
func (s *holderSide) lookup(p string) (rec hfl.Record, exists bool, gen uint64, ok bool) {
	dir, name := hfl.SplitPath(p)
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.heldLocked(p, now) {
		return hfl.Record{}, false, 0, false
	}
	if k := s.known[p]; k != nil && s.validLocked(&k.p, dir, now) {
		s.order.MoveToFront(k.elem)
		return k.rec, k.exists, k.gen, true
	}
	if l := s.lists[dir]; l != nil && s.validLocked(&l.p, dir, now) {
		rec, ok := l.recs[name]
		return rec, ok, rec.Generation, true
	}
	return hfl.Record{}, false, 0, false
}

// holds reports whether this node holds a promise for p itself (not only
// through its directory's listing).
func (s *holderSide) holds(p string) bool {
	dir, _ := hfl.SplitPath(p)
	s.mu.Lock()
	defer s.mu.Unlock()
	k := s.known[p]
	return k != nil && s.validLocked(&k.p, dir, time.Now())
}

// listing returns the listing of dir, in name order, under a promise that
// holds. The slice is shared: callers do not change it.
func (s *holderSide) listing(dir string) ([]hfl.Record, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.lists[dir]
	now := time.Now()
	if l == nil || !s.validLocked(&l.p, dir, now) || s.heldDirLocked(dir, now) {
		return nil, false
	}
	if l.sorted == nil {
		l.sorted = make([]hfl.Record, 0, len(l.recs))
		for _, rec := range l.recs {
			l.sorted = append(l.sorted, rec)
		}
		sort.Slice(l.sorted, func(i, j int) bool { return l.sorted[i].Path < l.sorted[j].Path })
	}
	return l.sorted, true
}

// holdsListing reports whether this node holds the listing of dir under a
// promise that holds.
func (s *holderSide) holdsListing(dir string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.lists[dir]
	return l != nil && s.validLocked(&l.p, dir, time.Now())
}

// startFlight notes a question about p (a path, or a directory's listing
// with listing) before it is asked.
func (s *holderSide) startFlight(p string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.flights[p]
	if f == nil {
		f = &flight{}
		s.flights[p] = f
	}
	f.users++
}

// endFlight ends a question and reports whether a change of p was told
// while it was in flight.
func (s *holderSide) endFlight(p string) (broken bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.flights[p]
	if f == nil {
		return true
	}
	broken = f.broken
	if f.users--; f.users == 0 {
		delete(s.flights, p)
	}
	return broken
}

// learn keeps what this node now knows of p, under promise pr (if ok).
func (s *holderSide) learn(p string, rec hfl.Record, exists bool, gen uint64, pr promise, ok bool) {
	if !ok {
		return
	}
	rec.Inline = nil
	s.mu.Lock()
	defer s.mu.Unlock()
	s.learnLocked(p, rec, exists, gen, pr)
}

func (s *holderSide) learnLocked(p string, rec hfl.Record, exists bool, gen uint64, pr promise) {
	k := s.known[p]
	if k == nil {
		k = &known{}
		k.elem = s.order.PushFront(p)
		s.known[p] = k
		for s.order.Len() > maxPromises {
			last := s.order.Back()
			s.order.Remove(last)
			delete(s.known, last.Value.(string))
		}
	} else {
		s.order.MoveToFront(k.elem)
		if k.gen > gen {
			return // never let an older state replace a newer one
		}
		if k.gen == gen && pr.home.Node == "" {
			// The same state told again without a promise (a late
			// answer): the promise this node has for it stands.
			k.rec, k.exists = rec, exists
			return
		}
	}
	k.rec, k.exists, k.gen, k.p = rec, exists, gen, pr
}

// learnListing keeps the whole listing of dir under pr.
func (s *holderSide) learnListing(dir string, recs []hfl.Record, pr promise) {
	if len(recs) > maxListing {
		return
	}
	l := &knownListing{p: pr, recs: make(map[string]hfl.Record, len(recs))}
	for _, rec := range recs {
		rec.Inline = nil
		l.recs[rec.Name()] = rec
	}
	s.mu.Lock()
	s.lists[dir] = l
	s.mu.Unlock()
}

// madeHere notes a change this node made itself, committed in the store
// at generation gen (the home tells the others): in the listing of its
// directory, if this node holds it, and as what this node knows of p,
// unless it knows of a newer state (without a promise, if it had none:
// the home's answer brings one).
func (s *holderSide) madeHere(p string, rec hfl.Record, exists bool, gen uint64) {
	dir, name := hfl.SplitPath(p)
	rec.Inline = nil
	s.mu.Lock()
	defer s.mu.Unlock()
	k := s.known[p]
	if k != nil && k.gen > gen {
		return // a newer change was told meanwhile (a removal, say)
	}
	if l := s.lists[dir]; l != nil {
		l.set(name, rec, exists, gen)
	}
	if k == nil {
		s.learnLocked(p, rec, exists, gen, promise{})
	} else {
		k.rec, k.exists, k.gen = rec, exists, gen
	}
}

// knowsSince reports whether this node knows a state of p at least as new
// as generation gen.
func (s *holderSide) knowsSince(p string, gen uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := s.known[p]
	return k != nil && k.gen >= gen
}

// told returns the newest state of p this node knows, promised or not: a
// change told, or made here.
func (s *holderSide) told(p string) (rec hfl.Record, exists bool, gen uint64, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if k := s.known[p]; k != nil {
		return k.rec, k.exists, k.gen, true
	}
	return hfl.Record{}, false, 0, false
}

// forget drops what this node knows of p.
func (s *holderSide) forget(p string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if k := s.known[p]; k != nil {
		s.order.Remove(k.elem)
		delete(s.known, p)
	}
}

// keepBytes keeps the bytes rec carries, for a moment.
func (s *holderSide) keepBytes(rec hfl.Record) {
	if rec.Inline == nil || rec.Provisional || !inlineFits(rec) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.bytes[rec.Path]; ok {
		s.nbytes -= len(old.Inline.Data)
	} else {
		s.bytesOrder = append(s.bytesOrder, rec.Path)
	}
	s.bytes[rec.Path] = rec
	s.nbytes += len(rec.Inline.Data)
	for s.nbytes > maxHolderBytes && len(s.bytesOrder) > 0 {
		p := s.bytesOrder[0]
		s.bytesOrder = s.bytesOrder[1:]
		if old, ok := s.bytes[p]; ok {
			s.nbytes -= len(old.Inline.Data)
			delete(s.bytes, p)
		}
	}
	if len(s.bytesOrder) > 2*len(s.bytes)+64 {
		keep := s.bytesOrder[:0]
		for _, p := range s.bytesOrder {
			if _, ok := s.bytes[p]; ok {
				keep = append(keep, p)
			}
		}
		s.bytesOrder = keep
	}
}

// attachBytes returns rec with the bytes kept for exactly its version.
func (s *holderSide) attachBytes(rec hfl.Record) hfl.Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	if b, ok := s.bytes[rec.Path]; ok && b.Owner == rec.Owner && b.Generation == rec.Generation && b.Size == rec.Size && b.MtimeNs == rec.MtimeNs {
		rec.Inline = b.Inline
	}
	return rec
}

// keepAheadLocked keeps rec, a record of dir/name sent ahead of its
// commit, unless the listing this node holds has it committed already (a
// commit's notice can overtake the record sent ahead of it).
func (s *holderSide) keepAheadLocked(dir, name string, rec hfl.Record, now time.Time) {
	l := s.lists[dir]
	if l == nil {
		return // not a lister: the record is not kept (see aheadOf)
	}
	if c, ok := l.recs[name]; ok && c.Owner == rec.Owner && c.MtimeNs == rec.MtimeNs && c.Size == rec.Size {
		return
	}
	s.ahead.keep(rec, now, maxHolderAhead)
}

// aheadOf returns the record of p sent ahead of its commit that this node
// was told, if it still holds the listing of p's directory (which tells
// it of the commit, and so keeps the record from going stale unseen).
func (s *holderSide) aheadOf(p string) (hfl.Record, bool) {
	dir, _ := hfl.SplitPath(p)
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, ok := s.ahead.fresh(p, now)
	if l := s.lists[dir]; !ok || l == nil || !s.validLocked(&l.p, dir, now) {
		return hfl.Record{}, false
	}
	return rec, true
}

// markLocked holds p back for owner's publish publish, sent ahead as rec
// (Path empty if not told), until the commit is told or until.
func (s *holderSide) markLocked(p, owner string, publish uint64, rec hfl.Record, until time.Time) {
	if !inlineFits(rec) {
		rec.Inline = nil
	}
	m := s.marks[p]
	if m == nil {
		if len(s.marks) >= maxMarks {
			now := time.Now()
			for q := range s.marks {
				s.heldLocked(q, now) // ends those run out
			}
		}
		m = &holdMark{}
		s.marks[p] = m
		dir, _ := hfl.SplitPath(p)
		s.markedDirs[dir]++
	}
	*m = holdMark{owner: owner, publish: publish, rec: rec, until: until}
}

// maxMarks is how many holds a node keeps before it looks for those run
// out (a hold ends with its commit's notice; only lost ones run out).
const maxMarks = 1024

// unmarkLocked ends the hold of p, and wakes the lookups that wait.
func (s *holderSide) unmarkLocked(p string) {
	if _, ok := s.marks[p]; !ok {
		return
	}
	delete(s.marks, p)
	dir, _ := hfl.SplitPath(p)
	if s.markedDirs[dir]--; s.markedDirs[dir] <= 0 {
		delete(s.markedDirs, dir)
	}
	close(s.settled)
	s.settled = make(chan struct{})
}

// heldLocked reports whether p is held back at now. A hold that ran out
// ends, and with it what this node knew of p: the commit's notice was
// missed, so p is asked about again, and its directory's listing read
// again.
func (s *holderSide) heldLocked(p string, now time.Time) bool {
	m := s.marks[p]
	if m == nil {
		return false
	}
	if now.Before(m.until) {
		return true
	}
	s.unmarkLocked(p)
	if k := s.known[p]; k != nil {
		k.p = promise{}
	}
	s.dropListingLocked(p)
	return false
}

// dropListingLocked drops the listing of p's directory, if this node
// holds it, and tells the managed directory aside (it may tell the kernel).
func (s *holderSide) dropListingLocked(p string) {
	dir, _ := hfl.SplitPath(p)
	if _, ok := s.lists[dir]; !ok {
		return
	}
	delete(s.lists, dir)
	if local := s.n.env.Local; local != nil {
		workers.Go(func() { local.ListingDropped(dir) })
	}
}

// heldDirLocked reports whether a path of directory dir is held back.
func (s *holderSide) heldDirLocked(dir string, now time.Time) bool {
	if s.markedDirs[dir] == 0 {
		return false
	}
	held := false
	for p := range s.marks {
		if d, _ := hfl.SplitPath(p); d == dir && s.heldLocked(p, now) {
			held = true
		}
	}
	return held
}

// markAsked holds p back as its home answered the question about it now
// in flight (see reply.Pending): held back for owner's publish publish,
// sent ahead as rec. Not if this node is the owner (its own commit's
// notice goes to the home, not here), nor if that hold's end was told
// meanwhile; a hold told meanwhile by a break stands (it is that one, or
// newer than the answer).
func (s *holderSide) markAsked(p, owner string, publish uint64, rec hfl.Record) {
	if owner == s.n.self.Node {
		return
	}
	if rec.Owner != owner || !rec.Provisional {
		rec = hfl.Record{}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.flights[p]
	if f == nil || slices.Contains(f.ended, holdKey{owner, publish}) {
		return
	}
	if m := s.marks[p]; m != nil && (f.broken || (m.owner == owner && m.publish == publish)) {
		return
	}
	s.markLocked(p, owner, publish, rec, time.Now().Add(pendingHold))
	if f.broken {
		s.marks[p].overtaken = true // another change was told meanwhile
	}
}

// unmarkAnswered ends the hold of p when its home answered the question
// about it now in flight without holding it back, and nothing was told
// meanwhile: the hold ended there, and its end did not reach this node
// yet (or never will: a notice lost). The listing of p's directory,
// which that end would have updated, answers nothing more.
func (s *holderSide) unmarkAnswered(p string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.flights[p]
	if _, marked := s.marks[p]; !marked || f == nil || f.broken {
		return
	}
	s.unmarkLocked(p)
	s.dropListingLocked(p)
}

// heldBack reports whether p is held back (see holdMark).
func (s *holderSide) heldBack(p string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.heldLocked(p, time.Now())
}

// waitSettled waits, at most settleWait, until p is no longer held back,
// and reports whether it is not.
func (s *holderSide) waitSettled(ctx context.Context, p string) bool {
	var limit *time.Timer
	for {
		s.mu.Lock()
		held := s.heldLocked(p, time.Now())
		ch := s.settled
		s.mu.Unlock()
		if !held {
			return true
		}
		if limit == nil {
			s.n.heldLookups.Add(1)
			limit = time.NewTimer(settleWait)
			defer limit.Stop()
		}
		select {
		case <-ch:
		case <-limit.C:
			s.n.heldRunOut.Add(1)
			return false
		case <-ctx.Done():
			return false
		}
	}
}

// markedRecord returns the record sent ahead of the commit p is held back
// for, unless another change of p was told meanwhile.
func (s *holderSide) markedRecord(p string) (hfl.Record, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.marks[p]
	if m == nil || m.overtaken || m.rec.Path == "" || !s.heldLocked(p, time.Now()) {
		return hfl.Record{}, false
	}
	return m.rec, true
}

// brokenBy takes a break this node sent itself, as its own home.
func (s *holderSide) brokenBy(msg notice) {
	s.broken(s.n.self.Node, msg)
}

// broken takes a break from home from: a change of msg.Path, its record
// msg.Rec (maybe provisional, or being written; its bytes in Inline), or
// nil for a removal at generation msg.Gen. What this node knew of the
// path is replaced (under a renewed promise if msg.Held: the home keeps
// this node as a holder of it), its listing of the path's directory
// updated (msg.Listing: this node holds it; msg.ListingEnded: no
// longer), waits for the path woken, and the managed directory told, to
// drop copies that are now stale. A provisional record told with Sync
// (see reply.Pending) holds back what this node knows of the path, which
// its commit, told next, would change.
func (s *holderSide) broken(from string, msg notice) {
	p, rec, gen, listing, ended, held := msg.Path, msg.Rec, msg.Gen, msg.Listing, msg.ListingEnded, msg.Held
	n := s.n
	n.broken.Add(1)
	dir, name := hfl.SplitPath(p)
	m, _ := n.member(from)
	_, epoch, _ := n.homeOf(dir)
	now := time.Now()
	var state hfl.Record
	exists := rec != nil
	if exists {
		state = *rec
	}
	s.mu.Lock()
	ends := exists && msg.Publish != 0 && (!state.Provisional || msg.Settle) // a hold's end
	dropped := false                                                         // the listing of dir, by a Settle
	if f := s.flights[p]; f != nil {
		f.broken = true
		if ends && len(f.ended) < maxFlightEnds {
			f.ended = append(f.ended, holdKey{state.Owner, msg.Publish})
		}
	}
	if f := s.flights[dir+"/"]; f != nil && listing {
		f.broken = true // a listing being read may be older than this
	}
	g := gen
	if exists {
		g = state.Generation
	}
	newer := false // a newer state of p is known here: breaks can overtake each other
	if k := s.known[p]; k != nil && k.gen > g {
		newer = true
	}
	if listing && ended {
		delete(s.lists, dir)
	} else if l := s.lists[dir]; l != nil && !state.Provisional {
		// Keep the listing in step. Told as a lister, its promise is
		// renewed; otherwise it was not counted among them (its promise
		// there ran out first), and the listing's own promise says how
		// long the rest holds.
		if !newer {
			l.set(name, state, exists, g)
		}
		if listing {
			l.p = promise{home: m, epoch: epoch, expires: now.Add(n.t.promiseTTL - n.t.promiseMargin)}
		}
	}
	holdsBack := state.Provisional && msg.Sync && !msg.Settle
	if m := s.marks[p]; m != nil {
		switch {
		case holdsBack:
		case ends && m.owner == state.Owner && m.publish == msg.Publish:
			s.unmarkLocked(p) // its commit, or its failure
			if msg.Settle && !(listing && ended) {
				// Overtaken at the home, the newer change may reach
				// this node after the Settle: the listing, which
				// lacks both, answers nothing more.
				if _, ok := s.lists[dir]; ok {
					delete(s.lists, dir)
					dropped = true
				}
			}
		case !state.Provisional:
			m.overtaken = true
		}
	}
	if holdsBack && (held || (listing && !ended)) {
		// Held back where this node holds a promise: its own for the
		// path, or its directory's listing. A listing this break ends
		// answers nothing more anyway.
		s.markLocked(p, state.Owner, msg.Publish, state, now.Add(pendingHold))
		if k := s.known[p]; k != nil {
			k.p = promise{} // asked again if the hold runs out
			if k.gen > 0 && (!k.exists || k.rec.Owner != state.Owner) {
				// Another change is known: whether this version
				// comes after it is known once its commit is told.
				s.marks[p].overtaken = true
			}
		}
	}
	if state.Provisional {
		if !msg.Settle {
			s.keepAheadLocked(dir, name, state, now)
		}
	} else {
		delete(s.ahead, p)
	}
	stale := false // told of a state older than one known here
	if !state.Provisional {
		var pr promise // none: known, not promised (asked again next time)
		if held {
			pr = promise{home: m, epoch: epoch, expires: now.Add(n.t.promiseTTL - n.t.promiseMargin)}
		}
		s.learnLocked(p, state, exists, g, pr)
		if k := s.known[p]; k != nil {
			k.rec.Inline = nil
			stale = k.gen > g
		}
	}
	s.mu.Unlock()
	if exists && !msg.Settle {
		n.env.Waits.Fire(p, &state, false)
	}
	if exists && !state.Provisional {
		s.keepBytes(state)
	}
	if local := n.env.Local; local != nil && (holdsBack || !state.Provisional) && !stale {
		// A record held back is told too: a new version is coming, so
		// what the kernel cached of the old one goes now.
		if !exists {
			state.Generation = gen // the removal's
		}
		local.Invalidated(p, state, exists)
	}
	if local := n.env.Local; local != nil && ((listing && ended) || dropped) {
		local.ListingDropped(dir)
	}
}

// maxRevokedDirs bounds the directories whose entries the kernel is made
// to forget when a home revokes this node's promises.
const maxRevokedDirs = 4096

// revoked takes home's word that every promise this node has from it is
// void (it took this node for cut off): what this node knows stays, as
// known but not promised, and is asked about again; listings from it are
// dropped, and the kernel forgets the entries it showed from them.
func (s *holderSide) revoked(home string) {
	n := s.n
	n.revoked.Add(1)
	dirs := make(map[string]struct{})
	waiting := n.env.Waits.Paths()
	var rewait []string
	s.mu.Lock()
	for _, f := range s.flights {
		f.broken = true // an answer on its way may be older than the revocation
	}
	for p, k := range s.known {
		if k.p.home.Node == home {
			k.p = promise{}
			if _, ok := waiting[p]; ok {
				rewait = append(rewait, p)
			}
			if len(dirs) < maxRevokedDirs {
				dir, _ := hfl.SplitPath(p)
				dirs[dir] = struct{}{}
			}
		}
	}
	for dir, l := range s.lists {
		if l.p.home.Node == home {
			delete(s.lists, dir)
			dirs[dir] = struct{}{}
		}
	}
	s.mu.Unlock()
	for _, p := range rewait {
		n.env.Waits.Fire(p, nil, false) // the wait registers at the home again
	}
	n.log.Info("a home dropped this node's promises (it took it for cut off); what they covered is asked about again", "home", home, "directories", len(dirs))
	if local := n.env.Local; local != nil {
		for dir := range dirs {
			local.ListingDropped(dir)
		}
	}
}

// missCount counts missing paths asked about in one directory.
type missCount struct {
	n     int
	since time.Time
}

// A directory where paths were missing missesToList times within
// missWindow is listed whole, so that what follows (a program probing for
// names, a consumer waiting for files one after the other) is answered
// here; a directory found too large is not listed for a while.
const (
	missesToList = 2
	missWindow   = time.Second
	tooLargeFor  = time.Minute
	maxMissDirs  = 4096
)

// noteMiss counts a missing path asked about in dir.
func (s *holderSide) noteMiss(dir string, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.misses[dir]
	if now.Sub(m.since) > missWindow {
		m = missCount{since: now}
	}
	m.n++
	if len(s.misses) >= maxMissDirs {
		clear(s.misses)
	}
	s.misses[dir] = m
}

// wantListing reports whether dir should be listed whole (see noteMiss).
func (s *holderSide) wantListing(dir string, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.misses[dir]
	return m.n >= missesToList && now.Sub(m.since) <= missWindow && now.Sub(s.tooLarge[dir]) > tooLargeFor
}

// listable reports whether dir was not found too large lately.
func (s *holderSide) listable(dir string, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return now.Sub(s.tooLarge[dir]) > tooLargeFor
}

// foundTooLarge notes that dir has more entries than a listing keeps.
func (s *holderSide) foundTooLarge(dir string, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.tooLarge) >= maxMissDirs {
		clear(s.tooLarge)
	}
	s.tooLarge[dir] = now
}

// promises counts the paths and listings this node holds promises for.
func (s *holderSide) promises() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.known) + len(s.lists)
}
