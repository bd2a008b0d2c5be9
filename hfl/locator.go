package hfl

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Level says where the locator found a record.
type Level int

const (
	// LevelLocal: the file is complete in this node's backing store.
	LevelLocal Level = iota
	// LevelCache: this daemon knew it, under a home's promise (or, on a
	// single node, from its own publishes).
	LevelCache
	// LevelHome: the path's home node (see notices) told it.
	LevelHome
	// LevelGlobal: the global metadata store held it.
	LevelGlobal
	numLevels
)

func (l Level) String() string {
	switch l {
	case LevelLocal:
		return "local"
	case LevelCache:
		return "cache"
	case LevelHome:
		return "home"
	case LevelGlobal:
		return "global"
	}
	return fmt.Sprintf("level(%d)", int(l))
}

// LocalIndex is the managed directory as the locator sees it: the first
// level, and what must hear of changes made elsewhere.
type LocalIndex interface {
	// LocalRecord returns the record of path if the file is complete here.
	LocalRecord(ctx context.Context, path string) (Record, bool)
	// Invalidated tells that path changed elsewhere: it is now rec, or
	// gone when exists is false. A copy of an older version here is stale.
	// It must not block for long: notices wait for it.
	Invalidated(path string, rec Record, exists bool)
	// ListingDropped tells that what this node knew of directory dir's
	// entries from its listing is no longer promised: a change of any of
	// them would not be told here.
	ListingDropped(dir string)
}

// LocatorConfig shapes the locator.
type LocatorConfig struct {
	// Namespace scopes every key, so that jobs sharing a store never see
	// each other's files.
	Namespace string
	// KeyDepth and KeyBins shape the hashed hierarchical key (DYAD's
	// DYAD_KEY_DEPTH and DYAD_KEY_BINS).
	KeyDepth int
	KeyBins  int
	// CacheSize bounds the number of records cached by this daemon on a
	// single node.
	CacheSize int
	// SingleNode says that no other node uses the store (the embedded
	// store): the namespace is this node's backing directory, and nothing
	// needs asking about.
	SingleNode bool
}

// DefaultLocatorConfig returns the defaults.
func DefaultLocatorConfig() LocatorConfig {
	return LocatorConfig{Namespace: "dyadfs", KeyDepth: DefaultKeyDepth, KeyBins: DefaultKeyBins, CacheSize: 65536}
}

// Validate checks the configuration.
func (c LocatorConfig) Validate() error {
	if c.Namespace == "" || strings.Trim(c.Namespace, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") != "" || c.Namespace[0] == '.' {
		return fmt.Errorf("namespace %q: want letters, digits, '.', '_' or '-', not starting with '.'", c.Namespace)
	}
	if err := ValidateKeyShape(c.KeyDepth, c.KeyBins); err != nil {
		return err
	}
	if c.CacheSize < 0 {
		return fmt.Errorf("cache size %d must not be negative", c.CacheSize)
	}
	return nil
}

// LocatorStats counts lookups answered at each level and misses.
type LocatorStats struct {
	Hits   map[string]uint64 `json:"hits"`
	Misses uint64            `json:"misses"`
	Cached int               `json:"cached_records"`
	// Notices is nil when notices are off (a single node).
	Notices *NoticeStats `json:"notices,omitempty"`
}

// Locator finds files through the levels and publishes records.
type Locator struct {
	cfg   LocatorConfig
	store Store
	local LocalIndex
	peers Peers        // nil: no notices
	waits *waits       // every wait for a path, whatever ends it
	cache *recordCache // a single node's own records

	notices atomic.Pointer[notices]

	hits   [numLevels]atomic.Uint64
	misses atomic.Uint64
}

// NewLocator returns a locator over store. local, its first level, may be
// nil; so may peers, through which it exchanges notices with the other
// nodes once StartNotices is called (nil: it never does).
func NewLocator(cfg LocatorConfig, store Store, local LocalIndex, peers Peers) (*Locator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Locator{cfg: cfg, store: guardStore(store), local: local, peers: peers, waits: newWaits(), cache: newRecordCache(cfg.CacheSize)}, nil
}

