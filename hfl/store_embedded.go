package hfl

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"
)

// EmbeddedStore is the in-process metadata store used when dyadfs runs on a
// single node. It lives as long as the daemon; on restart the daemon
// republishes what its backing store holds.
type EmbeddedStore struct {
	mu      sync.Mutex
	records map[string]Record
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

// NewEmbeddedStore returns an empty store. Generations start from the wall
// clock in nanoseconds so that they keep growing across daemon restarts.
func NewEmbeddedStore() *EmbeddedStore {
	return &EmbeddedStore{
		records: make(map[string]Record),
		dirs:    make(map[string]*embeddedDir),
		values:  make(map[string][]byte),
		waiters: make(map[string]*keyWaiters),
		lastGen: uint64(time.Now().UnixNano()),
		closed:  make(chan struct{}),
	}
}

func (s *EmbeddedStore) isClosed() bool {
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

// Publish implements Store.
func (s *EmbeddedStore) Publish(ctx context.Context, slot Slot, rec Record) (Record, error) {
	if s.isClosed() {
		return Record{}, ErrClosed
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

// ListDir implements Store.
func (s *EmbeddedStore) ListDir(ctx context.Context, dir, after string, limit int) ([]Record, error) {
	if s.isClosed() {
		return nil, ErrClosed
	}
	if limit <= 0 {
		limit = DefaultListLimit
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
	var out []Record
	for ; i < len(d.sorted) && len(out) < limit; i++ {
		out = append(out, s.records[d.keys[d.sorted[i]]])
	}
	return out, nil
}

// Lookup implements Store.
func (s *EmbeddedStore) Lookup(ctx context.Context, key string) (Record, error) {
	if s.isClosed() {
		return Record{}, ErrClosed
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, ok := s.records[key]
	if !ok {
		return Record{}, ErrNotFound
	}
	return rec, nil
}

// Wait implements Store.
func (s *EmbeddedStore) Wait(ctx context.Context, key string, after uint64) (Record, error) {
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
			err = ErrClosed
		}
		s.mu.Lock()
		w.n--
		if w.n == 0 && s.waiters[key] == w {
			delete(s.waiters, key)
		}
		s.mu.Unlock()
		if err != nil {
			return Record{}, err
		}
	}
}

type keyWaiters struct {
	ch chan struct{}
	n  int
}

// waitersLen reports how many keys have waiters; tests use it to check that
// abandoned waits leave nothing behind.
func (s *EmbeddedStore) waitersLen() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.waiters)
}

// Remove implements Store.
func (s *EmbeddedStore) Remove(ctx context.Context, slot Slot, cond RemoveCond) (uint64, error) {
	if s.isClosed() {
		return 0, ErrClosed
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, ok := s.records[slot.Key]
	if !ok {
		return 0, ErrNotFound
	}
	if !cond.matches(rec) {
		return 0, fmt.Errorf("remove %s (generation %d by %s): %w", rec.Path, rec.Generation, rec.Owner, ErrConflict)
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

// Register implements Store. In one process the daemon's life is the
// store's, so ttl plays no part.
func (s *EmbeddedStore) Register(ctx context.Context, key string, value []byte, ttl time.Duration, claim func(current []byte) error) error {
	if s.isClosed() {
		return ErrClosed
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

// Get implements Store.
func (s *EmbeddedStore) Get(ctx context.Context, key string) ([]byte, error) {
	if s.isClosed() {
		return nil, ErrClosed
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.values[key]
	if !ok {
		return nil, ErrNotFound
	}
	return append([]byte(nil), v...), nil
}

// List implements Store.
func (s *EmbeddedStore) List(ctx context.Context, prefix string) (map[string][]byte, error) {
	if s.isClosed() {
		return nil, ErrClosed
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

// PutIfAbsent implements Store.
func (s *EmbeddedStore) PutIfAbsent(ctx context.Context, key string, value []byte) ([]byte, error) {
	if s.isClosed() {
		return nil, ErrClosed
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if v, ok := s.values[key]; ok {
		return append([]byte(nil), v...), nil
	}
	s.values[key] = append([]byte(nil), value...)
	return append([]byte(nil), value...), nil
}

// Len returns the number of records held.
func (s *EmbeddedStore) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.records)
}

// Close implements Store.
func (s *EmbeddedStore) Close() error {
	s.once.Do(func() { close(s.closed) })
	return nil
}
