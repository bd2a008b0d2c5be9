package notice

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dyadfs/dyadfs/hfl"
	"github.com/dyadfs/dyadfs/internal/workers"
)

// The client half of the protocol: what the locator asks of it, as this
// node publishes, looks up, lists and waits.

// Publish commits rec with commit and tells rec's home, as o says: ahead of
// the commit (consumers that wait need not wait for it: the owner serves
// the file from now on), with a small file's bytes (inline, at most
// InlineMax), and once committed, aside or before it returns.
func (n *Protocol) Publish(ctx context.Context, rec hfl.Record, inline *hfl.Inline, o hfl.PublishOptions, commit func(context.Context) (hfl.Record, error)) (hfl.Record, error) {
	var publish uint64
	var told <-chan struct{}
	var held <-chan bool
	if o.Ahead {
		publish = n.nextPublish()
		ahead := rec
		ahead.Provisional, ahead.Inline = true, inline
		if !inlineFits(ahead) {
			ahead.Inline = nil
		}
		if o.Tell == hfl.TellOnce {
			held = n.holdBack(ctx, ahead, publish)
		} else {
			told = n.tellHome(ahead, publish, nil)
		}
	}
	start := time.Now()
	out, err := commit(ctx)
	if held != nil {
		// The record went ahead while the store committed: if the
		// home held the path back (every holder heard the commit is
		// coming, and no promise is made on it until told), the
		// close need not wait for the home again. A commit that took
		// longer than a lookup waits for a hold to end (settleWait:
		// such a lookup may have read the store before the commit
		// landed) waits for the home, as without a hold.
		took := <-held
		if took && err == nil && time.Since(start) < settleWait {
			n.holder.madeHere(out.Path, out, true, out.Generation)
			n.tellCommitted(ctx, out, publish)
			return out, nil
		}
		if err != nil {
			// Nothing committed: the nodes told it was coming stop
			// holding the path back (if the home held it: its answer
			// may have been lost).
			ahead := rec
			ahead.Provisional = true
			n.settleHome(ahead, publish)
		}
	}
	if err != nil {
		return hfl.Record{}, err
	}
	n.holder.madeHere(out.Path, out, true, out.Generation)
	switch o.Tell {
	case hfl.TellAside:
		n.tellHome(out, publish, told)
	default:
		if told != nil {
			select {
			case <-told: // after the record sent ahead, whose bytes the home keeps
			case <-ctx.Done():
			}
		}
		msg := notice{Kind: kindPublished, Rec: &out, Publish: publish, Sync: true}
		if o.Tell == hfl.TellSure {
			n.tellHomeSync(ctx, msg, out.Path, out, true)
		} else if !n.deliver(ctx, msg, out.Path, out, true, 1) {
			n.tellHome(out, publish, nil)
		}
	}
	return out, nil
}

// Removed tells path's home that this node removed its record at
// generation gen: with sync before it returns, else aside.
func (n *Protocol) Removed(ctx context.Context, path string, gen uint64, sync bool) {
	n.holder.madeHere(path, hfl.Record{Path: path}, false, gen)
	msg := notice{Kind: kindUnpublished, Path: path, Gen: gen, Sync: sync}
	if sync {
		n.tellHomeSync(ctx, msg, path, hfl.Record{}, false)
	} else {
		workers.Go(func() { n.tellHomeSync(n.ctx, msg, path, hfl.Record{}, false) })
	}
}

// Forget drops what this node knows of path.
func (n *Protocol) Forget(path string) { n.holder.forget(path) }

// Ahead returns the record of path sent ahead of its commit that this
// node was told, and not the commit yet.
func (n *Protocol) Ahead(path string) (hfl.Record, bool) { return n.holder.markedRecord(path) }

// CarriesBytes: small files' bytes travel with notices.
func (n *Protocol) CarriesBytes() bool { return true }

