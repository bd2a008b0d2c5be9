// Package flux keeps the metadata store in the Flux KVS of the instance the
// daemons run in (store URL flux://): no etcd to stand up.
//
// Layout. Each job (the first segment of every key, the locator's
// namespace) has a KVS namespace of its own, "<prefix><job>", so that
// forgetting a job is removing its namespace. Inside it, "." separates KVS
// directories, and each path component is escaped (see esc):
//
//	i.<bin>.<dir>.<bin>.<name>      a record, as JSON with its generation, in
//	                                its directory's index (lookups, waits and
//	                                listings all read it there)
//	v.<key>                         a value of PutIfAbsent or Register
//	m.gen, m.records                the last generation, the number of records
//	m.sync                          a count of catch-up commits (see catchUp)
//
// The bins (two hex digits of a hash for directories, one for names) keep
// KVS directories small: the KVS rewrites a whole directory on every change
// to it, so a commit costs time in proportion to the size of the
// directories it touches. Releases before this one kept a second copy of
// each record under its DYAD key ("r."), which doubled the directories a
// publish rewrites and bought nothing a lookup needs.
//
// Generations. The KVS has no per-key version and no conditional commit,
// so every write goes through one serializer: the store of the daemon of
// rank 0 (where the KVS master lives too) answers its service's write
// methods, assigns each publish and removal the next generation of a
// counter kept in the KVS, checks removal conditions and claims, and
// commits what arrives meanwhile in one transaction. Each answer carries
// the commit's root sequence, which the writer's store waits for on its own
// broker before it returns: a lookup after a publish sees it. Lookups,
// listings and waits read the local broker's KVS directly.
//
// Why one serializer rather than commits from each rank: the KVS orders
// commits, but a commit cannot read, so it could neither number a
// version (two ranks publishing one path would both take the same
// generation, and the loser's copies elsewhere would pass for current)
// nor remove a record only if it is still the one seen. The serializer
// costs no extra hop where it matters most: rank 0's daemon hands its
// writes to it directly (no Flux request), a publish of a key it knows
// the presence of reads nothing before its commit, and the writes of all
// ranks that arrive during a commit share the next one, so that the cost
// per file falls as writers are added.
//
// Catching up. A broker other than rank 0's learns of a namespace's
// commits from events it subscribes to when it first loads the
// namespace's root; a commit between that load and the subscription is
// missed, and the broker's view stays behind until the next commit in the
// namespace (flux-core 0.88, kvs getroot_completion). So the store makes
// sure, once per namespace, that its broker is current (see fresh), and a
// wait for a commit's version that does not end soon asks the serializer
// for another commit (see catchUp).
//
// Liveness. A value Register stored belongs to the rank that stored it; it
// is there while that rank's daemon is: the daemon's store serves a "ping"
// method, and its service goes away with its Flux handle (when the daemon
// exits or is killed; a broker that dies takes its ranks out of the
// overlay). Get and List leave out values whose daemon does not answer a
// ping (ENOSYS: gone; EHOSTUNREACH: its broker is gone); a slow daemon
// still answers. TTLs play no part.
package flux

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/dyadfs/dyadfs/flux"
	"github.com/dyadfs/dyadfs/hfl/store"
)

// Config configures the Flux store.
type Config struct {
	// Name names the job's service ("dyadfs-<job>"): each daemon of the
	// job registers it with its broker.
	Name string
	// Prefix is prepended to the KVS namespace of each job.
	Prefix string
	// RequestTimeout bounds every request to the serializer and every
	// ping.
	RequestTimeout time.Duration
	// Client opens the store without serving: no service is registered
	// (a command such as `dyadfs forget`, not a daemon). It cannot
	// Register.
	Client bool
	Log    *slog.Logger
}

// DefaultConfig returns the defaults for the job's service name.
func DefaultConfig(name string) Config {
	return Config{Name: name, Prefix: "dyadfs-", RequestTimeout: 10 * time.Second}
}

