package dmd

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// The copies this node holds of other nodes' files, and the shadows of
// their directories: one registry says what each is a copy of, its size,
// when it was fetched and last opened, and whether an open file pins it.
// Eviction and the status read it; install, open, a write here (which makes
// a copy this node's own), unlink, rename and the restart scan update it.
// Only fetched copies are ever evicted: this node's own files are not in
// it.

// Cache policies: which copy goes first when room is needed.
const (
	// PolicyLRU evicts the copy opened least recently.
	PolicyLRU = "lru"
	// PolicyFIFO evicts the copy fetched first.
	PolicyFIFO = "fifo"
)

// CacheConfig bounds the space fetched copies take (DYAD's
// DYAD_CACHE_CAPACITY, _POLICY, _LOW_WATERMARK and _GRACE_PERIOD).
type CacheConfig struct {
	// Capacity bounds the bytes of the copies kept here; 0: no bound.
	Capacity int64
	// Policy is PolicyLRU or PolicyFIFO.
	Policy string
	// LowWatermark is the fraction of Capacity eviction frees down to
	// once it starts, so that it does not run at every fetch.
	LowWatermark float64
	// Grace is how long a copy just fetched is not evicted before it is
	// first opened: the open that fetched it (or the program a prefetch
	// fetched it for) has not opened it yet. Once opened, the open pins
	// it, and after that only the policy's order counts: a reader that
	// goes through more than the capacity within the grace period is not
	// refused.
	Grace time.Duration
}

// DefaultCacheConfig is DYAD's defaults, without a capacity.
func DefaultCacheConfig() CacheConfig {
	return CacheConfig{Policy: PolicyLRU, LowWatermark: 0.8, Grace: 5 * time.Second}
}

// Validate checks the cache configuration.
func (c CacheConfig) Validate() error {
	switch {
	case c.Capacity < 0:
		return fmt.Errorf("cache capacity %d must not be negative (0: no bound)", c.Capacity)
	case c.Policy != "" && c.Policy != PolicyLRU && c.Policy != PolicyFIFO:
		return fmt.Errorf("cache policy %q: want lru or fifo", c.Policy)
	case c.LowWatermark < 0 || c.LowWatermark > 1:
		return fmt.Errorf("cache low watermark %v: want a fraction of the capacity, above 0 and at most 1", c.LowWatermark)
	case c.Grace < 0:
		return fmt.Errorf("cache grace period %v must not be negative", c.Grace)
	}
	return nil
}

// heldCopy is one entry of the registry.
type heldCopy struct {
	copyInfo
	id   FileID // the file's backing inode (none for a shadow directory)
	size int64
	// fetched and used are when the copy was installed and last opened
	// (Unix nanoseconds); opened says it was opened since.
	fetched, used int64
	opened        bool
}

// copyRegistry is the registry of copies. Its lock is taken last: under
// d.namesMu and d.mu, never around them.
type copyRegistry struct {
	cfg CacheConfig

	mu   sync.Mutex
	m    map[string]*heldCopy
	held int64 // bytes of the file copies in m
	// reserved holds the fetches in flight, by path: room is made for
	// them before they start.
	reserved      map[string]*reservation
	reservedBytes int64
	// opens counts the open read handles of each file, so that an open
	// (or mapped) copy is not evicted; kept only with a capacity.
	opens map[FileID]int32
	// evicted remembers paths evicted, to count the fetches that bring
	// them back (bounded: cleared when full).
	evicted map[string]struct{}

	// evictMu makes one fetch at a time choose what to evict; under it,
	// owners caches which owners left the job (see ownerGone).
	evictMu sync.Mutex
	owners  map[string]ownerSeen

	evictions, evictedBytes, refetches, noRoom atomic.Uint64
}

// ownerSeen is whether an owner was a member of the job, and when that
// was looked up.
type ownerSeen struct {
	gone bool
	at   time.Time
}

// ownerTTL is how long eviction trusts what it learnt of an owner: when
// every fetch evicts, a lookup in the store for each would cost more than
// the eviction.
const ownerTTL = 2 * time.Second

type reservation struct {
	size  int64
	users int
}

// maxEvictedRemembered bounds the paths kept to count refetches.
const maxEvictedRemembered = 1 << 16

// init readies the registry; zero values of cfg take the defaults.
func (r *copyRegistry) init(cfg CacheConfig) {
	def := DefaultCacheConfig()
	if cfg.Policy == "" {
		cfg.Policy = def.Policy
	}
	if cfg.LowWatermark == 0 {
		cfg.LowWatermark = def.LowWatermark
	}
	r.cfg = cfg
	r.m = make(map[string]*heldCopy)
	r.reserved = make(map[string]*reservation)
	if cfg.Capacity > 0 {
		r.opens = make(map[FileID]int32)
		r.evicted = make(map[string]struct{})
	}
}

