package notice

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"github.com/dyadfs/dyadfs/hfl"
	"github.com/dyadfs/dyadfs/internal/workers"
)

// Notices to one node go as the messages of one connection: a message is
// a system call on each side and a round trip, which cost more than the
// notice. While one is on its way to a node, the notices for that node
// queue, and the next message carries all of them (a batch); a lone notice
// goes at once, alone. The receiver handles a batch's notices at once, each
// in its own goroutine, as it handles separate messages, and answers with
// all the replies. A notice that may wait for other nodes before its reply
// (a publish or removal told before it returns) is not batched: the others
// would wait with it; nor is a home's break to a holder that the home
// gives a deadline (see holderSilence), which a batch ahead of it must not
// use up: only the breaks told aside are.

// Bounds of a batch: a message and its reply must stay within
// dtl.MaxMessage (60 KiB), and a small file's bytes take up to 16 KiB.
const (
	maxBatch      = 64
	maxBatchBytes = 40 << 10
	// bytesInReplies bounds a batch's replies with their small files'
	// bytes; past it, an answer leaves them out (a transfer brings them).
	bytesInReplies = 40 << 10
	// maxReplyBytes bounds a batch's replies, well within dtl.MaxMessage:
	// an answer past it is an error (its asker reads the store).
	maxReplyBytes = 56 << 10
)

// batchable reports whether msg may go in a batch.
func batchable(msg notice) bool {
	switch msg.Kind {
	case kindPublished, kindUnpublished, kindBreak:
		return !msg.Sync
	case kindAsk, kindList:
		return true
	}
	return false
}

// outboxKey names a node's incarnation (built at every send: no formatting).
type outboxKey struct {
	node, addr string
	started    int64
}

// outbox queues the notices for one node.
type outbox struct {
	n *Protocol
	m hfl.Member

	mu    sync.Mutex
	busy  bool // a message to m is on its way
	queue []*parcel
}

// parcel is one queued notice and, once done is closed, its reply.
type parcel struct {
	ctx   context.Context // its sender's: once it ends, it is not sent
	b     []byte
	reply []byte
	err   error
	done  chan struct{}
}

// outboxOf returns the outbox of m (of its incarnation: a restarted node
// gets a new one).
func (n *Protocol) outboxOf(m hfl.Member) *outbox {
	key := outboxKey{node: m.Node, addr: m.Addr, started: m.Started.UnixNano()}
	n.outMu.Lock()
	defer n.outMu.Unlock()
	o := n.outboxes[key]
	if o == nil {
		if len(n.outboxes) >= 4*maxBatch {
			clear(n.outboxes) // members come and go; the busy ones are made again
		}
		o = &outbox{n: n, m: m}
		n.outboxes[key] = o
	}
	return o
}

// send sends b, alone if nothing is on its way to the node, else in the
// next batch, and returns its reply.
func (o *outbox) send(ctx context.Context, b []byte) ([]byte, error) {
	o.mu.Lock()
	if !o.busy {
		o.busy = true
		o.mu.Unlock()
		reply, err := o.n.sendNow(ctx, o.m, b)
		o.next()
		return reply, err
	}
	p := &parcel{ctx: ctx, b: b, done: make(chan struct{})}
	o.queue = append(o.queue, p)
	o.mu.Unlock()
	select {
	case <-p.done:
		return p.reply, p.err
	case <-ctx.Done():
		o.mu.Lock()
		for i, q := range o.queue {
			if q == p {
				o.queue = append(o.queue[:i], o.queue[i+1:]...)
				break
			}
		}
		o.mu.Unlock()
		return nil, ctx.Err()
	}
}

// next sends what queued while a message was on its way, in batches, from
// a goroutine of its own (the sender of the last message does not wait for
// the others'); with nothing queued, the outbox is idle. Parcels whose
// senders gave up are dropped; when the node does not answer in time,
// every parcel queued hears so at once, not one batch's timeout after
// another.
func (o *outbox) next() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.queue) == 0 {
		o.busy = false
		return
	}
	workers.Go(func() {
		for {
			batch := o.take()
			if batch == nil {
				return
			}
			// A node that did not answer in time is taken for
			// unreachable; one that refused a notice is not.
			if err := o.deliver(batch); errors.Is(err, context.DeadlineExceeded) {
				o.mu.Lock()
				rest := o.queue
				o.queue = nil
				o.mu.Unlock()
				for _, p := range rest {
					p.err = err
					close(p.done)
				}
			}
		}
	})
}

// take takes the next batch off the queue, or, with none left, makes the
// outbox idle and returns nil.
func (o *outbox) take() []*parcel {
	o.mu.Lock()
	defer o.mu.Unlock()
	var batch []*parcel
	size := 0
	for len(o.queue) > 0 && len(batch) < maxBatch {
		p := o.queue[0]
		if p.ctx.Err() != nil {
			o.queue = o.queue[1:]
			p.err = p.ctx.Err()
			close(p.done)
			continue
		}
		if len(batch) > 0 && size+len(p.b) > maxBatchBytes {
			break
		}
		size += len(p.b)
		batch = append(batch, p)
		o.queue = o.queue[1:]
	}
	if len(batch) == 0 {
		o.busy = false
		return nil
	}
	return batch
}

