package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/dyadfs/dyadfs/hfl/store"
	"github.com/dyadfs/dyadfs/hfl/store/embedded"
	"github.com/dyadfs/dyadfs/hfl/store/etcd"
	fluxstore "github.com/dyadfs/dyadfs/hfl/store/flux"
)

// embeddedURL names the in-process store of a daemon that runs alone.
const embeddedURL = "embedded://"

// storeURL is a parsed --store: which backend, and its address.
type storeURL struct {
	scheme string // backend name, lower case
	addr   string // what follows "scheme://"
	etcd   []string
	tls    bool // https://: etcd over TLS
}

// parseStoreURL checks a store URL's form without connecting. An empty URL
// means the embedded store. A new backend adds its scheme here and in
// openStore.
func parseStoreURL(raw string) (storeURL, error) {
	scheme, addr, found := strings.Cut(raw, "://")
	if !found {
		scheme, addr = raw, ""
	}
	u := storeURL{scheme: strings.ToLower(scheme), addr: addr}
	switch u.scheme {
	case "", "embedded":
		if addr != "" {
			return u, fmt.Errorf("metadata store %q: the embedded store takes no address (use %s)", raw, embeddedURL)
		}
		u.scheme = "embedded"
		return u, nil
	case "etcd", "https":
		// https://: etcd over TLS (--etcd-cacert, --etcd-cert, --etcd-key).
		u.tls = u.scheme == "https"
		u.scheme = "etcd"
		eps, err := etcd.ParseEndpoints(addr)
		if err != nil {
			return u, fmt.Errorf("metadata store %q: %w", raw, err)
		}
		u.etcd = eps
		return u, nil
	case "flux":
		if addr != "" {
			return u, fmt.Errorf("metadata store %q: flux:// takes no address: it uses the broker that FLUX_URI names", raw)
		}
		return u, nil
	default:
		return u, fmt.Errorf("metadata store %q: unknown scheme %q (want %s, etcd://host:port[,host:port...], https://host:port[,...] for etcd over TLS, or flux://)", raw, u.scheme, embeddedURL)
	}
}

// fluxURL names the Flux KVS of the instance the daemon runs in.
const fluxURL = "flux://"

// singleNode reports whether the store can only be seen by this daemon,
// so that no other node can ask for a file.
func singleNode(raw string) bool {
	u, err := parseStoreURL(raw)
	return err == nil && u.scheme == "embedded"
}

// openStore opens the store named by raw, for namespace's daemons (or,
// with client, for a command that does not serve). fx is the connection
// to Flux, used by the Flux store.
func openStore(ctx context.Context, raw, namespace string, fx *fluxConn, client bool, access etcdAccess) (store.Store, error) {
	u, err := parseStoreURL(raw)
	if err != nil {
		return nil, err
	}
	switch u.scheme {
	case "embedded":
		return embedded.New(), nil
	case "flux":
		h, err := fx.handle()
		if err != nil {
			return nil, err
		}
		cfg := fluxstore.DefaultConfig(fluxService(namespace, ""))
		cfg.Client = client
		s, err := fluxstore.Open(ctx, h, cfg)
		if err != nil {
			return nil, err
		}
		return s, nil
	case "etcd":
		cfg, err := access.config(u)
		if err != nil {
			return nil, err
		}
		s, err := etcd.Open(ctx, cfg)
		if err != nil {
			return nil, err // not a nil *etcd.Store in a non-nil store.Store
		}
		return s, nil
	}
	return nil, fmt.Errorf("metadata store %q: no backend for scheme %q", raw, u.scheme)
}

// storeFailed is the command's error for a store that could not be opened
// or used, said once as "metadata store ...".
func storeFailed(err error) error {
	msg := err.Error()
	if !strings.HasPrefix(msg, "metadata store") {
		msg = "metadata store: " + msg
	}
	return fail(exitStore, msg)
}