// Known returns what this node knows of path under a promise.
func (n *Protocol) Known(path string) (hfl.State, bool) {
	rec, exists, gen, ok := n.holder.lookup(path)
	if !ok {
		return hfl.State{}, false
	}
	if !exists {
		return hfl.State{Gen: gen, Level: hfl.LevelCache}, true
	}
	return hfl.State{Rec: n.withBytes(rec), Exists: true, Gen: gen, Level: hfl.LevelCache}, true
}

// State returns what this node knows under a promise, else what the home
// knows, else what the store holds (the home registers this node before,
// so that a change after the store's answer is told to it).
func (n *Protocol) State(ctx context.Context, path string) (hfl.State, error) {
	if st, ok := n.Known(path); ok {
		return st, nil
	}
	settled := n.holder.waitSettled(ctx, path)
	if settled {
		// Held back for a commit that was then told (or not held).
		if st, ok := n.Known(path); ok {
			return st, nil
		}
	}
	dir, _ := hfl.SplitPath(path)
	now := time.Now()
	if n.holder.wantListing(dir, now) {
		// Paths keep missing here: the listing answers the next ones.
		if _, ok, _ := n.readListing(ctx, dir); ok {
			if st, ok := n.Known(path); ok {
				return st, nil
			}
		}
	}
	a := n.ask(ctx, path, 0, false)
	if a.pending && settled && n.holder.waitSettled(ctx, path) {
		// Held back at the home: its commit's notice is told to this
		// node (registered), unless it was waited for in vain above.
		if st, ok := n.Known(path); ok {
			a.endFlight()
			return st, nil
		}
	}
	if a.answered {
		if !a.exists {
			n.holder.noteMiss(dir, now)
			return hfl.State{Gen: a.gen, Level: hfl.LevelHome}, nil
		}
		return hfl.State{Rec: a.rec, Exists: true, Gen: a.rec.Generation, Level: hfl.LevelHome}, nil
	}
	rec, err := n.fromStore(ctx, path, a)
	switch {
	case errors.Is(err, hfl.ErrNotFound):
		n.holder.noteMiss(dir, now)
		return hfl.State{Level: hfl.LevelGlobal}, nil
	case err != nil:
		return hfl.State{Level: hfl.LevelGlobal}, err
	}
	return hfl.State{Rec: rec, Exists: true, Gen: rec.Generation, Level: hfl.LevelGlobal}, nil
}

// fromStore reads path's record from the store after a (the question to
// its home that registered this node), and keeps what it found under the
// promise a brought, unless a change was told meanwhile.
func (n *Protocol) fromStore(ctx context.Context, path string, a *asked) (hfl.Record, error) {
	rec, err := n.env.Store.Lookup(ctx, n.env.Keys.Slot(path))
	n.learnFromStore(path, a, rec, err)
	if err != nil {
		return hfl.Record{}, err
	}
	return n.home.withHeld(rec), nil // this node may be its home
}

// learnFromStore keeps what the store answered of path under a's promise.
func (n *Protocol) learnFromStore(path string, a *asked, rec hfl.Record, err error) {
	keep := a.endFlight()
	if exists := err == nil; exists || errors.Is(err, hfl.ErrNotFound) {
		n.holder.learn(path, rec, exists, rec.Generation, a.promise, a.registered && keep)
	}
}

// Hold makes sure this node holds a promise for path: its own, or, unless
// own, its directory's listing, whose home tells this node of every change
// of the directory's entries (and, if the listing's promise ends with a
// change, of that change and of every later one until the end reached
// this node; the path is then asked about again).
func (n *Protocol) Hold(ctx context.Context, path string, own bool) {
	dir, _ := hfl.SplitPath(path)
	if !n.holder.holds(path) && (own || !n.holder.holdsListing(dir)) {
		n.ask(ctx, path, 0, false).endFlight()
	}
}

