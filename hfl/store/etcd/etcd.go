// Package etcd keeps the metadata store in an etcd cluster shared by every node
// of a job (URL etcd://host:port[,host:port...]).
//
// Layout. The store holds two maps, records and registered values, and the
// conformance suite requires them to be apart (a registered value is not a
// record), so each has its own subtree under the prefix:
//
//	<prefix>dir/<dir>//<name>   a store.Record as JSON, in its directory's index; its "gen" field is stored as 0
//	<prefix>val/<key>           a value of Register or PutIfAbsent, raw bytes
//
// with the prefix "/dyadfs/" by default, so the entries of a job's
// directory run1 are listed by `etcdctl get --prefix
// /dyadfs/dir/<namespace>/run1//`, and all of its records by `etcdctl get
// --prefix /dyadfs/dir/<namespace>/`. A clean path never holds "//", so one
// directory's prefix never matches another's entries. A record is kept
// once, under its slot's index entry: a lookup, a wait and a listing all
// read it there. (Releases before 0.9 also kept a copy under
// <prefix>rec/<key>, the slot's hashed key, which was never read without
// the other: half the database and of etcd's work per publish. Forget
// still deletes that subtree.)
//
// Generations are etcd revisions: a record's generation is the ModRevision of
// its key, which Publish learns from the header of its transaction. Revisions are
// global, grow with every write and are never reused, not even after a key is
// deleted and written again, and they survive server restarts.
//
// Waits read the key (which answers at once if the record is there, and
// tells whether etcd is up), then set up a watch from the current revision
// and, once etcd confirms it, read the key again: whatever was published
// before the watch began the second read sees, whatever after it the watch
// delivers, so nothing is missed and nothing polls. (A watch from an older
// revision would be served by etcd's catch-up loop, every 100 ms.) The
// client library reconnects a watch by itself when the server restarts or a
// connection drops, and resumes it where it was; if the revision to resume
// from has been compacted away meanwhile, the wait starts over.
//
// Registered values live on a lease of their own, renewed until Close, which
// revokes it so that the value disappears at once. A daemon that dies stops
// renewing, and the server deletes the value when the lease's TTL runs out.
// etcd raises short TTLs to its minimum, ceil(1.5 x election timeout): 2 s
// with etcd's default 1 s election timeout, so a TTL of 1 s lasts 2 s.
package etcd

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dyadfs/dyadfs/hfl/store"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// DefaultPrefix is where the store's keys live in etcd.
const DefaultPrefix = "/dyadfs/"

// Subtrees under the prefix.
const (
	etcdRecordDir = "rec/" // of earlier releases: Forget deletes it
	etcdIndexDir  = "dir/"
	etcdValueDir  = "val/"
)

// Message size bounds. Records are a few hundred bytes and values small;
// etcd's server refuses requests above 1.5 MiB by default. A watch response
// can batch many events of one key, so replies get more room.
const (
	etcdMaxSendBytes = 2 << 20
	etcdMaxRecvBytes = 16 << 20
)

// Config configures the etcd backend.
type Config struct {
	// Endpoints are the client addresses of the etcd cluster, host:port.
	Endpoints []string
	// Prefix is prepended to every key; different prefixes on one cluster
	// are different stores.
	Prefix string
	// DialTimeout bounds each connection attempt and the reachability check
	// of Open. After a failed attempt the client tries again within
	// DialTimeout, so a server that comes back is found quickly.
	DialTimeout time.Duration
	// RequestTimeout bounds every call to etcd (each attempt of a waiting
	// read too): a call fails with store.ErrUnavailable rather than hang while
	// etcd is down. The caller's context bounds it further.
	RequestTimeout time.Duration
	// KeepAliveTime and KeepAliveTimeout: a connection with open watches or
	// leases is pinged after KeepAliveTime without traffic and dropped if no
	// answer comes within KeepAliveTimeout, which detects a dead server
	// whose connections do not close. gRPC pings no more often than every
	// 10 s, and etcd refuses pings more often than every 5 s.
	KeepAliveTime    time.Duration
	KeepAliveTimeout time.Duration
	// TLS, if set, makes the connections TLS (https:// endpoints), with
	// the CA and client certificate it holds.
	TLS *tls.Config
	// Username and Password authenticate with etcd's own users.
	Username, Password string
}

// Scheme is the URL scheme the configuration's endpoints are reached by.
func (c Config) Scheme() string {
	if c.TLS != nil {
		return "https"
	}
	return "etcd"
}

// Protected reports whether what the store holds is out of strangers'
// reach on the network: the connection is TLS with a client certificate,
// or etcd asks for a user and password (with which etcd's own access
// control decides who reads the job's keys).
func (c Config) Protected() bool {
	return (c.TLS != nil && len(c.TLS.Certificates) > 0) || c.Username != ""
}

