// Package embedded is the in-process metadata store of a daemon that runs
// alone (store URL embedded://, the default): nothing to set up, nothing
// shared with other nodes.
package embedded

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/dyadfs/dyadfs/hfl/store"
	"github.com/dyadfs/dyadfs/internal/digest"
)

// Store is the in-process metadata store used when dyadfs runs on a
// single node. It lives as long as the daemon; on restart the daemon
// republishes what its backing store holds.
type Store struct {
	mu sync.Mutex
	// dirs holds the records by directory and name (a slot's Dir and
	// Name), the directory's listing and its lookups at once: a record
	// by key as well would cost every file a second entry and its key.
	dirs    map[string]*embeddedDir
	records int // in dirs
	// owners are the records' owners, by index (see keptRecord), and
	// apart what few records have beyond it, by record.
	owners []string
	apart  map[*keptRecord]keptApart
	values map[string][]byte
	// waiters holds, per key, a channel closed at the next publish of the
	// key, and how many waits use it (so that abandoned waits leave nothing).
	waiters map[string]*keyWaiters
	lastGen uint64
	closed  chan struct{}
	once    sync.Once
}

// New returns an empty store. Generations start from the wall
// clock in nanoseconds so that they keep growing across daemon restarts.
func New() *Store {
	return &Store{
		dirs:    make(map[string]*embeddedDir),
		apart:   make(map[*keptRecord]keptApart),
		values:  make(map[string][]byte),
		waiters: make(map[string]*keyWaiters),
		lastGen: uint64(time.Now().UnixNano()),
		closed:  make(chan struct{}),
	}
}

// Held implements store.InProcess.
func (s *Store) Held(dir, name string) (store.Record, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lookupLocked(store.Slot{Dir: dir, Name: name})
}

func (s *Store) isClosed() bool {
	select {
	case <-s.closed:
		return true
	default:
		return false
	}
}

// embeddedDir is one directory's records by name, and the names in
// order, sorted again only when a listing needs them after a change.
// The map holds pointers: a map's slots are allocated by the power of
// two, so a slot of 24 bytes wastes less of that than one of the record's.
type embeddedDir struct {
	recs   map[string]*keptRecord
	sorted []string // nil after a change
	// base is the directory part of its records' paths (those of a
	// namespace's directory share it, their names the rest), taken from
	// the first; hasBase is false if that path did not end in its name.
	base    string
	hasBase bool
}

// newEmbeddedDir returns the directory of a first record, path, named name.
func newEmbeddedDir(path, name string) *embeddedDir {
	d := &embeddedDir{recs: make(map[string]*keptRecord)}
	switch {
	case path == name:
		d.hasBase = true
	case strings.HasSuffix(path, "/"+name):
		d.base, d.hasBase = path[:len(path)-len(name)-1], true
	}
	return d
}

// derives reports whether path is what d makes of name.
func (d *embeddedDir) derives(path, name string) bool {
	if !d.hasBase {
		return false
	}
	if d.base == "" {
		return path == name
	}
	return len(path) == len(d.base)+1+len(name) && strings.HasPrefix(path, d.base) &&
		path[len(d.base)] == '/' && strings.HasSuffix(path, name)
}

// pathOf returns the path of the record named name in d.
func (d *embeddedDir) pathOf(name string) string {
	if d.base == "" {
		return name
	}
	return d.base + "/" + name
}

// keptRecord is a record as the store keeps it, for every file of the
// node: 80 bytes against a Record's 144. Left out are the fields no store
// keeps (Provisional, Inline); the owner is an index into Store.owners
// (a node keeps its own files, and few others); the path is its
// directory's base and its name (see embeddedDir), or else kept apart
// with a symbolic link's target, in Store.apart, by the record's address
// (a publish rewrites a record in place).
type keptRecord struct {
	size, mtime, alloc int64
	ino, gen           uint64
	sum                digest.Sum
	mode, uid, gid     uint32
	owner              uint32
	writing, hasApart  bool
	pathApart          bool // the path is in Store.apart
}

// keptApart is what a record keeps apart: its path if its directory does
// not make it, its target if it is a symbolic link.
type keptApart struct{ path, target string }