// Store is the metadata store kept in the Flux KVS.
type Store struct {
	cfg Config
	h   *flux.Handle
	svc *flux.Service
	log *slog.Logger

	ctx    context.Context // ends with Close
	cancel context.CancelFunc

	ser *serializer // on rank 0 only

	closeOnce sync.Once
	closeErr  error

	mu         sync.Mutex
	registered map[string]bool // keys this daemon registered (withdrawn at Close)
	alive      map[uint32]aliveAt
	ensured    map[string]bool // job namespaces known to exist
	current    map[string]bool // job namespaces this rank's broker is known to follow
}

type aliveAt struct {
	ok bool
	at time.Time
}

var _ store.Store = (*Store)(nil)

// Open makes the store over handle h: it registers the job's service on
// h's broker and, on rank 0, runs the serializer. It does not wait for the
// serializer of rank 0 to answer: calls that write wait for it.
func Open(ctx context.Context, h *flux.Handle, cfg Config) (*Store, error) {
	if cfg.Name == "" || strings.ContainsAny(cfg.Name, ". ") {
		return nil, fmt.Errorf("flux store: service name %q must be non-empty, without dots or spaces", cfg.Name)
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = 10 * time.Second
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Store{cfg: cfg, h: h, log: log, registered: make(map[string]bool),
		alive: make(map[uint32]aliveAt), ensured: make(map[string]bool), current: make(map[string]bool)}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	if cfg.Client {
		return s, nil
	}
	svc, err := h.Serve(ctx, cfg.Name)
	if err != nil {
		if errors.Is(err, syscall.EEXIST) {
			err = fmt.Errorf("%w: another daemon of the job runs on this broker", err)
		}
		return nil, fmt.Errorf("flux store: register service %s on rank %d: %w", cfg.Name, h.Rank(), err)
	}
	s.svc = svc
	svc.Handle("ping", func(r flux.Request) { r.Respond(nil) })
	if h.Rank() == 0 {
		s.ser = newSerializer(s)
		svc.Handle("write", s.ser.request)
		go s.ser.run()
	}
	return s, nil
}

// Close withdraws what this daemon registered and unregisters its
// service. Closing again does nothing.
func (s *Store) Close() error {
	s.closeOnce.Do(func() { s.closeErr = s.close() })
	return s.closeErr
}

func (s *Store) close() error {
	s.mu.Lock()
	keys := make([]string, 0, len(s.registered))
	for k := range s.registered {
		keys = append(keys, k)
	}
	s.registered = map[string]bool{}
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.RequestTimeout)
	defer cancel()
	for _, k := range keys {
		s.write(ctx, writeReq{Op: opUnregister, Key: k, Rank: s.h.Rank()})
	}
	s.cancel()
	if s.ser != nil {
		s.ser.stop()
	}
	if s.svc == nil {
		return nil
	}
	return s.svc.Close()
}

// split is a key's job (the KVS namespace it lives in) and the rest.
func (s *Store) split(key string) (ns, rest string) {
	job, rest, ok := strings.Cut(key, "/")
	if !ok {
		job, rest = "", key
	}
	return s.cfg.Prefix + esc(job), rest
}

// esc makes s one KVS path component: "." separates components, so it is
// escaped, with "%"; and the result is never empty.
func esc(s string) string {
	var b strings.Builder
	b.WriteByte('_')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '.', '%', '/':
			fmt.Fprintf(&b, "%%%02X", c)
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// unesc undoes esc.
func unesc(s string) string {
	s = strings.TrimPrefix(s, "_")
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) {
			var c byte
			fmt.Sscanf(s[i+1:i+3], "%02X", &c)
			b.WriteByte(c)
			i += 2
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func hash(s string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(s))
	return h.Sum64()
}

// indexDir is the KVS directory of the index of directory dir (the rest
// of a Slot.Dir).
func indexDir(dir string) string {
	return fmt.Sprintf("i.%02x.%s", byte(hash(dir)), esc(dir))
}

// indexKey is where name's entry lives in the index of dir.
func indexKey(dir, name string) string {
	return fmt.Sprintf("%s.%x.%s", indexDir(dir), byte(hash(name))&0xf, esc(name))
}

// recordKey is the job's namespace of slot and where its record lives: in
// its directory's index, once, which lookups, waits and listings all read.
func (s *Store) recordKey(slot store.Slot) (ns, key string) {
	ns, _ = s.split(slot.Key)
	_, dir := s.split(slot.Dir)
	return ns, indexKey(dir, slot.Name)
}

// valueKey is where the value of rest lives.
func valueKey(rest string) string { return "v." + esc(rest) }

const (
	genKey     = "m.gen"
	recordsKey = "m.records"
	syncKey    = "m.sync"
)

// notFound reports whether err from the KVS says the key (or the job's
// namespace, which the first write makes) is not there.
func notFound(err error) bool {
	return errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.EOPNOTSUPP) || errors.Is(err, syscall.ENOTDIR)
}