// DefaultConfig returns the defaults for the given endpoints.
func DefaultConfig(endpoints ...string) Config {
	return Config{
		Endpoints:        endpoints,
		Prefix:           DefaultPrefix,
		DialTimeout:      3 * time.Second,
		RequestTimeout:   5 * time.Second,
		KeepAliveTime:    10 * time.Second,
		KeepAliveTimeout: 3 * time.Second,
	}
}

// Validate checks the configuration without connecting.
func (c Config) Validate() error {
	if len(c.Endpoints) == 0 {
		return errors.New("etcd: no endpoints (want host:port)")
	}
	for _, ep := range c.Endpoints {
		if err := checkEndpoint(ep); err != nil {
			return err
		}
	}
	if c.Prefix == "" {
		return errors.New("etcd: empty key prefix (the default is " + DefaultPrefix + ")")
	}
	for name, d := range map[string]time.Duration{
		"dial timeout": c.DialTimeout, "request timeout": c.RequestTimeout,
		"keepalive time": c.KeepAliveTime, "keepalive timeout": c.KeepAliveTimeout,
	} {
		if d <= 0 {
			return fmt.Errorf("etcd: %s %v must be positive", name, d)
		}
	}
	return nil
}

// ParseEndpoints splits the address part of an etcd:// URL into its
// endpoints and checks their form.
func ParseEndpoints(addr string) ([]string, error) {
	if addr == "" {
		return nil, errors.New("no endpoints: want etcd://host:port[,host:port...]")
	}
	eps := strings.Split(addr, ",")
	for _, ep := range eps {
		if err := checkEndpoint(ep); err != nil {
			return nil, err
		}
	}
	return eps, nil
}

func checkEndpoint(ep string) error {
	const want = "want host:port, e.g. 127.0.0.1:2379, comma-separated for several"
	if ep == "" {
		return fmt.Errorf("empty etcd endpoint: %s", want)
	}
	host, port, err := net.SplitHostPort(ep)
	if err != nil {
		return fmt.Errorf("etcd endpoint %q: %s", ep, want)
	}
	if host == "" || strings.ContainsAny(host, "/?#@ ") {
		return fmt.Errorf("etcd endpoint %q: bad host: %s", ep, want)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("etcd endpoint %q: port %q is not a number from 1 to 65535", ep, port)
	}
	return nil
}

// Store is the metadata store kept in an etcd cluster.
type Store struct {
	cfg       Config
	endpoints string // for messages
	cli       *clientv3.Client

	// ctx is canceled by Close; every call made through the store ends
	// with it.
	ctx    context.Context
	cancel context.CancelFunc
	once   sync.Once

	// regMu serializes Register and Close's withdrawal; regs holds the live
	// registrations by etcd key.
	regMu sync.Mutex
	regs  map[string]*etcdRegistration

	// commits gathers publishes into transactions (see batch.go).
	commits committer
}

var (
	_ store.Store     = (*Store)(nil)
	_ store.Deferring = (*Store)(nil)
)

// Open connects to the etcd cluster and checks, within
// cfg.DialTimeout (or ctx, if shorter), that it answers a read.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	endpoints := strings.Join(cfg.Endpoints, ",")
	eps := cfg.Endpoints
	if cfg.TLS != nil {
		eps = make([]string, len(cfg.Endpoints))
		for i, ep := range cfg.Endpoints {
			eps[i] = "https://" + ep
		}
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:            eps,
		TLS:                  cfg.TLS,
		Username:             cfg.Username,
		Password:             cfg.Password,
		DialTimeout:          cfg.DialTimeout,
		DialKeepAliveTime:    cfg.KeepAliveTime,
		DialKeepAliveTimeout: cfg.KeepAliveTimeout,
		MaxCallSendMsgSize:   etcdMaxSendBytes,
		MaxCallRecvMsgSize:   etcdMaxRecvBytes,
		// The store reports errors to its caller; the library logs nothing.
		Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			// gRPC's default backoff grows to 2 minutes between attempts,
			// which would keep a client away from a restarted server for as
			// long; cap it so that the store reconnects within seconds.
			Backoff: backoff.Config{
				BaseDelay:  100 * time.Millisecond,
				Multiplier: 1.6,
				Jitter:     0.2,
				MaxDelay:   cfg.DialTimeout,
			},
			MinConnectTimeout: cfg.DialTimeout,
		})},
	})
	if err != nil {
		return nil, fmt.Errorf("metadata store %s://%s: %w", cfg.Scheme(), endpoints, err)
	}
	cctx, cancel := context.WithTimeout(ctx, cfg.DialTimeout)
	defer cancel()
	// A linearizable read answers only if a leader and a quorum are up.
	if _, err := cli.Get(cctx, cfg.Prefix, clientv3.WithCountOnly()); err != nil {
		cli.Close()
		hint := "check that etcd runs there and that the URL names its client endpoints"
		if cfg.TLS != nil {
			hint += ", that the CA given signed its certificate and that it accepts the client certificate given"
		}
		if cfg.Username != "" {
			hint += ", and that the user and password are right"
		}
		switch {
		case errors.Is(ctx.Err(), context.Canceled):
			return nil, fmt.Errorf("metadata store %s://%s: %w", cfg.Scheme(), endpoints, ctx.Err())
		case ctx.Err() != nil:
			return nil, fmt.Errorf("metadata store %s://%s: no answer before the deadline (%w): %s", cfg.Scheme(), endpoints, ctx.Err(), hint)
		case cctx.Err() != nil:
			return nil, fmt.Errorf("metadata store %s://%s: no answer within %v (%w): %s", cfg.Scheme(), endpoints, cfg.DialTimeout, store.ErrUnavailable, hint)
		}
		return nil, fmt.Errorf("metadata store %s://%s: %w: %s", cfg.Scheme(), endpoints, err, hint)
	}
	sctx, scancel := context.WithCancel(context.Background())
	s := &Store{
		cfg:       cfg,
		endpoints: endpoints,
		cli:       cli,
		ctx:       sctx,
		cancel:    scancel,
		regs:      make(map[string]*etcdRegistration),
	}
	s.commits = committer{s: s, max: maxBatch}
	return s, nil
}

