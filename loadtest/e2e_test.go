package loadtest

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/fanwire/fanwire/broker"
	"github.com/fanwire/fanwire/gateway"
)

// TestRunAgainstGateway runs the load generator against a real gateway (in
// this process) on a real embedded NATS server: every client must get every
// event exactly once and in order, and the gateway's figures are sampled.
func TestRunAgainstGateway(t *testing.T) {
	natsURL := startNATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := broker.DialNATS(ctx, broker.NATSConfig{URL: natsURL})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() }) // after the gateway's cleanup: cleanups run last-in first-out
	wsURL := startGateway(t, b, nil)

	var progress strings.Builder
	res, err := Run(ctx, Config{
		URL:      wsURL,
		NATSURL:  natsURL,
		Clients:  20,
		Events:   2000,
		Size:     200,
		RcvBuf:   1 << 20,
		Proc:     ProcSampler{PID: os.Getpid()}, // the gateway runs in this process
		Progress: &progress,
	})
	if err != nil {
		t.Fatal(err)
	}
	if !res.OK() || res.Delivered != 20*2000 {
		var out strings.Builder
		res.WriteTable(&out)
		t.Fatalf("run not clean:\n%s", out.String())
	}
	if !res.GatewaySampled || res.GatewayRSSHighWaterBytes <= 0 || res.LatencyMax <= 0 {
		t.Errorf("figures missing: sampled %v rss %d max latency %v", res.GatewaySampled, res.GatewayRSSHighWaterBytes, res.LatencyMax)
	}
	if !strings.Contains(progress.String(), "delivered") {
		t.Errorf("no progress line: %q", progress.String())
	}
}

// TestResumeAgainstGateway measures a catch-up against a real gateway on a
// real JetStream stream: every missed event arrives once, in order.
func TestResumeAgainstGateway(t *testing.T) {
	natsURL := startNATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := broker.DialJetStream(ctx, broker.JetStreamConfig{
		NATSConfig: broker.NATSConfig{URL: natsURL, Subjects: []string{"loadtest.>"}}, Storage: "memory"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() }) // after the gateway's cleanup: cleanups run last-in first-out
	wsURL := startGateway(t, b, []string{"loadtest.>"})
	res, err := Resume(ctx, Config{URL: wsURL, NATSURL: natsURL, Size: 200}, 5000)
	if err != nil {
		t.Fatal(err)
	}
	if !res.OK || res.Received != 5000 || res.EventsPerSec <= 0 {
		t.Fatalf("resume: %+v", res)
	}
}

// startGateway runs a real gateway on b in this process until the test ends
// and returns its WebSocket URL once it is consuming (/readyz).
func startGateway(t *testing.T, b broker.Broker, subjects []string) string {
	t.Helper()
	srv, err := gateway.New(gateway.Config{Broker: b, Subjects: subjects})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	runCtx, stopRun := context.WithCancel(context.Background())
	runDone := make(chan error, 1)
	go func() { runDone <- srv.Run(runCtx) }()
	t.Cleanup(func() {
		sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer scancel()
		if err := srv.Shutdown(sctx); err != nil {
			t.Error(err)
		}
		stopRun()
		if err := <-runDone; err != nil {
			t.Error(err)
		}
		hs.Close()
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		if resp, err := http.Get(hs.URL + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return "ws" + strings.TrimPrefix(hs.URL, "http") + "/ws"
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("gateway not ready after 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