// List returns the listing of dir that this node holds, or reads it
// (first page only) if dir is small enough to keep.
func (n *Protocol) List(ctx context.Context, dir string, first bool) ([]hfl.Record, bool, error) {
	if recs, ok := n.holder.listing(dir); ok {
		return recs, true, nil // not while a path of dir is held back
	}
	if first && n.holder.listable(dir, time.Now()) {
		return n.readListing(ctx, dir)
	}
	return nil, false, nil
}

// HoldListing makes sure this node holds the listing of dir, unless it is
// too large to keep.
func (n *Protocol) HoldListing(ctx context.Context, dir string) {
	if n.holder.holdsListing(dir) || !n.holder.listable(dir, time.Now()) {
		return
	}
	n.readListing(ctx, dir)
}

// LocateWaiting is Locate for a consumer that waits, under w (see
// hfl.Locator.LocateWaiting).
func (n *Protocol) LocateWaiting(ctx context.Context, w *hfl.Watch, ahead bool) (hfl.Record, hfl.Level, error) {
	path := w.Path()
	if st, ok := n.Known(path); ok {
		if st.Exists {
			return st.Rec, hfl.LevelCache, nil
		}
		return hfl.Record{}, hfl.LevelCache, hfl.ErrNotFound
	}
	if ahead {
		// Held back for a commit told to be coming: the record sent
		// ahead is what the wait would take.
		if rec, ok := n.holder.markedRecord(path); ok {
			return rec, hfl.LevelHome, nil
		}
	}
	a := n.ask(ctx, path, 0, ahead)
	if a.answered {
		if a.exists && (!a.rec.Provisional || ahead) {
			return a.rec, hfl.LevelHome, nil
		}
		if !a.exists && a.gen > 0 {
			return hfl.Record{}, hfl.LevelHome, hfl.ErrNotFound
		}
	}
	// A notice's record will do unless it is provisional and only a
	// committed one was asked for.
	told := func() (hfl.Record, bool) {
		if !w.Fired() {
			return hfl.Record{}, false
		}
		rec, ok := w.Told()
		if !ok || (rec.Provisional && !ahead) {
			return hfl.Record{}, false
		}
		n.woken.Add(1)
		return rec, true
	}
	for {
		lctx, cancel := w.CancelOnChange(ctx)
		rec, err := n.env.Store.Lookup(lctx, n.env.Keys.Slot(path))
		ended := lctx.Err() != nil
		cancel()
		if rec, ok := told(); ok {
			a.endFlight()
			return rec, hfl.LevelHome, nil
		}
		if ended && ctx.Err() == nil && err != nil && !errors.Is(err, hfl.ErrNotFound) {
			// Ended by a change that does not answer: ask the
			// store again, past it.
			w.Rearm()
			continue
		}
		n.learnFromStore(path, a, rec, err)
		if err != nil {
			return hfl.Record{}, hfl.LevelGlobal, err
		}
		return n.home.withHeld(rec), hfl.LevelGlobal, nil
	}
}

// HomeOf returns the node that is the home of path in this node's view of
// the members.
func (n *Protocol) HomeOf(path string) string {
	dir, _ := hfl.SplitPath(path)
	m, _, _ := n.homeOf(dir)
	return m.Node
}

// Told returns the newest state of path this node knows of, promised or
// not.
func (n *Protocol) Told(path string) (rec hfl.Record, exists, ok bool) {
	rec, exists, gen, ok := n.holder.told(path)
	if ok && !exists {
		rec = hfl.Record{Path: path, Generation: gen}
	}
	return rec, exists, ok
}

// Stats returns the counters, and how many paths this node holds.
func (n *Protocol) Stats() (*hfl.NoticeStats, int) {
	s := n.stats()
	return &s, s.Promises
}

