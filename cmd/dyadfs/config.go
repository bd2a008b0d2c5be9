package main

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/dyadfs/dyadfs/dtl"
	"github.com/dyadfs/dyadfs/dtl/ucx"
	"github.com/dyadfs/dyadfs/flux"
	"github.com/dyadfs/dyadfs/fs"
	"github.com/dyadfs/dyadfs/fs/caller"
	"github.com/dyadfs/dyadfs/fs/dmd"
	"github.com/dyadfs/dyadfs/hfl"
	"github.com/dyadfs/dyadfs/internal/size"
)

// mountConfig is everything `dyadfs mount` needs, assembled from defaults,
// then DYAD's environment variables, then flags (flag > environment >
// default).
type mountConfig struct {
	Mountpoint string
	StoreURL   string
	Foreground bool
	LogLevel   slog.Level
	LogFile    string
	CPUProfile string
	// AllocProfile is where the daemon writes its allocations at unmount.
	AllocProfile string

	DMD     dmd.Config
	FS      fs.Config
	Locator hfl.LocatorConfig

	// nodeFromRank makes the node id the Flux broker's rank (a Flux
	// store and no --node).
	nodeFromRank bool
	// defaultBacking says the backing directory is dyadfs's choice (no
	// --backing, no DYADFS_BACKING): mount creates it.
	defaultBacking bool

	// Transport settings, used when the store is shared between nodes.
	DTL          string
	Transport    dtl.Config
	SecretFile   string
	LeaseTTL     time.Duration
	FetchTimeout time.Duration

	// Metrics is the address Prometheus metrics are served on ("": none).
	Metrics string
	// Etcd is how an etcd store is reached.
	Etcd etcdAccess
}

// envVars lists the environment variables dyadfs reads, all of them here.
// DYAD's names keep their DYAD meaning.
var envVars = []struct{ name, help string }{
	{"DYAD_KVS_NAMESPACE", "namespace (job scope) of the metadata keys: --namespace"},
	{"DYAD_KEY_DEPTH", "levels of the hashed metadata key: --key-depth"},
	{"DYAD_KEY_BINS", "bins per level of the hashed metadata key: --key-bins"},
	{"DYAD_FSYNC_WRITE", "fsync files before publishing them: --fsync-on-publish"},
	{"DYAD_SHARED_STORAGE", "all nodes share the backing storage: --shared-storage"},
	{"DYAD_DTL_MODE", "data transport: --dtl (DYAD's UCX, FLUX_RPC and MARGO are recognised)"},
	{"DYAD_ASYNC_PUBLISH", "a writer's close does not wait for its publish: --publish-wait 0"},
	{"DYAD_CACHE_CAPACITY", "bytes the copies of other nodes' files may take here: --cache-capacity"},
	{"DYAD_CACHE_POLICY", "which copy is evicted first, LRU or FIFO: --cache-policy"},
	{"DYAD_CACHE_LOW_WATERMARK", "fraction of the capacity eviction frees down to: --cache-low-watermark"},
	{"DYAD_CACHE_GRACE_PERIOD", "seconds a copy just fetched is kept from eviction: --cache-grace"},
	{"DYAD_PATH_ORIGIN", "directory (parallel file system) read for paths no node published: --origin"},
	{"DYADFS_STORE", "metadata store URL: --store"},
	{"DYADFS_BACKING", "node-local backing directory: --backing"},
	{"DYADFS_LOG_LEVEL", "log level: --log-level"},
	{"DYADFS_METRICS", "address Prometheus metrics are served on: --metrics"},
	{"DYADFS_ETCD_CACERT", "etcd's CA: --etcd-cacert (and DYADFS_ETCD_CERT, _KEY, _USER, _PASSWORD_FILE)"},
	{insecureSecretEnv, "keep the generated job secret in an unprotected etcd: --insecure-store-secret"},
}

// lookupEnv is os.LookupEnv; tests replace it.
var lookupEnv = os.LookupEnv