func (s *Store) valueKey(key string) string { return s.cfg.Prefix + etcdValueDir + key }

// indexPrefix is where the entries of directory dir are kept.
func (s *Store) indexPrefix(dir string) string { return s.cfg.Prefix + etcdIndexDir + dir + "//" }

func (s *Store) indexKey(slot store.Slot) string { return s.indexPrefix(slot.Dir) + slot.Name }

// call returns the context of one call to etcd: the caller's, bounded by
// RequestTimeout and ended by Close.
func (s *Store) call(ctx context.Context) (context.Context, context.CancelFunc) {
	cctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	stop := context.AfterFunc(s.ctx, cancel)
	return cctx, func() {
		stop()
		cancel()
	}
}

// fail turns the error of a call made with cctx, derived by call from ctx,
// into the store's: store.ErrClosed after Close, the caller's context error, or
// store.ErrUnavailable when the request timeout ran out.
func (s *Store) fail(ctx, cctx context.Context, op, key string, err error) error {
	switch {
	case s.ctx.Err() != nil:
		return fmt.Errorf("etcd: %s %q: %w", op, key, store.ErrClosed)
	case ctx.Err() != nil:
		return fmt.Errorf("etcd: %s %q: %w", op, key, ctx.Err())
	case errors.Is(cctx.Err(), context.DeadlineExceeded):
		return fmt.Errorf("etcd: %s %q: %w: no answer from %s within %v (%w)",
			op, key, store.ErrUnavailable, s.endpoints, s.cfg.RequestTimeout, context.DeadlineExceeded)
	}
	if r := refusal(err); r != nil {
		return fmt.Errorf("etcd: %s %q at %s: %w: %w", op, key, s.endpoints, r, err)
	}
	return fmt.Errorf("etcd: %s %q at %s: %w", op, key, s.endpoints, err)
}

// refusal returns the store's refusal that err from etcd stands for, or
// nil: etcd answered, and will not take the write until an operator acts.
func refusal(err error) error {
	var ee rpctypes.EtcdError
	if !errors.As(err, &ee) {
		if st, ok := status.FromError(err); ok {
			ee, _ = rpctypes.Error(st.Err()).(rpctypes.EtcdError)
		}
	}
	switch ee {
	case rpctypes.ErrNoSpace:
		return store.ErrNoSpace
	case rpctypes.ErrPermissionDenied, rpctypes.ErrUserEmpty, rpctypes.ErrAuthFailed, rpctypes.ErrInvalidAuthToken,
		rpctypes.ErrInvalidAuthMgmt, rpctypes.ErrAuthOldRevision:
		return store.ErrDenied
	case rpctypes.ErrRequestTooLarge, rpctypes.ErrTooManyOps:
		return store.ErrTooLarge
	}
	return nil
}

func (s *Store) checkOpen() error {
	if s.ctx.Err() != nil {
		return store.ErrClosed
	}
	return nil
}

// Publish implements store.Store: the record is put in its index entry, in
// one transaction with the publishes that arrived while the previous
// one was in flight (see batch.go); its revision is the generation.
func (s *Store) Publish(ctx context.Context, slot store.Slot, rec store.Record) (store.Record, error) {
	return s.publish(ctx, slot, rec, false)
}

// PublishDeferred implements store.Deferring: the publish may wait a
// moment for others to share its transaction (see batch.go).
func (s *Store) PublishDeferred(ctx context.Context, slot store.Slot, rec store.Record) (store.Record, error) {
	return s.publish(ctx, slot, rec, true)
}

