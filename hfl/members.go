package hfl

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"
)

// Member is a running daemon of a job, as it announces itself.
type Member struct {
	Node string `json:"node"`
	// Transport names the data transport and Addr where it listens.
	Transport string `json:"transport"`
	Addr      string `json:"addr"`
	// Started tells a restarted daemon from its previous life.
	Started time.Time `json:"started"`
}

// ErrNotRunning means a node has no live registration: its daemon stopped or
// died (its lease expired).
var ErrNotRunning = errors.New("node is not running")

// ErrNodeInUse means another live daemon of the namespace has registered the
// same node id: files published by either would be fetched from the other.
var ErrNodeInUse = errors.New("node id is in use by another running daemon")

// memberKey and secretKey live beside the records of a namespace; record
// keys start with a hex bin, so they cannot collide.
func memberKey(namespace, node string) string { return namespace + "/nodes/" + node }
func secretKey(namespace string) string       { return namespace + "/secret" }

// Register announces this daemon in the namespace until the store closes or,
// if the daemon dies, ttl after its last renewal. It refuses with
// ErrNodeInUse if a live registration of the same node id names another
// address; the same address is this node's own daemon restarting before its
// previous lease ran out. The check and the registration are one atomic
// step in the store: of two daemons started with the same node id at once,
// the second is refused.
func (l *Locator) Register(ctx context.Context, m Member, ttl time.Duration) error {
	v, err := json.Marshal(m)
	if err != nil {
		return err
	}
	claim := func(current []byte) error {
		var old Member
		if json.Unmarshal(current, &old) != nil {
			return nil // not a registration dyadfs wrote: take the key
		}
		if old.Addr != m.Addr || old.Transport != m.Transport {
			return fmt.Errorf("node %s: %w (%s at %s since %s)", m.Node, ErrNodeInUse,
				old.Transport, old.Addr, old.Started.Format(time.RFC3339))
		}
		return nil
	}
	err = l.store.Register(ctx, memberKey(l.cfg.Namespace, m.Node), v, ttl, claim)
	if errors.Is(err, ErrNodeInUse) {
		return err
	}
	if err != nil {
		return fmt.Errorf("register node %s: %w", m.Node, err)
	}
	return nil
}

// Member returns node's registration, or ErrNotRunning.
func (l *Locator) Member(ctx context.Context, node string) (Member, error) {
	v, err := l.store.Get(ctx, memberKey(l.cfg.Namespace, node))
	if errors.Is(err, ErrNotFound) {
		return Member{}, fmt.Errorf("node %s: %w", node, ErrNotRunning)
	}
	if err != nil {
		return Member{}, fmt.Errorf("look up node %s: %w", node, err)
	}
	var m Member
	if err := json.Unmarshal(v, &m); err != nil {
		return Member{}, fmt.Errorf("node %s: bad registration: %w", node, err)
	}
	return m, nil
}

// SecretSize is the size of a generated job secret.
const SecretSize = 32

// JobSecret returns the shared secret of namespace in s. The first daemon
// of a namespace generates it and stores it; every later one reads that
// one. Transports need it before the locator is built.
func JobSecret(ctx context.Context, s Store, namespace string) ([]byte, error) {
	candidate := make([]byte, SecretSize)
	if _, err := rand.Read(candidate); err != nil {
		return nil, err
	}
	secret, err := s.PutIfAbsent(ctx, secretKey(namespace), candidate)
	if err != nil {
		return nil, fmt.Errorf("job secret of namespace %s: %w", namespace, err)
	}
	return secret, nil
}

// secretMarkKey holds the fingerprint of the secret a namespace's nodes
// authenticate each other with.
func secretMarkKey(namespace string) string { return namespace + "/secret-fingerprint" }

// ErrSecretMismatch: this node's job secret is not the one the job's
// other nodes use: no transfer between them could be authenticated.
var ErrSecretMismatch = errors.New("job secrets differ")

// secretMark is what secretMarkKey holds.
type secretMark struct {
	Fingerprint string    `json:"fingerprint"`
	Node        string    `json:"node"`
	At          time.Time `json:"at"`
}

// SecretFingerprint is a short, one-way digest of a job secret: safe to
// show and to keep in the store.
func SecretFingerprint(secret []byte) string {
	h := sha256.Sum256(append([]byte("dyadfs job secret fingerprint\x00"), secret...))
	return hex.EncodeToString(h[:8])
}

// CheckSecret checks, as a node mounts, that secret is the job's: the
// first node of the namespace keeps its fingerprint in the store, and a
// node with another secret is refused (ErrSecretMismatch, naming the node
// that kept the fingerprint) instead of failing every transfer later.
func CheckSecret(ctx context.Context, s Store, namespace, node string, secret []byte) error {
	mine := secretMark{Fingerprint: SecretFingerprint(secret), Node: node, At: time.Now().UTC().Truncate(time.Second)}
	v, _ := json.Marshal(mine)
	got, err := s.PutIfAbsent(ctx, secretMarkKey(namespace), v)
	if err != nil {
		return fmt.Errorf("job secret of namespace %s: %w", namespace, err)
	}
	var kept secretMark
	if err := json.Unmarshal(got, &kept); err != nil || kept.Fingerprint == "" {
		return nil // written by something else: nothing to compare
	}
	if kept.Fingerprint != mine.Fingerprint {
		return fmt.Errorf("%w: this node's has fingerprint %s, the job's (kept by node %s since %s) %s",
			ErrSecretMismatch, mine.Fingerprint, kept.Node, kept.At.Format(time.RFC3339), kept.Fingerprint)
	}
	return nil
}

// storeIDKey holds the identity of a namespace's records in a store.
func storeIDKey(namespace string) string { return namespace + "/store-id" }

// StoreID returns the identity of this namespace's records in the store:
// made by the first daemon and kept beside them, so that it changes only
// when they are all gone (an embedded store, which lives as long as its
// daemon, has a new one every time). A mark that names it says a record
// was published in this very store.
func (l *Locator) StoreID(ctx context.Context) (string, error) {
	b := make([]byte, 12)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	id, err := l.store.PutIfAbsent(ctx, storeIDKey(l.cfg.Namespace), []byte(hex.EncodeToString(b)))
	if err != nil {
		return "", fmt.Errorf("identity of namespace %s in the store: %w", l.cfg.Namespace, err)
	}
	return string(id), nil
}

// LiveMembers returns the daemons of namespace registered in s now, by
// node.
func LiveMembers(ctx context.Context, s Store, namespace string) ([]Member, error) {
	vals, err := s.List(ctx, memberKey(namespace, ""))
	if err != nil {
		return nil, fmt.Errorf("members of namespace %s: %w", namespace, err)
	}
	out := make([]Member, 0, len(vals))
	for _, v := range vals {
		var m Member
		if json.Unmarshal(v, &m) == nil && m.Node != "" {
			out = append(out, m)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Node < out[j].Node })
	return out, nil
}