// keep stores rec, named name in d, in k; s.mu must be held.
func (s *Store) keep(d *embeddedDir, name string, k *keptRecord, r store.Record) {
	if k.hasApart {
		delete(s.apart, k)
	}
	*k = keptRecord{owner: s.ownerIndex(r.Owner), size: r.Size, mtime: r.MtimeNs, alloc: r.Alloc, ino: r.Ino,
		gen: r.Generation, sum: r.Sum, mode: r.Mode, uid: r.Uid, gid: r.Gid, writing: r.Writing}
	apart := keptApart{target: r.Target}
	if !d.derives(r.Path, name) {
		apart.path, k.pathApart = r.Path, true
	}
	if k.pathApart || apart.target != "" {
		k.hasApart = true
		s.apart[k] = apart
	}
}

// ownerIndex returns owner's index in s.owners, adding it if new; s.mu
// must be held.
func (s *Store) ownerIndex(owner string) uint32 {
	for i, o := range s.owners {
		if o == owner {
			return uint32(i)
		}
	}
	s.owners = append(s.owners, owner)
	return uint32(len(s.owners) - 1)
}

// record returns k, named name in d, as a Record; s.mu must be held.
func (s *Store) record(d *embeddedDir, name string, k *keptRecord) store.Record {
	r := store.Record{Owner: s.owners[k.owner], Size: k.size, MtimeNs: k.mtime, Alloc: k.alloc, Ino: k.ino,
		Generation: k.gen, Sum: k.sum, Mode: k.mode, Uid: k.uid, Gid: k.gid, Writing: k.writing}
	var apart keptApart
	if k.hasApart {
		apart = s.apart[k]
		r.Target = apart.target
	}
	if k.pathApart {
		r.Path = apart.path
	} else {
		r.Path = d.pathOf(name)
	}
	return r
}

// lookupLocked returns the record in slot (by its Dir and Name). s.mu
// must be held.
func (s *Store) lookupLocked(slot store.Slot) (store.Record, bool) {
	d := s.dirs[slot.Dir]
	if d == nil {
		return store.Record{}, false
	}
	k, ok := d.recs[slot.Name]
	if !ok {
		return store.Record{}, false
	}
	return s.record(d, slot.Name, k), true
}

