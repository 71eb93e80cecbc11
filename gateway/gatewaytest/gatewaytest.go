package gatewaytest

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fanwire/fanwire/gateway"
)

// Server is a running gateway.
type Server struct {
	Gateway *gateway.Server
	HTTP    *httptest.Server // its HTTP endpoints; HTTP.URL is http://127.0.0.1:port

	close func()
}

// Start builds a gateway from cfg, serves it and waits until /readyz says
// it consumes its broker. Close it before closing cfg.Broker; the cleanup
// it registers runs before cleanups registered earlier.
func Start(t testing.TB, cfg gateway.Config) *Server {
	t.Helper()
	return start(t, cfg, nil, http.DefaultClient, nil)
}

// StartListener is Start serving through wrap(l), l its loopback
// listener: a test's listener whose connections it controls (one that
// holds a client's writes up, say, for a client that reads nothing for
// certain rather than until the kernel's buffers fill).
func StartListener(t testing.TB, cfg gateway.Config, wrap func(l net.Listener) net.Listener) *Server {
	t.Helper()
	return start(t, cfg, nil, http.DefaultClient, wrap)
}

// StartTLS is Start serving HTTPS and wss:// with tc (its certificate from
// Certificates or GetCertificate); client, which must trust that
// certificate, asks /readyz. HTTP.URL is https://127.0.0.1:port.
func StartTLS(t testing.TB, cfg gateway.Config, tc *tls.Config, client *http.Client) *Server {
	t.Helper()
	return start(t, cfg, tc, client, nil)
}

func start(t testing.TB, cfg gateway.Config, tc *tls.Config, client *http.Client, wrap func(net.Listener) net.Listener) *Server {
	t.Helper()
	gw, err := gateway.New(cfg)
	if err != nil {
		t.Fatalf("gatewaytest: %v", err)
	}
	hs := httptest.NewUnstartedServer(nil)
	hs.Config = gw.HTTPServer()
	if wrap != nil {
		hs.Listener = wrap(hs.Listener)
	}
	if tc != nil {
		// Not httptest's StartTLS: it adds its own certificate, which a
		// handshake without SNI (an IP address) would get instead of tc's
		// GetCertificate.
		hs.Listener = tls.NewListener(hs.Listener, tc)
		hs.Start()
		hs.URL = "https://" + strings.TrimPrefix(hs.URL, "http://")
	} else {
		hs.Start()
	}
	runCtx, stopRun := context.WithCancel(context.Background())
	runDone := make(chan error, 1)
	go func() { runDone <- gw.Run(runCtx) }()
	var once sync.Once
	s := &Server{Gateway: gw, HTTP: hs}
	s.close = func() {
		once.Do(func() {
			sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := gw.Shutdown(sctx); err != nil {
				t.Errorf("gatewaytest: shutdown: %v", err)
			}
			stopRun()
			if err := <-runDone; err != nil {
				t.Errorf("gatewaytest: run: %v", err)
			}
			hs.Close()
		})
	}
	t.Cleanup(s.close)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if resp, err := client.Get(hs.URL + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return s
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("gatewaytest: gateway not ready after 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// WSURL is the native WebSocket endpoint, ws://127.0.0.1:port/ws (wss://
// with StartTLS).
func (s *Server) WSURL() string { return "ws" + strings.TrimPrefix(s.HTTP.URL, "http") + "/ws" }

// Close drains and stops the gateway (idempotent).
func (s *Server) Close() { s.close() }
