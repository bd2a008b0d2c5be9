package flux

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/dyadfs/dyadfs/flux"
	"github.com/dyadfs/dyadfs/hfl/store"
)

// The writes every store sends to the serializer of rank 0.
const (
	opPublish     = "publish"
	opRemove      = "remove"
	opPutIfAbsent = "put"
	opRegister    = "register"
	opUnregister  = "unregister"
	opForget      = "forget"
	// opEnsure makes the job's namespace, if it is not there.
	opEnsure = "ensure"
	// opSync makes the batch it is in commit, with a change of no
	// meaning if there is none other, so that a broker that missed a
	// commit's event learns of it (see Store.catchUp); the syncs of many
	// waiting writers make one commit.
	opSync = "sync"
)

// writeReq is a write, as sent to the serializer.
type writeReq struct {
	Op  string `json:"op"`
	NS  string `json:"ns"`
	Key string `json:"key,omitempty"`
	// Value is a publish's record, a removal's condition, a value's
	// registration.
	Value []byte `json:"value,omitempty"`
	// Expect is, for a register, the raw value its claim was judged on
	// (none: there was none).
	Expect []byte `json:"expect,omitempty"`
	// Rank is, for an unregister, the rank whose value it removes.
	Rank uint32 `json:"rank,omitempty"`
}

// writeAns is the serializer's answer.
type writeAns struct {
	// Gen is a publish's or removal's generation (a forget's count of
	// keys removed).
	Gen uint64 `json:"gen,omitempty"`
	// Seq is the root sequence of the commit, to wait for before reading.
	Seq int `json:"seq,omitempty"`
	// Value is what a PutIfAbsent's key holds afterwards.
	Value []byte `json:"value,omitempty"`
}

// write sends w to the serializer on rank 0 and, once it answered, waits
// until this rank's broker has its commit.
func (s *Store) write(ctx context.Context, w writeReq) (writeAns, error) {
	ans, err := s.ask(ctx, w)
	if err != nil {
		return writeAns{}, err
	}
	// Rank 0's broker committed it: it has the new root already.
	if ans.Seq > 0 && w.Op != opForget && s.ser == nil {
		if err := s.catchUp(ctx, w.NS, ans.Seq); err != nil {
			return writeAns{}, err
		}
	}
	return ans, nil
}

// ask sends w to the serializer on rank 0 and returns its answer. A
// serializer that is not there yet (its daemon is starting) is asked again
// until the request timeout. The daemon of rank 0 runs the serializer
// itself and hands it w directly: a Flux request to its own service would
// cost two trips through its broker per write.
func (s *Store) ask(ctx context.Context, w writeReq) (writeAns, error) {
	if s.ctx.Err() != nil {
		return writeAns{}, store.ErrClosed
	}
	if s.ser != nil {
		return s.ser.local(ctx, w)
	}
	payload, err := json.Marshal(w)
	if err != nil {
		return writeAns{}, err
	}
	deadline := time.Now().Add(s.cfg.RequestTimeout)
	pause := 20 * time.Millisecond
	for {
		var raw []byte
		raw, err = s.h.RPC(ctx, s.cfg.Name+".write", 0, payload, time.Until(deadline))
		if err == nil {
			var ans writeAns
			if err := json.Unmarshal(raw, &ans); err != nil {
				return writeAns{}, fmt.Errorf("flux store: the serializer's answer: %w", err)
			}
			return ans, nil
		}
		if !errors.Is(err, syscall.ENOSYS) || time.Until(deadline) <= pause || (s.cfg.Client && w.Op == opForget) {
			// A client's forget does not wait for a serializer: with
			// no daemon of rank 0, it removes the namespace itself.
			if errors.Is(err, syscall.ENOSYS) && !(s.cfg.Client && w.Op == opForget) {
				return writeAns{}, fmt.Errorf("the dyadfs daemon of rank 0 is not running (every write of the job goes through it: start dyadfs on rank 0 first, as scripts/flux-dyadfs.sh does): %w", err)
			}
			return writeAns{}, err
		}
		// No serializer yet: rank 0's daemon is starting.
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return writeAns{}, ctx.Err()
		}
		pause = min(2*pause, time.Second)
	}
}

// serializer orders every write of the job: it runs on rank 0.
type serializer struct {
	s     *Store
	queue chan pending
	stopc chan struct{}
	done  chan struct{}

	state map[string]*nsState // by KVS namespace; the run goroutine's
}

