package loadtest

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func sampleResult() *Result {
	return &Result{
		Clients: 200, Events: 20000, Size: 256, Subject: "loadtest.abc.hot",
		Expected: 4_000_000, Delivered: 4_000_000,
		Elapsed: 2310 * time.Millisecond, PublishElapsed: 450 * time.Millisecond,
		DeliveriesPerSec: 1.73e6,
		LatencyP50:       1200 * time.Microsecond, LatencyP95: 3400 * time.Microsecond,
		LatencyP99: 5600 * time.Microsecond, LatencyMax: 8900 * time.Microsecond, LatencyMean: 1500 * time.Microsecond,
		GatewaySampled: true, GatewayCPUSeconds: 3.2, GatewayRSSHighWaterBytes: 41 << 20, CPUPerDeliveryMicros: 0.8,
		LoadtestCPUSeconds: 2.1,
	}
}

func TestResultOK(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*Result)
		ok   bool
	}{
		{"clean", func(*Result) {}, true},
		{"gap", func(r *Result) { r.Gaps = 1 }, false},
		{"duplicate", func(r *Result) { r.Duplicates = 1 }, false},
		{"out of order", func(r *Result) { r.OutOfOrder = 1 }, false},
		{"missing", func(r *Result) { r.Missing = 1 }, false},
		{"unexpected", func(r *Result) { r.Unexpected = 1 }, false},
		{"malformed", func(r *Result) { r.Malformed = 1 }, false},
		{"server error", func(r *Result) { r.ServerErrors = 1 }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := sampleResult()
			tt.mod(r)
			if r.OK() != tt.ok {
				t.Errorf("OK() = %v, want %v", r.OK(), tt.ok)
			}
		})
	}
}

func TestResultWriteJSON(t *testing.T) {
	var buf bytes.Buffer
	if err := sampleResult().WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(buf.String(), "\n"); n != 1 || !strings.HasSuffix(buf.String(), "}\n") {
		t.Fatalf("want one JSON object on one line, got %q", buf.String())
	}
	var m map[string]any
	if err := json.Unmarshal(buf.Bytes(), &m); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"ok": true, "clients": 200.0, "events": 20000.0, "expected": 4e6, "delivered": 4e6,
		"gaps": 0.0, "duplicates": 0.0, "missing": 0.0, "elapsed_seconds": 2.31,
		"deliveries_per_sec": 1.73e6, "latency_p50_micros": 1200.0, "latency_p99_micros": 5600.0,
		"latency_max_micros": 8900.0, "gateway_cpu_seconds": 3.2, "gateway_rss_high_water_bytes": float64(41 << 20),
		"cpu_per_delivery_micros": 0.8, "timed_out": false,
	}
	for k, v := range want {
		if m[k] != v {
			t.Errorf("%s = %v, want %v", k, m[k], v)
		}
	}
	for k := range m {
		if k != strings.ToLower(k) || strings.ContainsAny(k, " -") {
			t.Errorf("key %q is not snake_case", k)
		}
	}

	// Without a sampled gateway the gateway keys are absent, not zero.
	r := sampleResult()
	r.GatewaySampled = false
	buf.Reset()
	if err := r.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(buf.String(), "gateway_") || strings.Contains(buf.String(), "cpu_per_delivery") {
		t.Errorf("unsampled gateway keys present: %s", buf.String())
	}
}

func TestResultWriteTable(t *testing.T) {
	var buf bytes.Buffer
	sampleResult().WriteTable(&buf)
	out := buf.String()
	for _, want := range []string{"4000000 / 4000000 (100.0%)", "1.73M", "1.2ms / 3.4ms / 5.6ms", "41.0 MiB", "0.800 µs/delivery", "result", "OK"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}

	r := sampleResult()
	r.Missing, r.TimedOut, r.Disconnects, r.FirstDisconnect = 10, true, 1, "client 3: read: EOF"
	buf.Reset()
	r.WriteTable(&buf)
	for _, want := range []string{"FAIL (timed out", "client 3: read: EOF"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, buf.String())
		}
	}
}

func TestProgressLine(t *testing.T) {
	var buf bytes.Buffer
	start := time.Unix(1000, 0)
	p := progress{w: &buf, expected: 4_000_000, start: start, at: start}
	p.tick(start.Add(500*time.Millisecond), 100) // under a second: nothing
	p.tick(start.Add(time.Second), 1_210_000)
	p.tick(start.Add(2*time.Second), 1_234_567+1_000_000)
	p.final(start.Add(4*time.Second), 4_000_000)
	want := "delivered 1210000/4000000 (30.2%) 1.21M/s\n" +
		"delivered 2234567/4000000 (55.9%) 1.02M/s\n" +
		"delivered 4000000/4000000 (100.0%) 1.00M/s overall\n"
	if buf.String() != want {
		t.Errorf("progress:\n%s\nwant:\n%s", buf.String(), want)
	}
	if got := siRate(850_300); got != "850.3k" {
		t.Errorf("siRate(850300) = %q", got)
	}
	if got := siRate(12.4); got != "12" {
		t.Errorf("siRate(12.4) = %q", got)
	}
}