// readListing reads the whole listing of dir from the store, after
// registering at its home, and keeps it if it is not too large. ok is
// false when it is too large (then the caller reads page by page).
func (n *Protocol) readListing(ctx context.Context, dir string) ([]hfl.Record, bool, error) {
	home, epoch, ok := n.homeOf(dir)
	if !ok {
		return nil, false, nil
	}
	key := dir + "/"
	n.holder.startFlight(key)
	sent := time.Now()
	var r reply
	var err error
	if home.Node == n.self.Node {
		r = n.home.list(n.self.Node, dir)
	} else {
		var b []byte
		if b, err = n.send(ctx, home, notice{Kind: kindList, Path: dir}); err == nil {
			r, err = decodeReply(b)
		}
	}
	var recs []hfl.Record
	after := ""
	for len(recs) <= maxListing {
		pg, lerr := n.env.Store.ListDir(ctx, n.env.Keys.DirIndex(dir), after, hfl.DefaultListLimit)
		if lerr != nil {
			n.holder.endFlight(key)
			return nil, false, fmt.Errorf("list %q: %w", dir, lerr)
		}
		recs = append(recs, pg...)
		if len(pg) < hfl.DefaultListLimit {
			break
		}
		after = pg[len(pg)-1].Name()
	}
	broken := n.holder.endFlight(key)
	if len(recs) > maxListing {
		n.holder.foundTooLarge(dir, time.Now())
		return nil, false, nil
	}
	if err == nil && !broken {
		if pr, ok := n.holder.promiseFrom(home, r, epoch, sent); ok {
			n.holder.learnListing(dir, recs, pr)
		}
	}
	return recs, true, nil
}

// LocateWaiting is Locate for a consumer that waits, under w, if nothing
// is found; the caller has looked in its managed directory already. The
// path's home registers it while it answers, and a record of the path
// that reaches this node while the global store is asked ends the search:

type asked struct {
	answered   bool       // the home knew the path's state
	exists     bool       // ...and it is rec (else removed at gen)
	rec        hfl.Record // may be provisional (asked with ahead)
	gen        uint64
	registered bool // the home registered this node: promise holds once the store answered
	promise    promise
	pending    bool // the home holds the path back for a commit that is coming (see reply.Pending)
	path       string
	h          *holderSide
	ended      bool
}

// endFlight ends the question's flight once, and reports whether what it
// brought may be kept (no change was told meanwhile).
func (a *asked) endFlight() bool {
	if a.h == nil || a.ended {
		return false
	}
	a.ended = true
	return !a.h.endFlight(a.path)
}

// ask asks path's home what it knows of path, registering this node as a
// holder. What the home knew is kept under its promise; if it knew
// nothing, the caller reads the store and keeps that (see asked).
func (n *Protocol) ask(ctx context.Context, p string, after uint64, withAhead bool) *asked {
	dir, _ := hfl.SplitPath(p)
	home, epoch, ok := n.homeOf(dir)
	if !ok {
		return &asked{}
	}
	a := &asked{path: p, h: n.holder}
	n.holder.startFlight(p)
	sent := time.Now()
	var r reply
	if home.Node == n.self.Node {
		r = n.home.ask(n.self.Node, p, after, withAhead)
	} else {
		n.asked.Add(1)
		b, err := n.send(ctx, home, notice{Kind: kindAsk, Path: p, After: after, Ahead: withAhead})
		if err == nil {
			r, err = decodeReply(b)
		}
		if err != nil {
			a.endFlight()
			return &asked{}
		}
	}
	a.promise, a.registered = n.holder.promiseFrom(home, r, epoch, sent)
	if !r.Pending {
		n.holder.unmarkAnswered(p)
	} else {
		a.pending = true
		var ahead hfl.Record
		if r.Rec != nil {
			ahead = *r.Rec
			ahead.Inline = r.Inline
		}
		n.holder.markAsked(p, r.PendingOwner, r.PendingPublish, ahead)
	}
	switch {
	case r.Rec != nil && r.Rec.Provisional:
		rec := *r.Rec
		rec.Inline = r.Inline
		if !inlineFits(rec) {
			rec.Inline = nil
		}
		a.answered, a.exists, a.rec = true, true, rec
		if r.Known {
			a.gen = r.Gen
		}
		a.endFlight()
	case r.Known:
		a.answered, a.gen = true, r.Gen
		if r.Rec != nil {
			rec := *r.Rec
			if rec.Inline = r.Inline; !inlineFits(rec) {
				rec.Inline = nil // a transfer brings it
			}
			a.exists, a.rec = true, rec
			n.holder.keepBytes(rec)
		}
		keep := a.endFlight()
		n.holder.learn(p, a.rec, a.exists, a.gen, a.promise, a.registered && keep)
	}
	return a
}