// fail turns a Flux error into the store's.
func (s *Store) fail(ctx context.Context, op, key string, err error) error {
	switch {
	case s.ctx.Err() != nil, errors.Is(err, flux.ErrClosed):
		return fmt.Errorf("flux store: %s %q: %w", op, key, store.ErrClosed)
	case ctx.Err() != nil && !errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("flux store: %s %q: %w", op, key, ctx.Err())
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, syscall.ETIMEDOUT),
		errors.Is(err, syscall.ENOSYS), errors.Is(err, syscall.EHOSTUNREACH):
		return fmt.Errorf("flux store: %s %q: %w: %w", op, key, store.ErrUnavailable, err)
	case errors.Is(err, syscall.EPERM), errors.Is(err, syscall.EACCES):
		return fmt.Errorf("flux store: %s %q: %w: %w", op, key, store.ErrDenied, err)
	case errors.Is(err, syscall.EFBIG), errors.Is(err, syscall.E2BIG):
		return fmt.Errorf("flux store: %s %q: %w: %w", op, key, store.ErrTooLarge, err)
	case errors.Is(err, syscall.ENOSPC):
		return fmt.Errorf("flux store: %s %q: %w: %w", op, key, store.ErrNoSpace, err)
	}
	return fmt.Errorf("flux store: %s %q: %w", op, key, err)
}

// Publish implements store.Store through the serializer.
func (s *Store) Publish(ctx context.Context, slot store.Slot, rec store.Record) (store.Record, error) {
	ns, rkey := s.recordKey(slot)
	rec.Generation = 0
	v, err := json.Marshal(rec)
	if err != nil {
		return store.Record{}, fmt.Errorf("flux store: publish %q: %w", slot.Key, err)
	}
	ans, err := s.write(ctx, writeReq{Op: opPublish, NS: ns, Key: rkey, Value: v})
	if err != nil {
		return store.Record{}, s.fail(ctx, "publish", slot.Key, err)
	}
	rec.Generation = ans.Gen
	return rec, nil
}

// decode reads a record as the store keeps it.
func decode(key string, v []byte) (store.Record, error) {
	var rec store.Record
	if err := json.Unmarshal(v, &rec); err != nil {
		return store.Record{}, fmt.Errorf("flux store: record %q: %w", key, err)
	}
	return rec, nil
}

// Lookup implements store.Store: one lookup in the local broker's KVS.
func (s *Store) Lookup(ctx context.Context, slot store.Slot) (store.Record, error) {
	key := slot.Key
	if s.ctx.Err() != nil {
		return store.Record{}, store.ErrClosed
	}
	ns, rkey := s.recordKey(slot)
	cctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	defer cancel()
	if err := s.fresh(cctx, ns); err != nil {
		return store.Record{}, s.fail(ctx, "lookup", key, err)
	}
	v, err := s.h.Lookup(cctx, ns, rkey)
	if notFound(err) {
		s.forgetEnsured(ns, err)
		return store.Record{}, store.ErrNotFound
	}
	if err != nil {
		return store.Record{}, s.fail(ctx, "lookup", key, err)
	}
	return decode(key, v)
}