// defaultMountConfig returns the defaults with the environment applied.
func defaultMountConfig() (mountConfig, error) {
	c := mountConfig{
		StoreURL:     embeddedURL,
		LogLevel:     slog.LevelInfo,
		DMD:          dmd.DefaultConfig(),
		FS:           fs.DefaultConfig(),
		Locator:      hfl.DefaultLocatorConfig(),
		DTL:          "tcp",
		Transport:    dtl.DefaultConfig(),
		LeaseTTL:     10 * time.Second,
		FetchTimeout: time.Minute,
	}
	c.DMD.CloseWait = 30 * time.Second
	c.Transport.Listen = ":7447"
	if h, err := os.Hostname(); err == nil {
		c.DMD.Node = h
	}
	var errs []string
	env := func(name string, apply func(string) error) {
		if v, ok := lookupEnv(name); ok {
			if err := apply(v); err != nil {
				errs = append(errs, fmt.Sprintf("%s=%q: %v", name, v, err))
			}
		}
	}
	env("DYAD_KVS_NAMESPACE", func(v string) error { c.Locator.Namespace = v; return nil })
	env(backingEnv, func(v string) error { c.DMD.Backing = v; return nil })
	env("DYADFS_METRICS", func(v string) error { c.Metrics = v; return nil })
	env("DYAD_KEY_DEPTH", func(v string) (err error) { c.Locator.KeyDepth, err = strconv.Atoi(v); return })
	env("DYAD_KEY_BINS", func(v string) (err error) { c.Locator.KeyBins, err = strconv.Atoi(v); return })
	env("DYAD_FSYNC_WRITE", func(v string) (err error) { c.DMD.FsyncOnPublish, err = parseBool(v); return })
	env("DYAD_SHARED_STORAGE", func(v string) (err error) { c.DMD.SharedStorage, err = parseBool(v); return })
	env("DYAD_DTL_MODE", func(v string) error { c.DTL = v; return nil })
	env("DYAD_ASYNC_PUBLISH", func(v string) error {
		async, err := parseBool(v)
		if async {
			c.DMD.CloseWait = 0
		}
		return err
	})
	env("DYAD_CACHE_CAPACITY", func(v string) (err error) { c.DMD.Cache.Capacity, err = size.Parse(v); return })
	env("DYAD_CACHE_POLICY", func(v string) error { c.DMD.Cache.Policy = strings.ToLower(strings.TrimSpace(v)); return nil })
	env("DYAD_CACHE_LOW_WATERMARK", func(v string) (err error) {
		c.DMD.Cache.LowWatermark, err = strconv.ParseFloat(strings.TrimSpace(v), 64)
		return
	})
	env("DYAD_CACHE_GRACE_PERIOD", func(v string) (err error) { c.DMD.Cache.Grace, err = parseSeconds(v); return })
	env("DYAD_PATH_ORIGIN", func(v string) error { c.DMD.Origin = v; return nil })
	// Inside a Flux job the store is Flux's KVS, unless told otherwise.
	env("FLUX_URI", func(string) error { c.StoreURL = fluxURL; return nil })
	env("DYADFS_STORE", func(v string) error { c.StoreURL = v; return nil })
	env("DYADFS_LOG_LEVEL", func(v string) error { return c.LogLevel.UnmarshalText([]byte(v)) })
	if err := c.Etcd.fromEnv(); err != nil {
		errs = append(errs, err.Error())
	}
	if len(errs) > 0 {
		return c, fmt.Errorf("bad environment: %s", strings.Join(errs, "; "))
	}
	return c, nil
}

// parseSeconds reads a duration as DYAD's variables give it, in seconds
// ("5", "0.5"), or with a unit ("500ms").
func parseSeconds(v string) (time.Duration, error) {
	v = strings.TrimSpace(v)
	if f, err := strconv.ParseFloat(v, 64); err == nil {
		return time.Duration(f * float64(time.Second)), nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("want seconds (5) or a duration (500ms)")
	}
	return d, nil
}

// byteSize is a flag of a byte count written as people do (64MiB).
type byteSize struct{ n *int64 }

