package etcd

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dyadfs/dyadfs/hfl/store"
	"github.com/dyadfs/dyadfs/internal/workers"
)

// Group commit. Publishes that arrive while a transaction is in flight go
// together into the next one: etcd's cost is per request and per WAL sync
// far more than per key, so a busy node (many writers, or releases that do
// not wait) pays one commit for many files, while a lone writer's publish
// is committed at once, as alone as before. One transaction is atomic:
// every publish in it lands, or none does and each of its callers hears
// the same refusal (a full store, a denied write).
//
// A key appears at most once in a transaction (etcd refuses duplicates),
// so a second publish of a key waits for the next one, which also keeps
// the two in the order they came.
//
// A batch of one, what a lone writer's waiting close makes, is a plain
// put: etcd handles it in about three quarters of a one-operation
// transaction's time (202 µs against 278 µs, with etcd --metrics
// extensive), with the same atomicity and the same refusals.
//
// A publish that nobody waits for (a release's, when closes do not wait
// for the store; a retry) may wait a moment for more to join it while
// publishes overlap (more than one is queued, or the transaction that
// just ended held more than one): for as long as that transaction took,
// within minLinger and maxLinger. A publish that a caller waits for
// ends the wait at once, and a publish that comes alone never waits: a
// lone writer's commit is as prompt as before, and a busy node pays one
// commit for several times the files.

// maxBatch is how many publishes one transaction takes at most: each is
// one put, and etcd's default limit is 128 operations (--max-txn-ops).
// A server configured lower refuses with "too many operations", and the
// batch is split.
const maxBatch = 128

// Bounds of a linger (see above): it lasts as long as the last
// transaction took, within them.
const (
	minLinger = 200 * time.Microsecond
	maxLinger = 5 * time.Millisecond
)

// publishReq is one publish waiting for its transaction.
type publishReq struct {
	key, value string // etcd key and the record's JSON
	slotKey    string // for messages
	// deferrable: nobody waits for this commit; it may linger.
	deferrable bool

	// Set by the committer before done is closed.
	rev  int64
	err  error
	done chan struct{}

	// abandoned: the caller stopped waiting before the request was taken
	// into a transaction; it is not committed.
	abandoned bool
}

// committer gathers publishes into transactions. At most one goroutine
// (a worker, see internal/workers) commits at a time; it runs while there
// is work and returns when the queue is empty.
type committer struct {
	s       *Store
	mu      sync.Mutex
	queue   []*publishReq
	running bool
	max     int // publishes per transaction; lowered if etcd refuses as many

	// urgent counts the queued publishes that a caller waits for: while
	// there is one, no transaction lingers.
	urgent int
	// lingering: the committer waits for more publishes; poke ends the
	// wait (sent under mu, so none is left over after it).
	lingering bool
	poke      chan struct{}
	// last is the size of the last transaction, took how long it took
	// and ended when: a linger follows overlap, and lasts about a commit.
	last  int
	took  time.Duration
	ended time.Time

	// For tests: do commits a batch (nil: commit), and longest bounds a
	// linger (0: maxLinger).
	do      func([]*publishReq)
	longest time.Duration

	// Counted for the status: transactions and the publishes they held.
	txns, publishes uint64
}

// submit queues req and makes sure a committer runs.
func (c *committer) submit(req *publishReq) {
	c.mu.Lock()
	c.queue = append(c.queue, req)
	if !req.deferrable {
		c.urgent++
	}
	if c.lingering && (!req.deferrable || len(c.queue) >= c.max) {
		select {
		case c.poke <- struct{}{}:
		default:
		}
	}
	start := !c.running
	c.running = true
	c.mu.Unlock()
	if start {
		workers.Go(c.run)
	}
}

// abandon drops req if it is still queued (a request already in a
// transaction may land).
func (c *committer) abandon(req *publishReq) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if slices.Contains(c.queue, req) && !req.abandoned {
		req.abandoned = true
		if !req.deferrable {
			c.urgent--
		}
	}
}

// run commits batches until the queue is empty.
func (c *committer) run() {
	for {
		c.linger()
		batch := c.next()
		if batch == nil {
			return
		}
		start := time.Now()
		if c.do != nil {
			c.do(batch)
		} else {
			c.commit(batch)
		}
		end := time.Now()
		c.mu.Lock()
		c.last, c.took, c.ended = len(batch), end.Sub(start), end
		c.mu.Unlock()
	}
}

