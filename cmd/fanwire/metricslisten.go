package main

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
)

// metricsListenUsage is --metrics-listen's help, the same for every role.
const metricsListenUsage = "when set, serve /metrics on this address instead of --listen (which then answers it 404): keep the metrics off the address clients reach"

// startMetrics serves reg's /metrics on addr ("": not at all) until stop,
// which waits for the server's goroutine. A failure to listen is an error
// at start naming the flag.
func startMetrics(addr string, reg *prometheus.Registry, log *zap.Logger) (stop func(), err error) {
	if addr == "" {
		return func() {}, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics-listen: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	ms := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan struct{})
	go func() {
		defer close(served)
		if err := ms.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics listener stopped", zap.Error(err))
		}
	}()
	log.Info("metrics served apart", zap.String("metrics", "http://"+ln.Addr().String()+"/metrics"))
	return func() {
		_ = ms.Close()
		<-served
	}, nil
}