// tellHome tells rec's home of rec (publish number publish), once after is
// closed (if not nil), aside: it retries until the home (in this node's
// view at each attempt) took it or the daemon stops. The committed record
// follows the provisional one, so that the home, given both in order,
// keeps the bytes the first one carries. The channel returned is closed
// when the home was told (or given up on).
func (n *Protocol) tellHome(rec hfl.Record, publish uint64, after <-chan struct{}) <-chan struct{} {
	done := make(chan struct{})
	workers.Go(func() {
		defer close(done)
		if after != nil {
			select {
			case <-after:
			case <-n.ctx.Done():
				return
			}
		}
		msg := notice{Kind: kindPublished, Rec: &rec, Inline: rec.Inline, Publish: publish}
		// A provisional notice is a shortcut for consumers waiting now:
		// one try. A committed one is how holders learn of the change.
		tries := 1
		if !rec.Provisional {
			tries = 20
		}
		n.deliver(n.ctx, msg, rec.Path, rec, !rec.Provisional, tries)
	})
	return done
}

// holdBack sends rec, provisional, to its home with Sync: the home tells
// every holder of the path and every lister of its directory that the
// commit is coming, and holds its own promises on the path back until
// the commit is told (see reply.Pending). One try, alongside the commit;
// the channel returned says whether the home did.
func (n *Protocol) holdBack(ctx context.Context, rec hfl.Record, publish uint64) <-chan bool {
	out := make(chan bool, 1)
	dir, _ := hfl.SplitPath(rec.Path)
	home, _, ok := n.homeOf(dir)
	if !ok {
		out <- false
		return out
	}
	if home.Node == n.self.Node {
		// Held here, at once; only the holders' telling, if any,
		// runs alongside the commit.
		held, tell := n.home.holdBackHere(ctx, rec, publish)
		if !held {
			// Taken as without a hold (its holders told aside), before
			// the commit's notice.
			n.home.published(ctx, n.self.Node, rec, publish, false, false, false)
		}
		if !held || tell == nil {
			out <- held
			return out
		}
		workers.Go(func() {
			tell()
			out <- true
		})
		return out
	}
	workers.Go(func() {
		b, err := n.send(ctx, home, notice{Kind: kindPublished, Rec: &rec, Inline: rec.Inline, Publish: publish, Sync: true})
		var r reply
		if err == nil {
			r, err = decodeReply(b)
		}
		out <- err == nil && r.Pending
	})
	return out
}

// tellCommitted tells out's home of its commit, publish publish, after the
// home held the path back: aside, or here and now if this node is the
// home (no message; its holders are told aside), which also spares the
// next close's commit the work of this one's told aside.
func (n *Protocol) tellCommitted(ctx context.Context, out hfl.Record, publish uint64) {
	dir, _ := hfl.SplitPath(out.Path)
	if home, _, ok := n.homeOf(dir); ok && home.Node == n.self.Node {
		n.deliver(ctx, notice{Kind: kindPublished, Rec: &out, Publish: publish}, out.Path, out, true, 1)
		return
	}
	n.tellHome(out, publish, nil)
}

