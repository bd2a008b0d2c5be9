package hfl

import "github.com/dyadfs/dyadfs/hfl/store"

// The locator's records and its view of the global store are those of
// package store: the names below let the rest of dyadfs speak of them as
// the locator's.
type (
	Record     = store.Record
	Inline     = store.Inline
	Store      = store.Store
	Slot       = store.Slot
	RemoveCond = store.RemoveCond
	Health     = store.Health
	InProcess  = store.InProcess
	Deferring  = store.Deferring
)

// FileIno is the inode number of a file born on node as its local inode
// ino at time birth (see store.FileIno).
func FileIno(node string, ino, birth uint64) uint64 { return store.FileIno(node, ino, birth) }

// The store's errors, as the locator passes them on.
var (
	ErrNotFound    = store.ErrNotFound
	ErrClosed      = store.ErrClosed
	ErrConflict    = store.ErrConflict
	ErrUnavailable = store.ErrUnavailable
	ErrNoSpace     = store.ErrNoSpace
	ErrDenied      = store.ErrDenied
	ErrTooLarge    = store.ErrTooLarge
)

// DefaultListLimit is how many entries a page of a listing holds.
const (
	DefaultListLimit = store.DefaultListLimit
)