// Wait implements store.Store: a watch of the key in the local broker's
// KVS, which reports each new value; a removal ends the watch, which
// starts again.
func (s *Store) Wait(ctx context.Context, slot store.Slot, after uint64) (store.Record, error) {
	key := slot.Key
	ns, rkey := s.recordKey(slot)
	for {
		if err := ctx.Err(); err != nil {
			return store.Record{}, err
		}
		if s.ctx.Err() != nil {
			return store.Record{}, store.ErrClosed
		}
		wctx, cancel := context.WithCancel(ctx)
		stop := context.AfterFunc(s.ctx, cancel)
		rec, again, err := s.watch(wctx, ns, rkey, key, after)
		stop()
		cancel()
		if s.ctx.Err() != nil {
			return store.Record{}, store.ErrClosed
		}
		if !again {
			return rec, err
		}
		// The namespace is not there yet (nothing was published in
		// the job): look again in a moment.
		t := time.NewTimer(50 * time.Millisecond)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		case <-s.ctx.Done():
			t.Stop()
		}
	}
}

// ensure makes sure the job's namespace exists (a watch must not wait for
// one that does not: see flux.Handle.Watch).
func (s *Store) ensure(ctx context.Context, ns string) error {
	s.mu.Lock()
	ok := s.ensured[ns]
	s.mu.Unlock()
	if ok {
		return nil
	}
	if _, err := s.write(ctx, writeReq{Op: opEnsure, NS: ns}); err != nil {
		return err
	}
	s.mu.Lock()
	s.ensured[ns] = true
	s.mu.Unlock()
	return nil
}

// forgetEnsured drops what ensure and fresh knew of ns when err says the
// namespace is gone (a forget removed it): the next watch makes it again
// first, and the next read checks this broker follows it.
func (s *Store) forgetEnsured(ns string, err error) {
	if errors.Is(err, syscall.EOPNOTSUPP) {
		s.forgetNamespace(ns)
	}
}

// forgetNamespace drops what ensure and fresh knew of ns.
func (s *Store) forgetNamespace(ns string) {
	s.mu.Lock()
	delete(s.ensured, ns)
	delete(s.current, ns)
	s.mu.Unlock()
}

// followed records that this rank's broker has every commit of ns and
// follows it.
func (s *Store) followed(ns string) {
	s.mu.Lock()
	s.current[ns] = true
	s.mu.Unlock()
}

// fresh makes sure, the first time this store reads namespace ns, that
// this rank's broker follows its commits and has every commit made so
// far: asking it for the root makes it load the root and subscribe; then
// it is brought to rank 0's sequence (catchUp), since a commit between
// its load and its subscription would be missed. Rank 0's broker commits
// them all itself.
func (s *Store) fresh(ctx context.Context, ns string) error {
	s.mu.Lock()
	ok := s.current[ns]
	s.mu.Unlock()
	if ok || s.h.Rank() == 0 {
		return nil
	}
	here, err := s.h.RootSeq(ctx, ns, flux.NodeAny)
	if err != nil {
		if notFound(err) {
			return nil // no namespace yet: nothing to miss
		}
		return err
	}
	seq, err := s.h.RootSeq(ctx, ns, 0)
	switch {
	case notFound(err):
		return nil
	case err != nil:
		return err
	case here >= seq:
		s.followed(ns)
		return nil
	}
	return s.catchUp(ctx, ns, seq)
}

// catchUpPatience is how long a wait for a version goes on before the
// store suspects its broker missed the commit's event and asks for
// another commit; it doubles up to maxCatchUpPatience.
const (
	catchUpPatience    = 250 * time.Millisecond
	maxCatchUpPatience = 2 * time.Second
)

// catchUp waits until this rank's broker has root sequence seq of ns. A
// broker that missed the event of a commit learns of it with the next
// one: when the wait lasts, the serializer is asked for a commit.
func (s *Store) catchUp(ctx context.Context, ns string, seq int) error {
	patience := catchUpPatience
	for {
		wctx, cancel := context.WithTimeout(ctx, patience)
		err := s.h.WaitVersion(wctx, ns, seq)
		late := wctx.Err() != nil && ctx.Err() == nil
		cancel()
		if !late {
			if err == nil {
				s.followed(ns)
			}
			return err
		}
		s.log.Debug("flux store: this broker is behind the namespace; asking for a commit", "ns", ns, "seq", seq, "waited", patience)
		if _, err := s.ask(ctx, writeReq{Op: opSync, NS: ns}); err != nil {
			return err
		}
		patience = min(2*patience, maxCatchUpPatience)
	}
}

