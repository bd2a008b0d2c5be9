package caller

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Who waits. A read-only open of a path that does not exist waits for it
// to be published, unless the calling process says it does not: the way
// DYAD's users say it (DYAD decides by the managed directories a process
// names as its own), or dyadfs's own variable.
//
//   - DYADFS_WAIT=0 (or no, false, off): the process never waits: a
//     missing path is ENOENT at once. DYADFS_WAIT=1 (yes, true, on): it
//     waits. It wins over DYAD's variables.
//   - DYAD_PATH_CONSUMER=DIR covering the path: the process consumes there,
//     and waits.
//   - DYAD_PATH_PRODUCER=DIR covering the path: the process produces there,
//     and does not wait (a program that looks for a file before it creates
//     it, such as sqlite3, gets ENOENT and creates it).
//   - Otherwise the mount's default decides (dyadfs mount --wait-missing).
//
// DIR covers a path if the path is DIR or below it; a relative DIR counts
// from the process's working directory.

// Names of the environment variables read.
const (
	EnvWait     = "DYADFS_WAIT"
	EnvConsumer = "DYAD_PATH_CONSUMER"
	EnvProducer = "DYAD_PATH_PRODUCER"
	// EnvRanges=0 (no, false, off): the process's opens of large files
	// fetch them whole before they return, instead of reading them in
	// ranges (dyadfs prefetch sets it).
	EnvRanges = "DYADFS_RANGES"
)

// Role is what a process said about waiting.
type Role int

const (
	// RoleDefault: nothing; the mount's default decides.
	RoleDefault Role = iota
	// RoleWait: the process waits for missing paths.
	RoleWait
	// RoleNoWait: the process gets ENOENT for missing paths.
	RoleNoWait
)

// maxEnviron bounds what is read of a process's environment.
const maxEnviron = 256 << 10

// environBufs keeps the buffers environments are read into: every open of
// a missing path reads one, and a fresh buffer each time would keep the
// garbage collector busy.
var environBufs = sync.Pool{New: func() any { b := make([]byte, maxEnviron); return &b }}

// RoleOf reads, from the environment of thread tid's process, what it said
// about waiting for target (an absolute path). A process whose environment
// cannot be read said nothing.
func RoleOf(tid uint32, target string) Role {
	env, cwd := roles.get(tid)
	return decideRole(env, cwd, target)
}

// roleTTL is how long what a thread's environment says is kept: a
// consumer opens one missing path after another, and its environment does
// not change.
const roleTTL = time.Second

// roleCache keeps the variables of interest (and the working directory)
// of recently seen threads.
type roleCache struct {
	mu sync.Mutex
	m  map[uint32]roleEntry
}

type roleEntry struct {
	env map[string]string
	cwd string
	at  time.Time
}

var roles = roleCache{m: make(map[uint32]roleEntry)}

func (c *roleCache) get(tid uint32) (map[string]string, string) {
	now := time.Now()
	c.mu.Lock()
	e, ok := c.m[tid]
	c.mu.Unlock()
	if ok && now.Sub(e.at) < roleTTL {
		return e.env, e.cwd
	}
	e = roleEntry{env: readEnviron(tid), at: now}
	if len(e.env) > 0 {
		e.cwd, _ = os.Readlink("/proc/" + strconv.FormatUint(uint64(tid), 10) + "/cwd")
	}
	c.mu.Lock()
	if len(c.m) >= 1024 {
		clear(c.m)
	}
	c.m[tid] = e
	c.mu.Unlock()
	return e.env, e.cwd
}

// readEnviron returns the variables of interest of thread tid's process.
func readEnviron(tid uint32) map[string]string {
	bp := environBufs.Get().(*[]byte)
	defer environBufs.Put(bp)
	buf := *bp
	n, err := procFiles.read(tid, "environ", buf, 0)
	if err != nil || n == 0 {
		return nil
	}
	return parseEnviron(buf[:n])
}

// parseEnviron returns the variables of interest from NUL-separated
// NAME=VALUE pairs.
func parseEnviron(b []byte) map[string]string {
	out := make(map[string]string)
	for _, kv := range bytes.Split(b, []byte{0}) {
		name, value, ok := bytes.Cut(kv, []byte{'='})
		if !ok {
			continue
		}
		switch string(name) {
		case EnvWait, EnvConsumer, EnvProducer, EnvRanges:
			out[string(name)] = string(value)
		}
	}
	return out
}

// WholeFiles reports whether thread tid's process asked for whole files
// (DYADFS_RANGES=0).
func WholeFiles(tid uint32) bool {
	env, _ := roles.get(tid)
	switch strings.ToLower(strings.TrimSpace(env[EnvRanges])) {
	case "0", "no", "false", "off":
		return true
	}
	return false
}

// decideRole applies the rules above.
func decideRole(env map[string]string, cwd, target string) Role {
	if v, ok := env[EnvWait]; ok {
		switch strings.ToLower(strings.TrimSpace(v)) {
		case "1", "yes", "true", "on":
			return RoleWait
		case "0", "no", "false", "off":
			return RoleNoWait
		}
	}
	covers := func(dir string) bool {
		if dir == "" {
			return false
		}
		if !filepath.IsAbs(dir) {
			if cwd == "" {
				return false
			}
			dir = filepath.Join(cwd, dir)
		}
		dir = filepath.Clean(dir)
		return target == dir || strings.HasPrefix(target, strings.TrimSuffix(dir, "/")+"/")
	}
	if covers(env[EnvConsumer]) {
		return RoleWait
	}
	if covers(env[EnvProducer]) {
		return RoleNoWait
	}
	return RoleDefault
}

// Comm returns the command name of thread tid's process, or "" if it cannot
// be read.
func Comm(tid uint32) string {
	pid, err := Tgid(tid)
	if err != nil {
		pid = tid
	}
	b, err := os.ReadFile("/proc/" + strconv.FormatUint(uint64(pid), 10) + "/comm")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