// bounded reports whether the copies have a capacity.
func (r *copyRegistry) bounded() bool { return r.cfg.Capacity > 0 }

func (r *copyRegistry) get(rel string) (copyInfo, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e, ok := r.m[rel]; ok {
		return e.copyInfo, true
	}
	return copyInfo{}, false
}

func (r *copyRegistry) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.m)
}

// note records that rel is a copy of version c. For a file, st is its
// attributes and at when it came (zero: now).
func (r *copyRegistry) note(rel string, c copyInfo, st *syscall.Stat_t, at time.Time) {
	e := &heldCopy{copyInfo: c}
	if st != nil && !c.dir {
		if at.IsZero() {
			at = time.Now()
		}
		e.id, e.size = IDOf(st), st.Size
		e.fetched, e.used = at.UnixNano(), at.UnixNano()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.dropLocked(rel)
	r.m[rel] = e
	r.held += e.size
	if res := r.reserved[rel]; res != nil && e.size > 0 {
		// The fetch that reserved the room installed it: it is held
		// now, not reserved twice until the fetch returns.
		r.reservedBytes -= res.size
		res.size = 0
	}
	if _, ok := r.evicted[rel]; ok && !c.dir {
		delete(r.evicted, rel)
		r.refetches.Add(1)
	}
}

func (r *copyRegistry) dropLocked(rel string) {
	if e, ok := r.m[rel]; ok {
		r.held -= e.size
		delete(r.m, rel)
	}
}

// forget records that rel is no copy (any more).
func (r *copyRegistry) forget(rel string) {
	r.mu.Lock()
	r.dropLocked(rel)
	r.mu.Unlock()
}

// forgetIf forgets rel if it is still the copy c (not noted again since).
func (r *copyRegistry) forgetIf(rel string, c copyInfo) {
	r.mu.Lock()
	if e, ok := r.m[rel]; ok && e.copyInfo == c {
		r.dropLocked(rel)
	}
	r.mu.Unlock()
}

// setGen records that the copy c at rel, fetched while its publish was
// committed, is generation gen.
func (r *copyRegistry) setGen(rel string, c copyInfo, gen uint64) {
	r.mu.Lock()
	if e, ok := r.m[rel]; ok && e.copyInfo == c {
		e.gen = gen
	}
	r.mu.Unlock()
}

func under(p, dir string) bool { return p == dir || strings.HasPrefix(p, dir+"/") }

// renamed follows a rename of oldRel to newRel: what was at and under
// newRel is gone (replaced), and the copies at and under oldRel are
// there. With exchange, the two trade places.
func (r *copyRegistry) renamed(oldRel, newRel string, exchange bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !exchange {
		for p := range r.m {
			if under(p, newRel) && !under(p, oldRel) {
				r.dropLocked(p)
			}
		}
	}
	r.moveLocked(oldRel, newRel, exchange)
}

// moved follows a rename of oldRel to newRel whose replaced entries are
// already gone: the copies at and under oldRel move.
func (r *copyRegistry) moved(oldRel, newRel string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.moveLocked(oldRel, newRel, false)
}

func (r *copyRegistry) moveLocked(oldRel, newRel string, exchange bool) {
	moved := make(map[string]*heldCopy)
	for p, e := range r.m {
		switch {
		case under(p, oldRel):
			delete(r.m, p)
			moved[newRel+p[len(oldRel):]] = e
		case exchange && under(p, newRel):
			delete(r.m, p)
			moved[oldRel+p[len(newRel):]] = e
		}
	}
	for p, e := range moved {
		r.dropLocked(p)
		r.m[p] = e
	}
}

// touch records that rel was opened: LRU keeps it longer.
func (r *copyRegistry) touch(rel string) {
	if !r.bounded() {
		return
	}
	r.mu.Lock()
	if e, ok := r.m[rel]; ok {
		e.used, e.opened = time.Now().UnixNano(), true
	}
	r.mu.Unlock()
}

// opened and closed count an open read handle of file id.
func (r *copyRegistry) opened(id FileID) {
	if !r.bounded() {
		return
	}
	r.mu.Lock()
	r.opens[id]++
	r.mu.Unlock()
}

func (r *copyRegistry) closed(id FileID) {
	if !r.bounded() {
		return
	}
	r.mu.Lock()
	if r.opens[id] <= 1 {
		delete(r.opens, id)
	} else {
		r.opens[id]--
	}
	r.mu.Unlock()
}

// reserve counts size bytes for a fetch of rel, if they fit under the
// capacity; a fetch of rel already reserved (another open waits for the
// same file) fits.
func (r *copyRegistry) reserve(rel string, size int64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if res := r.reserved[rel]; res != nil {
		res.users++
		return true
	}
	if r.held+r.reservedBytes+size > r.cfg.Capacity {
		return false
	}
	r.reserved[rel] = &reservation{size: size, users: 1}
	r.reservedBytes += size
	return true
}

func (r *copyRegistry) unreserve(rel string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	res := r.reserved[rel]
	if res == nil {
		return
	}
	if res.users--; res.users == 0 {
		delete(r.reserved, rel)
		r.reservedBytes -= res.size
	}
}

// victim is a copy eviction may remove.
type victim struct {
	rel   string
	id    FileID
	owner string
	size  int64
}

// victims chooses the copies to evict so that a fetch of size bytes fits,
// down to the low watermark, in the policy's order, skipping copies that
// are open, fetched within the grace period and not opened yet, or that
// keep (given path and owner) says to keep. It returns none, and what pins
// the rest, when even all of them would not make room.
func (r *copyRegistry) victims(size int64, now time.Time, keep func(rel, owner string) bool) ([]victim, pinned) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var pins pinned
	graceEnd := now.Add(-r.cfg.Grace).UnixNano()
	type cand struct {
		victim
		key int64
	}
	var cands []cand
	for p, e := range r.m {
		switch {
		case e.dir || e.size == 0:
			continue
		case r.opens[e.id] > 0:
			pins.open++
		case e.fetched > graceEnd && !e.opened:
			pins.grace++
		case keep(p, e.owner):
			pins.owner++
		default:
			key := e.used
			if r.cfg.Policy == PolicyFIFO {
				key = e.fetched
			}
			cands = append(cands, cand{victim{rel: p, id: e.id, owner: e.owner, size: e.size}, key})
		}
	}
	slices.SortFunc(cands, func(a, b cand) int { return cmp.Compare(a.key, b.key) })
	total := r.held + r.reservedBytes + size
	must := total - r.cfg.Capacity // at least this much, or the fetch does not fit
	want := max(must, total-int64(r.cfg.LowWatermark*float64(r.cfg.Capacity)))
	var out []victim
	var freed int64
	for _, c := range cands {
		if freed >= want {
			break
		}
		out = append(out, c.victim)
		freed += c.size
	}
	if freed < must {
		return nil, pins
	}
	return out, pins
}