// watch follows one watch until a record newer than after arrives (again
// false), the key is removed or the namespace is missing (again true), or
// ctx ends.
func (s *Store) watch(ctx context.Context, ns, rkey, key string, after uint64) (rec store.Record, again bool, err error) {
	if err := s.ensure(ctx, ns); err != nil {
		return store.Record{}, false, s.fail(ctx, "wait for", key, err)
	}
	fctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	err = s.fresh(fctx, ns)
	cancel()
	if err != nil {
		return store.Record{}, false, s.fail(ctx, "wait for", key, err)
	}
	events, err := s.h.Watch(ctx, ns, rkey)
	if err != nil {
		if notFound(err) {
			s.forgetEnsured(ns, err)
			return store.Record{}, true, nil
		}
		return store.Record{}, false, s.fail(ctx, "wait for", key, err)
	}
	for ev := range events {
		if ev.Err != nil {
			if notFound(ev.Err) {
				s.forgetEnsured(ns, ev.Err)
				return store.Record{}, true, nil
			}
			return store.Record{}, false, s.fail(ctx, "wait for", key, ev.Err)
		}
		rec, err := decode(key, ev.Value)
		if err != nil {
			return store.Record{}, false, err
		}
		if rec.Generation > after {
			return rec, false, nil
		}
	}
	if err := ctx.Err(); err != nil {
		return store.Record{}, false, err
	}
	return store.Record{}, true, nil // ended without a value: watch again
}

// Remove implements store.Store through the serializer, which judges cond
// against the record it knows.
func (s *Store) Remove(ctx context.Context, slot store.Slot, cond store.RemoveCond) (uint64, error) {
	ns, rkey := s.recordKey(slot)
	c, _ := json.Marshal(cond)
	ans, err := s.write(ctx, writeReq{Op: opRemove, NS: ns, Key: rkey, Value: c})
	switch {
	case err == nil:
		return ans.Gen, nil
	case errors.Is(err, syscall.ENOENT):
		return 0, store.ErrNotFound
	case errors.Is(err, syscall.EEXIST):
		return 0, fmt.Errorf("remove %s: %w", slot.Key, store.ErrConflict)
	}
	return 0, s.fail(ctx, "remove", slot.Key, err)
}

// ListDir implements store.Store: the index's bins are read from the local
// broker's KVS, their names sorted, and the page's records looked up at
// once.
func (s *Store) ListDir(ctx context.Context, dir, after string, limit int) ([]store.Record, error) {
	if s.ctx.Err() != nil {
		return nil, store.ErrClosed
	}
	if limit <= 0 {
		limit = store.DefaultListLimit
	}
	ns, d := s.split(dir)
	idir := indexDir(d)
	if err := s.fresh(ctx, ns); err != nil {
		return nil, s.fail(ctx, "list", dir, err)
	}
	bins, err := s.h.ListDir(ctx, ns, idir)
	if notFound(err) {
		s.forgetEnsured(ns, err)
		return nil, nil
	}
	if err != nil {
		return nil, s.fail(ctx, "list", dir, err)
	}
	type entry struct{ name, key string }
	var entries []entry
	for _, bin := range bins {
		names, err := s.h.ListDir(ctx, ns, idir+"."+bin)
		if notFound(err) {
			continue
		}
		if err != nil {
			return nil, s.fail(ctx, "list", dir, err)
		}
		for _, n := range names {
			if name := unesc(n); name > after {
				entries = append(entries, entry{name, idir + "." + bin + "." + n})
			}
		}
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].name < entries[j].name })
	if len(entries) > limit {
		entries = entries[:limit]
	}
	out := make([]store.Record, len(entries))
	errs := make([]error, len(entries))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64)
	for i, e := range entries {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			v, err := s.h.Lookup(ctx, ns, e.key)
			if err == nil {
				out[i], err = decode(e.key, v)
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	recs := out[:0]
	for i, err := range errs {
		switch {
		case notFound(err):
			// Removed while listed.
		case err != nil:
			return nil, s.fail(ctx, "list", dir, err)
		default:
			recs = append(recs, out[i])
		}
	}
	return recs, nil
}

// registration is a value as the store keeps it: with the rank that
// registered it (Register), or none (PutIfAbsent).
type registration struct {
	Value []byte  `json:"v"`
	Rank  *uint32 `json:"rank,omitempty"`
}

// Register implements store.Store. The claim is judged here, on what the
// serializer had; the write then succeeds only if that is still what it
// has, so that of two daemons claiming at once one sees the other's value.
func (s *Store) Register(ctx context.Context, key string, value []byte, ttl time.Duration, claim func(current []byte) error) error {
	ns, rest := s.split(key)
	vkey := valueKey(rest)
	for attempt := 0; ; attempt++ {
		cur, curRaw, err := s.liveValue(ctx, ns, vkey)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return s.fail(ctx, "register", key, err)
		}
		if err == nil && claim != nil {
			if err := claim(cur.Value); err != nil {
				return err
			}
		}
		rank := s.h.Rank()
		v, _ := json.Marshal(registration{Value: value, Rank: &rank})
		_, err = s.write(ctx, writeReq{Op: opRegister, NS: ns, Key: vkey, Value: v, Expect: curRaw})
		if err == nil {
			s.mu.Lock()
			s.registered[key] = true
			s.mu.Unlock()
			return nil
		}
		if !errors.Is(err, syscall.EEXIST) || attempt > 10 {
			return s.fail(ctx, "register", key, err)
		}
		// Another registration came in between: judge it.
	}
}

