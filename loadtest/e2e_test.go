package loadtest

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/fanwire/fanwire/broker"
	"github.com/fanwire/fanwire/gateway"
	"github.com/fanwire/fanwire/gateway/gatewaytest"
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
// and returns its WebSocket URL once it is consuming.
func startGateway(t *testing.T, b broker.Broker, subjects []string) string {
	t.Helper()
	return gatewaytest.Start(t, gateway.Config{Broker: b, Subjects: subjects}).WSURL()
}
