package loadtest

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// gauges is one reading of a gateway's /metrics: the Go runtime's
// goroutine count and heap in use (the collectors the gateway registers),
// and its own connection and subscription gauges (absent from a gateway
// that does not export them: has* false).
type gauges struct {
	goroutines    int64
	heapInuse     int64 // go_memstats_heap_inuse_bytes
	nextGC        int64 // go_memstats_next_gc_bytes: the heap goal of the next GC; 0 when absent
	stackInuse    int64 // go_memstats_stack_inuse_bytes
	gogc          int64 // go_gc_gogc_percent; 0 when absent (then 100)
	connections   int64 // fanwire_connections
	subscriptions int64 // fanwire_subscriptions
	hasConns      bool
	hasSubs       bool
}

// metricsReader reads a gateway's Prometheus text exposition. It holds no
// idle connection between reads (keep-alives off), so a read leaves no
// goroutine behind on either side, and the gateway's goroutine count does
// not carry a connection of ours from one reading to the next.
type metricsReader struct {
	url string       // static
	hc  *http.Client // static
}

func newMetricsReader(rawURL string, timeout time.Duration) *metricsReader {
	return &metricsReader{url: rawURL, hc: &http.Client{
		Transport: &http.Transport{DisableKeepAlives: true},
		Timeout:   timeout,
	}}
}

// read GETs the metrics page and parses the gauges it needs.
func (m *metricsReader) read(ctx context.Context) (gauges, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, m.url, nil)
	if err != nil {
		return gauges{}, fmt.Errorf("metrics %s: %w", m.url, err)
	}
	req.Header.Set("Accept", "text/plain") // the text format, whatever promhttp would negotiate
	resp, err := m.hc.Do(req)
	if err != nil {
		return gauges{}, fmt.Errorf("metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return gauges{}, fmt.Errorf("metrics %s: %s", m.url, resp.Status)
	}
	g, err := parseGauges(resp.Body)
	if err != nil {
		return gauges{}, fmt.Errorf("metrics %s: %w", m.url, err)
	}
	return g, nil
}

// parseGauges picks the gauges out of a Prometheus text exposition. It
// fails when the Go runtime's are missing: the gateway must register the
// Go collector for a churn run to mean anything.
func parseGauges(r io.Reader) (gauges, error) {
	var g gauges
	var hasG, hasH bool
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		name, val, ok := bytes.Cut(sc.Bytes(), []byte{' '})
		if !ok || len(name) == 0 || name[0] == '#' {
			continue
		}
		var dst *int64
		switch string(name) {
		case "go_goroutines":
			dst, hasG = &g.goroutines, true
		case "go_memstats_heap_inuse_bytes":
			dst, hasH = &g.heapInuse, true
		case "go_memstats_next_gc_bytes":
			dst = &g.nextGC
		case "go_memstats_stack_inuse_bytes":
			dst = &g.stackInuse
		case "go_gc_gogc_percent":
			dst = &g.gogc
		case "fanwire_connections":
			dst, g.hasConns = &g.connections, true
		case "fanwire_subscriptions":
			dst, g.hasSubs = &g.subscriptions, true
		default:
			continue
		}
		val, _, _ = bytes.Cut(bytes.TrimSpace(val), []byte{' '}) // a timestamp may follow
		f, err := strconv.ParseFloat(string(val), 64)
		if err != nil {
			return g, fmt.Errorf("%s %q: %w", name, val, err)
		}
		*dst = int64(f)
	}
	if err := sc.Err(); err != nil {
		return g, err
	}
	if !hasG || !hasH {
		return g, fmt.Errorf("%w: no go_goroutines or go_memstats_heap_inuse_bytes (the gateway must register the Go collector)", ErrProtocol)
	}
	return g, nil
}

// liveHeap estimates the heap that was live at the last GC from the goal
// the runtime set for the next one: since Go 1.21 the goal is live +
// (live + stacks + globals) × GOGC/100, so live = (goal - stacks ×
// GOGC/100) / (1 + GOGC/100), globals (well under 1 MiB here) left out.
// Unlike heap in use, it does not count the garbage made since that GC,
// which on an idle gateway was tens of MiB at 10,000 connections. 0 when
// the page has no goal.
func (g gauges) liveHeap() int64 {
	if g.nextGC <= 0 {
		return 0
	}
	pct := g.gogc
	if pct <= 0 {
		pct = 100
	}
	return (g.nextGC*100 - g.stackInuse*pct) / (100 + pct)
}

// metricsURL derives the gateway's /metrics from its native WebSocket
// endpoint: the gateway serves both on one listener
// (ws://127.0.0.1:8080/ws → http://127.0.0.1:8080/metrics).
func metricsURL(native string) (string, error) {
	u, err := url.Parse(native)
	if err != nil {
		return "", err
	}
	switch u.Scheme {
	case "ws", "http":
		u.Scheme = "http"
	case "wss", "https":
		u.Scheme = "https"
	default:
		return "", fmt.Errorf("scheme %q", u.Scheme)
	}
	u.Path, u.RawPath, u.RawQuery, u.Fragment = "/metrics", "", "", ""
	return u.String(), nil
}
