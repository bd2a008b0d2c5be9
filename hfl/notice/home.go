package notice

import (
	"context"
	"path"
	"sync"
	"time"

	"github.com/dyadfs/dyadfs/hfl"
	"github.com/dyadfs/dyadfs/internal/every"
	"github.com/dyadfs/dyadfs/internal/workers"
)

// The home side of notices: for the directories this node is home of, what
// it was told of their entries, and who holds a promise for them.

// Bounds of a home's memory.
const (
	// maxHolders bounds the promises a home keeps; past it, askers get
	// answers without a promise (and ask again next time).
	maxHolders = 1 << 20
	// maxKnown bounds the entries a home remembers without holders (what
	// it was told, so that askers need not read the store).
	maxKnown = 1 << 18
	// A home keeps provisional records (sent ahead of their publish) until
	// the committed record follows, for consumers that start waiting in
	// between: at most maxAhead of them, none older than aheadTTL.
	maxAhead = 4096
	aheadTTL = 10 * time.Second
	// pendingHold bounds how long a path is held back after its owner
	// sent its record ahead with Sync (see reply.Pending), at its home
	// and at the nodes told: the owner's commit and its notice come well
	// within it; an owner that dies meanwhile costs the nodes that look
	// the path up a wait (see settleWait) and a store read each, until
	// it runs out.
	pendingHold = 5 * time.Second
)

type homeSide struct {
	n *Protocol

	mu       sync.Mutex
	dirs     map[string]*homeDir
	nholders int
	nknown   int
	ahead    aheadRecords
	held     *heldData
	// revoking holds the holders taken for cut off (see silent) that
	// are not told yet that their promises are void, and when they were
	// last taken for it.
	revoking map[string]time.Time
	// maxListers is maxListers (tests lower it).
	maxListers int
	// pending holds the paths whose entries hold back (see
	// homeEntry.pendingUntil).
	pending map[string]struct{}
}

// homeDir is a directory this node is (or was) home of.
type homeDir struct {
	entries map[string]*homeEntry
	// listers hold a promise for the whole listing: they are told of
	// every change of its entries.
	listers map[string]time.Time
	// ending are the listers whose promise ended with a change (too many
	// listers) and that may not know it yet, by when it was granted:
	// every later change is told to them too, as ending their listing,
	// until the end reached them. A node that holds a path through the
	// listing alone (a copy made under it) must not miss a change that
	// comes meanwhile.
	ending map[string]time.Time
	// npending counts the entries that hold promises back (see
	// homeEntry.pendingUntil): a listing read meanwhile gets none.
	npending int
}

// homeEntry is what the home knows of one path, and its holders.
type homeEntry struct {
	known  bool       // a notice told the state (else askers read the store)
	exists bool       // the state: rec, or removed at gen
	rec    hfl.Record // without bytes (held apart)
	gen    uint64
	// holders: node -> when its promise was made or renewed.
	holders map[string]time.Time
	// pendingUntil, while it is in the future, says that the publish
	// pendingPublish of node pendingOwner was sent ahead with Sync and
	// is not told committed yet: the holders were told it is coming, and
	// an asker gets neither this home's state nor a promise, since what
	// it reads of the store may be older than the commit that the
	// owner's close returns after. Run out, the commit's notice was
	// missed, and the state known here is forgotten with it.
	pendingUntil   time.Time
	pendingOwner   string
	pendingPublish uint64
}

type aheadRecord struct {
	rec hfl.Record
	at  time.Time
}

// aheadRecords keeps records sent ahead of their commit, by path, for the
// consumers that start waiting before the commit is told: a home's, and a
// lister's.
type aheadRecords map[string]aheadRecord

// keep keeps rec, received at now, unless max records younger than
// aheadTTL are kept already (the consumers that wait then wait for the
// committed record).
func (a aheadRecords) keep(rec hfl.Record, now time.Time, max int) {
	if len(a) >= max {
		a.expire(now)
		if len(a) >= max {
			return
		}
	}
	a[rec.Path] = aheadRecord{rec: rec, at: now}
}

// fresh returns the record of p kept, unless it is aheadTTL old.
func (a aheadRecords) fresh(p string, now time.Time) (hfl.Record, bool) {
	r, ok := a[p]
	if !ok || now.Sub(r.at) >= aheadTTL {
		return hfl.Record{}, false
	}
	return r.rec, true
}

