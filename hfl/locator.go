package hfl

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
)

// Level says where the locator found a record.
type Level int

const (
	// LevelLocal: the file is complete in this node's backing store.
	LevelLocal Level = iota
	// LevelCache: this daemon's cache of records held it.
	LevelCache
	// LevelHome: the path's home node (see notices) held it.
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

// LocalIndex answers the first level: is the file complete here?
type LocalIndex interface {
	LocalRecord(ctx context.Context, path string) (Record, bool)
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
	// CacheSize bounds the number of records cached by this daemon.
	CacheSize int
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

// Locator finds files through the three levels and publishes records.
type Locator struct {
	cfg   LocatorConfig
	store Store
	local LocalIndex
	cache *recordCache

	notices atomic.Pointer[notices]

	hits   [numLevels]atomic.Uint64
	misses atomic.Uint64
}

// NewLocator returns a locator over store; local may be nil.
func NewLocator(cfg LocatorConfig, store Store, local LocalIndex) (*Locator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Locator{cfg: cfg, store: store, local: local, cache: newRecordCache(cfg.CacheSize)}, nil
}

// SetLocal sets the first level; it must be called before the locator is used.
func (l *Locator) SetLocal(local LocalIndex) { l.local = local }

// Key returns the store key of a clean relative path: the job namespace,
// then DYAD's hashed hierarchical key of the path.
func (l *Locator) Key(path string) string {
	return l.cfg.Namespace + "/" + DYADKey(path, l.cfg.KeyDepth, l.cfg.KeyBins)
}

// Publish records rec in the global store and the cache, and returns it with
// its new generation. A small file's bytes (rec.Inline, at most InlineMax)
// go with the notices only.
func (l *Locator) Publish(ctx context.Context, rec Record) (Record, error) {
	inline := rec.Inline
	if !inlineFits(rec) {
		inline = nil
	}
	rec.Provisional, rec.Generation, rec.Inline = false, 0, nil
	n := l.notices.Load()
	var publish uint64
	var told <-chan struct{}
	if n != nil {
		// Waiting consumers need not wait for the store's commit: the
		// owner serves the file from now on.
		publish = n.nextPublish()
		ahead := rec
		ahead.Provisional, ahead.Inline = true, inline
		told = n.published(ahead, publish, nil)
	}
	out, err := l.store.Publish(ctx, l.Key(rec.Path), rec)
	if err != nil {
		return Record{}, fmt.Errorf("publish %s: %w", rec.Path, err)
	}
	l.cache.put(out)
	if n != nil {
		// The home gives the bytes it holds of this publish the
		// committed generation, for consumers that come later.
		n.published(out, publish, told)
	}
	return out, nil
}

// NoticesOn reports whether notices are enabled: only then do a small
// file's bytes travel with them (see Record.Inline).
func (l *Locator) NoticesOn() bool { return l.notices.Load() != nil }

// Unpublish removes owner's record of path.
func (l *Locator) Unpublish(ctx context.Context, path, owner string) error {
	l.cache.remove(path)
	err := l.store.Remove(ctx, l.Key(path), owner)
	if err != nil && !errors.Is(err, ErrNotFound) {
		return fmt.Errorf("unpublish %s: %w", path, err)
	}
	if n := l.notices.Load(); n != nil {
		n.unpublished(path, owner)
	}
	return nil
}

// Locate searches the three levels in order and returns the first record
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

// cached is the second level, with the bytes this node holds as the
// path's home (n may be nil).
func (l *Locator) cached(path string, n *notices) (Record, bool) {
	rec, ok := l.cache.get(path)
	if !ok {
		return Record{}, false
	}
	l.hits[LevelCache].Add(1)
	if n != nil {
		rec = n.withHeld(rec)
	}
	return rec, true
}

// LocateWaiting is Locate for a consumer that waits if nothing is found.
// The path's home subscribes it while it answers, and a record of the path
// that reaches this node while the global store is asked ends the search:
// a publish that lands during the store's round trip is not waited for
// behind it. With ahead, the record found may be provisional (sent ahead
// of its publish).
func (l *Locator) LocateWaiting(ctx context.Context, path string, ahead bool) (Record, Level, error) {
	n := l.notices.Load()
	if n == nil {
		return l.Locate(ctx, path)
	}
	if rec, ok := l.localRecord(ctx, path); ok {
		return rec, LevelLocal, nil
	}
	if rec, ok := l.cached(path, n); ok {
		return rec, LevelCache, nil
	}
	w, done := n.waitChannel(path)
	defer done()
	if rec, found, _ := n.ask(ctx, path, 0, true, ahead); found {
		l.hits[LevelHome].Add(1)
		return rec, LevelHome, nil
	}
	type lookup struct {
		rec Record
		err error
	}
	answer := make(chan lookup, 1)
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		rec, err := l.store.Lookup(lctx, l.Key(path))
		answer <- lookup{rec, err}
	}()
	// The notice's record will do unless it is provisional and only a
	// committed one was asked for.
	notice := w.ch
	told := func() (Record, Level, error) {
		n.woken.Add(1)
		l.hits[LevelHome].Add(1)
		return w.rec, LevelHome, nil
	}
	for {
		select {
		case <-notice:
			if !w.rec.Provisional || ahead {
				return told()
			}
			notice = nil // only the store's answer will do
		case a := <-answer:
			if errors.Is(a.err, ErrNotFound) && notice != nil {
				select {
				case <-notice: // both at once: the notice has it
					if !w.rec.Provisional || ahead {
						return told()
					}
				default:
				}
			}
			return l.fromStore(a.rec, a.err, n)
		}
	}
}

// fromStore counts and caches what the global store answered.
func (l *Locator) fromStore(rec Record, err error, n *notices) (Record, Level, error) {
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			l.misses.Add(1)
		}
		return Record{}, LevelGlobal, err
	}
	l.hits[LevelGlobal].Add(1)
	l.cache.put(rec)
	if n != nil {
		rec = n.withHeld(rec) // this node may be its home
	}
	return rec, LevelGlobal, nil
}