func (s *Store) publish(ctx context.Context, slot store.Slot, rec store.Record, deferrable bool) (store.Record, error) {
	if err := s.checkOpen(); err != nil {
		return store.Record{}, err
	}
	rec.Generation = 0
	v, err := json.Marshal(rec)
	if err != nil {
		return store.Record{}, fmt.Errorf("etcd: publish %q: %w", slot.Key, err)
	}
	req := &publishReq{key: s.indexKey(slot), value: string(v), slotKey: slot.Key, deferrable: deferrable, done: make(chan struct{})}
	s.commits.submit(req)
	rev, err := s.commits.wait(ctx, req)
	if err != nil {
		return store.Record{}, err
	}
	rec.Generation = uint64(rev)
	return rec, nil
}

// ListDir implements store.Store: one linearizable range read of the
// directory's index (a home loads a directory with it and then answers
// for it, so it must not miss what a lagging member has not seen).
func (s *Store) ListDir(ctx context.Context, dir, after string, limit int) ([]store.Record, error) {
	if err := s.checkOpen(); err != nil {
		return nil, err
	}
	if limit <= 0 {
		limit = store.DefaultListLimit
	}
	prefix := s.indexPrefix(dir)
	start := prefix
	if after != "" {
		start = prefix + after + "\x00" // the first key after prefix+after
	}
	cctx, cancel := s.call(ctx)
	defer cancel()
	resp, err := s.cli.Get(cctx, start, clientv3.WithRange(clientv3.GetPrefixRangeEnd(prefix)),
		clientv3.WithLimit(int64(limit)), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
	if err != nil {
		return nil, s.fail(ctx, cctx, "list", dir, err)
	}
	out := make([]store.Record, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		rec, err := decodeRecord(string(kv.Key), kv.Value, kv.ModRevision)
		if err != nil {
			return nil, err
		}
		out = append(out, rec)
	}
	return out, nil
}

// decodeRecord reads a stored record; its generation is the key's revision.
func decodeRecord(key string, v []byte, modRev int64) (store.Record, error) {
	var rec store.Record
	if err := json.Unmarshal(v, &rec); err != nil {
		return store.Record{}, fmt.Errorf("etcd: record %q is corrupt: %w", key, err)
	}
	rec.Generation = uint64(modRev)
	return rec, nil
}

// Lookup implements store.Store.
func (s *Store) Lookup(ctx context.Context, slot store.Slot) (store.Record, error) {
	if err := s.checkOpen(); err != nil {
		return store.Record{}, err
	}
	key := slot.Key
	cctx, cancel := s.call(ctx)
	defer cancel()
	// A serializable read skips a consensus round. Stale, it can only miss
	// a record, and a miss leads to a Wait, which is exact.
	resp, err := s.cli.Get(cctx, s.indexKey(slot), clientv3.WithSerializable())
	if err != nil {
		return store.Record{}, s.fail(ctx, cctx, "lookup", key, err)
	}
	if len(resp.Kvs) == 0 {
		return store.Record{}, store.ErrNotFound
	}
	kv := resp.Kvs[0]
	return decodeRecord(key, kv.Value, kv.ModRevision)
}

// Wait implements store.Store. It ends only with a record, ctx's error, store.ErrClosed,
// a corrupt record or an error etcd will not recover from: while etcd is
// down or restarting it keeps waiting.
//
// It watches first and reads second. A watch that starts at the current
// revision is one etcd keeps "synced" and sends events to as they happen; a
// watch that starts at an older revision (the revision of an earlier read,
// if anything was written since) is served by etcd's catch-up loop, every
// 100 ms. The read after etcd has confirmed the watch sees the key as of
// the revision the watch starts after, or later, so together they miss
// nothing.
func (s *Store) Wait(ctx context.Context, slot store.Slot, after uint64) (store.Record, error) {
	if err := s.checkOpen(); err != nil {
		return store.Record{}, err
	}
	key, ekey := slot.Key, s.indexKey(slot)
	retry := newEtcdBackoff()
	for {
		rec, found, err := s.watch(ctx, key, ekey, after)
		if found || err != nil {
			return rec, err
		}
		// etcd did not answer the read, or the watch ended without an
		// answer (the server canceled it): start over.
		if err := s.sleep(ctx, retry.next()); err != nil {
			return store.Record{}, err
		}
	}
}

// watch watches ekey and, once etcd confirms the watch, reads it; it returns
// the first record newer than after, from the read or from the watch. It
// returns found == false with no error when the caller should start over.
func (s *Store) watch(ctx context.Context, key, ekey string, after uint64) (rec store.Record, found bool, err error) {
	// The watch's context is the store's, not the caller's, and ends when
	// this returns; see cancelWhenCreated for why.
	wctx, cancel := context.WithCancel(s.ctx)
	// While etcd is down, setting up a watch blocks (until the client has
	// a stream again), deaf to the caller giving up: it runs aside.
	started := make(chan clientv3.WatchChan, 1)
	go func() { started <- s.cli.Watch(wctx, ekey, clientv3.WithCreatedNotify()) }()
	var wch clientv3.WatchChan
	select {
	case wch = <-started:
	case <-ctx.Done():
		go func() { s.cancelWhenCreated(<-started, cancel) }()
		return store.Record{}, false, ctx.Err()
	case <-s.ctx.Done():
		cancel()
		return store.Record{}, false, store.ErrClosed
	}
	settled := false // etcd confirmed the watch, or it ended
	defer func() {
		if settled {
			cancel()
		} else {
			go s.cancelWhenCreated(wch, cancel)
		}
	}()
	for {
		select {
		case <-s.ctx.Done():
			return store.Record{}, false, store.ErrClosed
		case <-ctx.Done():
			return store.Record{}, false, ctx.Err()
		case wr, ok := <-wch:
			if !ok {
				// The channel closes when the client closes or gives up
				// on the stream; start over unless the store is closed.
				settled = true
				if err := s.checkOpen(); err != nil {
					return store.Record{}, false, err
				}
				return store.Record{}, false, nil
			}
			if wr.Created {
				settled = true
				rec, found, up, err := s.read(ctx, key, ekey, after, wr.Header.Revision)
				if found || err != nil || !up {
					return rec, found, err
				}
				continue
			}
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypePut && uint64(ev.Kv.ModRevision) > after {
					rec, err := decodeRecord(key, ev.Kv.Value, ev.Kv.ModRevision)
					return rec, err == nil, err
				}
			}
			if wr.CompactRevision != 0 {
				// The client resumed a broken stream from a revision that
				// is compacted away: read again.
				return store.Record{}, false, nil
			}
			if err := wr.Err(); err != nil {
				if werr := s.fail(ctx, wctx, "wait for", key, err); !etcdTransient(werr) {
					return store.Record{}, false, werr
				}
				return store.Record{}, false, nil
			}
		}
	}
}