// Publish implements store.Store.
func (s *Store) Publish(ctx context.Context, slot store.Slot, rec store.Record) (store.Record, error) {
	if s.isClosed() {
		return store.Record{}, store.ErrClosed
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lastGen++
	rec.Generation = s.lastGen
	d := s.dirs[slot.Dir]
	if d == nil {
		d = newEmbeddedDir(rec.Path, slot.Name)
		s.dirs[slot.Dir] = d
	}
	k, ok := d.recs[slot.Name]
	if !ok {
		k = new(keptRecord)
		d.recs[slot.Name] = k
		d.sorted = nil
		s.records++
	}
	s.keep(d, slot.Name, k, rec)
	if w, ok := s.waiters[slot.Key]; ok {
		close(w.ch)
		delete(s.waiters, slot.Key)
	}
	return rec, nil
}

// ListDir implements store.Store.
func (s *Store) ListDir(ctx context.Context, dir, after string, limit int) ([]store.Record, error) {
	if s.isClosed() {
		return nil, store.ErrClosed
	}
	if limit <= 0 {
		limit = store.DefaultListLimit
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	d := s.dirs[dir]
	if d == nil {
		return nil, nil
	}
	if d.sorted == nil {
		d.sorted = make([]string, 0, len(d.recs))
		for name := range d.recs {
			d.sorted = append(d.sorted, name)
		}
		sort.Strings(d.sorted)
	}
	i := sort.SearchStrings(d.sorted, after)
	if i < len(d.sorted) && d.sorted[i] == after {
		i++
	}
	var out []store.Record
	for ; i < len(d.sorted) && len(out) < limit; i++ {
		out = append(out, s.record(d, d.sorted[i], d.recs[d.sorted[i]]))
	}
	return out, nil
}

// Lookup implements store.Store.
func (s *Store) Lookup(ctx context.Context, slot store.Slot) (store.Record, error) {
	if s.isClosed() {
		return store.Record{}, store.ErrClosed
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, ok := s.lookupLocked(slot)
	if !ok {
		return store.Record{}, store.ErrNotFound
	}
	return rec, nil
}

// Wait implements store.Store.
func (s *Store) Wait(ctx context.Context, slot store.Slot, after uint64) (store.Record, error) {
	key := slot.Key
	for {
		s.mu.Lock()
		if rec, ok := s.lookupLocked(slot); ok && rec.Generation > after {
			s.mu.Unlock()
			return rec, nil
		}
		w, ok := s.waiters[key]
		if !ok {
			w = &keyWaiters{ch: make(chan struct{})}
			s.waiters[key] = w
		}
		w.n++
		s.mu.Unlock()

		var err error
		select {
		case <-w.ch:
		case <-ctx.Done():
			err = ctx.Err()
		case <-s.closed:
			err = store.ErrClosed
		}
		s.mu.Lock()
		w.n--
		if w.n == 0 && s.waiters[key] == w {
			delete(s.waiters, key)
		}
		s.mu.Unlock()
		if err != nil {
			return store.Record{}, err
		}
	}
}

type keyWaiters struct {
	ch chan struct{}
	n  int
}

// waitersLen reports how many keys have waiters; tests use it to check that
// abandoned waits leave nothing behind.
func (s *Store) waitersLen() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.waiters)
}

// Remove implements store.Store.
func (s *Store) Remove(ctx context.Context, slot store.Slot, cond store.RemoveCond) (uint64, error) {
	if s.isClosed() {
		return 0, store.ErrClosed
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, ok := s.lookupLocked(slot)
	if !ok {
		return 0, store.ErrNotFound
	}
	if !cond.Matches(rec) {
		return 0, fmt.Errorf("remove %s (generation %d by %s): %w", rec.Path, rec.Generation, rec.Owner, store.ErrConflict)
	}
	d := s.dirs[slot.Dir]
	delete(s.apart, d.recs[slot.Name])
	delete(d.recs, slot.Name)
	s.records--
	d.sorted = nil
	if len(d.recs) == 0 {
		delete(s.dirs, slot.Dir)
	}
	s.lastGen++
	return s.lastGen, nil
}

// Register implements store.Store. In one process the daemon's life is the
// store's, so ttl plays no part.
func (s *Store) Register(ctx context.Context, key string, value []byte, ttl time.Duration, claim func(current []byte) error) error {
	if s.isClosed() {
		return store.ErrClosed
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if cur, ok := s.values[key]; ok && claim != nil {
		if err := claim(append([]byte(nil), cur...)); err != nil {
			return err
		}
	}
	s.values[key] = append([]byte(nil), value...)
	return nil
}

// Get implements store.Store.
func (s *Store) Get(ctx context.Context, key string) ([]byte, error) {
	if s.isClosed() {
		return nil, store.ErrClosed
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.values[key]
	if !ok {
		return nil, store.ErrNotFound
	}
	return append([]byte(nil), v...), nil
}

// List implements store.Store.
func (s *Store) List(ctx context.Context, prefix string) (map[string][]byte, error) {
	if s.isClosed() {
		return nil, store.ErrClosed
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string][]byte)
	for k, v := range s.values {
		if strings.HasPrefix(k, prefix) {
			out[k] = append([]byte(nil), v...)
		}
	}
	return out, nil
}

// PutIfAbsent implements store.Store.
func (s *Store) PutIfAbsent(ctx context.Context, key string, value []byte) ([]byte, error) {
	if s.isClosed() {
		return nil, store.ErrClosed
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if v, ok := s.values[key]; ok {
		return append([]byte(nil), v...), nil
	}
	s.values[key] = append([]byte(nil), value...)
	return append([]byte(nil), value...), nil
}

// Health implements store.Store: an embedded store is always reachable,
// never full, and keeps nothing on disk.
func (s *Store) Health(ctx context.Context, namespace string) (store.Health, error) {
	if s.isClosed() {
		return store.Health{}, store.ErrClosed
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var n int64
	for dir, d := range s.dirs {
		if strings.HasPrefix(dir, namespace+"/") {
			n += int64(len(d.recs))
		}
	}
	return store.Health{Records: n}, nil
}

// Forget implements store.Store.
func (s *Store) Forget(ctx context.Context, namespace string, page int, progress func(int)) (int, error) {
	if s.isClosed() {
		return 0, store.ErrClosed
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	prefix := namespace + "/"
	n := 0
	for dir, d := range s.dirs {
		if strings.HasPrefix(dir, prefix) {
			n += len(d.recs)
			s.records -= len(d.recs)
			for _, k := range d.recs {
				delete(s.apart, k)
			}
			delete(s.dirs, dir)
		}
	}
	for k := range s.values {
		if strings.HasPrefix(k, prefix) {
			delete(s.values, k)
			n++
		}
	}
	if progress != nil {
		progress(n)
	}
	return n, nil
}

// Len returns the number of records held.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.records
}

// Close implements store.Store.
func (s *Store) Close() error {
	s.once.Do(func() { close(s.closed) })
	return nil
}