// ownersOf lists the owners of the file copies held.
func (r *copyRegistry) ownersOf() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	seen := make(map[string]bool)
	var out []string
	for _, e := range r.m {
		if !e.dir && !seen[e.owner] {
			seen[e.owner] = true
			out = append(out, e.owner)
		}
	}
	return out
}

// pinned counts the copies eviction could not take, by why.
type pinned struct{ open, grace, owner int }

// evictable reports whether rel is still the copy v and not open:
// eviction may remove it.
func (r *copyRegistry) evictable(v victim) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.m[v.rel]
	return ok && e.id == v.id && r.opens[v.id] == 0
}

// evictedNow counts v as evicted (its file is gone).
func (r *copyRegistry) evictedNow(v victim) {
	r.mu.Lock()
	if len(r.evicted) >= maxEvictedRemembered {
		clear(r.evicted)
	}
	r.evicted[v.rel] = struct{}{}
	r.mu.Unlock()
	r.evictions.Add(1)
	r.evictedBytes.Add(uint64(v.size))
}

// CacheStats says what the copies held here take, against the capacity.
type CacheStats struct {
	// CapacityBytes is the bound (0: none); HeldBytes what the copies
	// take now, and ReservedBytes what fetches in flight will add.
	CapacityBytes int64 `json:"capacity_bytes" help:"The capacity of the copies of other nodes' files here, in bytes (0: none): what held_bytes is bounded by."`
	HeldBytes     int64 `json:"held_bytes"`
	ReservedBytes int64 `json:"reserved_bytes"`
	// Copies counts the copies of files; PinnedByOpen, those open now.
	Copies       int `json:"copies"`
	PinnedByOpen int `json:"pinned_by_open"`
	// Evictions counts copies removed to make room, EvictedBytes their
	// bytes, Refetches the fetches of a path evicted before, and NoRoom
	// the fetches refused (ENOSPC) because nothing could be evicted.
	Evictions    uint64 `json:"evictions"`
	EvictedBytes uint64 `json:"evicted_bytes"`
	Refetches    uint64 `json:"refetches"`
	NoRoom       uint64 `json:"no_room"`
}

func (r *copyRegistry) stats() CacheStats {
	r.mu.Lock()
	s := CacheStats{CapacityBytes: r.cfg.Capacity, HeldBytes: r.held, ReservedBytes: r.reservedBytes}
	for _, e := range r.m {
		if !e.dir {
			s.Copies++
			if r.opens[e.id] > 0 {
				s.PinnedByOpen++
			}
		}
	}
	r.mu.Unlock()
	s.Evictions, s.EvictedBytes = r.evictions.Load(), r.evictedBytes.Load()
	s.Refetches, s.NoRoom = r.refetches.Load(), r.noRoom.Load()
	return s
}