// expire forgets the records aheadTTL old.
func (a aheadRecords) expire(now time.Time) {
	for p, r := range a {
		if now.Sub(r.at) >= aheadTTL {
			delete(a, p)
		}
	}
}

func newHomeSide(n *Protocol) *homeSide {
	return &homeSide{n: n, dirs: make(map[string]*homeDir), ahead: make(aheadRecords), held: newHeldData(),
		revoking: make(map[string]time.Time), maxListers: maxListers, pending: make(map[string]struct{})}
}

// entryLocked returns the entry of p, made if need be.
func (h *homeSide) entryLocked(p string) (*homeDir, *homeEntry) {
	dir, name := hfl.SplitPath(p)
	d := h.dirs[dir]
	if d == nil {
		d = &homeDir{entries: make(map[string]*homeEntry)}
		h.dirs[dir] = d
	}
	e := d.entries[name]
	if e == nil {
		e = &homeEntry{}
		d.entries[name] = e
	}
	return d, e
}

// holdLocked registers node as a holder of e, if there is room.
func (h *homeSide) holdLocked(e *homeEntry, node string, now time.Time) bool {
	if e.holders == nil {
		e.holders = make(map[string]time.Time)
	}
	if _, ok := e.holders[node]; !ok {
		if h.nholders >= maxHolders {
			return false
		}
		h.nholders++
	}
	e.holders[node] = now
	return true
}

// maxListers bounds the nodes a directory's home tells of every change of
// the directory's entries, keeping their listings current; past it, a
// change ends the listers' promises instead (they read the listing again
// when they need it), so that a change costs a bounded number of messages.
const maxListers = 64

// target is a holder to tell of a change.
type target struct {
	node    string
	held    bool // it holds the path (and stays a holder)
	listing bool // it holds the listing of the path's directory
	ended   bool // ...and that promise ends with this change
	granted time.Time
	// listed is when the ended listing was granted (see homeDir.ending).
	listed time.Time
	// shortcut says the notice is only a shortcut for it (a record sent
	// ahead, told to a lister): one that does not take it is not taken
	// for cut off.
	shortcut bool
}

// takeTargetsLocked returns the holders of e and the listers of d to tell
// of a change made by from. Holders and listers keep their promises,
// renewed when they are told, unless there are too many listers: then
// their promises end.
func (h *homeSide) takeTargetsLocked(d *homeDir, e *homeEntry, from string, now time.Time) []target {
	var out []target
	idx := make(map[string]int)
	for node, at := range e.holders {
		if node != from {
			// Renewed here as the holder renews it when told: a home
			// that forgot a holder sooner would stop telling it of
			// changes it still answers for.
			e.holders[node] = now
			idx[node] = len(out)
			out = append(out, target{node: node, held: true, granted: at})
		}
	}
	end := len(d.listers) > h.maxListers
	for node, at := range d.listers {
		if node == from {
			continue // it changed the listing itself and keeps it current
		}
		if end {
			delete(d.listers, node)
			if d.ending == nil {
				d.ending = make(map[string]time.Time)
			}
			d.ending[node] = at // still counted in nholders; told below
			continue
		}
		d.listers[node] = now
		if i, ok := idx[node]; ok {
			out[i].listing = true
		} else {
			out = append(out, target{node: node, listing: true, granted: at})
		}
	}
	for node, at := range d.ending {
		if node == from {
			continue
		}
		if i, ok := idx[node]; ok {
			out[i].listing, out[i].ended, out[i].listed = true, true, at
		} else {
			out = append(out, target{node: node, listing: true, ended: true, granted: at, listed: at})
		}
	}
	return out
}

// endTold notes that node was told, with a change of p, that its listing
// of p's directory, granted at granted, ended: later changes need not be
// told to it as a lister.
func (h *homeSide) endTold(p, node string, granted time.Time) {
	dir, _ := hfl.SplitPath(p)
	h.mu.Lock()
	defer h.mu.Unlock()
	if d := h.dirs[dir]; d != nil {
		if at, ok := d.ending[node]; ok && at.Equal(granted) {
			delete(d.ending, node)
			h.nholders--
		}
	}
}

