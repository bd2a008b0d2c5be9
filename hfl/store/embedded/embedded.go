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
)

// Store is the in-process metadata store used when dyadfs runs on a
// single node. It lives as long as the daemon; on restart the daemon
// republishes what its backing store holds.
type Store struct {
	mu      sync.Mutex
	records map[string]store.Record
	// dirs indexes the records by directory: Dir, then Name, then Key.
	dirs   map[string]*embeddedDir
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
		records: make(map[string]store.Record),
		dirs:    make(map[string]*embeddedDir),
		values:  make(map[string][]byte),
		waiters: make(map[string]*keyWaiters),
		lastGen: uint64(time.Now().UnixNano()),
		closed:  make(chan struct{}),
	}
}

func (s *Store) isClosed() bool {
	select {
	case <-s.closed:
		return true
	default:
		return false
	}
}

// embeddedDir is one directory's index: its entries' keys by name, and
// the names in order, sorted again only when a listing needs them after a
// change.
type embeddedDir struct {
	keys   map[string]string
	sorted []string // nil after a change
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
	s.records[slot.Key] = rec
	d := s.dirs[slot.Dir]
	if d == nil {
		d = &embeddedDir{keys: make(map[string]string)}
		s.dirs[slot.Dir] = d
	}
	if _, ok := d.keys[slot.Name]; !ok {
		d.sorted = nil
	}
	d.keys[slot.Name] = slot.Key
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
		d.sorted = make([]string, 0, len(d.keys))
		for name := range d.keys {
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
		out = append(out, s.records[d.keys[d.sorted[i]]])
	}
	return out, nil
}

// Lookup implements store.Store.
func (s *Store) Lookup(ctx context.Context, slot store.Slot) (store.Record, error) {
	key := slot.Key
	if s.isClosed() {
		return store.Record{}, store.ErrClosed
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, ok := s.records[key]
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
		if rec, ok := s.records[key]; ok && rec.Generation > after {
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
	rec, ok := s.records[slot.Key]
	if !ok {
		return 0, store.ErrNotFound
	}
	if !cond.Matches(rec) {
		return 0, fmt.Errorf("remove %s (generation %d by %s): %w", rec.Path, rec.Generation, rec.Owner, store.ErrConflict)
	}
	delete(s.records, slot.Key)
	if d := s.dirs[slot.Dir]; d != nil && d.keys[slot.Name] == slot.Key {
		delete(d.keys, slot.Name)
		d.sorted = nil
		if len(d.keys) == 0 {
			delete(s.dirs, slot.Dir)
		}
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
	for k := range s.records {
		if strings.HasPrefix(k, namespace+"/") {
			n++
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
	for k := range s.records {
		if strings.HasPrefix(k, prefix) {
			delete(s.records, k)
			n++
		}
	}
	for dir, d := range s.dirs {
		if strings.HasPrefix(dir, prefix) {
			n += len(d.keys)
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
	return len(s.records)
}

// Close implements store.Store.
func (s *Store) Close() error {
	s.once.Do(func() { close(s.closed) })
	return nil
}
