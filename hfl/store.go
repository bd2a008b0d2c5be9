package hfl

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// Store is the global metadata store: a key-value map of Records with
// versioned updates and blocking waits. Keys are opaque to the store; the
// Locator builds them. Every backend passes the kvtest conformance suite.
type Store interface {
	// Publish stores rec under key and returns it with the generation the
	// store assigned, which is larger than that of any earlier publish of key.
	Publish(ctx context.Context, key string, rec Record) (Record, error)
	// Lookup returns the record under key, or ErrNotFound.
	Lookup(ctx context.Context, key string) (Record, error)
	// Wait blocks until the store holds a record under key whose generation
	// is larger than after (after == 0: any record) and returns it. It ends
	// with ctx's error when ctx is done.
	Wait(ctx context.Context, key string, after uint64) (Record, error)
	// Remove deletes the record under key if its owner is owner (any owner
	// when owner is empty). It returns ErrNotFound when there is no such
	// record, and nil without deleting when the record belongs to another
	// owner: a newer publish from elsewhere wins over an older unlink.
	Remove(ctx context.Context, key, owner string) error

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

	// Close releases the store's resources and withdraws what Register
	// stored; pending waits end with ErrClosed.
	Close() error
}

// EmbeddedURL names the in-process store used on a single node.
const EmbeddedURL = "embedded://"

// storeSpec is a parsed store URL.
type storeSpec struct {
	scheme string // backend name
	addr   string // backend-specific address, after "scheme://"
}

// parseStoreURL checks a store URL's form without connecting. An empty URL
// means the embedded store.
func parseStoreURL(raw string) (storeSpec, error) {
	scheme, addr, found := strings.Cut(raw, "://")
	if !found {
		scheme, addr = raw, ""
	}
	spec := storeSpec{scheme: strings.ToLower(scheme), addr: addr}
	switch spec.scheme {
	case "", "embedded":
		if addr != "" {
			return spec, fmt.Errorf("metadata store %q: the embedded store takes no address (use %s)", raw, EmbeddedURL)
		}
		spec.scheme = "embedded"
		return spec, nil
	case "etcd":
		if _, err := parseEtcdEndpoints(addr); err != nil {
			return spec, fmt.Errorf("metadata store %q: %v", raw, err)
		}
		return spec, nil
	default:
		return spec, fmt.Errorf("metadata store %q: unknown scheme %q (want %s or etcd://host:port[,host:port...])", raw, spec.scheme, EmbeddedURL)
	}
}

// ValidateStoreURL reports whether rawURL names a known backend in a valid form.
func ValidateStoreURL(rawURL string) error {
	_, err := parseStoreURL(rawURL)
	return err
}

// OpenStore opens the store named by rawURL.
func OpenStore(ctx context.Context, rawURL string) (Store, error) {
	spec, err := parseStoreURL(rawURL)
	if err != nil {
		return nil, err
	}
	switch spec.scheme {
	case "embedded":
		return NewEmbeddedStore(), nil
	case "etcd":
		eps, err := parseEtcdEndpoints(spec.addr)
		if err != nil {
			return nil, fmt.Errorf("metadata store %q: %v", rawURL, err)
		}
		s, err := OpenEtcdStore(ctx, DefaultEtcdConfig(eps...))
		if err != nil {
			return nil, err // not a nil *EtcdStore in a non-nil Store
		}
		return s, nil
	}
	return nil, fmt.Errorf("metadata store %q: no backend for scheme %q", rawURL, spec.scheme)
}