// settleHome tells rec's home, aside, that the commit of publish publish,
// told to be coming (see holdBack), failed.
func (n *Protocol) settleHome(rec hfl.Record, publish uint64) {
	rec.Inline = nil
	msg := notice{Kind: kindPublished, Rec: &rec, Publish: publish, Settle: true}
	workers.Go(func() { n.deliver(n.ctx, msg, rec.Path, rec, false, 20) })
}

// tellHomeSync tells the home of p of msg and returns once the home told
// every holder. If the home cannot be reached, it waits until that home
// left the members (its holders' promises end with it) and tells the next.
func (n *Protocol) tellHomeSync(ctx context.Context, msg notice, p string, rec hfl.Record, exists bool) {
	n.deliver(ctx, msg, p, rec, exists, 0)
}

// deliver sends msg to p's home, trying again (at most tries times, 0: until
// ctx ends) while the home cannot be reached; this node then holds a
// promise for what it told.
func (n *Protocol) deliver(ctx context.Context, msg notice, p string, rec hfl.Record, exists bool, tries int) (took bool) {
	dir, _ := hfl.SplitPath(p)
	for attempt := 1; ; attempt++ {
		home, epoch, ok := n.homeOf(dir)
		if !ok {
			return false
		}
		sent := time.Now()
		var r reply
		var err error
		if home.Node == n.self.Node {
			if msg.Kind == kindPublished {
				r = n.home.published(ctx, n.self.Node, *msg.Rec, msg.Publish, msg.Sync, false, msg.Settle)
			} else {
				r = n.home.unpublished(ctx, n.self.Node, msg.Path, msg.Gen, msg.Sync, false)
			}
		} else {
			var b []byte
			if b, err = n.send(ctx, home, msg); err == nil {
				r, err = decodeReply(b)
			}
		}
		if err == nil {
			gen := msg.Gen
			if exists {
				gen = rec.Generation
			}
			if r.Known && r.Gen > gen && (msg.Rec == nil || !msg.Rec.Provisional) && r.Home.Equal(home.Started) && !n.holder.knowsSince(p, r.Gen) {
				// Overtaken at the home by a newer change: this node
				// takes it as told (two nodes wrote the path at once,
				// and this one lost), aside: taking it may tell the
				// kernel, which a request must not wait for.
				workers.Go(func() { n.holder.broken(home.Node, notice{Path: p, Rec: r.Rec, Gen: r.Gen}) })
				return true
			}
			if pr, ok := n.holder.promiseFrom(home, r, epoch, sent); ok && (msg.Rec == nil || !msg.Rec.Provisional) {
				n.holder.learn(p, rec, exists, gen, pr, true)
			}
			return true
		}
		if ctx.Err() != nil || (tries > 0 && attempt >= tries) {
			n.log.Debug("home not told", "home", home.Node, "path", p, "err", err)
			return false
		}
		if msg.Sync && tries == 0 {
			// The holders of a home that cannot be reached keep their
			// promises until it leaves the members: wait for that.
			n.homeWaits.Add(1)
			n.log.Warn("the home of a path cannot be reached; waiting for it to leave the members", "path", p, "home", home.Node, "err", err)
			if !n.awaitGone(ctx, home) {
				if ctx.Err() == nil {
					n.log.Error("the home of a path could not be told of a change; nodes that hold the path may not see it until their promises run out", "path", p, "home", home.Node)
				}
				return false
			}
			continue
		}
		pause := time.NewTimer(n.t.retry << min(attempt, 4))
		select {
		case <-pause.C:
		case <-ctx.Done():
			pause.Stop()
			return false
		}
	}
}

