package main

// The metrics endpoint that tail (--metrics-addr) and exporter serve.

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

	"github.com/omnibus-go/omnibus/promomnibus"
)

// metricsServer serves a Collector's metrics, with the Go runtime's and
// the process's, at /metrics.
type metricsServer struct {
	url  string // http://host:port/metrics, the port resolved
	srv  *http.Server
	done chan error
}

// serveMetrics listens on addr (host:port; port 0 picks one) and serves
// col until close. A busy or invalid address is an error now, not later.
func serveMetrics(addr string, col *promomnibus.Collector) (*metricsServer, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(col, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics-addr %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	s := &metricsServer{
		url:  "http://" + ln.Addr().String() + "/metrics",
		srv:  &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second},
		done: make(chan error, 1),
	}
	go func() { s.done <- s.srv.Serve(ln) }() // ends with close
	return s, nil
}

// close stops the server, letting a scrape in progress finish within a
// few seconds.
func (s *metricsServer) close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := s.srv.Shutdown(ctx)
	if serr := <-s.done; !errors.Is(serr, http.ErrServerClosed) {
		return serr
	}
	return err
}
