package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/dyadfs/dyadfs/dtl"
	fluxdtl "github.com/dyadfs/dyadfs/dtl/flux"
	"github.com/dyadfs/dyadfs/dtl/tcp"
	"github.com/dyadfs/dyadfs/dtl/ucx"
	"github.com/dyadfs/dyadfs/dtl/wire"
	"github.com/dyadfs/dyadfs/fs/dmd"
	"github.com/dyadfs/dyadfs/hfl"
)

// newTransport makes the named backend for namespace's daemons. A new
// backend adds a case here (and its name to availableDTL).
func newTransport(name string, cfg dtl.Config, namespace string, fx *fluxConn) (dtl.Transport, error) {
	switch name {
	case "tcp":
		return tcp.New(cfg)
	case "flux":
		h, err := fx.handle()
		if err != nil {
			return nil, err
		}
		return fluxdtl.New(h, fluxService(namespace, "-dtl"), cfg)
	case "ucx":
		t, err := ucx.New(cfg)
		if err != nil {
			return nil, err // not a nil *ucx.Transport in a non-nil interface
		}
		return t, nil
	}
	return nil, fmt.Errorf("transport %s is not available in this build", name)
}

// sharesFiles reports whether this daemon moves files between nodes: not
// with a single node's store, nor when every node sees the same storage.
func sharesFiles(c *mountConfig) bool {
	return !singleNode(c.StoreURL) && !c.DMD.SharedStorage
}

// openTransport makes the configured transport, authenticated with the
// job's secret (from --secret-file, or kept in the store).
func openTransport(ctx context.Context, c *mountConfig, store hfl.Store, fx *fluxConn, log *slog.Logger) (dtl.Transport, error) {
	cfg := c.Transport
	cfg.Log = log
	if cfg.Secret == nil {
		secret, err := hfl.JobSecret(ctx, store, c.Locator.Namespace)
		if err != nil {
			return nil, fail(exitStore, err.Error())
		}
		cfg.Secret = secret
	}
	if err := hfl.CheckSecret(ctx, store, c.Locator.Namespace, c.DMD.Node, cfg.Secret); errors.Is(err, hfl.ErrSecretMismatch) {
		from := "the one kept in the store"
		if c.SecretFile != "" {
			from = "--secret-file " + c.SecretFile
		}
		return nil, fail(exitSecret, fmt.Sprintf("%v: this node's secret (%s) is not the job's; copy the secret file the job's nodes use here (it must be the same on every node), or, if the whole job moved to a new secret, run dyadfs forget --namespace %s first", err, from, c.Locator.Namespace))
	} else if err != nil {
		return nil, fail(exitStore, err.Error())
	}
	t, err := newTransport(c.DTL, cfg, c.Locator.Namespace, fx)
	if err != nil {
		return nil, fail(exitUsage, err.Error())
	}
	return t, nil
}

// joinJob serves d's published files and messages on t, registers this
// node so that others find it, and starts the locator's notices (until
// the returned function is called).
func joinJob(ctx context.Context, c *mountConfig, t dtl.Transport, d *dmd.DMD, log *slog.Logger) (stop func(), err error) {
	if err := t.Serve(d); err != nil {
		return nil, fail(exitTransport, fmt.Sprintf("transport %s on %s: %v (pass another --listen)", c.DTL, c.Transport.Listen, err))
	}
	loc := d.Locator()
	self := hfl.Member{Node: c.DMD.Node, Transport: c.DTL, Addr: t.Addr(), Started: time.Now()}
	if err := loc.Register(ctx, self, c.LeaseTTL); err != nil {
		if errors.Is(err, hfl.ErrNodeInUse) {
			return nil, fail(exitNodeInUse, err.Error()+"; give each node its own --node, or wait --lease-ttl after that daemon died")
		}
		return nil, fail(exitStore, err.Error())
	}
	nctx, stop := context.WithCancel(context.Background())
	if err := loc.StartNotices(nctx, self); err != nil {
		// Waits work through the store alone until it answers.
		log.Warn("cannot read the job's members yet; notices begin once the store answers", "err", err)
	}
	log.Info("sharing files", "transport", c.DTL, "addr", t.Addr(), "node", c.DMD.Node)
	return stop, nil
}

// transportStatus is the transport part of the status file.
func transportStatus(name string, t dtl.Transport, d *dmd.DMD) func() map[string]any {
	return func() map[string]any {
		st := d.FetchStats()
		section := map[string]any{
			"name":             name,
			"addr":             t.Addr(),
			"transfers":        st.Transfers.Load(),
			"bytes":            st.Bytes.Load(),
			"joined_transfers": st.Joined.Load(),
			"from_notices":     st.FromNotices.Load(),
			"retries":          st.Retries.Load(),
			"failed_transfers": st.Failures.Load(),
			"failed_for_good":  st.Permanent(),
			// Copies checked against their owner's checksum.
			"verified_copies":       st.Verified.Load(),
			"corrupt_copies":        st.Corrupt.Load(),
			"unverified_copies":     st.Unverified.Load(),
			"checksum_reread_bytes": st.Reread.Load(),
		}
		// What the backend served to other nodes.
		switch tr := t.(type) {
		case *tcp.Transport:
			wireStatus(section, tr.Stats())
		case *fluxdtl.Transport:
			s := tr.Stats()
			section["files_served"], section["bytes_served"], section["requests_refused"] = s.Served, s.BytesSent, s.Refused
		case *ucx.Transport:
			s := tr.Stats()
			wireStatus(section, s.Stats)
			// Registered buffers in use: a transfer waits when none is free.
			section["send_buffers_busy"], section["recv_buffers_busy"] = s.SendSlots-s.SendFree, s.RecvSlots-s.RecvFree
		}
		return section
	}
}

// wireStatus adds the counters every binary transport keeps to section:
// what it served to other nodes, and the connections to other nodes it
// opened (and authenticated) and the fetches and messages that went out on
// one already open.
func wireStatus(section map[string]any, s wire.Stats) {
	section["files_served"], section["bytes_served"], section["requests_refused"] = s.Served, s.BytesSent, s.Refused
	section["connections_opened"], section["connections_reused"] = s.Dials, s.Reused
}