// read is the read of a wait: the record, if it is newer than after, as of
// revision minRev at least, the revision a confirmed watch starts after. A
// serializable read of the member's latest state needs no consensus round;
// only if that member has not applied minRev yet is the read made
// linearizable. (Reading the latest state rather than minRev's also catches
// a write that landed while etcd set the watch up: such a watch starts in
// the past and etcd serves it from a catch-up loop that runs every 100 ms.)
// up is false when etcd did not answer: a transient failure must not end the
// wait, so the caller backs off and starts over.
func (s *Store) read(ctx context.Context, key, ekey string, after uint64, minRev int64) (rec store.Record, found, up bool, err error) {
	cctx, cancel := s.call(ctx)
	defer cancel()
	resp, err := s.cli.Get(cctx, ekey, clientv3.WithSerializable())
	if err == nil && resp.Header.Revision < minRev {
		resp, err = s.cli.Get(cctx, ekey)
	}
	if err != nil {
		err = s.fail(ctx, cctx, "wait for", key, err)
		if etcdTransient(err) {
			return store.Record{}, false, false, nil
		}
		return store.Record{}, false, false, err
	}
	if len(resp.Kvs) > 0 && uint64(resp.Kvs[0].ModRevision) > after {
		kv := resp.Kvs[0]
		rec, err := decodeRecord(key, kv.Value, kv.ModRevision)
		return rec, err == nil, true, err
	}
	return store.Record{}, false, true, nil
}

// cancelWhenCreated cancels a watch once etcd has confirmed it. The client
// library (v3.5) cannot cancel on the server a watch whose creation it has
// requested but not yet seen confirmed: it forgets it, and the server keeps
// it until the connection's watch stream ends. Waits abandoned that early
// (a short deadline, an interrupted open) would pile up watches on the
// server, so such a watch is cancelled only after its confirmation, or after
// RequestTimeout if none comes.
func (s *Store) cancelWhenCreated(wch clientv3.WatchChan, cancel context.CancelFunc) {
	defer cancel()
	t := time.NewTimer(s.cfg.RequestTimeout)
	defer t.Stop()
	for {
		select {
		case wr, ok := <-wch:
			if !ok || wr.Created || wr.Canceled {
				return
			}
		case <-t.C:
			return
		case <-s.ctx.Done():
			return
		}
	}
}

// sleep waits d unless ctx ends or the store closes.
func (s *Store) sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-s.ctx.Done():
		return store.ErrClosed
	}
}

// etcdTransient reports whether an error from fail may go away by itself:
// the server is down, restarting, electing a leader or overloaded.
func etcdTransient(err error) bool {
	if errors.Is(err, store.ErrUnavailable) {
		return true
	}
	if errors.Is(err, store.ErrClosed) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || refusal(err) != nil {
		return false
	}
	code := status.Code(err) // looks through wrapping
	if ee := (rpctypes.EtcdError{}); errors.As(err, &ee) {
		code = ee.Code()
	}
	switch code {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Internal, codes.Aborted, codes.ResourceExhausted:
		return true
	}
	return false
}

// etcdBackoff spaces retries: 50 ms, doubling to 2 s.
type etcdBackoff struct{ d time.Duration }

