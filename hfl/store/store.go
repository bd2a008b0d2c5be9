// Package store defines what the Hierarchical File Locator keeps in the
// global metadata store: versioned records of published files, an index
// of every directory's entries, and the registrations of running daemons.
// Each backend is a package of its own beside this one (embedded, etcd),
// chosen by the store URL in cmd/dyadfs, and passes the storetest
// conformance suite; the locator sees only the Store interface.
package store

import (
	"context"
	"errors"
	"time"
)

// Store is the global metadata store: a key-value map of Records with
// versioned updates and blocking waits, and an index of every directory's
// entries. Keys are opaque to the store; the Locator builds them (see
// Slot). Every backend passes the storetest conformance suite.
type Store interface {
	// Publish stores rec in slot (under slot.Key, and as slot.Name in the
	// index of slot.Dir) and returns it with the generation the store
	// assigned, which is larger than that of any earlier publish or
	// removal of slot.Key.
	Publish(ctx context.Context, slot Slot, rec Record) (Record, error)
	// Lookup returns the record in slot (published there under
	// slot.Key), or ErrNotFound.
	Lookup(ctx context.Context, slot Slot) (Record, error)
	// Wait blocks until the store holds a record in slot whose
	// generation is larger than after (after == 0: any record) and
	// returns it. It ends with ctx's error when ctx is done.
	Wait(ctx context.Context, slot Slot, after uint64) (Record, error)
	// Remove deletes the record in slot, from the key and the directory
	// index at once, if it matches cond, and returns the generation of the
	// removal (larger than the removed record's). It returns ErrNotFound
	// when there is no record, and ErrConflict, deleting nothing, when the
	// record does not match cond: a newer publish wins over an older
	// unlink.
	Remove(ctx context.Context, slot Slot, cond RemoveCond) (uint64, error)
	// ListDir returns the records in the index of directory dir whose
	// names sort after after (byte order), in that order, at most limit of
	// them (limit <= 0: DefaultListLimit). Fewer than limit means the end.
	ListDir(ctx context.Context, dir, after string, limit int) ([]Record, error)

	// Register stores value under key for as long as this daemon lives:
	// until Close, or, in a store shared between nodes, until the daemon
	// stops renewing it and ttl passes. Daemons announce themselves so.
	// If a live value is under key already, claim (when not nil) decides:
	// an error from it fails Register, which stores nothing. The decision
	// and the write are one atomic step, so that of two daemons claiming
	// the same key at once, one sees the other's value.
	Register(ctx context.Context, key string, value []byte, ttl time.Duration, claim func(current []byte) error) error
	// Get returns a value stored by Register or PutIfAbsent, or ErrNotFound.
	Get(ctx context.Context, key string) ([]byte, error)
	// List returns every value stored by Register or PutIfAbsent under a
	// key that starts with prefix, by key (an empty map if none).
	List(ctx context.Context, prefix string) (map[string][]byte, error)
	// PutIfAbsent stores value under key unless the key exists, and
	// returns what the store holds afterwards: value, or what was there.
	PutIfAbsent(ctx context.Context, key string, value []byte) ([]byte, error)

	// Health describes the store as it is now, with the number of records
	// of namespace (the keys that start with namespace + "/").
	Health(ctx context.Context, namespace string) (Health, error)
	// Forget deletes every record, index entry and value of namespace
	// (every key that starts with namespace + "/"), at most page keys in
	// one request (page <= 0: DefaultForgetPage), and returns how many it
	// deleted. progress, if not nil, is called after each page with the
	// number deleted so far.
	Forget(ctx context.Context, namespace string, page int, progress func(deleted int)) (int, error)

	// Close releases the store's resources and withdraws what Register
	// stored; pending waits end with ErrClosed.
	Close() error
}

// InProcess is implemented by a store whose records live in the daemon's
// own memory (the embedded store): a lookup costs what a cache's would, so
// the locator keeps no second copy of them.
type InProcess interface {
	// Held returns the record of name in the index of directory dir (a
	// slot's Dir and Name): a map lookup, with no key to compute.
	Held(dir, name string) (Record, bool)
}

// Deferring is implemented by a store that commits publishes in groups
// (etcd's transactions): PublishDeferred is Publish for a record that no
// caller is held up by (a release's, when closes do not wait for the
// store; a retry), which may then wait a moment for more publishes to
// share its commit.
type Deferring interface {
	PublishDeferred(ctx context.Context, slot Slot, rec Record) (Record, error)
}

// Health is what a store says of itself (see Store.Health).
type Health struct {
	// Alarms are the store's alarms that refuse writes or signal damage
	// (etcd's NOSPACE, CORRUPT).
	Alarms []string `json:"alarms,omitempty"`
	// Bytes is the size of the store's database, the largest of its
	// members' (0 if it does not say).
	Bytes int64 `json:"db_bytes"`
	// Quota is the size past which the store refuses writes (0: none known).
	Quota int64 `json:"quota_bytes,omitempty"`
	// Records is the number of records of the namespace asked for.
	Records int64 `json:"records"`
}

// DefaultForgetPage is how many keys one request of Forget deletes.
const DefaultForgetPage = 1000

// Slot is where a record lives in a store: under Key, DYAD's hashed key of
// its path in the job's namespace, and as entry Name of directory Dir, the
// job's namespace and the path of the directory (see Locator.Slot).
type Slot struct {
	Key  string
	Dir  string
	Name string
}

// RemoveCond says which record Remove may delete: one published by Owner
// (any owner if empty), at generation MaxGeneration or older (any if 0).
type RemoveCond struct {
	Owner         string
	MaxGeneration uint64
}

// Matches reports whether rec may be removed under c.
func (c RemoveCond) Matches(rec Record) bool {
	return (c.Owner == "" || rec.Owner == c.Owner) && (c.MaxGeneration == 0 || rec.Generation <= c.MaxGeneration)
}

// DefaultListLimit is how many entries ListDir returns when asked for no
// particular number: a page of a large directory.
const DefaultListLimit = 1000

// ErrUnavailable means the metadata store did not answer in time: the
// call may succeed later. Backends wrap it with what they tried.
var ErrUnavailable = errors.New("metadata store unavailable")

// Refusals: the store answered, and will not take the write until an
// operator acts. Backends wrap them with their own error.
var (
	// ErrNoSpace: the store is full (etcd's quota, its NOSPACE alarm).
	ErrNoSpace = errors.New("metadata store is full")
	// ErrDenied: the store does not let this client write there.
	ErrDenied = errors.New("metadata store denied the write")
	// ErrTooLarge: the request is larger than the store takes.
	ErrTooLarge = errors.New("request too large for the metadata store")
)