func (b byteSize) String() string {
	if b.n == nil || *b.n == 0 {
		return "0"
	}
	for _, u := range []struct {
		suffix string
		n      int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if *b.n%u.n == 0 {
			return strconv.FormatInt(*b.n/u.n, 10) + u.suffix
		}
	}
	return strconv.FormatInt(*b.n, 10)
}

func (b byteSize) Set(s string) (err error) { *b.n, err = size.Parse(s); return }
func (b byteSize) Type() string             { return "bytes" }

// parseBool accepts what DYAD's users write in the environment.
func parseBool(v string) (bool, error) {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "1", "true", "yes", "on":
		return true, nil
	case "0", "false", "no", "off", "":
		return false, nil
	}
	return false, fmt.Errorf("want 1/0, true/false, yes/no or on/off")
}

// mountFlags binds the mount command's flags to c, whose current values are
// the defaults shown in help.
func mountFlags(c *mountConfig) (*pflag.FlagSet, *mountFlagValues) {
	f := pflag.NewFlagSet("mount", pflag.ContinueOnError)
	f.SortFlags = false
	f.Usage = func() {} // help goes to stdout through runHelp
	v := &mountFlagValues{logLevel: strings.ToLower(c.LogLevel.String()), flags: f}
	f.StringVar(&c.DMD.Backing, "backing", c.DMD.Backing, "node-local `DIR` that stores the managed directory's files (default: /var/tmp/dyadfs/NAMESPACE, created 0700; /var/tmp/dyadfs-UID/NAMESPACE for other users than root) (DYADFS_BACKING)")
	f.StringVar(&c.DMD.Node, "node", c.DMD.Node, "this node's `ID`, the owner of the files it publishes; give one where hostnames repeat (containers, several daemons on one host); with a Flux store, the broker's rank")
	f.StringVar(&c.StoreURL, "store", c.StoreURL, "metadata store `URL`: embedded:// (single node), etcd://host:port[,host:port...], https://host:port[,...] (etcd over TLS), or flux:// (the Flux KVS of the instance FLUX_URI names; the default inside a Flux job)")
	f.StringVar(&c.Locator.Namespace, "namespace", c.Locator.Namespace, "job `NAME` that scopes metadata keys (DYAD_KVS_NAMESPACE)")
	f.IntVar(&c.Locator.KeyDepth, "key-depth", c.Locator.KeyDepth, "levels of the hashed metadata key (DYAD_KEY_DEPTH)")
	f.IntVar(&c.Locator.KeyBins, "key-bins", c.Locator.KeyBins, "bins per level of the hashed metadata key (DYAD_KEY_BINS)")
	f.DurationVar(&c.DMD.WaitTimeout, "wait-timeout", c.DMD.WaitTimeout, "bound on how long an open waits for a file (0: forever); on expiry open fails with ETIMEDOUT")
	f.BoolVar(&c.FS.WaitMissing, "wait-missing", c.FS.WaitMissing, "a read-only open of a path published nowhere waits for it, unless its process says otherwise ("+caller.EnvWait+", "+caller.EnvConsumer+", "+caller.EnvProducer+"); false: ENOENT unless it says it waits")
	f.StringSliceVar(&c.FS.NeverWait, "never-wait", c.FS.NeverWait, "base-name `PATTERNS` (comma-separated globs) a read-only open never waits for, whoever asks: configuration files libraries probe at start-up in the working directory (\"\" to wait for every name)")
	f.DurationVar(&c.DMD.CloseWait, "publish-wait", c.DMD.CloseWait, "with other nodes, a writer's close publishes the file and fails if the store refuses it (ENOSPC when full, EACCES when denied) or does not answer within this time (EIO); 0: close returns at once and the publish follows (DYAD_ASYNC_PUBLISH)")
	f.BoolVar(&c.DMD.FsyncOnPublish, "fsync-on-publish", c.DMD.FsyncOnPublish, "make file data durable before publishing it (DYAD_FSYNC_WRITE)")
	f.BoolVar(&c.DMD.SharedStorage, "shared-storage", c.DMD.SharedStorage, "all nodes see the same backing storage: wait for records, never transfer (DYAD_SHARED_STORAGE)")
	f.Var(byteSize{&c.DMD.Cache.Capacity}, "cache-capacity", "`BYTES` (such as 64GiB) the copies of other nodes' files may take here; past it, the copies least used are evicted and fetched again when next opened (0: no bound) (DYAD_CACHE_CAPACITY)")
	f.StringVar(&c.DMD.Cache.Policy, "cache-policy", c.DMD.Cache.Policy, "which copy is evicted first: lru (opened least recently) or fifo (fetched first) (DYAD_CACHE_POLICY)")
	f.Float64Var(&c.DMD.Cache.LowWatermark, "cache-low-watermark", c.DMD.Cache.LowWatermark, "once eviction starts, it frees down to this fraction of the capacity (DYAD_CACHE_LOW_WATERMARK)")
	f.DurationVar(&c.DMD.Cache.Grace, "cache-grace", c.DMD.Cache.Grace, "a copy fetched this recently is not evicted before it is first opened (DYAD_CACHE_GRACE_PERIOD, in seconds)")
	f.Var(byteSize{&c.DMD.Ranges.Threshold}, "range-threshold", "an open of another node's file of at least `BYTES` returns once the file is known, and its reads fetch the blocks they touch (0: always fetch whole files first)")
	f.Var(byteSize{&c.DMD.Ranges.ReadAhead}, "range-read-ahead", "`BYTES` fetched ahead of the sequential reads of a file read in ranges")
	f.BoolVar(&c.DMD.Ranges.Fill, "range-fill", c.DMD.Ranges.Fill, "fetch the rest of a file read in ranges in the background once it is opened")
	f.StringVar(&c.DMD.Origin, "origin", c.DMD.Origin, "`DIR` (on a parallel file system) that a read-only open of a path published nowhere reads instead of waiting; only ever read (DYAD_PATH_ORIGIN)")
	f.BoolVar(&c.DMD.OriginPublish, "origin-publish", c.DMD.OriginPublish, "the first node to read a file from --origin brings it here and publishes it, so that other nodes fetch it from that node instead of the parallel file system")
	f.StringVar(&c.DTL, "dtl", c.DTL, dtlHelp())
	f.StringVar(&c.Transport.Listen, "listen", c.Transport.Listen, "`HOST:PORT` the transport serves files on")
	f.StringVar(&c.Transport.Advertise, "advertise", "", "`HOST:PORT` other nodes reach the transport at (default: the listen address, or this node's first non-loopback address)")
	f.StringVar(&c.SecretFile, "secret-file", "", "`FILE` holding the job secret that authenticates nodes (default: generated and kept in the store, per namespace)")
	f.DurationVar(&c.LeaseTTL, "lease-ttl", c.LeaseTTL, "how long after this daemon dies other nodes stop counting on it")
	f.DurationVar(&c.FetchTimeout, "fetch-timeout", c.FetchTimeout, "bound on fetching one file, retries included; on expiry the open fails with EIO")
	f.DurationVar(&c.Transport.StallTimeout, "stall-timeout", c.Transport.StallTimeout, "a transfer that makes no progress for this long fails (and is retried)")
	c.Etcd.flags(f, true)
	f.StringVar(&c.Metrics, "metrics", c.Metrics, "serve Prometheus metrics on `HOST:PORT` at /metrics (DYADFS_METRICS)")
	f.StringSliceVarP(&v.options, "options", "o", nil, "FUSE mount `OPTIONS`, comma-separated (allow_other, ...)")
	f.DurationVar(&c.FS.CacheTTL, "cache-ttl", c.FS.CacheTTL, "how long the kernel caches entries and attributes of existing files")
	f.BoolVar(&c.FS.Passthrough, "passthrough", c.FS.Passthrough, "let the kernel read and write backing files directly (FUSE passthrough) where it can")
	f.BoolVar(&c.FS.Xattrs, "xattrs", c.FS.Xattrs, "serve extended attributes (costs a round trip per write: the kernel checks security.capability)")
	f.BoolVarP(&c.Foreground, "foreground", "f", false, "stay attached and log to stderr instead of running as a daemon")
	f.StringVar(&v.logLevel, "log-level", v.logLevel, "log `LEVEL`: debug, info, warn, error")
	f.StringVar(&c.LogFile, "log-file", "", "daemon log `FILE` (default: /tmp/dyadfs-<mountpoint>.log; stderr with --foreground)")
	f.BoolVar(&c.FS.Debug, "debug-fuse", false, "log every FUSE request (very verbose)")
	f.StringVar(&c.CPUProfile, "cpu-profile", "", "write a Go CPU profile of the daemon to `FILE` until unmount (for developers)")
	f.MarkHidden("cpu-profile")
	f.StringVar(&c.AllocProfile, "alloc-profile", "", "write a Go profile of the daemon's allocations to `FILE` at unmount (for developers)")
	f.MarkHidden("alloc-profile")
	f.DurationVar(&c.DMD.WaitLogAfter, "wait-log-after", c.DMD.WaitLogAfter, "log an open that has waited this long (for tests)")
	f.MarkHidden("wait-log-after")
	return f, v
}

