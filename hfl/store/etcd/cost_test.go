package etcd_test

import (
	"context"
	"fmt"
	"testing"

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
