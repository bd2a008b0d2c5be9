package hfl

import (
	"container/list"
	"context"
	"errors"
	"sync"
	"time"
)

// Notices keeps this node's view of the namespace coherent with the other
// nodes' without a round trip through the global store on every lookup:
// the notice protocol (package notice) where several nodes share the
// store, SingleNode where one daemon does. The locator receives it in its
// constructor (see NewNotices) and leaves everything that crosses nodes
// to it.
type Notices interface {
	// Start takes part in the job as the member self (whose Started tells
	// its incarnation), until ctx ends. Before it, nothing is told or
	// asked: every answer comes from the store.
	Start(ctx context.Context, self Member) error
	// Publish commits rec with commit and tells the nodes that hold its
	// path, as o says; inline is a small file's bytes, sent with the
	// record when it goes ahead of the commit.
	Publish(ctx context.Context, rec Record, inline *Inline, o PublishOptions, commit func(context.Context) (Record, error)) (Record, error)
	// Removed tells that this node removed path's record at generation
	// gen; with sync it returns once the path's holders were told.
	Removed(ctx context.Context, path string, gen uint64, sync bool)
	// Forget drops what this node knows of path.
	Forget(path string)
	// State returns what the job's namespace has at path (see
	// Locator.State).
	State(ctx context.Context, path string) (State, error)
	// Known is State when this node knows path's state without asking
	// anyone (under a promise, or cached alone); ok is false otherwise.
	Known(path string) (st State, ok bool)
	// LocateWaiting, Await, Hold and HoldListing: see the locator's
	// methods of these names.
	LocateWaiting(ctx context.Context, w *Watch, ahead bool) (Record, Level, error)
	Await(ctx context.Context, w *Watch, after uint64, ahead bool) (Record, error)
	// List returns the whole listing of directory dir, if this node
	// holds it or, for the first page (first), reads it under the home's
	// promise; ok is false when the caller is to read the store's page.
	List(ctx context.Context, dir string, first bool) (recs []Record, ok bool, err error)
	Hold(ctx context.Context, path string, own bool)
	HoldListing(ctx context.Context, dir string)
	// HomeOf returns the node that is the home of path ("" if none).
	HomeOf(path string) string
	// Told returns the newest state of path this node knows of, promised
	// or not (see Locator.Told).
	Told(path string) (rec Record, exists, ok bool)
	// Ahead returns the record of path sent ahead of its commit that this
	// node was told, and not the commit yet (see Locator.Ahead).
	Ahead(path string) (Record, bool)
	// HandleMessage answers a message of node from.
	HandleMessage(ctx context.Context, from string, msg []byte) ([]byte, error)
	// CarriesBytes reports whether a small file's bytes travel with the
	// notices of its publish (see Record.Inline).
	CarriesBytes() bool
	// Stats returns the notices' counters (nil for none) and how many
	// records this node keeps.
	Stats() (*NoticeStats, int)
}

// NoticeEnv is what a locator gives its notices: its keys, its store, its
// managed directory and its waits, so that both see the same.
type NoticeEnv struct {
	Keys  Keyspace
	Store Store
	// Local is the managed directory, told of changes made elsewhere; nil
	// for none.
	Local LocalIndex
	// Waits are the waits for paths, which a change told ends.
	Waits *Waits
	// CacheSize bounds the records kept.
	CacheSize int
	// InProcess is Store, when it keeps its records in the daemon's
	// memory (see store.InProcess): a cache in front of it would hold
	// every record twice, each copy as quick to read. Nil otherwise.
	InProcess InProcess
}

// InlineMax is the size of the largest file whose bytes travel with the
// notices of its publish. For a file this small the transfer's round trip,
// and the owner's open and send, cost more than the bytes themselves.
const InlineMax = 16 << 10

// NewNotices makes a locator's notices.
type NewNotices func(NoticeEnv) Notices

// Tell says when a publish returns, against the path's home telling the
// nodes that hold the path.
type Tell int

const (
	// TellAside returns once the store committed; the home is told in
	// the background, retried.
	TellAside Tell = iota
	// TellOnce also waits until the home told every holder, for one
	// try; a home that does not answer is told aside. A writer's close
	// (close-to-open) must not hang on a node that died. With Ahead, the
	// holders are told that the commit is coming alongside the commit,
	// and of the commit itself aside, once the home holds the path back
	// meanwhile (its promises on it, and the listers' answers for it).
	TellOnce
	// TellSure waits until the home told every holder; a home that
	// cannot be reached is waited for until it left the members. A
	// rename or a rewrite's claim must not leave holders serving what
	// changed.
	TellSure
)

// PublishOptions say how a publish goes.
type PublishOptions struct {
	// Ahead tells the path's home of the record, with a small file's
	// bytes, before the store commits it: consumers that wait need not
	// wait for the commit, since the owner serves the file from then on.
	Ahead bool
	Tell  Tell
	// Claim records that this node rewrites a file published before: the
	// record (with its last complete version's attributes) is committed
	// with Writing set, so that no node serves its copy any more. The next
	// publish ends the claim.
	Claim bool
	// Deferrable: nothing waits for the commit (a release's publish when
	// closes do not wait for the store, a retry); a store that groups
	// its commits may hold it a moment for others to share it.
	Deferrable bool
	// Spent, if not nil, adds up where the publish's time went.
	Spent *PublishSpent
}

// PublishSpent is where one publish's time went: the daemon counts it for
// the closes that wait (see dyadfs status), so that what a close costs can
// be seen stage by stage.
type PublishSpent struct {
	// Commit is the store's commit, as the publish waited for it (a group
	// commit's queue included).
	Commit time.Duration
	// Tell is the rest: the record sent ahead, and the path's home told
	// of the commit, telling every holder first if the publish waits.
	Tell time.Duration
}

