package etcd_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dyadfs/dyadfs/hfl"
	"github.com/dyadfs/dyadfs/hfl/store/etcd"
	"github.com/dyadfs/dyadfs/hfl/store/etcd/etcdtest"
)

// BenchmarkEtcdCostPerFile measures what one file costs etcd: the database
// bytes and revisions of its publish, of a rewrite (the claim, then the
// new version), and what is left of it once etcd's history is compacted
// and the database defragmented (the live records). Records are those a
// producer publishes: run1/stepNNNNNN.dat, 4 KiB, keyed as DYAD does.
// scripts/bench.sh reports these rows; README "Sizing the store" quotes them.
func BenchmarkEtcdCostPerFile(b *testing.B) {
	srv := etcdtest.Start(b)
	ctx := context.Background()
	s := openEtcdB(b, srv.Endpoints())
	raw, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoints()}})
	if err != nil {
		b.Fatal(err)
	}
	defer raw.Close()
	cfg := hfl.DefaultLocatorConfig()
	cfg.Namespace = "job"
	loc, err := hfl.NewLocator(cfg, s, nil, hfl.SingleNode)
	if err != nil {
		b.Fatal(err)
	}
	status := func() (size, inUse, rev int64) {
		st, err := raw.Status(ctx, srv.Endpoints())
		if err != nil {
			b.Fatal(err)
		}
		return st.DbSize, st.DbSizeInUse, st.Header.Revision
	}
	const n = 20000
	rec := func(i int) hfl.Record {
		return hfl.Record{Path: fmt.Sprintf("run1/step%06d.dat", i), Owner: "node017", Size: 4096, Mode: 0o100644, Uid: 1000, Gid: 1000, MtimeNs: 1764000000123456789}
	}
	for range b.N {
		size0, _, rev0 := status()
		for i := range n {
			r := rec(i)
			if _, err := s.Publish(ctx, loc.Slot(r.Path), r); err != nil {
				b.Fatal(err)
			}
		}
		size1, _, rev1 := status()
		for i := range n {
			r := rec(i)
			claim := r
			claim.Writing = true
			if _, err := s.Publish(ctx, loc.Slot(r.Path), claim); err != nil {
				b.Fatal(err)
			}
			r.MtimeNs++
			if _, err := s.Publish(ctx, loc.Slot(r.Path), r); err != nil {
				b.Fatal(err)
			}
		}
		size2, _, rev2 := status()
		if err := etcdtest.Reclaim(ctx, srv.Endpoints()); err != nil {
			b.Fatal(err)
		}
		_, live, _ := status()
		b.ReportMetric(float64(size1-size0)/n, "publish-B/file")
		b.ReportMetric(float64(rev1-rev0)/n, "publish-revs/file")
		b.ReportMetric(float64(size2-size1)/n, "rewrite-B/file")
		b.ReportMetric(float64(rev2-rev1)/n, "rewrite-revs/file")
		b.ReportMetric(float64(live)/n, "live-B/file")
	}
}

func openEtcdB(b *testing.B, endpoint string) *etcd.Store {
	s, err := etcd.Open(context.Background(), etcd.DefaultConfig(endpoint))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	return s
}

// BenchmarkEtcdCPUByBatch measures what one publish costs etcd and the
// publishing daemon's client as more publishes share a transaction: k
// publishes at once, again and again (the first of each round usually
// goes alone, so files/txn says what the transactions held). A lone
// writer's waiting close makes transactions of one; a busy node's
// releases and many writers make larger ones (see batch.go).
// scripts/bench.sh cost runs it; docs/performance.md quotes it.
func BenchmarkEtcdCPUByBatch(b *testing.B) {
	srv := etcdtest.Start(b)
	ctx := context.Background()
	s := openEtcdB(b, srv.Endpoints())
	cfg := hfl.DefaultLocatorConfig()
	cfg.Namespace = "job"
	loc, err := hfl.NewLocator(cfg, s, nil, hfl.SingleNode)
	if err != nil {
		b.Fatal(err)
	}
	const files = 4000
	for _, k := range []int{1, 2, 4, 8, 16, 32, 64} {
		b.Run(fmt.Sprintf("batch=%d", k), func(b *testing.B) {
			for n := range b.N {
				txns0, _ := s.Commits()
				etcd0, self0 := procCPU(b, srv.Pid()), selfCPU()
				for first := 0; first < files; first += k {
					var wg sync.WaitGroup
					for i := first; i < min(first+k, files); i++ {
						wg.Go(func() {
							r := hfl.Record{Path: fmt.Sprintf("b%d/r%d/step%06d.dat", k, n, i), Owner: "node017", Size: 4096, Mode: 0o100644, MtimeNs: 1764000000123456789}
							if _, err := s.Publish(ctx, loc.Slot(r.Path), r); err != nil {
								b.Error(err)
							}
						})
					}
					wg.Wait()
				}
				txns1, _ := s.Commits()
				etcd1, self1 := procCPU(b, srv.Pid()), selfCPU()
				b.ReportMetric(float64((etcd1-etcd0).Microseconds())/files, "etcd-µs/file")
				b.ReportMetric(float64((self1-self0).Microseconds())/files, "client-µs/file")
				b.ReportMetric(float64(files)/float64(txns1-txns0), "files/txn")
			}
		})
	}
}

// procCPU is the CPU time process pid spent so far (all its threads).
func procCPU(b *testing.B, pid int) time.Duration {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		b.Fatal(err)
	}
	// Fields after the command's closing parenthesis: utime and stime
	// are the 12th and 13th, in clock ticks (100 a second on Linux).
	f := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+1:]))
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// selfCPU is this process's CPU time so far.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
