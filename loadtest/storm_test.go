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

// TestRunStorm runs a small reconnect storm against two real gateways on
// one durable broker: every client connects to node A, node A drains
// (closing every connection with 1001) while events flow, and every client
// must come back on node B after fanwire.js's backoff and get every event
// exactly once, in order.
func TestRunStorm(t *testing.T) {
	if testing.Short() {
		t.Skip("-short (make test-quick) leaves out the slow tests: make test runs them")
	}
	for _, kind := range []string{"jetstream", "redis"} {
		t.Run(kind, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			const clients, events = 50, 3000
			cfg := Config{Clients: clients, Events: events, Size: 200, Rate: 2000, RcvBuf: 1 << 20, StormAfter: 500,
				Proc: ProcSampler{PID: os.Getpid()}} // both gateways run in this process
			_, subjects := testBroker(ctx, t, &cfg, kind)
			nodeB := gatewaytest.Start(t, gateway.Config{Broker: dialNode(ctx, t, &cfg, kind), Subjects: subjects})
			nodeA := gatewaytest.Start(t, gateway.Config{Broker: dialNode(ctx, t, &cfg, kind), Subjects: subjects})
			cfg.URL, cfg.StormURL = nodeA.WSURL(), nodeB.WSURL()
			cfg.StormStop = func(context.Context) error { nodeA.Close(); return nil }

			res, err := Run(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			var table strings.Builder
			res.WriteTable(&table)
			st := res.Storm
			if !res.OK() || res.Delivered != clients*events || res.Disconnects != 0 || st == nil {
				t.Fatalf("run not clean:\n%s", table.String())
			}
			if st.Back != clients || st.CaughtUp != clients || st.ClosedGoingAway != clients || st.Attempts < clients ||
				st.After < 500 || st.AllBack < st.BackMedian || st.AllCaughtUp < st.AllBack || !st.NodeSampled || st.NodeRSSHighWater <= 0 {
				t.Fatalf("storm figures: %+v\n%s", *st, table.String())
			}
			if !strings.Contains(table.String(), "storm back on node B") {
				t.Errorf("the table has no storm rows:\n%s", table.String())
			}
			t.Logf("\n%s", table.String())
			var js strings.Builder
			if err := res.WriteJSON(&js); err != nil || !strings.Contains(js.String(), `"storm":{"ok":true`) {
				t.Errorf("JSON without the storm: %v\n%s", err, js.String())
			}
		})
	}
}

// dialNode dials a broker of kind for one more gateway, on the servers
// testBroker started for cfg, closed after that gateway (cleanups run
// last-in first-out).
func dialNode(ctx context.Context, t *testing.T, cfg *Config, kind string) broker.Broker {
	t.Helper()
	var b broker.Broker
	var err error
	switch kind {
	case "jetstream":
		b, err = broker.DialJetStream(ctx, broker.JetStreamConfig{
			NATSConfig: broker.NATSConfig{URL: cfg.NATSURL, Subjects: []string{"loadtest.>"}}, Storage: "memory"})
	case "redis":
		b, err = broker.DialRedis(ctx, broker.RedisConfig{URL: cfg.RedisURL, Stream: cfg.Stream})
	default:
		t.Fatalf("no durable broker %q", kind)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// TestBackoffPolicy checks the reconnect waits against fanwire.js's
// policy: retry n waits at most min(30 s, 500 ms·2ⁿ), never less than 0,
// and a connection that stayed up 10 s starts the count again.
func TestBackoffPolicy(t *testing.T) {
	b := newBackoff(1, 7)
	for n, limit := range []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second,
		8 * time.Second, 16 * time.Second, 30 * time.Second, 30 * time.Second} {
		if got := backoffCap(n); got != limit {
			t.Fatalf("cap of retry %d = %v, want %v", n, got, limit)
		}
		for range 100 {
			b.attempt = n
			if d := b.next(); d < 0 || d > limit {
				t.Fatalf("retry %d waits %v, want 0 to %v", n, d, limit)
			}
		}
	}
	if backoffCap(1000) != backoffMax {
		t.Errorf("cap of retry 1000 = %v, want %v", backoffCap(1000), backoffMax)
	}
	now := time.Now()
	b.attempt = 5
	b.connected(now.Add(-9*time.Second), now)
	if b.attempt != 5 {
		t.Errorf("a connection up 9 s reset the count to %d", b.attempt)
	}
	b.connected(now.Add(-10*time.Second), now)
	if b.attempt != 0 {
		t.Errorf("a connection up 10 s left the count at %d", b.attempt)
	}
	a, c := newBackoff(3, 1), newBackoff(3, 1)
	if a.next() != c.next() {
		t.Errorf("one seed and client drew different waits")
	}
}

// TestPeakCores checks the busiest second of node B's samples: only spans
// of a second or more count, and a window shorter than a second is taken
// whole.
func TestPeakCores(t *testing.T) {
	t0 := time.Unix(0, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	for _, tc := range []struct {
		name    string
		samples []nodeSample
		want    float64
	}{
		{"none", nil, 0},
		{"half a second", []nodeSample{{at: at(0), cpu: 1}, {at: at(500), cpu: 1.5}}, 1},
		{"a short burst does not count alone", []nodeSample{
			{at: at(0), cpu: 0}, {at: at(1000), cpu: 0.5}, {at: at(1100), cpu: 0.8}, {at: at(2000), cpu: 1.0},
		}, 0.8 / 1.1}, // 0 to 1.1 s; 1 to 1.1 s alone would say 3 cores
		{"the busiest of three seconds", []nodeSample{
			{at: at(0), cpu: 0}, {at: at(1000), cpu: 0.2}, {at: at(2000), cpu: 1.9}, {at: at(3000), cpu: 2.0},
		}, 1.7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := peakCores(tc.samples); got < tc.want-1e-9 || got > tc.want+1e-9 {
				t.Errorf("peakCores = %v, want %v", got, tc.want)
			}
		})
	}
}