// SingleNode is the notices of a daemon that shares its store with no
// other: nothing changes unseen, so the records it published or looked up
// are kept (a bounded LRU, unless the store is in this process) and
// nothing is told.
func SingleNode(env NoticeEnv) Notices {
	size := env.CacheSize
	if env.InProcess != nil {
		size = 0
	}
	return &singleNode{env: env, cache: newRecordCache(size)}
}

type singleNode struct {
	env   NoticeEnv
	cache *recordCache
}

// kept returns the record of path this node knows without asking: from
// its cache, or from the store itself when it is in this process.
func (s *singleNode) kept(path string) (Record, bool) {
	if s.env.InProcess != nil {
		dir, name := SplitPath(path)
		return s.env.InProcess.Held(s.env.Keys.DirIndex(dir), name)
	}
	return s.cache.get(path)
}

func (s *singleNode) Start(context.Context, Member) error { return nil }

func (s *singleNode) Publish(ctx context.Context, rec Record, _ *Inline, _ PublishOptions, commit func(context.Context) (Record, error)) (Record, error) {
	out, err := commit(ctx)
	if err == nil {
		s.cache.put(out)
	}
	return out, err
}

func (s *singleNode) Removed(_ context.Context, path string, _ uint64, _ bool) { s.cache.remove(path) }
func (s *singleNode) Forget(path string)                                       { s.cache.remove(path) }

func (s *singleNode) State(ctx context.Context, path string) (State, error) {
	if rec, ok := s.cache.get(path); ok {
		return State{Rec: rec, Exists: true, Gen: rec.Generation, Level: LevelCache}, nil
	}
	rec, err := s.env.Store.Lookup(ctx, s.env.Keys.Slot(path))
	switch {
	case errors.Is(err, ErrNotFound):
		return State{Level: LevelGlobal}, nil
	case err != nil:
		return State{Level: LevelGlobal}, err
	}
	s.cache.put(rec)
	return State{Rec: rec, Exists: true, Gen: rec.Generation, Level: LevelGlobal}, nil
}

func (s *singleNode) Known(path string) (State, bool) {
	if rec, ok := s.kept(path); ok {
		return State{Rec: rec, Exists: true, Gen: rec.Generation, Level: LevelCache}, true
	}
	return State{}, false
}

func (s *singleNode) LocateWaiting(ctx context.Context, w *Watch, _ bool) (Record, Level, error) {
	st, err := s.State(ctx, w.path)
	if err == nil && !st.Exists {
		err = ErrNotFound
	}
	return st.Rec, st.Level, err
}

func (s *singleNode) Await(ctx context.Context, w *Watch, after uint64, _ bool) (Record, error) {
	if w.Fired() {
		return Record{}, ErrChangedHere
	}
	wctx, cancel := w.CancelOnChange(ctx)
	defer cancel()
	rec, err := s.env.Store.Wait(wctx, s.env.Keys.Slot(w.path), after)
	switch {
	case err == nil:
		s.cache.put(rec)
		return rec, nil
	case ctx.Err() != nil:
		return Record{}, ctx.Err()
	case w.Fired():
		return Record{}, ErrChangedHere
	}
	return Record{}, err
}

func (s *singleNode) List(context.Context, string, bool) ([]Record, bool, error) {
	return nil, false, nil
}

func (s *singleNode) Hold(context.Context, string, bool)  {}
func (s *singleNode) HoldListing(context.Context, string) {}
func (s *singleNode) HomeOf(string) string                { return "" }

func (s *singleNode) Told(path string) (Record, bool, bool) {
	rec, ok := s.kept(path) // its publishes, and records it looked up
	return rec, ok, ok
}

func (s *singleNode) Ahead(string) (Record, bool) { return Record{}, false }

func (s *singleNode) HandleMessage(context.Context, string, []byte) ([]byte, error) {
	return nil, errors.New("this node takes no notices")
}

func (s *singleNode) CarriesBytes() bool         { return false }
func (s *singleNode) Stats() (*NoticeStats, int) { return nil, s.cache.len() }

// NoticeStats counts notices.
type NoticeStats struct {
	Members int    `json:"members"`
	Sent    uint64 `json:"sent"`
	// Batched counts the notices that went with others in one message.
	Batched  uint64 `json:"sent_in_batches"`
	Received uint64 `json:"received"`
	Failed   uint64 `json:"failed"`
	// Breaks counts changes a home passed on to holders; Broken, the
	// changes this node was told of as a holder.
	Breaks uint64 `json:"breaks_sent"`
	Broken uint64 `json:"breaks_received"`
	// Asked counts the questions this node sent to another node's home.
	Asked uint64 `json:"questions_asked"`
	// Holders and Promises: what this node keeps as a home, and holds.
	Holders    int    `json:"holders"`
	Promises   int    `json:"promises"`
	WokenBy    uint64 `json:"waits_woken_by_notice"`
	StoreWaits uint64 `json:"waits_on_store"`
	// HomeWaits counts rewrites and removals that waited for a home that
	// could not be reached to leave the members.
	HomeWaits uint64 `json:"waits_for_dead_home"`
	// HeldLookups counts lookups that waited for a path held back for a
	// commit that was coming (see notice.holdMark); HeldRunOut, those
	// whose commit was not told within the wait (a second), which read
	// the store instead.
	HeldLookups uint64 `json:"lookups_held_back"`
	HeldRunOut  uint64 `json:"lookups_held_back_in_vain"`
	// SilentHolders counts holders this node, as a home, took for cut off
	// (their promises dropped); Revoked, the times this node was told
	// its promises from a home were dropped.
	SilentHolders uint64 `json:"silent_holders"`
	Revoked       uint64 `json:"promises_revoked"`
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
	rec.Inline = nil
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
