package hfl

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// downStore wraps the locator's store: once a call found the store
// unavailable (no answer within its request timeout), the calls that
// follow fail at once for a while, instead of each waiting that long.
// Looking a name up happens on every create; while the store is down a
// create must not take seconds (the name is taken for missing, and the
// publish is retried later). Waits are not guarded: they wait for the
// store to come back.
type downStore struct {
	Store

	mu    sync.Mutex
	until time.Time     // calls fail at once until then
	pause time.Duration // the next pause, growing while the store stays down
}

// Pauses of a store that does not answer.
const (
	downFirst = 500 * time.Millisecond
	downMax   = 5 * time.Second
)

func guardStore(s Store) *downStore { return &downStore{Store: s} }

// check fails at once while the store is taken for down.
func (g *downStore) check() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if time.Now().Before(g.until) {
		return fmt.Errorf("%w (no answer a moment ago; asking again from %s)", ErrUnavailable, g.until.Format("15:04:05.000"))
	}
	return nil
}

// done notes how a call ended.
func (g *downStore) done(err error) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if errors.Is(err, ErrUnavailable) {
		if g.pause == 0 {
			g.pause = downFirst
		} else {
			g.pause = min(2*g.pause, downMax)
		}
		g.until = time.Now().Add(g.pause)
	} else if err == nil || errors.Is(err, ErrNotFound) || errors.Is(err, ErrConflict) {
		g.pause, g.until = 0, time.Time{}
	}
	return err
}

func (g *downStore) Publish(ctx context.Context, slot Slot, rec Record) (Record, error) {
	return g.publish(ctx, slot, rec, false)
}

// publish is Publish; with deferrable, for a record nobody waits for,
// through PublishDeferred if the store groups its commits.
func (g *downStore) publish(ctx context.Context, slot Slot, rec Record, deferrable bool) (Record, error) {
	if err := g.check(); err != nil {
		return Record{}, err
	}
	commit := g.Store.Publish
	if d, ok := g.Store.(Deferring); ok && deferrable {
		commit = d.PublishDeferred
	}
	out, err := commit(ctx, slot, rec)
	return out, g.done(err)
}

func (g *downStore) Lookup(ctx context.Context, slot Slot) (Record, error) {
	if err := g.check(); err != nil {
		return Record{}, err
	}
	rec, err := g.Store.Lookup(ctx, slot)
	return rec, g.done(err)
}

func (g *downStore) Remove(ctx context.Context, slot Slot, cond RemoveCond) (uint64, error) {
	if err := g.check(); err != nil {
		return 0, err
	}
	at, err := g.Store.Remove(ctx, slot, cond)
	return at, g.done(err)
}

func (g *downStore) ListDir(ctx context.Context, dir, after string, limit int) ([]Record, error) {
	if err := g.check(); err != nil {
		return nil, err
	}
	recs, err := g.Store.ListDir(ctx, dir, after, limit)
	return recs, g.done(err)
}
