package main

// BenchmarkHostileFiltersDeployed: what one client holding the most
// expensive filters the limits allow does to everyone else's delivery
// (issue 37), as deployed: nats-server (built from the version in go.mod)
// with JetStream in its own process, one `fanwire ws` process on it, and
// the clients and the publisher in the benchmark's process.
//
// Victims (FANWIRE_BENCH_HOSTILE_VICTIMS, 50 connections) subscribe to
// app.lat.*; a publisher sends FANWIRE_BENCH_HOSTILE_RATE (500) events a
// second to NATS, each carrying its send time and a list of 300 numbers,
// for FANWIRE_BENCH_HOSTILE_SECONDS (10) in each phase:
//
//  1. baseline: the victims alone;
//  2. hostile: one more connection subscribes 256 filtered views on
//     app.lat.* whose where runs to --max-filter-cost on every event
//     (doc.xs.all(x, doc.xs.all(y, …)) over the 300 numbers), and
//     subscribes each again as soon as it ends (filter_too_costly) or its
//     refusal's wait is over, within --max-message-rate;
//  3. baseline again (the machine's drift).
//
// Each phase reports the victims' delivery latency (p50, p99, max, from
// the publisher's send to a victim's read), the node's CPU (s/s), the
// cost units its dispatcher spent on filters, and the hostile's ended
// views. FANWIRE_BENCH_BIN runs another fanwire binary (an older one, to
// compare in the same harness); FANWIRE_BENCH_WS_ARGS adds flags to the
// node (split on spaces).
//
//	go test -run '^$' -bench BenchmarkHostileFiltersDeployed -benchtime 1x ./cmd/fanwire

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/fanwire/fanwire/broker/brokertest"
	"github.com/nats-io/nats.go"
)

func BenchmarkHostileFiltersDeployed(b *testing.B) {
	victims := envInt(b, "FANWIRE_BENCH_HOSTILE_VICTIMS", 50)
	rate := envInt(b, "FANWIRE_BENCH_HOSTILE_RATE", 500)
	seconds := envInt(b, "FANWIRE_BENCH_HOSTILE_SECONDS", 10)
	bin := os.Getenv("FANWIRE_BENCH_BIN")
	if bin == "" {
		bin = buildBinary(b)
	}
	natsBin := brokertest.NATSServerBinary(b)
	for range b.N {
		url, natsPID := brokertest.NATSProcess(b, natsBin)
		args := []string{"--broker", "jetstream", "--nats-url", url, "--subjects", "app.>", "--allow-anonymous"}
		if extra := os.Getenv("FANWIRE_BENCH_WS_ARGS"); extra != "" {
			args = append(args, strings.Fields(extra)...)
		}
		ws := startWSProc(b, bin, args...)
		ctx, cancel := context.WithCancel(context.Background())
		lat := &latencies{}
		var wg sync.WaitGroup
		for range victims {
			c, _, err := websocket.Dial(ctx, ws.url(), nil)
			if err != nil {
				b.Fatal(err)
			}
			c.SetReadLimit(16 << 20)
			if err := c.Write(ctx, websocket.MessageText, []byte(`{"type":"subscribe","id":"v","subject":"app.lat.*"}`)); err != nil {
				b.Fatal(err)
			}
			hostileReadUntil(ctx, b, c, `"subscribed"`)
			wg.Go(func() { victimRead(ctx, c, lat) })
		}
		nc, err := nats.Connect(url)
		if err != nil {
			b.Fatal(err)
		}
		xs := strings.TrimSuffix(strings.Repeat("1,", 300), ",")
		var seq atomic.Int64
		phase := func(name string) {
			lat.reset()
			cpu0, cost0, ended0 := procCPU(b, ws.pid()), ws.labelled("fanwire_filter_cost_units_total", ""), filterTooCostly(b, ws)
			ncpu0 := procCPU(b, natsPID)
			start := time.Now()
			sent := publishPaced(b, nc, &seq, rate, time.Duration(seconds)*time.Second, xs)
			elapsed := time.Since(start).Seconds()
			want := sent * int64(victims)
			deadline := time.Now().Add(30 * time.Second)
			for lat.count() < want && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			p := lat.percentiles()
			b.Logf("%-9s %d events × %d victims: got %d; latency p50 %.2f ms, p99 %.2f ms, max %.2f ms; node CPU %.3f s/s, nats-server %.3f s/s; filter cost %.0f units/s; hostile views ended %.0f",
				name, sent, victims, lat.count(), p[0], p[1], p[2], (procCPU(b, ws.pid())-cpu0)/elapsed, (procCPU(b, natsPID)-ncpu0)/elapsed,
				(ws.labelled("fanwire_filter_cost_units_total", "")-cost0)/elapsed, filterTooCostly(b, ws)-ended0)
			b.ReportMetric(p[1], name+"-p99-ms")
		}
		phase("baseline")
		hctx, hcancel := context.WithCancel(ctx)
		var hwg sync.WaitGroup
		hostile(hctx, b, ws.url(), &hwg)
		// Let it subscribe its 256 views (within --max-message-rate).
		time.Sleep(3 * time.Second)
		phase("hostile")
		hcancel()
		hwg.Wait()
		phase("after")
		cancel()
		wg.Wait()
		nc.Close()
	}
}

// filterTooCostly is the node's count of views ended by their cost.
func filterTooCostly(b *testing.B, ws *wsProc) float64 {
	return ws.labelled("fanwire_client_errors_total", `code="filter_too_costly"`)
}