// SingleNode reports whether no other node uses the store.
func (l *Locator) SingleNode() bool { return l.cfg.SingleNode }

// Key returns the store key of a clean relative path: the job namespace,
// then DYAD's hashed hierarchical key of the path.
func (l *Locator) Key(path string) string {
	return l.cfg.Namespace + "/" + DYADKey(path, l.cfg.KeyDepth, l.cfg.KeyBins)
}

// Slot returns where the record of a clean relative path lives in the
// store.
func (l *Locator) Slot(p string) Slot {
	dir, name := splitPath(p)
	return Slot{Key: l.Key(p), Dir: l.dirIndex(dir), Name: name}
}

// dirIndex names the store's index of directory dir ("" for the top).
func (l *Locator) dirIndex(dir string) string { return l.cfg.Namespace + "/" + dir }

// Publish records rec in the global store and returns it with its new
// generation. Its home is told twice, without the caller waiting: ahead of
// the store's commit (consumers that wait need not wait for it: the owner
// serves the file from now on), with a small file's bytes (rec.Inline, at
// most InlineMax), and once committed.
func (l *Locator) Publish(ctx context.Context, rec Record) (Record, error) {
	return l.publish(ctx, rec, false)
}

// PublishAndTell is Publish for a writer's close that returns once the
// publish is seen everywhere (close-to-open): it returns once the path's
// home told every node holding a promise for the path of the committed
// record, as a rewrite's claim is told (a node that knew the name missing
// must not answer ENOENT after the close returned). A home that does not
// answer within a few tries is told aside, as Publish tells it.
func (l *Locator) PublishAndTell(ctx context.Context, rec Record) (Record, error) {
	return l.publish(ctx, rec, true)
}

func (l *Locator) publish(ctx context.Context, rec Record, tellNow bool) (Record, error) {
	inline := rec.Inline
	if !inlineFits(rec) {
		inline = nil
	}
	rec.Provisional, rec.Generation, rec.Inline, rec.Writing = false, 0, nil, false
	n := l.notices.Load()
	var publish uint64
	var told <-chan struct{}
	if n != nil {
		publish = n.nextPublish()
		ahead := rec
		ahead.Provisional, ahead.Inline = true, inline
		told = n.tellHome(ahead, publish, nil)
	}
	out, err := l.store.Publish(ctx, l.Slot(rec.Path), rec)
	if err != nil {
		return Record{}, fmt.Errorf("publish %s: %w", rec.Path, err)
	}
	switch {
	case n == nil:
		l.cache.put(out)
	case tellNow:
		n.holder.madeHere(out.Path, out, true, out.Generation)
		select {
		case <-told: // after the record sent ahead, whose bytes the home keeps
		case <-ctx.Done():
		}
		msg := notice{Kind: kindPublished, Rec: &out, Publish: publish, Sync: true}
		if !n.deliver(ctx, msg, out.Path, out, true, 1) {
			n.tellHome(out, publish, nil)
		}
	default:
		n.holder.madeHere(out.Path, out, true, out.Generation)
		n.tellHome(out, publish, told)
	}
	return out, nil
}

// PublishSync is Publish, but it returns once the path's home told every
// node holding a promise for the path (a rename, a link, a chmod made here
// is seen everywhere once it returns). No provisional notice goes ahead.
func (l *Locator) PublishSync(ctx context.Context, rec Record) (Record, error) {
	return l.publishTold(ctx, rec, false)
}

// Claim records that this node is rewriting a file published before: rec
// (with its last complete version's attributes) becomes the path's record
// with Writing set, and Claim returns once the path's home has told every
// node holding a promise for it, so that none serves its copy any more
// (close-to-open: an open that starts after the writer's close reads the
// new version). The next Publish ends the claim.
func (l *Locator) Claim(ctx context.Context, rec Record) (Record, error) {
	return l.publishTold(ctx, rec, true)
}