// published takes a record from its owner. A provisional one (sent ahead
// of its commit, maybe with a small file's bytes) is passed on to the
// holders, which wait for it; a committed or a writing one becomes the
// path's state, told to every holder (all of them before the reply, with
// sync). The owner becomes a holder.
func (h *homeSide) published(ctx context.Context, from string, rec hfl.Record, publish uint64, sync, forwarded, settle bool) reply {
	n := h.n
	now := time.Now()
	r := reply{Home: n.self.Started}
	h.mu.Lock()
	d, e := h.entryLocked(rec.Path)
	if rec.Provisional && settle {
		// The owner's commit failed: what was held back for it is as
		// it was.
		var targets []target
		if e.pendingOwner == rec.Owner && e.pendingPublish == publish {
			h.settleLocked(d, e, rec.Path)
			targets = h.takeTargetsLocked(d, e, from, now)
		}
		h.mu.Unlock()
		h.tell(ctx, rec.Path, targets, notice{Kind: kindBreak, Path: rec.Path, Rec: &rec, Publish: publish, Settle: true}, false)
		return r
	}
	if rec.Provisional {
		h.takeAheadLocked(rec, publish, now)
		if sync && !forwarded && h.holdBackLocked(d, e, rec, publish, now) {
			// Every holder and lister hears that the commit is coming
			// before the owner's close may return, as they would hear
			// the commit itself; the commit's notice then follows
			// aside.
			targets := h.takeTargetsLocked(d, e, from, now)
			h.mu.Unlock()
			h.tell(ctx, rec.Path, targets, holdBreak(rec, publish), true)
			r.Pending = true
			return r
		}
		var targets []target
		for node, at := range e.holders {
			if node != from {
				targets = append(targets, target{node: node, held: true, granted: at})
			}
		}
		// The listers too, as neither holders nor listers here (a
		// record sent ahead changes no promise): a consumer that
		// waits for a name of a listing it holds need not ask to be
		// told (see Await).
		if len(d.listers) <= h.maxListers {
			for node, at := range d.listers {
				if _, held := e.holders[node]; !held && node != from {
					targets = append(targets, target{node: node, granted: at, shortcut: true})
				}
			}
		}
		h.mu.Unlock()
		h.tell(ctx, rec.Path, targets, notice{Kind: kindBreak, Path: rec.Path, Rec: &rec, Inline: rec.Inline}, false)
		return r
	}
	settled := false
	if e.pendingOwner == rec.Owner && e.pendingPublish == publish {
		settled = true
		h.settleLocked(d, e, rec.Path)
	}
	if e.known && e.gen >= rec.Generation {
		// An older notice, overtaken: the sender is not registered,
		// and hears what the path is now (it may have lost a race to
		// write the path). What was held back for it ends.
		h.overtakenLocked(e, &r)
		var targets []target
		if settled {
			targets = h.takeTargetsLocked(d, e, from, now)
		}
		h.mu.Unlock()
		ahead := rec
		ahead.Provisional, ahead.Generation = true, 0
		h.tell(ctx, rec.Path, targets, notice{Kind: kindBreak, Path: rec.Path, Rec: &ahead, Publish: publish, Settle: true}, false)
		return r
	}
	if !e.known {
		h.nknown++
	}
	inline := rec.Inline
	rec.Inline = nil
	e.known, e.exists, e.rec, e.gen = true, true, rec, rec.Generation
	if rec.Writing {
		h.held.drop(rec.Path, "")
	} else {
		if inline != nil {
			h.held.put(hfl.Record{Path: rec.Path, Owner: rec.Owner, Size: rec.Size, MtimeNs: rec.MtimeNs, Inline: inline}, publish)
		}
		h.held.commit(rec, publish)
	}
	if a, ok := h.ahead[rec.Path]; ok && (a.rec.Owner == rec.Owner || rec.Writing) {
		delete(h.ahead, rec.Path)
	}
	told := h.held.attach(rec)
	if forwarded {
		from = rec.Owner // the owner knows; the home that passed it on holds nothing here
	}
	targets := h.takeTargetsLocked(d, e, from, now)
	if !forwarded && !h.holdLocked(e, from, now) {
		r.NoPromise = true
	}
	h.evictLocked()
	h.mu.Unlock()
	var fwd *notice
	if !forwarded {
		rec.Inline = inline
		fwd = &notice{Kind: kindPublished, Rec: &rec, Inline: inline, Publish: publish, Sync: sync, Forwarded: true}
	}
	h.tellAndForward(ctx, rec.Path, targets, notice{Kind: kindBreak, Path: rec.Path, Rec: &told, Inline: told.Inline, Publish: publish}, sync, fwd, from)
	return r
}

