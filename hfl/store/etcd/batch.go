package etcd

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dyadfs/dyadfs/hfl/store"
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

// maxBatch is how many publishes one transaction takes at most: each is
// one put, and etcd's default limit is 128 operations (--max-txn-ops).
// A server configured lower refuses with "too many operations", and the
// batch is split.
const maxBatch = 128

// publishReq is one publish waiting for its transaction.
type publishReq struct {
	key, value string // etcd key and the record's JSON
	slotKey    string // for messages

	// Set by the committer before done is closed.
	rev  int64
	err  error
	done chan struct{}

	// abandoned: the caller stopped waiting before the request was taken
	// into a transaction; it is not committed.
	abandoned bool
}

// committer gathers publishes into transactions. At most one goroutine
// commits at a time; it runs while there is work and exits when the queue
// is empty.
type committer struct {
	s       *Store
	mu      sync.Mutex
	queue   []*publishReq
	running bool
	max     int // publishes per transaction; lowered if etcd refuses as many

	// Counted for the status: transactions and the publishes they held.
	txns, publishes uint64
}

// submit queues req and makes sure a committer runs.
func (c *committer) submit(req *publishReq) {
	c.mu.Lock()
	c.queue = append(c.queue, req)
	start := !c.running
	c.running = true
	c.mu.Unlock()
	if start {
		go c.run()
	}
}

// abandon drops req if it is still queued (a request already in a
// transaction may land).
func (c *committer) abandon(req *publishReq) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if slices.Contains(c.queue, req) {
		req.abandoned = true
	}
}

// run commits batches until the queue is empty.
func (c *committer) run() {
	for {
		batch := c.next()
		if batch == nil {
			return
		}
		c.commit(batch)
	}
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