func newEtcdBackoff() *etcdBackoff { return &etcdBackoff{} }

func (b *etcdBackoff) next() time.Duration {
	switch {
	case b.d == 0:
		b.d = 50 * time.Millisecond
	case b.d < 2*time.Second:
		b.d = min(2*b.d, 2*time.Second)
	}
	return b.d
}

// Health implements store.Store: the database size (the largest of the
// endpoints'), the cluster's alarms, and the namespace's record count.
func (s *Store) Health(ctx context.Context, namespace string) (store.Health, error) {
	if err := s.checkOpen(); err != nil {
		return store.Health{}, err
	}
	cctx, cancel := s.call(ctx)
	defer cancel()
	var h store.Health
	var statusErr error
	answered := false
	start := time.Now()
	for _, ep := range s.cfg.Endpoints {
		st, err := s.cli.Status(cctx, ep)
		if err != nil {
			statusErr = err
			continue
		}
		answered = true
		h.Bytes = max(h.Bytes, st.DbSize)
	}
	if !answered {
		if s.ctx.Err() == nil && (ctx.Err() != nil || cctx.Err() != nil) {
			// Say which endpoints were asked, whoever's deadline ended it.
			return store.Health{}, fmt.Errorf("etcd: no answer from %s within %v: %w", s.endpoints, time.Since(start).Round(time.Millisecond), store.ErrUnavailable)
		}
		return store.Health{}, s.fail(ctx, cctx, "status", "", statusErr)
	}
	alarms, err := s.cli.AlarmList(cctx)
	if err != nil {
		return store.Health{}, s.fail(ctx, cctx, "alarm list", "", err)
	}
	for _, a := range alarms.Alarms {
		h.Alarms = append(h.Alarms, a.Alarm.String())
	}
	count, err := s.cli.Get(cctx, s.cfg.Prefix+etcdIndexDir+namespace+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return store.Health{}, s.fail(ctx, cctx, "count", namespace, err)
	}
	h.Records = count.Count
	return h, nil
}