// holdBackHere is published's hold for a record rec sent ahead with Sync by
// this node, its home: it reports whether the path is held back, and
// returns the telling of its holders and listers, to run alongside the
// commit (nil: nobody to tell).
func (h *homeSide) holdBackHere(ctx context.Context, rec hfl.Record, publish uint64) (bool, func()) {
	now := time.Now()
	h.mu.Lock()
	d, e := h.entryLocked(rec.Path)
	h.takeAheadLocked(rec, publish, now)
	if !h.holdBackLocked(d, e, rec, publish, now) {
		h.mu.Unlock()
		return false, nil
	}
	targets := h.takeTargetsLocked(d, e, h.n.self.Node, now)
	h.mu.Unlock()
	if len(targets) == 0 {
		return true, nil
	}
	return true, func() { h.tell(ctx, rec.Path, targets, holdBreak(rec, publish), true) }
}

// holdBreak is the break that tells a holder to hold rec's path back for
// its publish publish (see reply.Pending).
func holdBreak(rec hfl.Record, publish uint64) notice {
	return notice{Kind: kindBreak, Path: rec.Path, Rec: &rec, Inline: rec.Inline, Publish: publish}
}

// takeAheadLocked keeps rec, sent ahead of its commit, and its bytes.
func (h *homeSide) takeAheadLocked(rec hfl.Record, publish uint64, now time.Time) {
	if rec.Inline != nil {
		h.held.put(rec, publish)
	}
	h.keepAheadLocked(rec, now)
}

// tellAndForward tells targets of a change of p (see tell) and passes
// fwd, if not nil, on to the other homes (see forward), at once: each of
// them is bounded by holderSilence, and with sync the change waits for
// both, not one after the other.
func (h *homeSide) tellAndForward(ctx context.Context, p string, targets []target, msg notice, sync bool, fwd *notice, from string) {
	var home hfl.Member
	forward := false
	if fwd != nil {
		home, forward = h.forwardTo(p, from)
	}
	if !forward || !sync {
		if forward {
			h.forward(ctx, *fwd, p, home) // aside
		}
		h.tell(ctx, p, targets, msg, sync)
		return
	}
	done := make(chan struct{})
	workers.Go(func() {
		defer close(done)
		h.forward(ctx, *fwd, p, home)
	})
	h.tell(ctx, p, targets, msg, sync)
	<-done
}

// unpublished takes the removal of p at generation gen.
func (h *homeSide) unpublished(ctx context.Context, from, p string, gen uint64, sync, forwarded bool) reply {
	n := h.n
	r := reply{Home: n.self.Started}
	h.mu.Lock()
	d, e := h.entryLocked(p)
	if e.known && e.gen >= gen {
		h.overtakenLocked(e, &r)
		h.mu.Unlock()
		return r
	}
	if !e.known {
		h.nknown++
	}
	e.known, e.exists, e.rec, e.gen = true, false, hfl.Record{}, gen
	h.held.drop(p, "")
	delete(h.ahead, p)
	if forwarded {
		from = "" // who removed it is not known here: every holder is told
	}
	targets := h.takeTargetsLocked(d, e, from, time.Now())
	if !forwarded && !h.holdLocked(e, from, time.Now()) {
		r.NoPromise = true
	}
	h.evictLocked()
	h.mu.Unlock()
	var fwd *notice
	if !forwarded {
		fwd = &notice{Kind: kindUnpublished, Path: p, Gen: gen, Sync: sync, Forwarded: true}
	}
	h.tellAndForward(ctx, p, targets, notice{Kind: kindBreak, Path: p, Gen: gen}, sync, fwd, from)
	return r
}

// overtakenLocked answers a change older than what the home knows of its
// path (e): no promise, and the path's state now.
func (h *homeSide) overtakenLocked(e *homeEntry, r *reply) {
	r.NoPromise, r.Known, r.Gen = true, true, e.gen
	if e.exists {
		rec := e.rec
		r.Rec = &rec
	}
}