// publishTold commits rec (a claim if writing) and returns once the path's
// home told every holder of the path.
func (l *Locator) publishTold(ctx context.Context, rec Record, writing bool) (Record, error) {
	rec.Provisional, rec.Generation, rec.Inline, rec.Writing = false, 0, nil, writing
	out, err := l.store.Publish(ctx, l.Slot(rec.Path), rec)
	if err != nil {
		what := "publish"
		if writing {
			what = "claim"
		}
		return Record{}, fmt.Errorf("%s %s: %w", what, rec.Path, err)
	}
	if n := l.notices.Load(); n != nil {
		n.holder.madeHere(out.Path, out, true, out.Generation)
		n.tellHomeSync(ctx, notice{Kind: kindPublished, Rec: &out, Sync: true}, out.Path, out, true)
	} else {
		l.cache.put(out)
	}
	return out, nil
}

// NoticesOn reports whether notices are enabled: only then do a small
// file's bytes travel with them (see Record.Inline).
func (l *Locator) NoticesOn() bool { return l.notices.Load() != nil }

// Unpublish removes the record of path if it matches cond. With sync it
// returns once the path's home told every holder (an unlink or rename by
// a user); without, the home is told aside (a withdrawal of this node's
// own record, retried). It returns ErrConflict, removing nothing, when the
// record does not match cond.
func (l *Locator) Unpublish(ctx context.Context, path string, cond RemoveCond, sync bool) error {
	l.cache.remove(path)
	at, err := l.store.Remove(ctx, l.Slot(path), cond)
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("unpublish %s: %w", path, err)
	}
	if n := l.notices.Load(); n != nil {
		n.holder.madeHere(path, Record{Path: path}, false, at)
		msg := notice{Kind: kindUnpublished, Path: path, Gen: at, Sync: sync}
		if sync {
			n.tellHomeSync(ctx, msg, path, Record{}, false)
		} else {
			go n.tellHomeSync(n.ctx, msg, path, Record{}, false)
		}
	}
	return nil
}

// Locate searches the levels in order and returns the first record
// found, or ErrNotFound.
func (l *Locator) Locate(ctx context.Context, path string) (Record, Level, error) {
	if rec, ok := l.localRecord(ctx, path); ok {
		return rec, LevelLocal, nil
	}
	return l.Record(ctx, path)
}

// localRecord is the first level.
func (l *Locator) localRecord(ctx context.Context, path string) (Record, bool) {
	if l.local == nil {
		return Record{}, false
	}
	rec, ok := l.local.LocalRecord(ctx, path)
	if ok {
		l.hits[LevelLocal].Add(1)
	}
	return rec, ok
}

// State is what the job's namespace has at a path.
type State struct {
	Rec    Record // when Exists
	Exists bool
	// Gen orders states: the record's generation, or that of its removal
	// (0: never published, or removed when is not known).
	Gen   uint64
	Level Level
}

// Record returns the path's record in the job's namespace, wherever it was
// published, or ErrNotFound (see State).
func (l *Locator) Record(ctx context.Context, path string) (Record, Level, error) {
	st, err := l.State(ctx, path)
	if err == nil && !st.Exists {
		err = ErrNotFound
	}
	return st.Rec, st.Level, err
}