// mountFlagValues holds flags that need parsing after pflag.
type mountFlagValues struct {
	options  []string
	logLevel string
	flags    *pflag.FlagSet
}

// finish applies the parsed flag values and derived settings to c and
// validates the result.
func (v *mountFlagValues) finish(c *mountConfig, args []string) error {
	if len(args) != 1 {
		return fail(exitUsage, "mount takes exactly one MOUNTPOINT (see dyadfs help mount)")
	}
	if err := c.LogLevel.UnmarshalText([]byte(v.logLevel)); err != nil {
		return fail(exitUsage, fmt.Sprintf("--log-level %q: want debug, info, warn or error", v.logLevel))
	}
	for _, o := range v.options {
		switch o = strings.TrimSpace(o); o {
		case "":
		case "allow_other":
			c.FS.AllowOther = true
		default:
			c.FS.Options = append(c.FS.Options, o)
		}
	}
	if c.DMD.Backing == "" {
		c.DMD.Backing, c.defaultBacking = defaultBacking(c.Locator.Namespace), true
	}
	var err error
	if c.Mountpoint, err = filepath.Abs(args[0]); err != nil {
		return fail(exitMountpoint, fmt.Sprintf("mountpoint %s: %v", args[0], err))
	}
	if c.DMD.Backing, err = filepath.Abs(c.DMD.Backing); err != nil {
		return fail(exitBacking, fmt.Sprintf("backing directory %s: %v", c.DMD.Backing, err))
	}
	if _, err := parseStoreURL(c.StoreURL); err != nil {
		return fail(exitUsage, fmt.Sprintf("--store: %v", err))
	}
	c.Locator.SingleNode = singleNode(c.StoreURL)
	if u, _ := parseStoreURL(c.StoreURL); u.scheme == "etcd" {
		cfg, err := c.Etcd.config(u)
		if err != nil {
			return fail(exitUsage, err.Error())
		}
		if c.SecretFile == "" && !cfg.Protected() && !c.Etcd.InsecureSecret {
			return fail(exitUsage, fmt.Sprintf("the job secret would be kept in clear in etcd, where anyone who reaches %s reads it and can join the job: "+
				"pass --secret-file FILE (the same on every node), or reach etcd over https:// with --etcd-cert and --etcd-key or as --etcd-user, "+
				"or --insecure-store-secret to accept the risk", u.addr))
		}
	}
	if u, _ := parseStoreURL(c.StoreURL); u.scheme == "flux" && !v.flags.Changed("node") {
		c.nodeFromRank = true
	}
	if err := c.Locator.Validate(); err != nil {
		return fail(exitUsage, err.Error())
	}
	if c.DMD.WaitTimeout < 0 {
		return fail(exitUsage, fmt.Sprintf("--wait-timeout %v must not be negative (0 waits forever)", c.DMD.WaitTimeout))
	}
	if c.DMD.CloseWait < 0 {
		return fail(exitUsage, fmt.Sprintf("--publish-wait %v must not be negative (0: close does not wait)", c.DMD.CloseWait))
	}
	for _, pat := range c.FS.NeverWait {
		if _, err := path.Match(pat, ""); err != nil || strings.Contains(pat, "/") {
			return fail(exitUsage, fmt.Sprintf("--never-wait %q: want base-name globs such as ucx.conf or *.conf, without slashes", pat))
		}
	}
	c.DMD.Cache.Policy = strings.ToLower(c.DMD.Cache.Policy)
	if c.DMD.Cache.LowWatermark <= 0 {
		return fail(exitUsage, fmt.Sprintf("--cache-low-watermark %v: want a fraction of the capacity, above 0 and at most 1", c.DMD.Cache.LowWatermark))
	}
	if err := c.DMD.Cache.Validate(); err != nil {
		return fail(exitUsage, "--cache-*: "+err.Error())
	}
	if c.DMD.Origin != "" {
		abs, err := filepath.Abs(c.DMD.Origin)
		if err != nil {
			return fail(exitUsage, fmt.Sprintf("--origin %s: %v", c.DMD.Origin, err))
		}
		if st, err := os.Stat(abs); err != nil || !st.IsDir() {
			return fail(exitUsage, fmt.Sprintf("--origin %s: not a directory this node can read (the parallel file system's dataset directory)", c.DMD.Origin))
		}
		if abs == c.Mountpoint || strings.HasPrefix(abs, c.Mountpoint+"/") {
			return fail(exitUsage, fmt.Sprintf("--origin %s is inside the mountpoint %s: give the parallel file system's directory", c.DMD.Origin, c.Mountpoint))
		}
		c.DMD.Origin = abs
	} else if c.DMD.OriginPublish {
		return fail(exitUsage, "--origin-publish needs --origin DIR")
	}
	if c.DMD.Ranges.Threshold < 0 || c.DMD.Ranges.ReadAhead < 0 {
		return fail(exitUsage, "--range-threshold and --range-read-ahead must not be negative")
	}
	if c.DMD.Cache.Capacity > 0 && c.DMD.SharedStorage {
		return fail(exitUsage, "--cache-capacity: with --shared-storage nothing is copied here, so there is nothing to bound")
	}
	if c.FS.CacheTTL < 0 {
		return fail(exitUsage, fmt.Sprintf("--cache-ttl %v must not be negative", c.FS.CacheTTL))
	}
	if c.DMD.Node == "" || strings.ContainsAny(c.DMD.Node, "/ \t\n") {
		return fail(exitUsage, fmt.Sprintf("--node %q: want a non-empty id without slashes or spaces", c.DMD.Node))
	}
	if c.LogFile == "" && !c.Foreground {
		c.LogFile = defaultLogFile(c.Mountpoint)
	}
	if err := c.finishTransport(v.flags); err != nil {
		return err
	}
	if c.DMD.SharedStorage && !v.flags.Changed("cache-ttl") {
		// Other nodes change the shared backing directory unseen: let
		// the kernel cache nothing.
		c.FS.CacheTTL = 0
	}
	return nil
}