// forwardTo returns the other home that the holders of p may have
// registered at while the members were changing, to pass a change of p
// made by from on to: the home in this node's view, if it is not this node
// (the sender's view is older), or else the home before it, if it joined a
// moment ago (the holders' views may be older). Mostly there is none.
func (h *homeSide) forwardTo(p, from string) (hfl.Member, bool) {
	n := h.n
	dir, _ := hfl.SplitPath(p)
	m, _, ok := n.homeOf(dir)
	if !ok || m.Node == n.self.Node {
		if m, ok = n.previousHome(dir); !ok || m.Node == n.self.Node {
			return hfl.Member{}, false
		}
	}
	return m, m.Node != from
}

// forward passes the change msg of p on to the home m (see forwardTo).
func (h *homeSide) forward(ctx context.Context, msg notice, p string, m hfl.Member) {
	n := h.n
	if !msg.Sync {
		n.sendAside(m, msg)
		return
	}
	// Bounded as a holder is: an other home that does not answer must not
	// hold up the change (it is cut off, and the promises it made lapse
	// with its membership).
	sctx, cancel := context.WithTimeout(ctx, n.t.silence)
	_, err := n.send(sctx, m, msg)
	cancel()
	if err != nil {
		n.log.Info("change not passed on to the previous home", "to", m.Node, "path", p, "err", err)
	}
}

// ask answers a node that asks about p, and registers it as a holder.
func (h *homeSide) ask(from, p string, after uint64, withAhead bool) reply {
	n := h.n
	now := time.Now()
	r := reply{Home: n.self.Started}
	h.mu.Lock()
	defer h.mu.Unlock()
	d, e := h.entryLocked(p)
	if !h.holdLocked(e, from, now) {
		r.NoPromise = true
	}
	if h.pendingLocked(d, e, p, now) {
		// The asker waits for the commit's notice, which it is
		// registered for, and keeps nothing meanwhile.
		r.NoPromise, r.Pending, r.PendingOwner, r.PendingPublish = true, true, e.pendingOwner, e.pendingPublish
	} else if e.known {
		r.Known, r.Gen = true, e.gen
		if e.exists {
			rec := h.held.attach(e.rec)
			r.Rec, r.Inline = &rec, rec.Inline
		}
	}
	if a, ok := h.ahead.fresh(p, now); ok && withAhead && (!e.known || !e.exists || e.rec.Writing || e.gen <= after) {
		rec := h.held.attach(a)
		r.Rec, r.Inline = &rec, rec.Inline
	}
	return r
}

// list registers a node that reads the listing of dir.
func (h *homeSide) list(from, dir string) reply {
	r := reply{Home: h.n.self.Started}
	h.mu.Lock()
	defer h.mu.Unlock()
	d := h.dirs[dir]
	if d == nil {
		d = &homeDir{entries: make(map[string]*homeEntry)}
		h.dirs[dir] = d
	}
	if d.listers == nil {
		d.listers = make(map[string]time.Time)
	}
	if _, ok := d.ending[from]; ok {
		delete(d.ending, from) // it reads the listing again: a lister anew
		h.nholders--
	}
	if _, ok := d.listers[from]; !ok {
		if h.nholders >= maxHolders {
			r.NoPromise = true
			return r
		}
		h.nholders++
	}
	now := time.Now()
	d.listers[from] = now
	if h.expirePendingLocked(now); d.npending > 0 {
		r.NoPromise = true // registered, but what it reads may miss a commit
	}
	return r
}

// tell sends the break msg to targets: with wait, every one of them before
// it returns (a holder that cannot be reached is waited for until it left
// the members or its promise ran out, or ctx ends); without, aside.
func (h *homeSide) tell(ctx context.Context, p string, targets []target, msg notice, wait bool) {
	if len(targets) == 0 {
		return
	}
	n := h.n
	if !wait {
		for _, t := range targets {
			workers.Go(func() { h.tellOne(n.ctx, p, t, msg, false) })
		}
		return
	}
	if len(targets) == 1 {
		h.tellOne(ctx, p, targets[0], msg, true) // no goroutine to wait for
		return
	}
	var wg sync.WaitGroup
	for _, t := range targets {
		wg.Add(1)
		workers.Go(func() {
			defer wg.Done()
			h.tellOne(ctx, p, t, msg, true)
		})
	}
	wg.Wait()
}