// linger waits a moment before a transaction of deferrable publishes
// while publishes overlap (more than one is queued, or the transaction
// that ended just now held more than one), so that more join it. It
// returns at once otherwise, and as soon as a publish that a caller waits
// for comes, a transaction's worth is queued, or the store closes.
func (c *committer) linger() {
	c.mu.Lock()
	n := 0
	for _, req := range c.queue {
		if !req.abandoned {
			n++
		}
	}
	last := c.last
	if time.Since(c.ended) > max(maxLinger, c.longest) {
		last = 0 // publishes overlapped a while ago, not now
	}
	wait, ok := lingerFor(n, c.urgent, c.max, last, c.took)
	if !ok {
		c.mu.Unlock()
		return
	}
	if c.longest > 0 {
		wait = c.longest
	}
	if c.poke == nil {
		c.poke = make(chan struct{}, 1)
	}
	c.lingering = true
	c.mu.Unlock()
	t := time.NewTimer(wait)
	select {
	case <-t.C:
	case <-c.poke:
	case <-c.s.ctx.Done():
	}
	t.Stop()
	c.mu.Lock()
	c.lingering = false
	select {
	case <-c.poke:
	default:
	}
	c.mu.Unlock()
}

// lingerFor says whether, and how long, a transaction waits for more
// publishes when queued are queued (urgent of them waited for), at most
// limit go in one, and the last one held last publishes and took took.
func lingerFor(queued, urgent, limit, last int, took time.Duration) (time.Duration, bool) {
	if queued == 0 || urgent > 0 || queued >= limit || (last < 2 && queued < 2) {
		return 0, false
	}
	return min(maxLinger, max(minLinger, took)), true
}

// next takes the next transaction's publishes from the queue, in order,
// leaving for later a key already taken; it returns nil, and ends the
// committer's turn, when nothing is queued.
func (c *committer) next() []*publishReq {
	c.mu.Lock()
	defer c.mu.Unlock()
	var batch []*publishReq
	keys := make(map[string]bool)
	rest := c.queue[:0]
	for _, req := range c.queue {
		switch {
		case req.abandoned:
			continue
		case len(batch) >= c.max || keys[req.key]:
			rest = append(rest, req)
			continue
		}
		keys[req.key] = true
		batch = append(batch, req)
		if !req.deferrable {
			c.urgent--
		}
	}
	clear(c.queue[len(rest):])
	c.queue = rest
	if len(batch) == 0 {
		c.running = false
		return nil
	}
	return batch
}

// commit puts batch in one transaction (a put, if it holds one publish)
// and tells each caller.
func (c *committer) commit(batch []*publishReq) {
	s := c.s
	cctx, cancel := s.call(context.Background())
	var rev int64
	var err error
	if len(batch) == 1 {
		var resp *clientv3.PutResponse
		if resp, err = s.cli.Put(cctx, batch[0].key, batch[0].value); err == nil {
			rev = resp.Header.Revision
		}
	} else {
		ops := make([]clientv3.Op, 0, len(batch))
		for _, req := range batch {
			ops = append(ops, clientv3.OpPut(req.key, req.value))
		}
		var resp *clientv3.TxnResponse
		if resp, err = s.cli.Txn(cctx).Then(ops...).Commit(); err == nil {
			rev = resp.Header.Revision
		}
	}
	cancel()
	if err != nil && len(batch) > 1 && tooMany(err) {
		// Split it: a server with a lower operation limit, or one
		// request too large, which then fails alone.
		if rpctypes.ErrorDesc(err) == rpctypes.ErrorDesc(rpctypes.ErrGRPCTooManyOps) {
			c.mu.Lock()
			c.max = max(1, len(batch)/2)
			c.mu.Unlock()
		}
		half := len(batch) / 2
		c.commit(batch[:half])
		c.commit(batch[half:])
		return
	}
	c.mu.Lock()
	c.txns++
	c.publishes += uint64(len(batch))
	c.mu.Unlock()
	for _, req := range batch {
		if err != nil {
			req.err = s.fail(context.Background(), cctx, "publish", req.slotKey, err)
		} else {
			req.rev = rev
		}
		close(req.done)
	}
}

// tooMany reports whether etcd refused a transaction for its size.
func tooMany(err error) bool {
	return errors.Is(refusal(err), store.ErrTooLarge)
}

// wait waits for req's transaction, or for ctx.
func (c *committer) wait(ctx context.Context, req *publishReq) (int64, error) {
	select {
	case <-req.done:
		return req.rev, req.err
	case <-ctx.Done():
		c.abandon(req)
		return 0, fmt.Errorf("etcd: publish %q: %w", req.slotKey, ctx.Err())
	}
}

// Commits returns how many transactions the group commit made so far,
// and how many publishes they held.
func (s *Store) Commits() (transactions, publishes uint64) {
	c := &s.commits
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.txns, c.publishes
}
