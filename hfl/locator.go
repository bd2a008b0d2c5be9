package hfl

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
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
	// LevelHome: the path's home node (see Notices) told it.
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
	// single node whose store is not in its own process (see
	// store.InProcess).
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

// Keys returns the keyspace the configuration names.
func (c LocatorConfig) Keys() Keyspace {
	return Keyspace{Namespace: c.Namespace, Depth: c.KeyDepth, Bins: c.KeyBins}
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
	cfg     LocatorConfig
	keys    Keyspace
	store   *downStore
	local   LocalIndex
	waits   *Waits // every wait for a path, whatever ends it
	notices Notices

	hits   [numLevels]atomic.Uint64
	misses atomic.Uint64
}

// NewLocator returns a locator over store, whose notices newNotices makes
// (SingleNode, or the notice protocol over the transport's messages).
// local, its first level, may be nil.
func NewLocator(cfg LocatorConfig, store Store, local LocalIndex, newNotices NewNotices) (*Locator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	l := &Locator{cfg: cfg, keys: cfg.Keys(), store: guardStore(store), local: local, waits: newWaits()}
	inProcess, _ := store.(InProcess)
	l.notices = newNotices(NoticeEnv{Keys: l.keys, Store: l.store, Local: local, Waits: l.waits, CacheSize: cfg.CacheSize, InProcess: inProcess})
	return l, nil
}

// SingleNode reports whether no other node uses the store.
func (l *Locator) SingleNode() bool { return l.cfg.SingleNode }

// Key returns the store key of a clean relative path (see Keyspace.Key).
func (l *Locator) Key(path string) string { return l.keys.Key(path) }

// Slot returns where the record of a clean relative path lives in the
// store.
func (l *Locator) Slot(p string) Slot { return l.keys.Slot(p) }

// StartNotices takes part in the job's notices as the member self, until
// ctx ends (see Notices.Start). HandleMessage must receive the messages
// the transport's peers send.
func (l *Locator) StartNotices(ctx context.Context, self Member) error {
	return l.notices.Start(ctx, self)
}

// HandleMessage answers a notice from node from (the transport's message
// handler).
func (l *Locator) HandleMessage(ctx context.Context, from string, msg []byte) ([]byte, error) {
	return l.notices.HandleMessage(ctx, from, msg)
}

// Publish records rec in the global store and returns it with its new
// generation; the nodes that hold its path are told as o says. A publish
// sent ahead carries a small file's bytes (rec.Inline, at most InlineMax).
func (l *Locator) Publish(ctx context.Context, rec Record, o PublishOptions) (Record, error) {
	inline := rec.Inline
	rec.Provisional, rec.Generation, rec.Inline, rec.Writing = false, 0, nil, o.Claim
	commit := func(ctx context.Context) (Record, error) {
		return l.store.publish(ctx, l.Slot(rec.Path), rec, o.Deferrable)
	}
	if spent := o.Spent; spent != nil {
		// Timed only when asked: the untimed publish allocates nothing
		// more. Added up: a publish that is tried again spends on each try.
		start, before, untimed := time.Now(), spent.Commit, commit
		commit = func(ctx context.Context) (Record, error) {
			t := time.Now()
			out, err := untimed(ctx)
			spent.Commit += time.Since(t)
			return out, err
		}
		defer func() { spent.Tell += max(0, time.Since(start)-(spent.Commit-before)) }()
	}
	out, err := l.notices.Publish(ctx, rec, inline, o, commit)
	if err != nil {
		what := "publish"
		if o.Claim {
			what = "claim"
		}
		return Record{}, fmt.Errorf("%s %s: %w", what, rec.Path, err)
	}
	return out, nil
}

// CarriesBytes reports whether a small file's bytes travel with the
// notices of its publish (see Record.Inline).
func (l *Locator) CarriesBytes() bool { return l.notices.CarriesBytes() }

// Unpublish removes the record of path if it matches cond. With sync it
// returns once the path's home told every holder (an unlink or rename by
// a user); without, the home is told aside (a withdrawal of this node's
// own record, retried). It returns ErrConflict, removing nothing, when the
// record does not match cond.
func (l *Locator) Unpublish(ctx context.Context, path string, cond RemoveCond, sync bool) error {
	at, err := l.store.Remove(ctx, l.Slot(path), cond)
	if errors.Is(err, ErrNotFound) {
		l.notices.Forget(path)
		return nil
	}
	if err != nil {
		l.notices.Forget(path)
		return fmt.Errorf("unpublish %s: %w", path, err)
	}
	l.notices.Removed(ctx, path, at, sync)
	return nil
}