// tellOne tells one holder; see tell. A holder that does not take the
// change within holderSilence (with persist; after three tries without)
// is taken for cut off: see silent.
func (h *homeSide) tellOne(ctx context.Context, p string, t target, msg notice, persist bool) {
	n := h.n
	msg.Listing, msg.ListingEnded, msg.Held = t.listing, t.ended, t.held
	msg.Sync = persist // a break with a deadline goes alone (see batchable)
	n.breaks.Add(1)
	if t.node == n.self.Node {
		h.n.holder.brokenBy(msg)
		if t.ended {
			h.endTold(p, t.node, t.listed)
		}
		return
	}
	deadline := time.Now().Add(n.t.silence)
	for attempt := 0; ; attempt++ {
		m, ok := n.member(t.node)
		if !ok {
			// Gone from the members: its promises went with it, but it
			// may come back believing them (cut off, its lease ran out).
			h.silent(p, t.node)
			return
		}
		sctx, cancel := ctx, context.CancelFunc(func() {})
		if persist {
			sctx, cancel = context.WithDeadline(ctx, deadline)
		}
		_, err := n.send(sctx, m, msg)
		cancel()
		if err == nil && t.ended {
			h.endTold(p, t.node, t.listed)
		}
		if err == nil || ctx.Err() != nil {
			return
		}
		if (persist && !time.Now().Before(deadline)) || (!persist && attempt >= 2) || time.Since(t.granted) > n.t.promiseTTL {
			if !t.shortcut {
				h.silent(p, t.node)
			}
			return
		}
		pause := time.NewTimer(min(n.t.retry<<min(attempt, 3), time.Until(deadline)))
		if !persist {
			pause.Reset(n.t.retry << min(attempt, 3))
		}
		select {
		case <-pause.C:
		case <-ctx.Done():
			pause.Stop()
			return
		}
	}
}

// silent takes holder node, which did not take a change of p, for cut off,
// as an AFS file server marks a client down: it loses every promise it
// holds here (p's and the rest: none of them is kept any more), so that
// no change waits for it, and it is told so as soon as it answers again
// (see revoke), until its promises would have run out anyway. It then
// asks afresh.
func (h *homeSide) silent(p, node string) {
	h.mu.Lock()
	_, telling := h.revoking[node]
	h.revoking[node] = time.Now()
	h.dropHoldersLocked(func(holder string, _ time.Time) bool { return holder == node })
	h.mu.Unlock()
	if telling {
		return // the revocation on its way covers these too
	}
	h.n.silent.Add(1)
	h.n.log.Warn("a node holding paths here does not answer; its promises are dropped, and it is told so once it answers", "node", node, "path", p)
	go h.revoke(node)
}

// revoke tells node, taken for cut off, that its promises from this home
// are void: until it took it, this daemon stops, or the promises would
// have run out anyway (promiseTTL after it was last taken for cut off).
func (h *homeSide) revoke(node string) {
	n := h.n
	since := time.Now()
	pause := n.t.retry
	for {
		h.mu.Lock()
		last := h.revoking[node]
		if time.Since(last) >= n.t.promiseTTL {
			delete(h.revoking, node)
			h.mu.Unlock()
			return
		}
		h.mu.Unlock()
		if m, ok := n.lastSeen(node); ok {
			if _, err := n.send(n.ctx, m, notice{Kind: kindRevoke}); err == nil {
				h.mu.Lock()
				again := !h.revoking[node].Equal(last)
				if !again {
					delete(h.revoking, node)
				}
				h.mu.Unlock()
				if again {
					continue // taken for cut off again while it was told
				}
				n.log.Info("a node taken for cut off answers again and was told its promises are void", "node", node, "after", time.Since(since).Round(time.Millisecond))
				return
			}
		}
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-n.ctx.Done():
			t.Stop()
			return
		}
		pause = min(2*pause, 2*time.Second)
	}
}

// keepAheadLocked keeps a provisional record for consumers that ask for it
// before its committed record arrives.
func (h *homeSide) keepAheadLocked(rec hfl.Record, now time.Time) {
	rec.Inline = nil // held apart, within its own bound
	h.ahead.keep(rec, now, maxAhead)
}

// evictLocked forgets known entries that nobody holds once there are too
// many of them.
func (h *homeSide) evictLocked() {
	if h.nknown <= maxKnown {
		return
	}
	for dir, d := range h.dirs {
		for name, e := range d.entries {
			if len(e.holders) == 0 && e.known && e.pendingUntil.IsZero() {
				delete(d.entries, name)
				h.nknown--
				h.held.drop(path.Join(dir, name), "")
			}
		}
		if len(d.entries) == 0 && len(d.listers) == 0 && len(d.ending) == 0 {
			delete(h.dirs, dir)
		}
		if h.nknown <= maxKnown*3/4 {
			return
		}
	}
}

