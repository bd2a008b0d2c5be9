//go:build flux

package flux_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/dyadfs/dyadfs/flux"
	"github.com/dyadfs/dyadfs/flux/fluxtest"
	"github.com/dyadfs/dyadfs/hfl/store"
	fluxstore "github.com/dyadfs/dyadfs/hfl/store/flux"
	"github.com/dyadfs/dyadfs/hfl/store/storetest"
)

func open(t testing.TB, h *flux.Handle, name string) *fluxstore.Store {
	t.Helper()
	cfg := fluxstore.DefaultConfig(name)
	cfg.Prefix = name + "-"
	s, err := fluxstore.Open(context.Background(), h, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestFluxStoreConformance runs the store conformance suite on the Flux
// KVS, with the store on rank 1 and the serializer on rank 0: every write
// crosses the overlay, every read is rank 1's.
func TestFluxStoreConformance(t *testing.T) {
	in := fluxtest.Start(t, 2)
	h0, h1 := in.Open(t, 0), in.Open(t, 1)
	var n atomic.Int64
	storetest.Run(t, func(t *testing.T) store.Store {
		name := fmt.Sprintf("t%d", n.Add(1))
		ser := open(t, h0, name)
		t.Cleanup(func() { ser.Close() })
		return open(t, h1, name)
	})
}

// TestFluxStoreConformanceOnRankZero runs it with the store of rank 0's
// daemon, which hands its writes to its own serializer without a Flux
// request.
func TestFluxStoreConformanceOnRankZero(t *testing.T) {
	in := fluxtest.Start(t, 1)
	h0 := in.Open(t, 0)
	var n atomic.Int64
	storetest.Run(t, func(t *testing.T) store.Store {
		return open(t, h0, fmt.Sprintf("z%d", n.Add(1)))
	})
}

// TestFluxRecordsCounted: the count of records stays right across writes
// of new and existing keys and removals, also when the serializer's daemon
// restarts and finds records it did not write.
func TestFluxRecordsCounted(t *testing.T) {
	in := fluxtest.Start(t, 2)
	h0, h1 := in.Open(t, 0), in.Open(t, 1)
	ctx := context.Background()
	s := open(t, h1, "count")
	defer s.Close()
	slot := func(name string) store.Slot { return store.Slot{Key: "job/" + name, Dir: "job/", Name: name} }
	publish := func(name string) {
		t.Helper()
		if _, err := s.Publish(ctx, slot(name), store.Record{Path: name, Owner: "b", Size: 1, Mode: 0o100644}); err != nil {
			t.Fatal(err)
		}
	}
	want := func(n int64) {
		t.Helper()
		if h, err := s.Health(ctx, "job"); err != nil || h.Records != n {
			t.Fatalf("Health: %+v, %v; want %d records", h, err, n)
		}
	}
	ser := open(t, h0, "count")
	publish("a")
	publish("b")
	publish("a")
	want(2)
	ser.Close()
	ser = open(t, h0, "count") // a new daemon on rank 0
	defer ser.Close()
	publish("a")
	publish("c")
	want(3)
	if _, err := s.Remove(ctx, slot("b"), store.RemoveCond{}); err != nil {
		t.Fatal(err)
	}
	publish("b")
	publish("b")
	want(3)
}

// TestFluxRegistrationOfADeadDaemon: a value a daemon registered is gone
// once its Flux handle is (the daemon exited or was killed), without any
// TTL to wait for; one registered by a live daemon stays.
func TestFluxRegistrationOfADeadDaemon(t *testing.T) {
	in := fluxtest.Start(t, 3)
	h0 := in.Open(t, 0)
	ser := open(t, h0, "reg")
	defer ser.Close()
	ctx := context.Background()
	for _, rank := range []int{1, 2} {
		h, err := flux.Open(in.URIs[rank])
		if err != nil {
			t.Fatal(err)
		}
		s := open(t, h, "reg")
		if err := s.Register(ctx, fmt.Sprintf("job/nodes/n%d", rank), []byte("here"), time.Minute, nil); err != nil {
			t.Fatal(err)
		}
		if rank == 2 {
			h.Close() // dies without withdrawing: its service goes with its handle
		} else {
			t.Cleanup(func() { s.Close(); h.Close() })
		}
	}
	if v, err := ser.Get(ctx, "job/nodes/n1"); err != nil || string(v) != "here" {
		t.Fatalf("a live daemon's registration: %q, %v", v, err)
	}
	start := time.Now()
	if _, err := ser.Get(ctx, "job/nodes/n2"); !errors.Is(err, store.ErrNotFound) || time.Since(start) > 5*time.Second {
		t.Fatalf("a dead daemon's registration: %v after %v, want ErrNotFound at once", err, time.Since(start))
	}
	if m, err := ser.List(ctx, "job/nodes/"); err != nil || len(m) != 1 {
		t.Fatalf("list: %v, %v; want only the live one", m, err)
	}
}

// TestFluxHealthSize: the health of the Flux store tells the size of the
// instance's content store and the disk it may fill, as etcd's tells its
// database's.
func TestFluxHealthSize(t *testing.T) {
	in := fluxtest.Start(t, 2)
	h0, h1 := in.Open(t, 0), in.Open(t, 1)
	ser := open(t, h0, "size")
	defer ser.Close()
	s := open(t, h1, "size")
	defer s.Close()
	ctx := context.Background()
	if _, err := s.Publish(ctx, store.Slot{Key: "job/k", Dir: "job/", Name: "k"}, store.Record{Path: "k", Owner: "a", Size: 1, Mode: 0o100644}); err != nil {
		t.Fatal(err)
	}
	h, err := s.Health(ctx, "job")
	if err != nil || h.Records != 1 || h.Bytes <= 0 || h.Quota <= h.Bytes {
		t.Fatalf("Health: %+v, %v; want 1 record, a database size and a larger quota", h, err)
	}
}

// TestFluxPublishWhileBrokerLoadsNamespace: a rank's broker that first
// loads a job's namespace while a commit is made there can miss that
// commit's event (it subscribes after loading); a publish from that rank
// must still return, and its lookup see the record, instead of waiting for
// the next commit. Each round is a new namespace, read (a wait) and
// written at once from rank 1; the race comes about in about one round in
// a hundred.
func TestFluxPublishWhileBrokerLoadsNamespace(t *testing.T) {
	in := fluxtest.Start(t, 2)
	h0, h1 := in.Open(t, 0), in.Open(t, 1)
	slot := store.Slot{Key: "job/f", Dir: "job/", Name: "f"}
	for i := 0; i < 300; i++ {
		name := fmt.Sprintf("load%d", i)
		ser := open(t, h0, name)
		s := open(t, h1, name)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		waited := make(chan error, 1)
		go func() {
			_, err := s.Wait(ctx, slot, 0)
			waited <- err
		}()
		out, err := s.Publish(ctx, slot, store.Record{Path: "f", Owner: "b", Size: 1, Mode: 0o100644})
		if err == nil {
			var got store.Record
			if got, err = s.Lookup(ctx, slot); err == nil && got.Generation != out.Generation {
				err = fmt.Errorf("lookup after publish: generation %d, want %d", got.Generation, out.Generation)
			}
		}
		if err == nil {
			err = <-waited
		}
		cancel()
		s.Close()
		ser.Close()
		if err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
	}
}

// BenchmarkPublish times one publish at a time through the store of each
// rank (rank 0's daemon runs the serializer), against a bare one-key KVS
// commit from the same rank: what the store adds to the KVS's own cost.
func BenchmarkPublish(b *testing.B) {
	in := fluxtest.Start(b, 2)
	ctx := context.Background()
	h0 := in.Open(b, 0)
	ser := open(b, h0, "bench")
	defer ser.Close()
	for rank, s := range []*fluxstore.Store{ser, open(b, in.Open(b, 1), "bench")} {
		b.Run(fmt.Sprintf("store-rank%d", rank), func(b *testing.B) {
			for i := range b.N {
				name := fmt.Sprintf("f%d-%d", rank, i)
				if _, err := s.Publish(ctx, store.Slot{Key: "job/d/" + name, Dir: "job/d/", Name: name},
					store.Record{Path: "d/" + name, Owner: "a", Size: 4096, Mode: 0o100644}); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("commit-rank%d", rank), func(b *testing.B) {
			h := in.Open(b, rank)
			ns := fmt.Sprintf("benchcommit%d", rank)
			if err := h.CreateNamespace(ctx, ns, ^uint32(0)); err != nil && !errors.Is(err, syscall.EEXIST) {
				b.Fatal(err)
			}
			v := make([]byte, 200)
			for i := range b.N {
				if _, err := h.Commit(ctx, ns, []flux.Op{flux.Put(fmt.Sprintf("d.k%d", i), v)}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
