package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/dyadfs/dyadfs/dtl"
	"github.com/dyadfs/dyadfs/dtl/tcp"
	"github.com/dyadfs/dyadfs/fs/dmd"
	"github.com/dyadfs/dyadfs/hfl"
)

// singleNode reports whether the store can only be seen by this daemon,
// so that no other node can ask for a file.
func singleNode(storeURL string) bool {
	scheme, _, _ := strings.Cut(strings.ToLower(storeURL), "://")
	return scheme == "" || scheme == "embedded"
}

// newTransport makes the named backend.
func newTransport(name string, cfg dtl.Config) (dtl.Transport, error) {
	switch name {
	case "tcp":
		return tcp.New(cfg)
	}
	return nil, fmt.Errorf("transport %s is not available in this build", name)
}

// sharing is what a daemon runs to share files with other nodes.
type sharing struct {
	transport dtl.Transport
	fetcher   *dtl.Fetcher
	stop      context.CancelFunc // ends the notices' upkeep
}

// startSharing starts the data transport serving d's published files,
// registers this node so that others find it, and gives d a fetcher for
// files published elsewhere. With a single-node store or shared storage it
// does nothing.
func startSharing(ctx context.Context, c *mountConfig, loc *hfl.Locator, d *dmd.DMD, log *slog.Logger) (*sharing, error) {
	if singleNode(c.StoreURL) {
		return nil, nil
	}
	if c.DMD.SharedStorage {
		log.Info("shared storage: files are not transferred")
		return nil, nil
	}
	cfg := c.Transport
	cfg.Log = log
	if cfg.Secret == nil {
		secret, err := loc.JobSecret(ctx)
		if err != nil {
			return nil, fail(exitStore, err.Error())
		}
		cfg.Secret = secret
	}
	t, err := newTransport(c.DTL, cfg)
	if err != nil {
		return nil, fail(exitUsage, err.Error())
	}
	// Notices (hfl/notice.go) travel as the transport's messages, where
	// it carries them.
	messenger, notices := t.(dtl.Messenger)
	if notices {
		messenger.HandleMessages(loc.HandleMessage)
	}
	if err := t.Serve(d); err != nil {
		return nil, fail(exitTransport, fmt.Sprintf("transport %s on %s: %v (pass another --listen)", c.DTL, cfg.Listen, err))
	}
	self := hfl.Member{Node: c.DMD.Node, Transport: c.DTL, Addr: t.Addr(), Started: time.Now()}
	if err := loc.Register(ctx, self, c.LeaseTTL); err != nil {
		t.Close()
		if errors.Is(err, hfl.ErrNodeInUse) {
			return nil, fail(exitNodeInUse, err.Error()+"; give each node its own --node, or wait --lease-ttl after that daemon died")
		}
		return nil, fail(exitStore, err.Error())
	}
	nctx, stop := context.WithCancel(context.Background())
	if notices {
		if err := loc.EnableNotices(nctx, self, messenger, log); err != nil {
			// Waits still work through the store alone, only slower.
			log.Warn("notices are off", "err", err)
		}
	}
	f, err := dtl.NewFetcher(dtl.FetcherConfig{
		Transport:     t,
		TransportName: c.DTL,
		Owners:        loc,
		Dest:          d,
		TempDir:       d.TempDir(),
		Timeout:       c.FetchTimeout,
		Log:           log,
	})
	if err != nil {
		stop()
		t.Close()
		return nil, fail(exitInternal, err.Error())
	}
	d.SetFetcher(f)
	log.Info("sharing files", "transport", c.DTL, "addr", t.Addr(), "node", c.DMD.Node)
	return &sharing{transport: t, fetcher: f, stop: stop}, nil
}

// close stops serving peers.
func (s *sharing) close() {
	if s != nil {
		s.stop()
		s.transport.Close()
		s.fetcher.Close()
	}
}

// status is the transport part of the status file.
func (s *sharing) status() map[string]any {
	if s == nil {
		return nil
	}
	st := s.fetcher.Stats()
	return map[string]any{
		"transport": map[string]any{
			"addr":             s.transport.Addr(),
			"transfers":        st.Transfers.Load(),
			"bytes":            st.Bytes.Load(),
			"joined_transfers": st.Joined.Load(),
			"from_notices":     st.FromNotices.Load(),
			"retries":          st.Retries.Load(),
			"failed_transfers": st.Failures.Load(),
		},
	}
}
