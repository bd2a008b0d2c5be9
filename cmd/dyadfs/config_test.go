package main

import (
	"strings"
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

// TestCacheConfig: DYAD's cache variables and dyadfs's flags, by value;
// bad values are refused with what to write.
func TestCacheConfig(t *testing.T) {
	defer func(old func(string) (string, bool)) { lookupEnv = old }(lookupEnv)
	env := map[string]string{
		"DYAD_CACHE_CAPACITY":      "2GiB",
		"DYAD_CACHE_POLICY":        "FIFO",
		"DYAD_CACHE_LOW_WATERMARK": "0.5",
		"DYAD_CACHE_GRACE_PERIOD":  "2.5",
		"DYAD_SHARED_STORAGE":      "0",
	}
	lookupEnv = func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	c, err := defaultMountConfig()
	if err != nil {
		t.Fatal(err)
	}
	cc := c.DMD.Cache
	if cc.Capacity != 2<<30 || cc.Policy != "fifo" || cc.LowWatermark != 0.5 || cc.Grace != 2500*time.Millisecond || c.DMD.SharedStorage {
		t.Fatalf("environment not applied by value: %+v, shared storage %v", cc, c.DMD.SharedStorage)
	}
	flags, vals := mountFlags(&c)
	if err := flags.Parse([]string{"--cache-capacity", "64MiB", "--cache-policy", "lru", "--cache-grace", "1s", "/m"}); err != nil {
		t.Fatal(err)
	}
	if err := vals.finish(&c, flags.Args()); err != nil {
		t.Fatal(err)
	}
	if cc := c.DMD.Cache; cc.Capacity != 64<<20 || cc.Policy != "lru" || cc.LowWatermark != 0.5 || cc.Grace != time.Second {
		t.Fatalf("flags did not win: %+v", cc)
	}

	lookupEnv = func(string) (string, bool) { return "", false }
	d, _ := defaultMountConfig()
	if cc := d.DMD.Cache; cc.Capacity != 0 || cc.Policy != "lru" || cc.LowWatermark != 0.8 || cc.Grace != 5*time.Second {
		t.Fatalf("defaults: %+v, want DYAD's (no capacity, lru, 0.8, 5s)", cc)
	}
	for _, args := range [][]string{
		{"--cache-capacity", "lots"}, {"--cache-policy", "random"}, {"--cache-low-watermark", "1.5"},
		{"--cache-grace", "-1s"}, {"--cache-low-watermark", "0"}, {"--cache-capacity", "1G", "--shared-storage"},
	} {
		d, _ := defaultMountConfig()
		flags, vals := mountFlags(&d)
		err := flags.Parse(append(args, "/m"))
		if err == nil {
			err = vals.finish(&d, flags.Args())
		}
		if err == nil {
			t.Errorf("%v accepted", args)
		}
	}
	env = map[string]string{"DYAD_CACHE_CAPACITY": "big"}
	lookupEnv = func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	if _, err := defaultMountConfig(); err == nil {
		t.Error("DYAD_CACHE_CAPACITY=big accepted")
	}
}

func TestMount8Args(t *testing.T) {
	got, err := mount8Args([]string{"dyadfs", "/mnt/dmd", "-o",
		"rw,backing=/local/dmd,store=etcd://10.0.0.1:2379,10.0.0.2:2379,wait_timeout=10m,allow_other,defaults,_netdev,x-systemd.automount,foreground,dev,suid"})
	if err != nil {
		t.Fatal(err)
	}
	want := "--backing=/local/dmd --store=etcd://10.0.0.1:2379,10.0.0.2:2379 --wait-timeout=10m --foreground -o rw,allow_other,dev,suid -- /mnt/dmd"
	if strings.Join(got, " ") != want {
		t.Fatalf("mount8Args: %q\nwant %q", strings.Join(got, " "), want)
	}
	if !isMount8Form([]string{"dyadfs", "/mnt/dmd", "-o", "x"}) || isMount8Form([]string{"mount", "/mnt/dmd"}) || isMount8Form([]string{"status", "/mnt"}) {
		t.Fatal("isMount8Form")
	}
}
