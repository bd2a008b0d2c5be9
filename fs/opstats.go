package fs

import (
	"golang.org/x/sys/unix"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/dyadfs/dyadfs/metrics"

	"github.com/prometheus/client_golang/prometheus"
)

//go:generate go run ./internal/opgen -o opstats_gen.go

// maxErrno bounds the errno table; larger codes are counted as EIO.
const maxErrno = 256

// opStats counts requests, their latency and the errnos they end with.
type opStats struct {
	count  [numOps]atomic.Uint64
	errs   [numOps]atomic.Uint64
	nanos  [numOps]atomic.Uint64
	errnos [maxErrno]atomic.Uint64
	// hist are the operations' latency histograms (metrics.FUSERequest).
	hist [numOps]prometheus.Observer
}

func newOpStats() *opStats {
	s := &opStats{}
	for i := range s.hist {
		s.hist[i] = metrics.FUSERequest.WithLabelValues(opNames[i])
	}
	return s
}

func (s *opStats) record(op int, start time.Time, st fuse.Status) {
	took := time.Since(start)
	s.count[op].Add(1)
	s.nanos[op].Add(uint64(took))
	s.hist[op].Observe(took.Seconds())
	if st != fuse.OK {
		s.errs[op].Add(1)
		code := int(st)
		if code <= 0 || code >= maxErrno {
			code = int(syscall.EIO)
		}
		s.errnos[code].Add(1)
	}
}

// OpStat is one operation's counters in the status file.
type OpStat struct {
	Count     uint64  `json:"count"`
	Errors    uint64  `json:"errors"`
	MeanMicro float64 `json:"mean_us"`
}

func (s *opStats) snapshot() (map[string]OpStat, map[string]uint64) {
	ops := make(map[string]OpStat)
	for i := 0; i < numOps; i++ {
		n := s.count[i].Load()
		if n == 0 {
			continue
		}
		ops[opNames[i]] = OpStat{
			Count:     n,
			Errors:    s.errs[i].Load(),
			MeanMicro: float64(s.nanos[i].Load()) / float64(n) / 1e3,
		}
	}
	errnos := make(map[string]uint64)
	for code := 1; code < maxErrno; code++ {
		if n := s.errnos[code].Load(); n > 0 {
			errnos[errnoName(syscall.Errno(code))] = n
		}
	}
	return ops, errnos
}

// errnoName is the symbolic name of an errno ("ENOENT", "ENOTTY"), or its
// number for one Linux has no name for.
func errnoName(e syscall.Errno) string {
	if name := unix.ErrnoName(e); name != "" {
		return name
	}
	return "errno" + strconv.Itoa(int(e))
}

// countingFS wraps the node filesystem and counts every request: the one
// place that sees every operation and the errno it ends with.
type countingFS struct {
	fuse.RawFileSystem
	s *opStats
}

func newCountingFS(inner fuse.RawFileSystem, s *opStats) *countingFS {
	return &countingFS{RawFileSystem: inner, s: s}
}

// opTimer times one request from its start. The generated wrappers pass
// the wrapped call's results through it, so that each is one line.
type opTimer struct {
	s     *opStats
	op    int
	start time.Time
}

func (s *opStats) start(op int) opTimer { return opTimer{s: s, op: op, start: time.Now()} }

// status records the request's end with st, and returns st.
func (t opTimer) status(st fuse.Status) fuse.Status {
	t.s.record(t.op, t.start, st)
	return st
}

// valueTimer times a request that returns a value besides its status. It
// is a generic type because a method cannot have type parameters.
type valueTimer[T any] struct{ opTimer }

func startValue[T any](s *opStats, op int) valueTimer[T] { return valueTimer[T]{s.start(op)} }

// done records the request's end with st, and returns r and st.
func (t valueTimer[T]) done(r T, st fuse.Status) (T, fuse.Status) { return r, t.status(st) }