// State returns what the job's namespace has at path: what this node knows
// under a promise, else what the home knows, else what the store holds
// (the home registers this node before, so that a change after the store's
// answer is told to it). A record with Writing set stands for a file being
// rewritten.
func (l *Locator) State(ctx context.Context, path string) (State, error) {
	n := l.notices.Load()
	if n == nil {
		if rec, ok := l.cache.get(path); ok {
			l.hits[LevelCache].Add(1)
			return State{Rec: rec, Exists: true, Gen: rec.Generation, Level: LevelCache}, nil
		}
		rec, err := l.store.Lookup(ctx, l.Slot(path))
		return l.stateFromStore(rec, err, nil)
	}
	cached := func() (State, bool) {
		rec, exists, gen, ok := n.holder.lookup(path)
		if !ok {
			return State{}, false
		}
		l.hits[LevelCache].Add(1)
		if !exists {
			l.misses.Add(1)
			return State{Gen: gen, Level: LevelCache}, true
		}
		return State{Rec: n.withBytes(rec), Exists: true, Gen: gen, Level: LevelCache}, true
	}
	if st, ok := cached(); ok {
		return st, nil
	}
	dir, _ := splitPath(path)
	now := time.Now()
	if n.holder.wantListing(dir, now) {
		// Paths keep missing here: the listing answers the next ones.
		if _, ok, _ := n.readListing(ctx, dir); ok {
			if st, ok := cached(); ok {
				return st, nil
			}
		}
	}
	a := n.ask(ctx, path, 0, false)
	if a.answered {
		l.hits[LevelHome].Add(1)
		if !a.exists {
			l.misses.Add(1)
			n.holder.noteMiss(dir, now)
			return State{Gen: a.gen, Level: LevelHome}, nil
		}
		return State{Rec: a.rec, Exists: true, Gen: a.rec.Generation, Level: LevelHome}, nil
	}
	rec, err := l.store.Lookup(ctx, l.Slot(path))
	keep := a.endFlight()
	if exists := err == nil; exists || errors.Is(err, ErrNotFound) {
		n.holder.learn(path, rec, exists, rec.Generation, a.promise, a.registered && keep)
	}
	if errors.Is(err, ErrNotFound) {
		n.holder.noteMiss(dir, now)
	}
	return l.stateFromStore(rec, err, n)
}

// stateFromStore is State for what the store answered.
func (l *Locator) stateFromStore(rec Record, err error, n *notices) (State, error) {
	rec, lv, err := l.fromStore(rec, err, n)
	switch {
	case errors.Is(err, ErrNotFound):
		return State{Level: lv}, nil
	case err != nil:
		return State{Level: lv}, err
	}
	return State{Rec: rec, Exists: true, Gen: rec.Generation, Level: lv}, nil
}

// Hold makes sure this node holds a promise for path itself, not only
// through its directory's listing (which ends at the first change in the
// directory): a copy of the path, or a shadow of the directory, is about
// to be made here and must hear of its changes.
func (l *Locator) Hold(ctx context.Context, path string) {
	n := l.notices.Load()
	if n == nil || n.holder.holds(path) {
		return
	}
	n.ask(ctx, path, 0, false).endFlight()
}

// fromStore counts what the global store answered.
func (l *Locator) fromStore(rec Record, err error, n *notices) (Record, Level, error) {
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			l.misses.Add(1)
		}
		return Record{}, LevelGlobal, err
	}
	l.hits[LevelGlobal].Add(1)
	if n == nil {
		l.cache.put(rec)
	} else {
		rec = n.home.withHeld(rec) // this node may be its home
	}
	return rec, LevelGlobal, nil
}

// List returns up to limit entries of directory dir (clean, "" for the
// top) whose names sort after after, in name order; fewer than limit means
// the end. The first page of a directory small enough is read whole from
// the store, after registering at its home, and the listing kept under the
// home's promise for the pages and lookups that follow.
func (l *Locator) List(ctx context.Context, dir, after string, limit int) ([]Record, error) {
	if limit <= 0 {
		limit = DefaultListLimit
	}
	n := l.notices.Load()
	if n != nil {
		if recs, ok := n.holder.listing(dir); ok {
			return page(recs, after, limit), nil
		}
		if after == "" && n.holder.listable(dir, time.Now()) {
			if recs, ok, err := n.readListing(ctx, dir); err != nil || ok {
				return page(recs, after, limit), err
			}
		}
	}
	recs, err := l.store.ListDir(ctx, l.dirIndex(dir), after, limit)
	if err != nil {
		return nil, fmt.Errorf("list %q: %w", dir, err)
	}
	return recs, nil
}