// Forget implements store.Store: page by page, it reads the next keys of
// the namespace in each subtree and deletes that range. Reads and deletes
// are what etcd still takes when it is full (its NOSPACE alarm).
func (s *Store) Forget(ctx context.Context, namespace string, page int, progress func(int)) (int, error) {
	if err := s.checkOpen(); err != nil {
		return 0, err
	}
	if page <= 0 {
		page = store.DefaultForgetPage
	}
	deleted := 0
	for _, sub := range []string{etcdRecordDir, etcdIndexDir, etcdValueDir} {
		prefix := s.cfg.Prefix + sub + namespace + "/"
		for {
			cctx, cancel := s.call(ctx)
			keys, err := s.cli.Get(cctx, prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly(),
				clientv3.WithLimit(int64(page)), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
			if err != nil {
				err = s.fail(ctx, cctx, "forget", namespace, err)
				cancel()
				return deleted, err
			}
			if len(keys.Kvs) == 0 {
				cancel()
				break
			}
			first, last := string(keys.Kvs[0].Key), string(keys.Kvs[len(keys.Kvs)-1].Key)
			del, err := s.cli.Delete(cctx, first, clientv3.WithRange(last+"\x00"))
			if err != nil {
				err = s.fail(ctx, cctx, "forget", namespace, err)
				cancel()
				return deleted, err
			}
			cancel()
			deleted += int(del.Deleted)
			if progress != nil {
				progress(deleted)
			}
		}
	}
	return deleted, nil
}

// Remove implements store.Store: it reads the record and deletes it only if
// it is still the same revision, judging cond again if another write came
// in between.
func (s *Store) Remove(ctx context.Context, slot store.Slot, cond store.RemoveCond) (uint64, error) {
	if err := s.checkOpen(); err != nil {
		return 0, err
	}
	ekey := s.indexKey(slot)
	cctx, cancel := s.call(ctx)
	defer cancel()
	resp, err := s.cli.Get(cctx, ekey)
	if err != nil {
		return 0, s.fail(ctx, cctx, "remove", slot.Key, err)
	}
	kvs := resp.Kvs
	for {
		if len(kvs) == 0 {
			return 0, store.ErrNotFound
		}
		kv := kvs[0]
		rec, err := decodeRecord(slot.Key, kv.Value, kv.ModRevision)
		if err != nil {
			return 0, err
		}
		if !cond.Matches(rec) {
			return 0, fmt.Errorf("remove %s (generation %d by %s): %w", rec.Path, rec.Generation, rec.Owner, store.ErrConflict)
		}
		tr, err := s.cli.Txn(cctx).
			If(clientv3.Compare(clientv3.ModRevision(ekey), "=", kv.ModRevision)).
			Then(clientv3.OpDelete(ekey)).
			Else(clientv3.OpGet(ekey)).
			Commit()
		if err != nil {
			return 0, s.fail(ctx, cctx, "remove", slot.Key, err)
		}
		if tr.Succeeded {
			return uint64(tr.Header.Revision), nil
		}
		kvs = tr.Responses[0].GetResponseRange().GetKvs()
	}
}

// Get implements store.Store.
func (s *Store) Get(ctx context.Context, key string) ([]byte, error) {
	if err := s.checkOpen(); err != nil {
		return nil, err
	}
	cctx, cancel := s.call(ctx)
	defer cancel()
	resp, err := s.cli.Get(cctx, s.valueKey(key))
	if err != nil {
		return nil, s.fail(ctx, cctx, "get", key, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, store.ErrNotFound
	}
	return resp.Kvs[0].Value, nil
}

// List implements store.Store: one serializable range read (a member's own
// answer, which may lag the leader's by a moment).
func (s *Store) List(ctx context.Context, prefix string) (map[string][]byte, error) {
	if err := s.checkOpen(); err != nil {
		return nil, err
	}
	cctx, cancel := s.call(ctx)
	defer cancel()
	resp, err := s.cli.Get(cctx, s.valueKey(prefix), clientv3.WithPrefix(), clientv3.WithSerializable())
	if err != nil {
		return nil, s.fail(ctx, cctx, "list", prefix, err)
	}
	out := make(map[string][]byte, len(resp.Kvs))
	base := len(s.valueKey(""))
	for _, kv := range resp.Kvs {
		out[string(kv.Key[base:])] = kv.Value
	}
	return out, nil
}

// PutIfAbsent implements store.Store: one transaction that writes value if the
// key was never created, and otherwise reads what is there.
func (s *Store) PutIfAbsent(ctx context.Context, key string, value []byte) ([]byte, error) {
	if err := s.checkOpen(); err != nil {
		return nil, err
	}
	ekey := s.valueKey(key)
	cctx, cancel := s.call(ctx)
	defer cancel()
	tr, err := s.cli.Txn(cctx).
		If(clientv3.Compare(clientv3.CreateRevision(ekey), "=", 0)).
		Then(clientv3.OpPut(ekey, string(value))).
		Else(clientv3.OpGet(ekey)).
		Commit()
	if err != nil {
		return nil, s.fail(ctx, cctx, "put-if-absent", key, err)
	}
	if tr.Succeeded {
		return append([]byte(nil), value...), nil
	}
	kvs := tr.Responses[0].GetResponseRange().GetKvs()
	if len(kvs) == 0 {
		// Cannot happen: the comparison and the read are one transaction.
		return nil, fmt.Errorf("etcd: put-if-absent %q: key exists but reads empty", key)
	}
	return kvs[0].Value, nil
}

// etcdRegistration is one registered value and the goroutine that keeps
// its lease alive.
type etcdRegistration struct {
	key   string // store key, for messages
	ekey  string
	value string
	ttl   int64 // seconds, as asked
	claim func(current []byte) error

	cancel context.CancelFunc
	done   chan struct{} // closed when keep returns

	mu    sync.Mutex
	lease clientv3.LeaseID // the lease the value is on now
}

func (r *etcdRegistration) currentLease() clientv3.LeaseID {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lease
}

// Register implements store.Store. ttl is rounded up to whole seconds; etcd may
// raise it further to its minimum lease TTL (2 s with default settings).
// Registering a key again replaces the earlier registration.
func (s *Store) Register(ctx context.Context, key string, value []byte, ttl time.Duration, claim func(current []byte) error) error {
	if ttl <= 0 {
		return fmt.Errorf("etcd: register %q: ttl %v must be positive", key, ttl)
	}
	secs := int64(math.Ceil(ttl.Seconds()))
	s.regMu.Lock()
	defer s.regMu.Unlock()
	if err := s.checkOpen(); err != nil {
		return err
	}
	reg := &etcdRegistration{key: key, ekey: s.valueKey(key), value: string(value), ttl: secs, claim: claim, done: make(chan struct{})}
	cctx, cancel := s.call(ctx)
	defer cancel()
	// Judge what is there before letting go of an earlier registration of
	// the key by this store, which a refused claim must leave alone. (The
	// write judges again, atomically.)
	if claim != nil {
		get, err := s.cli.Get(cctx, reg.ekey)
		if err != nil {
			return s.fail(ctx, cctx, "register", key, err)
		}
		if len(get.Kvs) > 0 && string(get.Kvs[0].Value) != reg.value {
			if err := claim(get.Kvs[0].Value); err != nil {
				return err
			}
		}
	}
	// Stop renewing an earlier registration first, so that it cannot put
	// the key back on its own lease once this one has, and revoke its lease
	// only after the key has moved to the new lease.
	old := s.regs[key]
	if old != nil {
		old.cancel()
		<-old.done
		delete(s.regs, key)
	}
	defer func() {
		if old != nil {
			s.revoke(old.currentLease())
		}
	}()
	lease, err := s.grantAndPut(cctx, reg)
	var refused *claimRefused
	if errors.As(err, &refused) {
		return refused.err
	}
	if err != nil {
		return s.fail(ctx, cctx, "register", key, err)
	}
	reg.lease = lease
	kctx, kcancel := context.WithCancel(s.ctx)
	ch, err := s.cli.KeepAlive(kctx, lease)
	if err != nil {
		kcancel()
		s.revoke(lease)
		return s.fail(ctx, cctx, "register", key, err)
	}
	reg.cancel = kcancel
	s.regs[key] = reg
	go s.keep(kctx, reg, ch)
	return nil
}

// grantAndPut puts reg's value on a new lease and returns the lease.
func (s *Store) grantAndPut(ctx context.Context, reg *etcdRegistration) (clientv3.LeaseID, error) {
	g, err := s.cli.Grant(ctx, reg.ttl)
	if err != nil {
		return 0, err
	}
	// Read, let claim judge what is there, then write only if the key is
	// still as read; if another daemon wrote in between, judge again.
	for attempt := 0; ; attempt++ {
		get, err := s.cli.Get(ctx, reg.ekey)
		if err != nil {
			s.revoke(g.ID)
			return 0, err
		}
		unchanged := clientv3.Compare(clientv3.CreateRevision(reg.ekey), "=", 0)
		if len(get.Kvs) > 0 {
			kv := get.Kvs[0]
			if reg.claim != nil && string(kv.Value) != reg.value {
				if err := reg.claim(kv.Value); err != nil {
					s.revoke(g.ID)
					return 0, &claimRefused{err}
				}
			}
			unchanged = clientv3.Compare(clientv3.ModRevision(reg.ekey), "=", kv.ModRevision)
		}
		resp, err := s.cli.Txn(ctx).If(unchanged).Then(clientv3.OpPut(reg.ekey, reg.value, clientv3.WithLease(g.ID))).Commit()
		if err != nil {
			s.revoke(g.ID)
			return 0, err
		}
		if resp.Succeeded {
			return g.ID, nil
		}
		if attempt == 10 {
			s.revoke(g.ID)
			return 0, fmt.Errorf("%s keeps changing under concurrent registrations", reg.key)
		}
	}
}

// claimRefused carries a claim's refusal out of grantAndPut, apart from
// etcd's own errors.
type claimRefused struct{ err error }

func (e *claimRefused) Error() string { return e.err.Error() }

// keep drains the lease's keepalive answers until ctx ends. If the lease is
// lost while the store is open (etcd was unreachable for longer than the
// TTL, or the client gave up on the lease during a restart), it puts the
// value on a new lease, retrying until it succeeds.
func (s *Store) keep(ctx context.Context, reg *etcdRegistration, ch <-chan *clientv3.LeaseKeepAliveResponse) {
	defer close(reg.done)
	for {
		for range ch {
		}
		if ctx.Err() != nil {
			return
		}
		retry := newEtcdBackoff()
		for {
			cctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
			lease, err := s.grantAndPut(cctx, reg)
			var refused *claimRefused
			if errors.As(err, &refused) {
				// Another daemon took the key while this one's lease
				// was lost: it is theirs now.
				cancel()
				return
			}
			if err == nil {
				ch, err = s.cli.KeepAlive(ctx, lease)
				if err != nil {
					s.revoke(lease)
				}
			}
			cancel()
			if err == nil {
				reg.mu.Lock()
				old := reg.lease
				reg.lease = lease
				reg.mu.Unlock()
				// The value is on the new lease now; the old one, if the
				// server still has it, holds nothing of ours.
				s.revoke(old)
				break
			}
			t := time.NewTimer(retry.next())
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return
			}
		}
	}
}

// revoke revokes a lease, which deletes what was put on it, ignoring
// errors: an unrevoked lease expires after its TTL.
func (s *Store) revoke(lease clientv3.LeaseID) error {
	if lease == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.RequestTimeout)
	defer cancel()
	_, err := s.cli.Revoke(ctx, lease)
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return nil
	}
	return err
}

// Close implements store.Store: it ends pending calls and waits (store.ErrClosed),
// revokes the leases of registered values, which deletes them, and closes
// the connection. If etcd does not answer the revocations within
// RequestTimeout, the values expire after their TTL and Close says so.
func (s *Store) Close() error {
	var err error
	s.once.Do(func() {
		s.cancel()
		s.regMu.Lock()
		regs := s.regs
		s.regs = nil
		s.regMu.Unlock()

		var wg sync.WaitGroup
		var mu sync.Mutex
		var errs []error
		for _, reg := range regs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-reg.done
				if rerr := s.revoke(reg.currentLease()); rerr != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("etcd: withdraw %q (it expires after %ds): %w", reg.key, reg.ttl, rerr))
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		if cerr := s.cli.Close(); cerr != nil && !errors.Is(cerr, context.Canceled) {
			errs = append(errs, fmt.Errorf("etcd: close: %w", cerr))
		}
		err = errors.Join(errs...)
	})
	return err
}