// liveValue returns the value under vkey if it is there and its daemon (if
// it was registered) is alive, with the raw form it is kept in; a value of
// a dead daemon reads as store.ErrNotFound (and its raw form is returned,
// for a claim to replace it).
func (s *Store) liveValue(ctx context.Context, ns, vkey string) (registration, []byte, error) {
	if err := s.fresh(ctx, ns); err != nil {
		return registration{}, nil, err
	}
	raw, err := s.h.Lookup(ctx, ns, vkey)
	if notFound(err) {
		return registration{}, nil, store.ErrNotFound
	}
	if err != nil {
		return registration{}, nil, err
	}
	var r registration
	if err := json.Unmarshal(raw, &r); err != nil {
		return registration{}, raw, fmt.Errorf("flux store: value %q: %w", vkey, err)
	}
	if r.Rank != nil && !s.rankAlive(ctx, *r.Rank) {
		return registration{}, raw, store.ErrNotFound
	}
	return r, raw, nil
}

// aliveFor is how long a ping's answer is trusted.
const aliveFor = time.Second

// rankAlive reports whether the daemon of the job on rank answers a ping.
func (s *Store) rankAlive(ctx context.Context, rank uint32) bool {
	if rank == s.h.Rank() && !s.cfg.Client {
		return true // this daemon
	}
	s.mu.Lock()
	a, ok := s.alive[rank]
	s.mu.Unlock()
	if ok && time.Since(a.at) < aliveFor {
		return a.ok
	}
	_, err := s.h.RPC(ctx, s.cfg.Name+".ping", rank, nil, s.cfg.RequestTimeout)
	alive := err == nil || !(errors.Is(err, syscall.ENOSYS) || errors.Is(err, syscall.EHOSTUNREACH))
	s.mu.Lock()
	s.alive[rank] = aliveAt{ok: alive, at: time.Now()}
	s.mu.Unlock()
	return alive
}

// Get implements store.Store.
func (s *Store) Get(ctx context.Context, key string) ([]byte, error) {
	if s.ctx.Err() != nil {
		return nil, store.ErrClosed
	}
	ns, rest := s.split(key)
	r, _, err := s.liveValue(ctx, ns, valueKey(rest))
	if errors.Is(err, store.ErrNotFound) {
		return nil, store.ErrNotFound
	}
	if err != nil {
		return nil, s.fail(ctx, "get", key, err)
	}
	return r.Value, nil
}