type pending struct {
	w writeReq
	r flux.Request
}

// nsState is what the serializer keeps of a job's namespace.
type nsState struct {
	gen     uint64
	records int64
	syncs   uint64
	// present holds a hash of each record key known to be in the
	// namespace, so that a publish need not look its key up to count
	// records; all says it holds them all (the namespace had no record
	// when loaded), so that a key missing from it is new. A collision
	// of hashes would only miscount one record.
	present map[uint64]struct{}
	all     bool
}

func newSerializer(s *Store) *serializer {
	return &serializer{s: s, queue: make(chan pending, 4096), stopc: make(chan struct{}), done: make(chan struct{}),
		state: make(map[string]*nsState)}
}

// request queues one write for the serializer.
func (z *serializer) request(r flux.Request) {
	var w writeReq
	if err := json.Unmarshal(r.Payload(), &w); err != nil {
		r.RespondError(syscall.EPROTO, "bad write request: "+err.Error())
		return
	}
	select {
	case z.queue <- pending{w, r}:
	case <-z.stopc:
		r.RespondError(syscall.ENOSYS, "the store is closing")
	}
}

// local queues w, written by this daemon, and waits for its answer.
func (z *serializer) local(ctx context.Context, w writeReq) (writeAns, error) {
	r := &localRequest{done: make(chan struct{})}
	select {
	case z.queue <- pending{w, r}:
	case <-z.stopc:
		return writeAns{}, store.ErrClosed
	case <-ctx.Done():
		return writeAns{}, ctx.Err()
	}
	select {
	case <-r.done:
	case <-ctx.Done():
		return writeAns{}, ctx.Err() // the write may still be committed, as a request's may
	}
	if r.err != nil {
		return writeAns{}, r.err
	}
	var ans writeAns
	if err := json.Unmarshal(r.answer, &ans); err != nil {
		return writeAns{}, fmt.Errorf("flux store: the serializer's answer: %w", err)
	}
	return ans, nil
}

// localRequest is a write of the serializer's own daemon, answered as a
// Flux request is.
type localRequest struct {
	answer []byte
	err    error
	done   chan struct{}
}

func (r *localRequest) Topic() string   { return "write" }
func (r *localRequest) Payload() []byte { return nil }
func (r *localRequest) Userid() uint32  { return 0 }
func (r *localRequest) Stream([]byte) error {
	return errors.New("flux store: a write is answered once")
}

func (r *localRequest) Respond(data []byte) error {
	r.answer = data
	close(r.done)
	return nil
}

func (r *localRequest) RespondError(errno syscall.Errno, msg string) error {
	r.err = &flux.Error{Op: "write", Errno: errno, Msg: msg}
	close(r.done)
	return nil
}

func (z *serializer) stop() {
	close(z.stopc)
	<-z.done
}

// maxBatch bounds the writes one commit carries.
const maxBatch = 512

// run takes the writes that arrived, a batch at a time, and commits each
// job's in one transaction.
func (z *serializer) run() {
	defer close(z.done)
	for {
		var batch []pending
		select {
		case p := <-z.queue:
			batch = append(batch, p)
		case <-z.stopc:
			return
		}
	more:
		for len(batch) < maxBatch {
			select {
			case p := <-z.queue:
				batch = append(batch, p)
			default:
				break more
			}
		}
		byNS := make(map[string][]pending)
		var order []string
		for _, p := range batch {
			switch p.w.Op {
			case opForget:
				z.forget(p)
				continue
			case opEnsure:
				z.ensure(p)
				continue
			}
			if _, ok := byNS[p.w.NS]; !ok {
				order = append(order, p.w.NS)
			}
			byNS[p.w.NS] = append(byNS[p.w.NS], p)
		}
		for _, ns := range order {
			z.commit(ns, byNS[ns])
		}
	}
}

// ctx is what the serializer's calls to the KVS run under.
func (z *serializer) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(z.s.ctx, z.s.cfg.RequestTimeout)
}