// deliver sends batch (one notice: as it is) and hands each parcel its
// reply. It returns the error of a message that did not reach the node.
func (o *outbox) deliver(batch []*parcel) error {
	defer func() {
		for _, p := range batch {
			close(p.done)
		}
	}()
	if len(batch) == 1 {
		batch[0].reply, batch[0].err = o.n.sendNow(o.n.ctx, o.m, batch[0].b)
		return batch[0].err
	}
	msgs := make([][]byte, len(batch))
	for i, p := range batch {
		msgs[i] = p.b
	}
	o.n.batched.Add(uint64(len(batch)))
	rb, err := o.n.sendNow(o.n.ctx, o.m, encodeBatch(msgs))
	if err != nil {
		for _, p := range batch {
			p.err = err
		}
		return err
	}
	replies, err := decodeBatchReply(rb, len(batch))
	for i, p := range batch {
		if err != nil {
			p.err = err
		} else {
			p.reply, p.err = replies[i].b, replies[i].err
		}
	}
	return nil
}

// handleBatch answers a batch from node from: its notices at once, each
// as a message of its own would be.
func (n *Protocol) handleBatch(ctx context.Context, from string, msg []byte) ([]byte, error) {
	msgs, err := decodeBatch(msg)
	if err != nil {
		return nil, fmt.Errorf("bad notice: %w", err)
	}
	replies := make([]batchReply, len(msgs))
	var wg sync.WaitGroup
	for i, b := range msgs {
		wg.Go(func() {
			in, err := decodeNotice(b)
			if err == nil && !batchable(in) {
				err = fmt.Errorf("%w: a %v notice in a batch", errBadMessage, in.Kind)
			}
			if err != nil {
				replies[i].err = fmt.Errorf("bad notice: %w", err)
				return
			}
			replies[i].b, replies[i].err = n.handle(ctx, from, in)
		})
	}
	wg.Wait()
	return encodeBatchReply(replies), nil
}

// batchReply is the reply to one notice of a batch, or its error.
type batchReply struct {
	b   []byte
	err error
}

// isBatch reports whether msg is a batch.
func isBatch(msg []byte) bool {
	return len(msg) >= 2 && msg[0] == codecVersion && kind(msg[1]) == kindBatch
}

// encodeBatch encodes notices (each encoded) as one message.
func encodeBatch(msgs [][]byte) []byte {
	size := 8
	for _, m := range msgs {
		size += len(m) + binary.MaxVarintLen32
	}
	b := make([]byte, 0, size)
	b = append(b, codecVersion, byte(kindBatch))
	b = binary.AppendUvarint(b, uint64(len(msgs)))
	for _, m := range msgs {
		b = appendBytes(b, m)
	}
	return b
}

// decodeBatch returns a batch's notices (not copied: each is decoded,
// which copies what it keeps).
func decodeBatch(msg []byte) ([][]byte, error) {
	d := decoder{b: msg[2:]}
	count := d.uvarint()
	if count > maxBatch {
		return nil, fmt.Errorf("%w: a batch of %d", errBadMessage, count)
	}
	msgs := make([][]byte, 0, count)
	for range count {
		msgs = append(msgs, d.raw())
	}
	return msgs, d.end()
}

// encodeBatchReply encodes replies in order: each an error's text or a
// reply. Past bytesInReplies, replies leave their small files' bytes out;
// past maxReplyBytes, a reply is an error.
func encodeBatchReply(replies []batchReply) []byte {
	b := []byte{codecVersion}
	b = binary.AppendUvarint(b, uint64(len(replies)))
	for _, r := range replies {
		rb, err := r.b, r.err
		if err == nil && len(b)+len(rb) > bytesInReplies {
			if rep, derr := decodeReply(rb); derr == nil && rep.Inline != nil {
				rep.Inline = nil
				rb = encodeReply(rep)
			}
		}
		// Room is kept for the error that may stand for each reply still
		// to come.
		if err == nil && len(b)+len(rb)+binary.MaxVarintLen32 > maxReplyBytes-len(replies)*maxErrorBytes {
			err = errors.New("no room left in the batch's reply; ask again")
		}
		if err != nil {
			text := err.Error()
			if len(text) > maxErrorBytes-binary.MaxVarintLen32-1 {
				text = text[:maxErrorBytes-binary.MaxVarintLen32-1]
			}
			b = append(b, 1)
			b = appendString(b, text)
			continue
		}
		b = append(b, 0)
		b = appendBytes(b, rb)
	}
	return b
}

// maxErrorBytes bounds an error's place in a batch's reply.
const maxErrorBytes = 96

// decodeBatchReply decodes the replies to a batch of count notices.
func decodeBatchReply(msg []byte, count int) ([]batchReply, error) {
	d := decoder{b: msg}
	if d.byte() != codecVersion || d.uvarint() != uint64(count) {
		d.fail("not the replies to the batch sent")
	}
	replies := make([]batchReply, count)
	for i := range replies {
		if d.byte() == 1 {
			replies[i].err = &remoteError{d.string()}
		} else {
			replies[i].b = d.bytes()
		}
	}
	if err := d.end(); err != nil {
		return nil, err
	}
	return replies, nil
}

// remoteError is the error a node answered to one notice of a batch.
type remoteError struct{ text string }

func (e *remoteError) Error() string { return "refused by the peer: " + e.text }