// labelled is the value of name{labels} (labels "": unlabelled) on the
// process's /metrics, 0 when absent (an older binary's).
func (p *wsProc) labelled(name, labels string) float64 {
	p.tb.Helper()
	resp, err := http.Get("http://" + p.listen + "/metrics")
	if err != nil {
		p.tb.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		p.tb.Fatal(err)
	}
	for l := range strings.SplitSeq(string(body), "\n") {
		series := name
		if labels != "" {
			series += "{" + labels + "}"
		}
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	return 0
}

// publishPaced publishes rate events a second for d, evenly, straight to
// NATS (no HTTP batching in the latency); it returns how many.
func publishPaced(b *testing.B, nc *nats.Conn, seq *atomic.Int64, rate int, d time.Duration, xs string) int64 {
	every := time.Second / time.Duration(rate)
	start := time.Now()
	var n int64
	for i := 0; ; i++ {
		at := start.Add(time.Duration(i) * every)
		if at.Sub(start) >= d {
			break
		}
		time.Sleep(time.Until(at))
		s := seq.Add(1)
		data := `{"doc":{"n":` + strconv.FormatInt(s, 10) + `,"t":` + strconv.FormatInt(time.Now().UnixNano(), 10) + `,"xs":[` + xs + `]}}`
		if err := nc.Publish("app.lat."+strconv.FormatInt(s%100, 10), []byte(data)); err != nil {
			b.Fatal(err)
		}
		n++
	}
	if err := nc.Flush(); err != nil {
		b.Fatal(err)
	}
	return n
}

// hostile holds 256 of the most expensive filters the node allows, and
// subscribes each again whenever it may: at once after its view ended,
// after the wait a refusal names (within --max-message-rate and the
// client-error limit, so the node never closes it).
func hostile(ctx context.Context, b *testing.B, url string, wg *sync.WaitGroup) {
	c, _, err := websocket.Dial(ctx, url, nil)
	if err != nil {
		b.Fatal(err)
	}
	c.SetReadLimit(16 << 20)
	type retry struct {
		id        int
		notBefore time.Time
	}
	again := make(chan retry, 1024)
	for i := range 256 {
		again <- retry{id: i}
	}
	wg.Go(func() { // reads: an ended or refused view goes back to again
		defer c.CloseNow()
		for {
			_, frame, err := c.Read(ctx)
			if err != nil {
				return
			}
			for msg := range strings.SplitSeq(string(frame), "\n") {
				if !strings.Contains(msg, `"type":"error"`) {
					continue
				}
				i := strings.Index(msg, `"id":"h`)
				if i < 0 {
					continue
				}
				rest := msg[i+len(`"id":"h`):]
				n, err := strconv.Atoi(rest[:strings.IndexByte(rest, '"')])
				if err != nil {
					continue
				}
				r := retry{id: n}
				switch {
				case strings.Contains(msg, "rate_limited"):
					r.notBefore = time.Now().Add(time.Second)
				case strings.Contains(msg, "again in "):
					w := msg[strings.Index(msg, "again in ")+len("again in "):]
					if d, err := time.ParseDuration(w[:strings.IndexByte(w, '"')]); err == nil {
						r.notBefore = time.Now().Add(d)
					}
				}
				select {
				case again <- r:
				case <-ctx.Done():
					return
				}
			}
		}
	})
	wg.Go(func() { // writes, within --max-message-rate (100/s)
		tick := time.NewTicker(11 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case r := <-again:
				if d := time.Until(r.notBefore); d > 0 {
					select {
					case <-ctx.Done():
						return
					case <-time.After(d):
					}
				}
				w := fmt.Sprintf(`doc.xs.all(x, doc.xs.all(y, x + y >= %d))`, -r.id)
				msg := fmt.Sprintf(`{"type":"subscribe","id":"h%d","subject":"app.lat.*","where":%q}`, r.id, w)
				if c.Write(ctx, websocket.MessageText, []byte(msg)) != nil {
					return
				}
				<-tick.C
			}
		}
	})
}

// victimRead reads c's events until ctx ends, recording each one's
// latency from the send time in its data.
func victimRead(ctx context.Context, c *websocket.Conn, lat *latencies) {
	defer c.CloseNow()
	for {
		_, frame, err := c.Read(ctx)
		if err != nil {
			return
		}
		now := time.Now().UnixNano()
		for msg := range strings.SplitSeq(string(frame), "\n") {
			i := strings.Index(msg, `"t":`)
			if i < 0 {
				continue
			}
			rest := msg[i+4:]
			j := strings.IndexByte(rest, ',')
			if j < 0 {
				continue
			}
			if t, err := strconv.ParseInt(rest[:j], 10, 64); err == nil {
				lat.add(float64(now-t) / 1e6)
			}
		}
	}
}

func hostileReadUntil(ctx context.Context, b *testing.B, c *websocket.Conn, want string) {
	for {
		_, frame, err := c.Read(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if strings.Contains(string(frame), want) {
			return
		}
	}
}

// latencies collects delivery latencies (ms) from many readers.
type latencies struct {
	mu sync.Mutex
	ms []float64
}

func (l *latencies) add(ms float64) {
	l.mu.Lock()
	l.ms = append(l.ms, ms)
	l.mu.Unlock()
}

func (l *latencies) reset() {
	l.mu.Lock()
	l.ms = l.ms[:0]
	l.mu.Unlock()
}

func (l *latencies) count() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return int64(len(l.ms))
}

// percentiles are p50, p99 and the max.
func (l *latencies) percentiles() [3]float64 {
	l.mu.Lock()
	s := slices.Clone(l.ms)
	l.mu.Unlock()
	if len(s) == 0 {
		return [3]float64{}
	}
	slices.Sort(s)
	at := func(q float64) float64 { return s[min(len(s)-1, int(q*float64(len(s))))] }
	return [3]float64{at(0.50), at(0.99), s[len(s)-1]}
}