// List implements store.Store. The values of a job are few (its daemons,
// its secret): they are all read.
func (s *Store) List(ctx context.Context, prefix string) (map[string][]byte, error) {
	if s.ctx.Err() != nil {
		return nil, store.ErrClosed
	}
	ns, rest := s.split(prefix)
	job, _, _ := strings.Cut(prefix, "/")
	out := make(map[string][]byte)
	if err := s.fresh(ctx, ns); err != nil {
		return nil, s.fail(ctx, "list", prefix, err)
	}
	names, err := s.h.ListDir(ctx, ns, "v")
	if notFound(err) {
		return out, nil
	}
	if err != nil {
		return nil, s.fail(ctx, "list", prefix, err)
	}
	for _, n := range names {
		k := unesc(n)
		if !strings.HasPrefix(k, rest) {
			continue
		}
		r, _, err := s.liveValue(ctx, ns, "v."+n)
		if errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, s.fail(ctx, "list", prefix, err)
		}
		out[job+"/"+k] = r.Value
	}
	return out, nil
}

// PutIfAbsent implements store.Store through the serializer.
func (s *Store) PutIfAbsent(ctx context.Context, key string, value []byte) ([]byte, error) {
	ns, rest := s.split(key)
	v, _ := json.Marshal(registration{Value: value})
	ans, err := s.write(ctx, writeReq{Op: opPutIfAbsent, NS: ns, Key: valueKey(rest), Value: v})
	if err != nil {
		return nil, s.fail(ctx, "put", key, err)
	}
	var r registration
	if err := json.Unmarshal(ans.Value, &r); err != nil {
		return nil, fmt.Errorf("flux store: put %q: %w", key, err)
	}
	return r.Value, nil
}

// Health implements store.Store: the job's record count, from its
// counter, and the size of the instance's content store on rank 0 (what
// `flux module stats content-sqlite` shows), whose quota is the disk it
// is on: its size and the free space there.
func (s *Store) Health(ctx context.Context, namespace string) (store.Health, error) {
	if s.ctx.Err() != nil {
		return store.Health{}, store.ErrClosed
	}
	var h store.Health
	h.Bytes, h.Quota = s.contentSize(ctx)
	ns := s.cfg.Prefix + esc(namespace)
	if err := s.fresh(ctx, ns); err != nil {
		return store.Health{}, s.fail(ctx, "health", namespace, err)
	}
	v, err := s.h.Lookup(ctx, ns, recordsKey)
	if notFound(err) {
		return h, nil
	}
	if err != nil {
		return store.Health{}, s.fail(ctx, "health", namespace, err)
	}
	fmt.Sscan(string(v), &h.Records)
	return h, nil
}

// contentSize asks rank 0's content-sqlite module for its database's size
// and the free space beside it; 0, 0 when it does not answer (another
// backing module, or none).
func (s *Store) contentSize(ctx context.Context) (size, quota int64) {
	ans, err := s.h.RPC(ctx, "content-sqlite.stats-get", 0, []byte("{}"), healthTimeout)
	if err != nil {
		return 0, 0
	}
	var st struct {
		Size int64 `json:"dbfile_size"`
		Free int64 `json:"dbfile_free"`
	}
	// Flux string payloads end in a NUL.
	if json.Unmarshal(bytes.TrimRight(ans, "\x00"), &st) != nil || st.Size <= 0 {
		return 0, 0
	}
	return st.Size, st.Size + st.Free
}

// healthTimeout bounds asking the content store for its size.
const healthTimeout = 2 * time.Second

// Forget implements store.Store: the job's KVS namespace is removed, at
// once (the KVS frees it as one unit; page plays no part). Through the
// serializer if the job's rank-0 daemon runs (so that it forgets what it
// kept of the namespace); else directly.
func (s *Store) Forget(ctx context.Context, namespace string, page int, progress func(int)) (int, error) {
	ns := s.cfg.Prefix + esc(namespace)
	var n int
	ans, err := s.write(ctx, writeReq{Op: opForget, NS: ns})
	switch {
	case err == nil:
		n = int(ans.Gen) // the serializer counts what it removed
	case errors.Is(err, syscall.ENOSYS):
		c, err := forgetNamespace(ctx, s.h, ns)
		if err != nil {
			return 0, s.fail(ctx, "forget", namespace, err)
		}
		n = int(c)
	default:
		return 0, s.fail(ctx, "forget", namespace, err)
	}
	// The namespace is made again by the next write: it is new to this
	// rank's broker then.
	s.forgetNamespace(ns)
	if progress != nil {
		progress(n)
	}
	return n, nil
}
