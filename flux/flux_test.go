//go:build flux

package flux_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dyadfs/dyadfs/flux"
	"github.com/dyadfs/dyadfs/flux/fluxtest"
)

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// TestHandle: rank and size; KVS commit, lookup, listing, watch, across
// ranks; services and RPCs, one response and streams; errors as errnos.
func TestHandle(t *testing.T) {
	in := fluxtest.Start(t, 2)
	h0, h1 := in.Open(t, 0), in.Open(t, 1)
	if h0.Rank() != 0 || h1.Rank() != 1 || h0.Size() != 2 {
		t.Fatalf("ranks %d, %d, size %d", h0.Rank(), h1.Rank(), h0.Size())
	}
	ctx := ctxFor(t)

	t.Run("KVS", func(t *testing.T) {
		if err := h0.CreateNamespace(ctx, "fluxtest", 0); err != nil {
			t.Fatal(err)
		}
		if err := h0.CreateNamespace(ctx, "fluxtest", 0); !errors.Is(err, syscall.EEXIST) {
			t.Fatalf("second create: %v, want EEXIST", err)
		}
		seq, err := h0.Commit(ctx, "fluxtest", []flux.Op{flux.Put("d.a", []byte("one")), flux.Put("d.b", []byte{})})
		if err != nil || seq <= 0 {
			t.Fatalf("commit: %d, %v", seq, err)
		}
		if err := h1.WaitVersion(ctx, "fluxtest", seq); err != nil {
			t.Fatal(err)
		}
		for _, rank := range []uint32{0, flux.NodeAny} {
			if got, err := h1.RootSeq(ctx, "fluxtest", rank); err != nil || got != seq {
				t.Fatalf("root sequence from rank 1 of rank %d's broker: %d, %v; want %d", rank, got, err, seq)
			}
		}
		if _, err := h1.RootSeq(ctx, "fluxtest-none", 0); !errors.Is(err, syscall.EOPNOTSUPP) {
			t.Fatalf("root sequence of a namespace that is not there: %v, want EOPNOTSUPP", err)
		}
		if v, err := h1.Lookup(ctx, "fluxtest", "d.a"); err != nil || string(v) != "one" {
			t.Fatalf("lookup on rank 1: %q, %v", v, err)
		}
		if v, err := h1.Lookup(ctx, "fluxtest", "d.b"); err != nil || len(v) != 0 {
			t.Fatalf("lookup of an empty value: %q, %v", v, err)
		}
		if _, err := h1.Lookup(ctx, "fluxtest", "d.none"); !errors.Is(err, flux.ErrNotFound) {
			t.Fatalf("lookup of a missing key: %v", err)
		}
		if names, err := h1.ListDir(ctx, "fluxtest", "d"); err != nil || fmt.Sprint(names) != "[a b]" {
			t.Fatalf("list: %v, %v", names, err)
		}
		wctx, cancel := context.WithCancel(ctx)
		events, err := h1.Watch(wctx, "fluxtest", "w.k")
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range []string{"1", "2"} {
			if _, err := h0.Commit(ctx, "fluxtest", []flux.Op{flux.Put("w.k", []byte(v))}); err != nil {
				t.Fatal(err)
			}
			select {
			case ev := <-events:
				if ev.Err != nil || string(ev.Value) != v {
					t.Fatalf("watch: %q, %v; want %q", ev.Value, ev.Err, v)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("watch: no event for %s", v)
			}
		}
		cancel()
		for ev := range events {
			if ev.Err != nil {
				t.Fatalf("watch ended with %v", ev.Err)
			}
		}
		if err := h0.RemoveNamespace(ctx, "fluxtest"); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("RPC", func(t *testing.T) {
		s1, err := h1.Serve(ctx, "dyadfstest")
		if err != nil {
			t.Fatal(err)
		}
		s1.Handle("echo", func(r flux.Request) { r.Respond(append([]byte("rank1:"), r.Payload()...)) })
		s1.Handle("fail", func(r flux.Request) { r.RespondError(syscall.EACCES, "no") })
		s1.Handle("count", func(r flux.Request) {
			for i := range 5 {
				r.Stream([]byte{byte(i)})
			}
			r.RespondError(syscall.ENODATA, "")
		})
		if _, err := h1.Serve(ctx, "dyadfstest"); !errors.Is(err, syscall.EEXIST) {
			t.Fatalf("a second service of one name: %v, want EEXIST", err)
		}
		if got, err := h0.RPC(ctx, "dyadfstest.echo", 1, []byte("hi"), 5*time.Second); err != nil || string(got) != "rank1:hi" {
			t.Fatalf("rpc: %q, %v", got, err)
		}
		if _, err := h0.RPC(ctx, "dyadfstest.fail", 1, nil, 5*time.Second); !errors.Is(err, syscall.EACCES) {
			t.Fatalf("rpc answered with an error: %v", err)
		}
		if _, err := h0.RPC(ctx, "dyadfstest.echo", 0, nil, 5*time.Second); !errors.Is(err, syscall.ENOSYS) {
			t.Fatalf("rpc to a rank without the service: %v, want ENOSYS", err)
		}
		if _, err := h0.RPC(ctx, "dyadfstest.echo", 7, nil, 5*time.Second); !errors.Is(err, syscall.EHOSTUNREACH) {
			t.Fatalf("rpc to a rank that does not exist: %v, want EHOSTUNREACH", err)
		}
		var got []byte
		if err := h0.Stream(ctx, "dyadfstest.count", 1, nil, func(b []byte) error { got = append(got, b...); return nil }); err != nil || !bytes.Equal(got, []byte{0, 1, 2, 3, 4}) {
			t.Fatalf("stream: %v, %v", got, err)
		}
		// Many at once, from many goroutines.
		var wg sync.WaitGroup
		errs := make(chan error, 200)
		for i := range 200 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				p := []byte(fmt.Sprint(i))
				got, err := h0.RPC(ctx, "dyadfstest.echo", 1, p, 10*time.Second)
				if err == nil && string(got) != "rank1:"+string(p) {
					err = fmt.Errorf("got %q", got)
				}
				errs <- err
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		s1.Close()
	})

	t.Run("Events", func(t *testing.T) {
		sctx, stop := context.WithCancel(ctx)
		evs, err := h1.Subscribe(sctx, "dyadfs-test.")
		if err != nil {
			t.Fatal(err)
		}
		h := in.Open(t, 1)
		closing, err := h.Subscribe(ctx, "dyadfs-test.")
		if err != nil {
			t.Fatal(err)
		}
		for i := range 3 {
			if err := h0.Publish(ctx, fmt.Sprintf("dyadfs-test.e%d", i), []byte{byte(i)}); err != nil {
				t.Fatal(err)
			}
		}
		if err := h0.Publish(ctx, "other.topic", nil); err != nil {
			t.Fatal(err)
		}
		for i := range 3 {
			select {
			case ev := <-evs:
				if ev.Topic != fmt.Sprintf("dyadfs-test.e%d", i) || !bytes.Equal(ev.Payload, []byte{byte(i)}) {
					t.Fatalf("event %d: %q %v", i, ev.Topic, ev.Payload)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("event %d did not arrive", i)
			}
		}
		// Ending the context or closing the handle ends the channel.
		stop()
		h.Close()
		for _, ch := range []<-chan flux.Event{evs, closing} {
			deadline := time.After(10 * time.Second)
		drain:
			for {
				select {
				case _, ok := <-ch:
					if !ok {
						break drain
					}
				case <-deadline:
					t.Fatal("a subscription's channel stayed open")
				}
			}
		}
	})

	t.Run("Close", func(t *testing.T) {
		h := in.Open(t, 1)
		before := runtime.NumGoroutine()
		h.Close()
		if _, err := h.Lookup(ctx, "", "x"); !errors.Is(err, flux.ErrClosed) {
			t.Fatalf("lookup on a closed handle: %v", err)
		}
		if n := runtime.NumGoroutine(); n > before {
			t.Fatalf("%d goroutines after Close, %d before", n, before)
		}
	})
}

// TestNotBuilt is in stub_test.go.