// load returns the state of namespace ns, making the namespace (and
// reading its counters) the first time.
func (z *serializer) load(ctx context.Context, ns string) (*nsState, error) {
	if st := z.state[ns]; st != nil {
		return st, nil
	}
	if err := z.s.h.CreateNamespace(ctx, ns, ^uint32(0)); err != nil && !errors.Is(err, syscall.EEXIST) {
		return nil, err
	}
	st := &nsState{present: make(map[uint64]struct{})}
	v, err := z.s.h.Lookup(ctx, ns, recordsKey)
	if err != nil && !notFound(err) {
		return nil, err
	}
	if err == nil {
		st.records, _ = strconv.ParseInt(string(v), 10, 64)
	}
	st.all = st.records == 0
	v, err = z.s.h.Lookup(ctx, ns, genKey)
	if err != nil && !notFound(err) {
		return nil, err
	}
	if err == nil {
		st.gen, _ = strconv.ParseUint(string(v), 10, 64)
	} else {
		// A new namespace: generations start from the clock, so that
		// they go on growing when a forgotten job's namespace is made
		// again (as the embedded store's do across restarts).
		st.gen = uint64(time.Now().UnixNano())
	}
	z.state[ns] = st
	return st, nil
}

// current is what a key holds as the batch sees it: nil if nothing.
type current struct {
	value []byte
	ok    bool
}

// commit applies one job's writes in order and commits them together.
func (z *serializer) commit(ns string, batch []pending) {
	ctx, cancel := z.ctx()
	defer cancel()
	fail := func(err error) {
		for _, p := range batch {
			respondErr(p.r, err)
		}
	}
	st, err := z.load(ctx, ns)
	if err != nil {
		fail(err)
		return
	}
	view, err := z.read(ctx, ns, st, batch)
	if err != nil {
		fail(err)
		return
	}
	gen, records := st.gen, st.records
	var ops []flux.Op
	var changes []keyChange // of records, applied to st.present once committed
	sync := false
	type answer struct {
		p   pending
		ans writeAns
		err error
	}
	answers := make([]answer, 0, len(batch))
	for _, p := range batch {
		w := p.w
		cur := view[w.Key]
		a := answer{p: p}
		switch w.Op {
		case opPublish:
			var rec store.Record
			if err := json.Unmarshal(w.Value, &rec); err != nil {
				a.err = &flux.Error{Op: "publish", Errno: syscall.EPROTO, Msg: err.Error()}
				break
			}
			gen++
			rec.Generation = gen
			v, _ := json.Marshal(rec)
			ops = append(ops, flux.Put(w.Key, v))
			if !cur.ok {
				records++
			}
			changes = append(changes, keyChange{hash(w.Key), true})
			view[w.Key] = current{v, true}
			a.ans.Gen = gen
		case opRemove:
			var cond store.RemoveCond
			json.Unmarshal(w.Value, &cond)
			if !cur.ok {
				a.err = &flux.Error{Op: "remove", Errno: syscall.ENOENT}
				break
			}
			var rec store.Record
			if err := json.Unmarshal(cur.value, &rec); err != nil || !cond.Matches(rec) {
				a.err = &flux.Error{Op: "remove", Errno: syscall.EEXIST, Msg: "the record changed since it was seen"}
				break
			}
			gen++
			ops = append(ops, flux.Unlink(w.Key))
			records--
			changes = append(changes, keyChange{hash(w.Key), false})
			view[w.Key] = current{}
			a.ans.Gen = gen
		case opPutIfAbsent:
			if cur.ok {
				a.ans.Value = cur.value
				break
			}
			ops = append(ops, flux.Put(w.Key, w.Value))
			view[w.Key] = current{w.Value, true}
			a.ans.Value = w.Value
		case opRegister:
			if (w.Expect == nil && cur.ok) || (w.Expect != nil && !bytes.Equal(w.Expect, cur.value)) {
				a.err = &flux.Error{Op: "register", Errno: syscall.EEXIST, Msg: "another registration came in"}
				break
			}
			ops = append(ops, flux.Put(w.Key, w.Value))
			view[w.Key] = current{w.Value, true}
		case opSync:
			sync = true
		case opUnregister:
			var r registration
			if cur.ok && json.Unmarshal(cur.value, &r) == nil && r.Rank != nil && *r.Rank == w.Rank {
				ops = append(ops, flux.Unlink(w.Key))
				view[w.Key] = current{}
			}
		default:
			a.err = &flux.Error{Op: w.Op, Errno: syscall.EPROTO, Msg: "unknown write"}
		}
		answers = append(answers, a)
	}
	seq := 0
	if sync && len(ops) == 0 {
		// Any commit announces a new root sequence; without other
		// changes, one of a key that only counts them.
		st.syncs++
		ops = append(ops, flux.Put(syncKey, []byte(strconv.FormatUint(st.syncs, 10))))
	}
	if len(ops) > 0 {
		ops = append(ops, flux.Put(genKey, []byte(strconv.FormatUint(gen, 10))),
			flux.Put(recordsKey, []byte(strconv.FormatInt(records, 10))))
		// Committed here, on rank 0, the root sequence is exact.
		seq, err = z.s.h.Commit(ctx, ns, ops)
		if err != nil {
			// What the KVS has is unknown: read it again next time.
			delete(z.state, ns)
			fail(err)
			return
		}
		st.gen, st.records = gen, records
		for _, c := range changes {
			if c.present {
				st.present[c.hash] = struct{}{}
			} else {
				delete(st.present, c.hash)
			}
		}
	}
	for _, a := range answers {
		if a.err != nil {
			respondErr(a.p.r, a.err)
			continue
		}
		a.ans.Seq = seq
		v, _ := json.Marshal(a.ans)
		a.p.r.Respond(v)
	}
}

