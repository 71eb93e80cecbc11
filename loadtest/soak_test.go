package loadtest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fanwire/fanwire/gateway"
	"github.com/fanwire/fanwire/gateway/gatewaytest"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// TestRunWithChurn runs a short churn soak against a real gateway (in this
// process, with the Go collector on its /metrics, as `fanwire ws`
// registers it) on a real embedded NATS: the stable clients get every
// event once and in order, churners connect many times and see clean
// streams, and the goroutines, heap and connection gauges come back.
// The gateway shares this process, so its goroutine count includes the
// load generator's: the churners' goroutines have exited before the
// after figures are read.
func TestRunWithChurn(t *testing.T) {
	if testing.Short() {
		t.Skip("-short (make test-quick) leaves out the slow tests: make test runs them")
	}
	for _, tc := range []struct{ proto, kind string }{
		{ProtoNative, "nats"}, {ProtoGraphQL, "nats"}, {ProtoNative, "jetstream"},
	} {
		t.Run(tc.proto+"/"+tc.kind, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cfg := Config{Proto: tc.proto, Clients: 10, Size: 200, RcvBuf: 1 << 20,
				Churn: 3 * time.Second, ChurnClients: 10, Rate: 400, ChurnBaseline: 2 * time.Second, ChurnSettle: 4 * time.Second}
			b, subjects := testBroker(ctx, t, &cfg, tc.kind)
			reg := prometheus.NewRegistry()
			reg.MustRegister(collectors.NewGoCollector())
			cfg.URL = gatewaytest.Start(t, gateway.Config{Broker: b, Subjects: subjects, Registry: reg}).WSURL()

			res, err := Run(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			var table strings.Builder
			res.WriteTable(&table)
			t.Log("\n" + table.String())
			c := res.Churn
			if !res.OK() || c == nil || res.Delivered != int64(10*res.Events) || res.Disconnects != 0 {
				t.Fatalf("run not clean:\n%s", table.String())
			}
			if res.Events != 400*9 {
				t.Errorf("events %d, want Rate × (2s + 3s + 4s) = 3600", res.Events)
			}
			// 10 churners over 3 s, sessions of at most half a second's
			// events: far more than 20 connects unless churn is broken.
			if c.Connects < 20 || c.Delivered == 0 || c.Drops == 0 || c.CleanCloses == 0 {
				t.Errorf("too little churn: %+v", c)
			}
			if tc.proto == ProtoNative && c.Resubscribes == 0 {
				t.Errorf("no subscription hand-over in %d resubscribing sessions", c.Resubscribing)
			}
			if c.Goroutines.Peak <= c.Goroutines.Baseline || !c.HasConnections || c.Connections.Baseline != 10 {
				t.Errorf("gateway figures: goroutines %+v, connections %+v", c.Goroutines, c.Connections)
			}
		})
	}
}