// page returns the part of recs (sorted by path) after after.
func page(recs []Record, after string, limit int) []Record {
	i := 0
	if after != "" {
		i = sort.Search(len(recs), func(i int) bool { return recs[i].Name() > after })
	}
	return recs[i:min(len(recs), i+limit)]
}

// HoldListing makes sure this node holds the listing of directory dir
// (clean, "" for the top), reading it if need be: creates there are then
// answered here. A directory too large to keep is not read.
func (l *Locator) HoldListing(ctx context.Context, dir string) {
	n := l.notices.Load()
	if n == nil || n.holder.holdsListing(dir) || !n.holder.listable(dir, time.Now()) {
		return
	}
	n.readListing(ctx, dir)
}

// readListing reads the whole listing of dir from the store, after
// registering at its home, and keeps it if it is not too large. ok is
// false when it is too large (then the caller reads page by page).
func (n *notices) readListing(ctx context.Context, dir string) ([]Record, bool, error) {
	l := n.l
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
	var recs []Record
	after := ""
	for len(recs) <= maxListing {
		pg, lerr := l.store.ListDir(ctx, l.dirIndex(dir), after, DefaultListLimit)
		if lerr != nil {
			n.holder.endFlight(key)
			return nil, false, fmt.Errorf("list %q: %w", dir, lerr)
		}
		recs = append(recs, pg...)
		if len(pg) < DefaultListLimit {
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
// a publish that lands during the store's round trip is not waited for
// behind it. With ahead, the record found may be provisional (sent ahead
// of its publish).
func (l *Locator) LocateWaiting(ctx context.Context, w *Watch, ahead bool) (Record, Level, error) {
	path := w.path
	n := l.notices.Load()
	if n == nil {
		return l.Record(ctx, path)
	}
	if rec, exists, _, ok := n.holder.lookup(path); ok {
		l.hits[LevelCache].Add(1)
		if exists {
			return n.withBytes(rec), LevelCache, nil
		}
		l.misses.Add(1)
		return Record{}, LevelCache, ErrNotFound
	}
	a := n.ask(ctx, path, 0, ahead)
	if a.answered {
		if a.exists && (!a.rec.Provisional || ahead) {
			l.hits[LevelHome].Add(1)
			return a.rec, LevelHome, nil
		}
		if !a.exists && a.gen > 0 {
			l.misses.Add(1)
			return Record{}, LevelHome, ErrNotFound
		}
	}
	// A notice's record will do unless it is provisional and only a
	// committed one was asked for.
	told := func() (Record, bool) {
		if !w.fired() || !w.w.told || (w.w.rec.Provisional && !ahead) {
			return Record{}, false
		}
		n.woken.Add(1)
		l.hits[LevelHome].Add(1)
		return w.w.rec, true
	}
	for {
		lctx, cancel := w.cancelOnChange(ctx)
		rec, err := l.store.Lookup(lctx, l.Slot(path))
		ended := lctx.Err() != nil
		cancel()
		if rec, ok := told(); ok {
			a.endFlight()
			return rec, LevelHome, nil
		}
		if ended && ctx.Err() == nil && err != nil && !errors.Is(err, ErrNotFound) {
			// Ended by a change that does not answer: ask the
			// store again, past it.
			w.rearm()
			continue
		}
		keep := a.endFlight()
		if err == nil || errors.Is(err, ErrNotFound) {
			n.holder.learn(path, rec, err == nil, rec.Generation, a.promise, a.registered && keep)
		}
		return l.fromStore(rec, err, n)
	}
}

// Await blocks, under w, until the job has a record of w's path newer than
// generation after, and returns it; or until the path changes on this
// node (ErrChangedHere), or ctx ends. With ahead, the record may be
// provisional: sent by its owner ahead of the store's commit, whose file
// the owner serves. The wait parks no goroutine but the caller's.
func (l *Locator) Await(ctx context.Context, w *Watch, after uint64, ahead bool) (Record, error) {
	if n := l.notices.Load(); n != nil {
		return n.await(ctx, w, after, ahead)
	}
	if w.fired() {
		return Record{}, ErrChangedHere
	}
	wctx, cancel := w.cancelOnChange(ctx)
	defer cancel()
	rec, err := l.store.Wait(wctx, l.Slot(w.path), after)
	switch {
	case err == nil:
		l.cache.put(rec)
		return rec, nil
	case ctx.Err() != nil:
		return Record{}, ctx.Err()
	case w.fired():
		return Record{}, ErrChangedHere
	}
	return Record{}, err
}

// Published returns the global store's record of path, bypassing the other
// levels: what other nodes would find.
func (l *Locator) Published(ctx context.Context, path string) (Record, error) {
	return l.store.Lookup(ctx, l.Slot(path))
}

// HomeOf returns the node that is the home of path (see notices) in this
// node's view of the members, or "" when notices are off.
func (l *Locator) HomeOf(path string) string {
	n := l.notices.Load()
	if n == nil {
		return ""
	}
	dir, _ := splitPath(path)
	m, _, _ := n.homeOf(dir)
	return m.Node
}

// Told returns the newest state of path this node knows of, promised or
// not: what a home told it, or what it published or removed itself. A
// removal is rec with exists false, its generation in rec.Generation.
// ok is false when it knows nothing of path.
func (l *Locator) Told(path string) (rec Record, exists, ok bool) {
	n := l.notices.Load()
	if n == nil {
		rec, ok := l.cache.get(path) // its publishes, and records it looked up
		return rec, ok, ok
	}
	rec, exists, gen, ok := n.holder.told(path)
	if ok && !exists {
		rec = Record{Path: path, Generation: gen}
	}
	return rec, exists, ok
}

// Forget drops what this node knows of path, for example after its owner
// refused it.
func (l *Locator) Forget(path string) {
	l.cache.remove(path)
	if n := l.notices.Load(); n != nil {
		n.holder.forget(path)
	}
}

// Stats returns the level counters.
func (l *Locator) Stats() LocatorStats {
	s := LocatorStats{Hits: make(map[string]uint64, numLevels), Misses: l.misses.Load(), Cached: l.cache.len()}
	for lv := Level(0); lv < numLevels; lv++ {
		s.Hits[lv.String()] = l.hits[lv].Load()
	}
	if n := l.notices.Load(); n != nil {
		ns := n.stats()
		s.Notices = &ns
		s.Cached = ns.Promises
	}
	return s
}

// asked is what a question to a path's home brought.
type asked struct {
	answered   bool   // the home knew the path's state
	exists     bool   // ...and it is rec (else removed at gen)
	rec        Record // may be provisional (asked with ahead)
	gen        uint64
	registered bool // the home registered this node: promise holds once the store answered
	promise    promise
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
func (n *notices) ask(ctx context.Context, p string, after uint64, withAhead bool) *asked {
	dir, _ := splitPath(p)
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
func (n *notices) tellHome(rec Record, publish uint64, after <-chan struct{}) <-chan struct{} {
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
		msg := notice{Kind: kindPublished, Rec: &rec, Inline: rec.Inline, Publish: publish}
		// A provisional notice is a shortcut for consumers waiting now:
		// one try. A committed one is how holders learn of the change.
		tries := 1
		if !rec.Provisional {
			tries = 20
		}
		n.deliver(n.ctx, msg, rec.Path, rec, !rec.Provisional, tries)
	}()
	return done
}

// tellHomeSync tells the home of p of msg and returns once the home told
// every holder. If the home cannot be reached, it waits until that home
// left the members (its holders' promises end with it) and tells the next.
func (n *notices) tellHomeSync(ctx context.Context, msg notice, p string, rec Record, exists bool) {
	n.deliver(ctx, msg, p, rec, exists, 0)
}

// deliver sends msg to p's home, trying again (at most tries times, 0: until
// ctx ends) while the home cannot be reached; this node then holds a
// promise for what it told.
func (n *notices) deliver(ctx context.Context, msg notice, p string, rec Record, exists bool, tries int) (took bool) {
	dir, _ := splitPath(p)
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
				r = n.home.published(ctx, n.self.Node, *msg.Rec, msg.Publish, msg.Sync, false)
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
				go n.holder.broken(home.Node, p, r.Rec, r.Gen, false, false, false)
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
func (n *notices) awaitGone(ctx context.Context, m Member) bool {
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

// await waits for a record of w's path newer than after: told by a
// notice, or, once the grace has passed (at once if the home cannot
// register this node), found by a wait on the global store, made in this
// goroutine and ended by the next notice. A long wait asks its home again
// now and then, so that the home keeps this node registered.
func (n *notices) await(ctx context.Context, w *Watch, after uint64, ahead bool) (Record, error) {
	path := w.path
	newer := func(rec Record) bool {
		return (rec.Provisional && ahead) || (!rec.Provisional && !rec.Writing && rec.Generation > after)
	}
	onStore := false
	toStore := func() {
		if !onStore {
			onStore = true
			n.storeWaits.Add(1)
		}
	}
	grace := time.NewTimer(n.t.grace)
	defer grace.Stop()
	for {
		if w.fired() {
			if w.w.here {
				return Record{}, ErrChangedHere
			}
			if w.w.told {
				n.woken.Add(1)
				if newer(w.w.rec) {
					return w.w.rec, nil
				}
			}
			w.rearm()
		}
		if !n.holder.holds(path) {
			// Not registered at the home yet (or no longer): ask,
			// which registers this node.
			a := n.ask(ctx, path, after, ahead)
			a.endFlight()
			if a.answered && a.exists && newer(a.rec) {
				return a.rec, nil
			}
			if !a.registered {
				toStore()
			}
		}
		if rec, exists, _, ok := n.holder.lookup(path); ok && exists && newer(rec) {
			return n.withBytes(rec), nil
		}
		if !onStore {
			select {
			case <-w.w.ch:
			case <-grace.C:
				toStore()
			case <-ctx.Done():
				return Record{}, ctx.Err()
			}
			continue
		}
		// On the store, until a notice, a change here, or the time to
		// ask the home again.
		cctx, cancel := w.cancelOnChange(ctx)
		wctx, cancelRenew := context.WithTimeout(cctx, n.t.resubscribe)
		rec, err := n.l.store.Wait(wctx, n.l.Slot(path), after)
		ended := wctx.Err() != nil
		cancelRenew()
		cancel()
		switch {
		case err == nil:
			return rec, nil
		case ctx.Err() != nil:
			return Record{}, ctx.Err()
		case !ended:
			return Record{}, err // the store failed
		}
	}
}

// recordCache is a bounded LRU of records keyed by path: on a single
// node, where nothing changes unseen, the records this node published.
type recordCache struct {
	mu    sync.Mutex
	max   int
	order *list.List // front: most recently used
	byKey map[string]*list.Element
}

func newRecordCache(max int) *recordCache {
	return &recordCache{max: max, order: list.New(), byKey: make(map[string]*list.Element)}
}

func (c *recordCache) get(path string) (Record, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.byKey[path]
	if !ok {
		return Record{}, false
	}
	c.order.MoveToFront(e)
	return e.Value.(Record), true
}

func (c *recordCache) put(rec Record) {
	if c.max == 0 {
		return
	}
	rec.Inline = nil // bytes are held by homes only, within their bound
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.byKey[rec.Path]; ok {
		// Never let an older generation replace a newer one.
		if e.Value.(Record).Generation <= rec.Generation {
			e.Value = rec
		}
		c.order.MoveToFront(e)
		return
	}
	c.byKey[rec.Path] = c.order.PushFront(rec)
	for c.order.Len() > c.max {
		last := c.order.Back()
		c.order.Remove(last)
		delete(c.byKey, last.Value.(Record).Path)
	}
}

func (c *recordCache) remove(path string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.byKey[path]; ok {
		c.order.Remove(e)
		delete(c.byKey, path)
	}
}

func (c *recordCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.order.Len()
}