// sweep forgets promises that ran out, until ctx ends.
func (h *homeSide) sweep(ctx context.Context) {
	every.Run(ctx, h.n.t.promiseTTL/2, nil, func() { h.expire(time.Now()) })
}

// dropHoldersLocked forgets the promises (of paths and of listings) for
// which drop, given the holder and when its promise was made or renewed,
// is true, and the entries and directories left with nothing to keep.
func (h *homeSide) dropHoldersLocked(drop func(holder string, at time.Time) bool) {
	for dir, d := range h.dirs {
		for node, at := range d.listers {
			if drop(node, at) {
				delete(d.listers, node)
				h.nholders--
			}
		}
		for node, at := range d.ending {
			if drop(node, at) {
				delete(d.ending, node)
				h.nholders--
			}
		}
		for name, e := range d.entries {
			for node, at := range e.holders {
				if drop(node, at) {
					delete(e.holders, node)
					h.nholders--
				}
			}
			if !e.known && len(e.holders) == 0 && e.pendingUntil.IsZero() {
				delete(d.entries, name)
			}
		}
		if len(d.entries) == 0 && len(d.listers) == 0 && len(d.ending) == 0 {
			delete(h.dirs, dir)
		}
	}
}

// expire forgets promises older than promiseTTL, and entries that neither
// are known nor held.
func (h *homeSide) expire(now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.expirePendingLocked(now)
	h.dropHoldersLocked(func(_ string, at time.Time) bool { return now.Sub(at) > h.n.t.promiseTTL })
	h.ahead.expire(now)
}

// holdBackLocked marks e, the entry of rec's path in d, as holding back
// for the publish publish of rec, sent ahead (see homeEntry.pendingUntil),
// and reports whether it did. It does not when the holders may have
// registered at another home too (the members are changing: that home
// hears only the commit, so the owner waits for it), nor while another
// owner's publish holds e back.
func (h *homeSide) holdBackLocked(d *homeDir, e *homeEntry, rec hfl.Record, publish uint64, now time.Time) bool {
	if _, other := h.forwardTo(rec.Path, rec.Owner); other {
		return false
	}
	if h.pendingLocked(d, e, rec.Path, now) && e.pendingOwner != rec.Owner {
		return false
	}
	if e.pendingUntil.IsZero() {
		d.npending++
		h.pending[rec.Path] = struct{}{}
	}
	e.pendingUntil, e.pendingOwner, e.pendingPublish = now.Add(pendingHold), rec.Owner, publish
	return true
}

// pendingLocked reports whether e, the entry of p in d, holds back at now.
// A hold run out ends, and the state known here with it: the commit's
// notice was missed (see homeEntry.pendingUntil).
func (h *homeSide) pendingLocked(d *homeDir, e *homeEntry, p string, now time.Time) bool {
	if e.pendingUntil.IsZero() {
		return false
	}
	if now.Before(e.pendingUntil) {
		return true
	}
	h.settleLocked(d, e, p)
	if e.known {
		e.known = false
		h.nknown--
	}
	return false
}

// settleLocked ends the hold of e, the entry of p in d.
func (h *homeSide) settleLocked(d *homeDir, e *homeEntry, p string) {
	if !e.pendingUntil.IsZero() {
		e.pendingUntil, e.pendingOwner, e.pendingPublish = time.Time{}, "", 0
		d.npending--
		delete(h.pending, p)
	}
}

// expirePendingLocked ends the holds run out at now.
func (h *homeSide) expirePendingLocked(now time.Time) {
	for p := range h.pending {
		dir, name := hfl.SplitPath(p)
		if d := h.dirs[dir]; d != nil {
			if e := d.entries[name]; e != nil {
				h.pendingLocked(d, e, p, now)
				continue
			}
		}
		delete(h.pending, p) // not reached: entries that hold back stay
	}
}

// holders counts the promises this home keeps.
func (h *homeSide) holders() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.nholders
}

// withHeld returns rec with its bytes, if this node holds them.
func (h *homeSide) withHeld(rec hfl.Record) hfl.Record {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.held.attach(rec)
}