// TestRunWithChurnNeedsMetrics checks that a churn run fails before any
// client connects when the gateway's /metrics has no Go collector.
func TestRunWithChurnNeedsMetrics(t *testing.T) {
	natsURL, b := startNATSBroker(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	wsURL := startGateway(t, b, nil) // a registry without the Go collector
	_, err := Run(ctx, Config{URL: wsURL, NATSURL: natsURL, Clients: 2, Churn: time.Second, Timeout: 5 * time.Second})
	if err == nil || !strings.Contains(err.Error(), "go_goroutines") {
		t.Fatalf("err = %v, want one naming go_goroutines", err)
	}
}

func TestParseGauges(t *testing.T) {
	page := `# HELP go_goroutines Number of goroutines that currently exist.
# TYPE go_goroutines gauge
go_goroutines 231
go_memstats_heap_inuse_bytes 1.1853824e+07
go_memstats_next_gc_bytes 2.5e+07
go_memstats_stack_inuse_bytes 1e+06
go_gc_gogc_percent 100
fanwire_connections 100
fanwire_subscriptions{x="y"} 3
fanwire_subscriptions 100 1764500000000
go_goroutines_other 7
`
	g, err := parseGauges(strings.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}
	want := gauges{goroutines: 231, heapInuse: 11853824, nextGC: 25_000_000, stackInuse: 1_000_000, gogc: 100,
		connections: 100, subscriptions: 100, hasConns: true, hasSubs: true}
	if g != want {
		t.Fatalf("got %+v, want %+v", g, want)
	}
	if live := g.liveHeap(); live != 12_000_000 { // goal 25 MB = 2 × live + 1 MB of stacks
		t.Errorf("live heap = %d, want 12000000", live)
	}
	g.gogc = 50
	if live := g.liveHeap(); live != 16_333_333 { // 25 MB = 1.5 × live + 0.5 MB
		t.Errorf("live heap at GOGC=50 = %d, want 16333333", live)
	}
	if _, err := parseGauges(strings.NewReader("fanwire_connections 1\n")); err == nil {
		t.Fatal("a page without the Go collector parsed")
	}
}

func TestListsSub(t *testing.T) {
	msg := []byte(`{"type":"event","subject":"a.b","subs":["r2","s1"],"data":{"subs":["r3"]}}`)
	for id, want := range map[string]bool{"s1": true, "r2": true, "r3": false, "s": false, "1": false} {
		if got := listsSub(msg, id); got != want {
			t.Errorf("listsSub(%q) = %v, want %v", id, got, want)
		}
	}
}

func TestChurnConfig(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"events given", Config{Churn: time.Second, Events: 10}, "Events 10 with Churn"},
		{"settle too short", Config{Churn: time.Second, ChurnBaseline: 4 * time.Second, ChurnSettle: 2 * time.Second}, "ChurnSettle"},
		{"with resume", Config{Churn: time.Second, ResumeShare: 0.5, Broker: "jetstream"}, "ResumeShare with Churn"},
		{"bad metrics url", Config{Churn: time.Second, MetricsURL: "ftp://x/metrics"}, "MetricsURL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.URL, cfg.NATSURL = "ws://127.0.0.1:1/ws", "nats://127.0.0.1:1"
			if err := cfg.setDefaults(); err != nil {
				t.Fatal(err)
			}
			err := cfg.validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one containing %q", err, tc.want)
			}
		})
	}
	cfg := Config{URL: "wss://gw.example:8443/x/ws", NATSURL: "nats://127.0.0.1:1", Churn: 30 * time.Second}
	if err := cfg.setDefaults(); err != nil {
		t.Fatal(err)
	}
	if err := cfg.validate(); err != nil {
		t.Fatal(err)
	}
	got := fmt.Sprint(cfg.MetricsURL, " ", cfg.Rate, " ", cfg.Events, " ", cfg.ChurnClients)
	if want := "https://gw.example:8443/metrics 500 25000 50"; got != want {
		t.Errorf("defaults: %q, want %q", got, want)
	}
}

// TestChurnVerdict checks what fails a churn run, and that the table
// says why.
func TestChurnVerdict(t *testing.T) {
	clean := func() *ChurnStats {
		return &ChurnStats{Connects: 100, GoroutineSlack: goroutineSlack, HasConnections: true,
			Goroutines: Gauge{200, 400, 203}, Heap: Gauge{10 << 20, 30 << 20, 14 << 20}, HeapLimit: 23 << 20,
			Connections: Gauge{100, 150, 100}, Subscriptions: Gauge{100, 160, 100}}
	}
	for _, tc := range []struct {
		name  string
		spoil func(*ChurnStats)
		want  string
	}{
		{"clean", func(*ChurnStats) {}, ""},
		{"goroutine leak", func(c *ChurnStats) { c.Goroutines.After = 206 }, "goroutine leak: 206 after, baseline 200"},
		{"heap", func(c *ChurnStats) { c.Heap.After = 24 << 20 }, "heap not back"},
		{"connections", func(c *ChurnStats) { c.Subscriptions.After = 101 }, "subscriptions 101 after, 100 before"},
		{"no churn", func(c *ChurnStats) { c.Connects = 0 }, "no churn session connected"},
		{"gap", func(c *ChurnStats) { c.Gaps, c.FirstViolation = 3, "churner 1, session 2: seq 9 after 5" }, "seq 9 after 5"},
		{"misrouted", func(c *ChurnStats) { c.Misrouted, c.FirstViolation = 1, "x" }, "churn stream: x"},
		{"late start", func(c *ChurnStats) { c.LateStarts, c.FirstViolation = 1, "first event seq 90" }, "first event seq 90"},
		{"session error", func(c *ChurnStats) { c.Errors, c.FirstError = 1, "churner 3: read: EOF" }, "churner 3: read: EOF"},
		{"incomplete", func(c *ChurnStats) { c.Incomplete = true }, "incomplete"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := clean()
			tc.spoil(c)
			if got := c.Problem(); (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) || c.OK() != (tc.want == "") {
				t.Fatalf("Problem() = %q, OK() = %v; want %q", got, c.OK(), tc.want)
			}
			r := &Result{Churn: c}
			var table strings.Builder
			r.WriteTable(&table)
			if tc.want != "" && (r.OK() || !strings.Contains(table.String(), "FAIL ("+c.Problem()+")")) {
				t.Errorf("a failing churn did not fail the run:\n%s", table.String())
			}
		})
	}
}