// ErrNoRoom: a fetch would take the copies past the cache capacity, and
// nothing can be evicted to make room (ENOSPC).
var ErrNoRoom = fmt.Errorf("no room for the copy under the cache capacity: %w", syscall.ENOSPC)

// makeRoom makes room under the capacity for a fetch of rec's size bytes
// at rel, evicting copies if it must, and returns what frees the room
// reserved once the fetch is done. It fails with ErrNoRoom at once when
// room cannot be made.
func (d *DMD) makeRoom(ctx context.Context, rel string, size int64) (func(), error) {
	r := &d.copies
	if !r.bounded() {
		return func() {}, nil
	}
	release := func() { r.unreserve(rel) }
	if size > r.cfg.Capacity {
		r.noRoom.Add(1)
		d.log.Warn("cannot fetch a file larger than the cache capacity", "path", rel, "size", size, "capacity", r.cfg.Capacity)
		return nil, fmt.Errorf("%s (%d bytes, capacity %d): %w", rel, size, r.cfg.Capacity, ErrNoRoom)
	}
	if r.reserve(rel, size) {
		return release, nil
	}
	r.evictMu.Lock()
	defer r.evictMu.Unlock()
	if r.reserve(rel, size) { // another fetch made room meanwhile
		return release, nil
	}
	now := time.Now()
	// Which owners left the job, asked outside the registry's lock (the
	// store may be slow to answer).
	gone := make(map[string]bool)
	for _, owner := range r.ownersOf() {
		gone[owner] = d.ownerGone(owner, now)
	}
	failed := make(map[string]bool) // chosen, but changed since (written here, opened)
	keep := func(rel, owner string) bool { return gone[owner] || failed[rel] }
	var pins pinned
	for range 3 {
		var victims []victim
		victims, pins = r.victims(size, now, keep)
		if len(victims) == 0 {
			break
		}
		for _, v := range victims {
			if !d.evict(v) {
				failed[v.rel] = true
			}
		}
		if r.reserve(rel, size) {
			return release, nil
		}
	}
	r.noRoom.Add(1)
	st := r.stats()
	d.log.Warn("cannot fetch: the copies here fill the cache capacity and none can be evicted",
		"path", rel, "size", size, "capacity", r.cfg.Capacity, "held", st.HeldBytes, "in_flight", st.ReservedBytes,
		"open", pins.open, "within_grace", pins.grace, "owner_gone", pins.owner)
	return nil, fmt.Errorf("%s (%d bytes; %d of %d held, %d copies open, %d fetched within %v): %w",
		rel, size, st.HeldBytes, r.cfg.Capacity, pins.open, pins.grace, r.cfg.Grace, ErrNoRoom)
}

// ownerGone reports whether owner may have left the job: a copy of its
// file may be the only one left, and is kept. A store that cannot say
// keeps it too. d.copies.evictMu must be held.
func (d *DMD) ownerGone(owner string, now time.Time) bool {
	r := &d.copies
	if s, ok := r.owners[owner]; ok && now.Sub(s.at) < ownerTTL {
		return s.gone
	}
	mctx, cancel := context.WithTimeout(d.life, 2*time.Second)
	_, err := d.loc.Member(mctx, owner)
	cancel()
	gone := err != nil
	if r.owners == nil || len(r.owners) > 4096 {
		r.owners = make(map[string]ownerSeen)
	}
	r.owners[owner] = ownerSeen{gone: gone, at: now}
	return gone
}

// evict removes the copy v to make room, unless it changed since it was
// chosen (opened, written here, replaced); it reports whether it did.
func (d *DMD) evict(v victim) bool {
	d.namesMu.Lock()
	if !d.copies.evictable(v) {
		d.namesMu.Unlock()
		return false
	}
	want := syscall.Stat_t{Dev: v.id.Dev, Ino: v.id.Ino}
	removed := d.removeBeneathLocked(v.rel, false, &want)
	d.namesMu.Unlock()
	if !removed {
		return false
	}
	d.copies.evictedNow(v)
	d.log.Debug("evicted a copy", "path", v.rel, "size", v.size, "owner", v.owner)
	d.changedUnseen(v.rel)
	return true
}

// CopiesBounded reports whether copies have a capacity: read opens pin
// them then (see CopyOpened).
func (d *DMD) CopiesBounded() bool { return d.copies.bounded() }

// CopyOpened records a read open of file id at rel: a copy is not evicted
// while open, and LRU counts the open as a use. CopyClosed undoes it.
func (d *DMD) CopyOpened(id FileID, rel string) {
	d.copies.opened(id)
	d.copies.touch(rel)
}

// CopyClosed records the release of a read open of file id.
func (d *DMD) CopyClosed(id FileID) { d.copies.closed(id) }
