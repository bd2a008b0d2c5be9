// Package hfl is the Hierarchical File Locator: it answers "where is the
// complete copy of this file?" by looking in this node's managed directory,
// then in this daemon's cache of records, then in the global metadata store.
//
// The metadata store is an interface (Store) with one implementation per
// backend, chosen by URL. Records are versioned: the store assigns every
// publish of a key a generation larger than any before it, so a waiter can ask
// for "anything newer than what I saw" and never miss an update.
package hfl

import (
	"errors"
	"fmt"
	"path"
	"strings"
)

// ErrBadPath means a path cannot name a file in the managed directory.
var ErrBadPath = errors.New("path is not inside the managed directory")

// CleanPath turns a user-supplied relative path into the canonical form used
// in records and keys: slash-separated, no leading slash, no "." or ".."
// elements. Paths that would leave the managed directory are refused.
func CleanPath(p string) (string, error) {
	if p == "" || strings.HasPrefix(p, "/") || strings.ContainsRune(p, 0) {
		return "", fmt.Errorf("%q: %w", p, ErrBadPath)
	}
	for rest, more := p, true; more; {
		var elem string
		elem, rest, more = strings.Cut(rest, "/")
		if elem == ".." {
			return "", fmt.Errorf("%q: %w", p, ErrBadPath)
		}
	}
	c := path.Clean(p)
	if c == "." {
		return "", fmt.Errorf("%q: %w", p, ErrBadPath)
	}
	return c, nil
}