// dtlNames maps DYAD's DYAD_DTL_MODE values and dyadfs's names to backends.
var dtlNames = map[string]string{"tcp": "tcp", "ucx": "ucx", "flux_rpc": "flux", "flux-rpc": "flux", "flux": "flux", "margo": "margo"}

// availableDTL lists the transports this build has.
var availableDTL = func() []string {
	names := []string{"tcp"}
	if ucx.Built {
		names = append(names, "ucx")
	}
	if flux.Built {
		names = append(names, "flux")
	}
	return names
}()

// dtlHelp describes the transports this build has, for --dtl's help.
func dtlHelp() string {
	what := map[string]string{
		"tcp":  "tcp",
		"ucx":  "ucx (RDMA, or TCP and shared memory, as UCX_TLS says)",
		"flux": "flux (Flux RPC through the brokers)",
	}
	var parts []string
	for _, n := range availableDTL {
		parts = append(parts, what[n])
	}
	return "data `TRANSPORT` between nodes, of this build's: " + strings.Join(parts, ", ") + " (DYAD_DTL_MODE)"
}

func (c *mountConfig) finishTransport(flags *pflag.FlagSet) error {
	name, ok := dtlNames[strings.ToLower(c.DTL)]
	if !ok {
		return fail(exitUsage, fmt.Sprintf("--dtl %q: unknown transport (available: %s)", c.DTL, strings.Join(availableDTL, ", ")))
	}
	// A backend this binary lacks is a usage error found before the store
	// is reached.
	if name == "ucx" && !ucx.Built {
		return fail(exitUsage, fmt.Sprintf("--dtl ucx: %v", ucx.ErrNotBuilt))
	}
	if name == "flux" && !flux.Built {
		return fail(exitUsage, fmt.Sprintf("--dtl flux: %v", flux.ErrNotBuilt))
	}
	if !slices.Contains(availableDTL, name) {
		return fail(exitUsage, fmt.Sprintf("--dtl %s: not available in this build (available: %s)", name, strings.Join(availableDTL, ", ")))
	}
	c.DTL = name
	c.Transport.Node = c.DMD.Node
	if _, _, err := net.SplitHostPort(c.Transport.Listen); err != nil {
		return fail(exitUsage, fmt.Sprintf("--listen %q: want HOST:PORT (%v)", c.Transport.Listen, err))
	}
	if c.Transport.Advertise != "" {
		if _, _, err := net.SplitHostPort(c.Transport.Advertise); err != nil {
			return fail(exitUsage, fmt.Sprintf("--advertise %q: want HOST:PORT (%v)", c.Transport.Advertise, err))
		}
	}
	if c.Metrics != "" {
		_, port, err := net.SplitHostPort(c.Metrics)
		if n, perr := strconv.ParseUint(port, 10, 16); err != nil || perr != nil || (n == 0 && port != "0") {
			return fail(exitUsage, fmt.Sprintf("--metrics %q: want HOST:PORT with a port from 0 to 65535 (such as :9464)", c.Metrics))
		}
	}
	if c.LeaseTTL < time.Second {
		return fail(exitUsage, fmt.Sprintf("--lease-ttl %v: want at least 1s", c.LeaseTTL))
	}
	if c.FetchTimeout <= 0 || c.Transport.StallTimeout <= 0 {
		return fail(exitUsage, "--fetch-timeout and --stall-timeout must be positive")
	}
	if c.SecretFile != "" {
		b, err := os.ReadFile(c.SecretFile)
		if err != nil {
			return fail(exitUsage, fmt.Sprintf("--secret-file: %v", err))
		}
		if st, err := os.Stat(c.SecretFile); err == nil && st.Mode().Perm()&0o077 != 0 {
			return fail(exitUsage, fmt.Sprintf("--secret-file %s can be read by other users: chmod 600 %s", c.SecretFile, c.SecretFile))
		}
		// The line an editor or echo adds is not part of the secret.
		c.Transport.Secret = []byte(strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r"))
		if len(c.Transport.Secret) < 16 {
			return fail(exitUsage, fmt.Sprintf("--secret-file %s: the secret must be at least 16 bytes (for example: head -c 32 /dev/urandom | base64 > %s)", c.SecretFile, c.SecretFile))
		}
	}
	return nil
}

func defaultLogFile(mountpoint string) string {
	name := strings.Trim(strings.ReplaceAll(mountpoint, "/", "-"), "-")
	return filepath.Join(os.TempDir(), "dyadfs-"+name+".log")
}

// durationOrZero prints a wait timeout the way users think of it.
func durationOrZero(d time.Duration) string {
	if d == 0 {
		return "forever"
	}
	return d.String()
}