// keyChange is a record key, by hash, that a commit adds or removes.
type keyChange struct {
	hash    uint64
	present bool
}

// read looks up, at once, every key the batch's writes need to judge. A
// publish needs only whether its key is there, which st may know: a
// writer's lone publish then costs no lookup.
func (z *serializer) read(ctx context.Context, ns string, st *nsState, batch []pending) (map[string]current, error) {
	keys := make(map[string]bool) // true: its value is needed
	for _, p := range batch {
		if p.w.Key != "" {
			keys[p.w.Key] = keys[p.w.Key] || p.w.Op != opPublish
		}
	}
	view := make(map[string]current, len(keys))
	for k, needValue := range keys {
		if needValue {
			continue
		}
		if _, ok := st.present[hash(k)]; ok {
			view[k] = current{ok: true}
			delete(keys, k)
		} else if st.all {
			view[k] = current{}
			delete(keys, k)
		}
	}
	var mu sync.Mutex
	var firstErr error
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64)
	for k := range keys {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			v, err := z.s.h.Lookup(ctx, ns, k)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				view[k] = current{v, true}
				if strings.HasPrefix(k, "i.") {
					st.present[hash(k)] = struct{}{}
				}
			case notFound(err):
				view[k] = current{}
			case firstErr == nil:
				firstErr = err
			}
		}()
	}
	wg.Wait()
	return view, firstErr
}

// ensure makes a job's namespace, if it is not there.
func (z *serializer) ensure(p pending) {
	ctx, cancel := z.ctx()
	defer cancel()
	if _, err := z.load(ctx, p.w.NS); err != nil {
		respondErr(p.r, err)
		return
	}
	p.r.Respond([]byte("{}"))
}

// forget removes a job's namespace, and answers how many keys went.
func (z *serializer) forget(p pending) {
	ctx, cancel := z.ctx()
	defer cancel()
	n, err := forgetNamespace(ctx, z.s.h, p.w.NS)
	delete(z.state, p.w.NS)
	if err != nil {
		respondErr(p.r, err)
		return
	}
	v, _ := json.Marshal(writeAns{Gen: n})
	p.r.Respond(v)
}

// forgetNamespace removes KVS namespace ns and returns how many keys of
// the store's it held.
func forgetNamespace(ctx context.Context, h *flux.Handle, ns string) (uint64, error) {
	var n uint64
	if v, err := h.Lookup(ctx, ns, recordsKey); err == nil {
		records, _ := strconv.ParseUint(string(v), 10, 64)
		n += records
	}
	if names, err := h.ListDir(ctx, ns, "v"); err == nil {
		n += uint64(len(names))
	}
	if err := h.RemoveNamespace(ctx, ns); err != nil && !notFound(err) {
		return 0, err
	}
	return n, nil
}

// respondErr answers r with err's errno.
func respondErr(r flux.Request, err error) {
	var fe *flux.Error
	if errors.As(err, &fe) {
		r.RespondError(fe.Errno, fe.Msg)
		return
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		r.RespondError(errno, err.Error())
		return
	}
	r.RespondError(syscall.EIO, err.Error())
}
