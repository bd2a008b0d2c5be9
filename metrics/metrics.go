// Package metrics serves dyadfs's counters to Prometheus: the histograms
// the daemon observes (how long opens wait, fetches take and carry,
// publishes take, FUSE requests take), and every counter of the status,
// read from it at each scrape.
package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Buckets: latencies from 10 µs to about 80 s; sizes from 1 KiB to 16 GiB.
var (
	latencyBuckets = prometheus.ExponentialBuckets(10e-6, 4, 12)
	sizeBuckets    = prometheus.ExponentialBuckets(1024, 4, 13)
)

// The histograms. They cost an atomic add per observation whether served
// or not.
var (
	OpenWait = prometheus.NewHistogram(histogramOpts("dyadfs_open_wait_seconds",
		"How long opens of files not here waited, until they were here or failed.", latencyBuckets))
	FetchDuration = prometheus.NewHistogramVec(histogramOpts("dyadfs_fetch_duration_seconds",
		"How long fetching a file from its owner took, retries included, by outcome (ok, error).", latencyBuckets),
		[]string{"outcome"})
	FetchBytes = prometheus.NewHistogram(histogramOpts("dyadfs_fetch_bytes",
		"Sizes of the files fetched from their owners.", sizeBuckets))
	PublishDuration = prometheus.NewHistogramVec(histogramOpts("dyadfs_publish_duration_seconds",
		"How long publishing a file's record in the store took, by outcome (ok, error).", latencyBuckets),
		[]string{"outcome"})
	FUSERequest = prometheus.NewHistogramVec(histogramOpts("dyadfs_fuse_request_duration_seconds",
		"How long the daemon took to answer FUSE requests, by operation.", latencyBuckets),
		[]string{"op"})
)

// histogramOpts names a histogram, says what it measures and sets its
// buckets: all that dyadfs's histograms set.
func histogramOpts(name, help string, buckets []float64) prometheus.HistogramOpts {
	return prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}
}

// Outcome is the label value of an error.
func Outcome(err error) string {
	if err != nil {
		return "error"
	}
	return "ok"
}

// Server serves /metrics.
type Server struct {
	srv  *http.Server
	ln   net.Listener
	done chan error
}

// Serve listens on addr and serves the histograms, the status's counters
// (status is called at each scrape; see statusCollector) and the Go
// runtime's and process's metrics.
func Serve(addr string, status func() any) (*Server, error) {
	reg := prometheus.NewRegistry()
	for _, c := range []prometheus.Collector{OpenWait, FetchDuration, FetchBytes, PublishDuration, FUSERequest,
		&statusCollector{status: status},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("metrics: %w", err)
		}
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorLog: nil}))
	s := &Server{
		srv:  &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second},
		ln:   ln,
		done: make(chan error, 1),
	}
	go func() { s.done <- s.srv.Serve(ln) }()
	return s, nil
}

// Addr is the address served on.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close stops serving.
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := s.srv.Shutdown(ctx)
	if serr := <-s.done; !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	return err
}