// awaitGone waits until m is no longer a member (in this node's view, read
// again every membersRetry) and every other node read the members since,
// or until ctx ends. It gives up, reporting false, after promiseTTL plus a
// refresh: a home that stays a member but cannot be reached from here (a
// partition) may never leave, and the promises it made hold at most that
// long unless their holders renew them there.
func (n *Protocol) awaitGone(ctx context.Context, m hfl.Member) bool {
	t := time.NewTicker(n.t.retry)
	defer t.Stop()
	limit := time.NewTimer(n.t.promiseTTL + n.t.refresh)
	defer limit.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-limit.C:
			return false
		case <-t.C:
		}
		rctx, cancel := context.WithTimeout(ctx, n.t.timeout)
		err := n.refresh(rctx)
		cancel()
		if err != nil {
			continue
		}
		if cur, ok := n.member(m.Node); !ok || !cur.Started.Equal(m.Started) {
			// The others read the members at most membersRefresh
			// later: until then they may still trust m's promises.
			wait := time.NewTimer(n.t.refresh + n.t.retry)
			select {
			case <-wait.C:
			case <-ctx.Done():
				wait.Stop()
			}
			return true
		}
	}
}

// Await waits for a record of w's path newer than after: told by a
// notice, or, once the grace has passed (at once if the home cannot
// register this node), found by a wait on the global store, made in this
// goroutine and ended by the next notice. A long wait asks its home again
// now and then, so that the home keeps this node registered.
func (n *Protocol) Await(ctx context.Context, w *hfl.Watch, after uint64, ahead bool) (hfl.Record, error) {
	path := w.Path()
	dir, _ := hfl.SplitPath(path)
	newer := func(rec hfl.Record) bool {
		return (rec.Provisional && ahead) || (!rec.Provisional && !rec.Writing && rec.Generation > after)
	}
	onStore, graceOver := false, false
	toStore := func() {
		if !onStore {
			onStore = true
			n.storeWaits.Add(1)
		}
	}
	grace := time.NewTimer(n.t.grace)
	defer grace.Stop()
	for {
		if w.Fired() {
			if w.ChangedHere() {
				return hfl.Record{}, hfl.ErrChangedHere
			}
			if rec, told := w.Told(); told {
				n.woken.Add(1)
				if newer(rec) {
					return rec, nil
				}
			}
			w.Rearm()
		}
		if !n.holder.holds(path) && !n.holder.heldBack(path) && (graceOver || !n.holder.holdsListing(dir)) {
			// Not registered at the home yet (or no longer), for the
			// path or its directory's listing (whose listers the
			// home tells of records sent ahead too), or waiting
			// under the listing alone past the grace (the listing
			// may have ended unseen, or its home changed): ask,
			// which registers this node.
			a := n.ask(ctx, path, after, ahead)
			a.endFlight()
			if a.answered && a.exists && newer(a.rec) {
				return a.rec, nil
			}
			if !a.registered && !a.pending {
				toStore() // the home tells this node of nothing
			}
		}
		if rec, exists, _, ok := n.holder.lookup(path); ok && exists && newer(rec) {
			return n.withBytes(rec), nil
		}
		if ahead {
			// Told as a lister, or held back, before this wait began.
			if rec, ok := n.holder.aheadOf(path); ok {
				return rec, nil
			}
			if rec, ok := n.holder.markedRecord(path); ok {
				return rec, nil
			}
		}
		if !onStore {
			select {
			case <-w.Done():
			case <-grace.C:
				graceOver = true
				toStore()
			case <-ctx.Done():
				return hfl.Record{}, ctx.Err()
			}
			continue
		}
		// On the store, until a notice, a change here, or the time to
		// ask the home again.
		cctx, cancel := w.CancelOnChange(ctx)
		wctx, cancelRenew := context.WithTimeout(cctx, n.t.resubscribe)
		rec, err := n.env.Store.Wait(wctx, n.env.Keys.Slot(path), after)
		ended := wctx.Err() != nil
		cancelRenew()
		cancel()
		switch {
		case err == nil:
			return rec, nil
		case ctx.Err() != nil:
			return hfl.Record{}, ctx.Err()
		case !ended:
			return hfl.Record{}, err // the store failed
		}
	}
}
