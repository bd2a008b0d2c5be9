package main

import (
	"context"
	"strings"
	"testing"
)

func TestStoreURLs(t *testing.T) {
	good := []string{"", "embedded", "embedded://", "EMBEDDED://", "flux://", "FLUX://",
		"etcd://127.0.0.1:2379", "ETCD://h1:2379,h2:2379,h3:2379", "etcd://[::1]:2379", "etcd://etcd-0.etcd.svc:32379"}
	for _, u := range good {
		if _, err := parseStoreURL(u); err != nil {
			t.Errorf("parseStoreURL(%q): %v", u, err)
		}
	}
	bad := []string{"embedded://host:1", "bogus://x", "redis://h:1",
		"etcd://", "etcd", "etcd://h1", "etcd://h1:", "etcd://:2379", "etcd://h1:2379,", "etcd://h1:2379,,h2:2379",
		"etcd://h1:0", "etcd://h1:70000", "etcd://h1:port", "etcd://http://h1:2379", "etcd://h1:2379/", "etcd://user@h1:2379", "etcds://h1:2379", "flux://local:///tmp/x"}
	for _, u := range bad {
		_, err := parseStoreURL(u)
		if err == nil {
			t.Errorf("parseStoreURL(%q) accepted a bad URL", u)
			continue
		}
		if strings.Contains(err.Error(), "\n") {
			t.Errorf("parseStoreURL(%q): message spans lines: %q", u, err)
		}
	}
	for _, u := range []string{"", "embedded://"} {
		s, err := openStore(context.Background(), u, "job", &fluxConn{}, false, etcdAccess{})
		if err != nil {
			t.Fatalf("openStore(%q): %v", u, err)
		}
		s.Close()
		if !singleNode(u) {
			t.Errorf("singleNode(%q) = false", u)
		}
	}
	if singleNode("etcd://h1:2379") {
		t.Error("an etcd store is taken for a single node's")
	}
}