// Record searches the last two levels, the cache and the global store, for
// path's record: where it was published, by this node or another.
func (l *Locator) Record(ctx context.Context, path string) (Record, Level, error) {
	n := l.notices.Load()
	if rec, ok := l.cached(path, n); ok {
		return rec, LevelCache, nil
	}
	if n != nil {
		if rec, found, _ := n.ask(ctx, path, 0, false, false); found {
			l.hits[LevelHome].Add(1)
			return rec, LevelHome, nil
		}
	}
	rec, err := l.store.Lookup(ctx, l.Key(path))
	return l.fromStore(rec, err, n)
}

// Wait blocks until the global store holds a record of path newer than
// generation after, and returns it.
func (l *Locator) Wait(ctx context.Context, path string, after uint64) (Record, error) {
	return l.wait(ctx, path, after, false)
}

// WaitAhead is Wait, but it may also return a provisional record: one sent
// by its owner ahead of the store's commit, whose file the owner serves.
func (l *Locator) WaitAhead(ctx context.Context, path string, after uint64) (Record, error) {
	return l.wait(ctx, path, after, true)
}

func (l *Locator) wait(ctx context.Context, path string, after uint64, ahead bool) (Record, error) {
	if n := l.notices.Load(); n != nil {
		return n.wait(ctx, path, after, ahead)
	}
	rec, err := l.store.Wait(ctx, l.Key(path), after)
	if err != nil {
		return Record{}, err
	}
	l.cache.put(rec)
	return rec, nil
}

// Published returns the global store's record of path, bypassing the first
// two levels: what other nodes would find.
func (l *Locator) Published(ctx context.Context, path string) (Record, error) {
	return l.store.Lookup(ctx, l.Key(path))
}

// Forget drops path from the cache, for example after its owner refused it.
func (l *Locator) Forget(path string) { l.cache.remove(path) }

// Stats returns the level counters.
func (l *Locator) Stats() LocatorStats {
	s := LocatorStats{Hits: make(map[string]uint64, numLevels), Misses: l.misses.Load(), Cached: l.cache.len()}
	for lv := Level(0); lv < numLevels; lv++ {
		s.Hits[lv.String()] = l.hits[lv].Load()
	}
	if n := l.notices.Load(); n != nil {
		ns := n.stats()
		s.Notices = &ns
	}
	return s
}

// recordCache is a bounded LRU of records keyed by path.
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
