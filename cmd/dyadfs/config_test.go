package main

import (
	"testing"
	"time"
)

// TestConfigPrecedence: flag > environment > default, for every DYAD
// variable dyadfs honours.
func TestConfigPrecedence(t *testing.T) {
	env := map[string]string{
		"DYAD_KVS_NAMESPACE":  "job42",
		"DYAD_KEY_DEPTH":      "2",
		"DYAD_KEY_BINS":       "256",
		"DYAD_FSYNC_WRITE":    "1",
		"DYAD_SHARED_STORAGE": "yes",
		"DYADFS_STORE":        "embedded://",
		"DYADFS_LOG_LEVEL":    "warn",
	}
	defer func(old func(string) (string, bool)) { lookupEnv = old }(lookupEnv)
	lookupEnv = func(k string) (string, bool) { v, ok := env[k]; return v, ok }

	c, err := defaultMountConfig()
	if err != nil {
		t.Fatal(err)
	}
	if c.Locator.Namespace != "job42" || c.Locator.KeyDepth != 2 || c.Locator.KeyBins != 256 ||
		!c.DMD.FsyncOnPublish || !c.DMD.SharedStorage || c.LogLevel.String() != "WARN" {
		t.Fatalf("environment not applied: %+v", c)
	}
	flags, vals := mountFlags(&c)
	if err := flags.Parse([]string{"--namespace", "cli", "--key-depth", "4", "--fsync-on-publish=false",
		"--wait-timeout", "2s", "--backing", "/b", "-o", "allow_other,ro", "/m"}); err != nil {
		t.Fatal(err)
	}
	if err := vals.finish(&c, flags.Args()); err != nil {
		t.Fatal(err)
	}
	if c.Locator.Namespace != "cli" || c.Locator.KeyDepth != 4 || c.Locator.KeyBins != 256 ||
		c.DMD.FsyncOnPublish || !c.DMD.SharedStorage || c.DMD.WaitTimeout != 2*time.Second ||
		!c.FS.AllowOther || len(c.FS.Options) != 1 || c.FS.Options[0] != "ro" || c.Mountpoint != "/m" || c.DMD.Backing != "/b" {
		t.Fatalf("flags did not win: %+v", c)
	}

	lookupEnv = func(string) (string, bool) { return "", false }
	d, err := defaultMountConfig()
	if err != nil {
		t.Fatal(err)
	}
	if d.Locator.Namespace != "dyadfs" || d.Locator.KeyDepth != 3 || d.Locator.KeyBins != 1024 || d.DMD.FsyncOnPublish {
		t.Fatalf("defaults: %+v", d)
	}
}

func TestBadEnvironment(t *testing.T) {
	defer func(old func(string) (string, bool)) { lookupEnv = old }(lookupEnv)
	for _, kv := range [][2]string{{"DYAD_KEY_DEPTH", "deep"}, {"DYAD_FSYNC_WRITE", "maybe"}, {"DYADFS_LOG_LEVEL", "loud"}} {
		lookupEnv = func(k string) (string, bool) {
			if k == kv[0] {
				return kv[1], true
			}
			return "", false
		}
		if _, err := defaultMountConfig(); err == nil {
			t.Errorf("%s=%s accepted", kv[0], kv[1])
		}
	}
}