// Locate searches the levels in order and returns the first record
// found, or ErrNotFound.
func (l *Locator) Locate(ctx context.Context, path string) (Record, Level, error) {
	if l.local != nil {
		if rec, ok := l.local.LocalRecord(ctx, path); ok {
			l.hits[LevelLocal].Add(1)
			return rec, LevelLocal, nil
		}
	}
	return l.Record(ctx, path)
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
	st, err := l.notices.State(ctx, path)
	if err == nil {
		l.count(st.Level, st.Exists)
	}
	return st, err
}

// Known returns the record at path when this node knows, without asking
// anyone, that the namespace has one (see State).
func (l *Locator) Known(path string) (Record, bool) {
	st, ok := l.notices.Known(path)
	if !ok || !st.Exists {
		return Record{}, false
	}
	l.count(st.Level, true)
	return st.Rec, true
}

// count counts an answer at level lv: a record found there is a hit, a
// path found missing a miss.
func (l *Locator) count(lv Level, found bool) {
	if found {
		l.hits[lv].Add(1)
	} else {
		l.misses.Add(1)
	}
}

// Hold makes sure this node holds a promise for path, its own or, unless
// own, through its directory's listing: a copy of the path, or a shadow
// of the directory (own: a lookup trusts a directory here without asking,
// and a listing's promise can end before the path's would), is about to
// be made here and must hear of its changes.
func (l *Locator) Hold(ctx context.Context, path string, own bool) { l.notices.Hold(ctx, path, own) }

// List returns up to limit entries of directory dir (clean, "" for the
// top) whose names sort after after, in name order; fewer than limit means
// the end. The first page of a directory small enough is read whole from
// the store, after registering at its home, and the listing kept under the
// home's promise for the pages and lookups that follow.
func (l *Locator) List(ctx context.Context, dir, after string, limit int) ([]Record, error) {
	if limit <= 0 {
		limit = DefaultListLimit
	}
	if recs, ok, err := l.notices.List(ctx, dir, after == ""); err != nil || ok {
		return page(recs, after, limit), err
	}
	recs, err := l.store.ListDir(ctx, l.keys.DirIndex(dir), after, limit)
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
func (l *Locator) HoldListing(ctx context.Context, dir string) { l.notices.HoldListing(ctx, dir) }

// LocateWaiting is Locate for a consumer that waits, under w, if nothing
// is found; the caller has looked in its managed directory already. The
// path's home registers it while it answers, and a record of the path
// that reaches this node while the global store is asked ends the search:
// a publish that lands during the store's round trip is not waited for
// behind it. With ahead, the record found may be provisional (sent ahead
// of its publish).
func (l *Locator) LocateWaiting(ctx context.Context, w *Watch, ahead bool) (Record, Level, error) {
	rec, lv, err := l.notices.LocateWaiting(ctx, w, ahead)
	if err == nil || errors.Is(err, ErrNotFound) {
		l.count(lv, err == nil)
	}
	return rec, lv, err
}

// Await blocks, under w, until the job has a record of w's path newer than
// generation after, and returns it; or until the path changes on this
// node (ErrChangedHere), or ctx ends. With ahead, the record may be
// provisional: sent by its owner ahead of the store's commit, whose file
// the owner serves. The wait parks no goroutine but the caller's.
func (l *Locator) Await(ctx context.Context, w *Watch, after uint64, ahead bool) (Record, error) {
	return l.notices.Await(ctx, w, after, ahead)
}

// Published returns the global store's record of path, bypassing the other
// levels: what other nodes would find.
func (l *Locator) Published(ctx context.Context, path string) (Record, error) {
	return l.store.Lookup(ctx, l.Slot(path))
}

// HomeOf returns the node that is the home of path (see Notices) in this
// node's view of the members, or "" when there is none.
func (l *Locator) HomeOf(path string) string { return l.notices.HomeOf(path) }

// Told returns the newest state of path this node knows of, promised or
// not: what a home told it, or what it published or removed itself. A
// removal is rec with exists false, its generation in rec.Generation.
// ok is false when it knows nothing of path.
func (l *Locator) Told(path string) (rec Record, exists, ok bool) { return l.notices.Told(path) }

// Ahead returns the record of path sent ahead of its commit (provisional)
// that this node was told, and not the commit yet: a copy fetched as that
// record is the version being committed.
func (l *Locator) Ahead(path string) (Record, bool) { return l.notices.Ahead(path) }

// Forget drops what this node knows of path, for example after its owner
// refused it.
func (l *Locator) Forget(path string) { l.notices.Forget(path) }

// Stats returns the level counters.
func (l *Locator) Stats() LocatorStats {
	s := LocatorStats{Hits: make(map[string]uint64, numLevels), Misses: l.misses.Load()}
	for lv := Level(0); lv < numLevels; lv++ {
		s.Hits[lv.String()] = l.hits[lv].Load()
	}
	s.Notices, s.Cached = l.notices.Stats()
	return s
}
