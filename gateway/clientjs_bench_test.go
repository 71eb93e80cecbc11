package gateway_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	neturl "net/url"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/performance"
	"github.com/chromedp/chromedp"
	"github.com/fanwire/fanwire/broker/brokertest"
	"github.com/fanwire/fanwire/gateway/browsertest"
	"github.com/nats-io/nats.go/jetstream"
)

// BenchmarkClient measures fanwire.js against a `fanwire ws` process on
// JetStream (NATS embedded in the benchmark's process: the figures are the
// client's own, measured in the client's process):
//
//   - node, chromium: the client's cost per event while it receives 10,000
//     events/s (about 100 B of data each): the time inside the socket's
//     onmessage (the client's parsing and dispatch, plus the app's count),
//     and the whole Node process's CPU (the ws library's framing too), or
//     Chromium's main-thread task time for the page;
//
//   - failover: a client on two nodes, receiving 1,000 events/s, and the
//     first node drained with SIGTERM: the time until the client is
//     connected to the other node, and until it has the next event there.
//
//     go test -run '^$' -bench BenchmarkClient -benchtime 1x -count 3 ./gateway
func BenchmarkClient(b *testing.B) {
	node := requireClientFixture(b)
	bin := buildFanwire(b)

	b.Run("node", func(b *testing.B) {
		for range b.N {
			url := brokertest.NATS(b).ClientURL()
			js := brokertest.JetStream(b, url)
			gw := startGateway(b, bin, jsNodeArgs(url, "BENCH")...)
			cmd := exec.Command(node, "bench.mjs", gw.wsURL())
			cmd.Dir = clientFixture
			stdin, err := cmd.StdinPipe()
			if err != nil {
				b.Fatal(err)
			}
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				b.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				b.Fatal(err)
			}
			lines := bufio.NewScanner(stdout)
			if !lines.Scan() {
				b.Fatal("bench.mjs ended before subscribing")
			}
			report := func() (r benchReport) {
				if _, err := stdin.Write([]byte("\n")); err != nil {
					b.Fatal(err)
				}
				if !lines.Scan() {
					b.Fatal("bench.mjs ended")
				}
				if err := json.Unmarshal(lines.Bytes(), &r); err != nil {
					b.Fatal(err)
				}
				return r
			}
			report() // start counting now
			total := publishAt(b, js, 10000, 5*time.Second)
			var sum benchReport
			deadline := time.Now().Add(30 * time.Second)
			for sum.Events < total && time.Now().Before(deadline) {
				time.Sleep(100 * time.Millisecond)
				sum.add(report())
			}
			stdin.Close()
			_ = cmd.Wait()
			if sum.Events != total || sum.LastN != total-1 {
				b.Fatalf("the client got %d events (last %d) of %d", sum.Events, sum.LastN, total)
			}
			b.ReportMetric(sum.HandlerMs*1000/float64(total), "handler-µs/event")
			b.ReportMetric(sum.CPUMs*1000/float64(total), "process-cpu-µs/event")
			b.ReportMetric(float64(total), "events")
		}
	})

	b.Run("chromium", func(b *testing.B) {
		pages := httptest.NewServer(http.FileServer(http.Dir(clientFixture)))
		b.Cleanup(pages.Close)
		browser := browsertest.Start(b)
		for range b.N {
			url := brokertest.NATS(b).ClientURL()
			js := brokertest.JetStream(b, url)
			gw := startGateway(b, bin, jsNodeArgs(url, "BENCH")...)
			p := openTab(b, browser, `JSON.stringify(window.bench)`)
			p.Do(chromedp.Navigate(pages.URL + "/bench.html?" + neturl.Values{"gw": {gw.httpURL()}, "url": {gw.wsURL()}}.Encode()))
			var st benchPage
			pollBench(b, p, func(s benchPage) bool { return s.Subscribed })
			if _, err := chromedp.Call(p.Context(), performance.Enable, performance.EnableParams{}); err != nil {
				p.Fatal(err)
			}
			before := pageMetrics(b, p)
			pollBench(b, p, func(s benchPage) bool { st = s; return true })
			total := publishAt(b, js, 10000, 5*time.Second)
			pollBench(b, p, func(s benchPage) bool { return s.Events-st.Events >= total })
			after := pageMetrics(b, p)
			var end benchPage
			pollBench(b, p, func(s benchPage) bool { end = s; return true })
			if end.Events-st.Events != total || end.LastN != total-1 {
				b.Fatalf("the page got %d events (last %d) of %d", end.Events-st.Events, end.LastN, total)
			}
			b.ReportMetric((end.HandlerMs-st.HandlerMs)*1000/float64(total), "handler-µs/event")
			b.ReportMetric((after["TaskDuration"]-before["TaskDuration"])*1e6/float64(total), "main-thread-µs/event")
			b.ReportMetric((after["ScriptDuration"]-before["ScriptDuration"])*1e6/float64(total), "script-µs/event")
			b.ReportMetric(float64(total), "events")
		}
	})

	b.Run("failover", func(b *testing.B) {
		for range b.N {
			url := brokertest.NATS(b).ClientURL()
			js := brokertest.JetStream(b, url)
			a := startGateway(b, bin, jsNodeArgs(url, "FAILOVER")...)
			other := startGateway(b, bin, jsNodeArgs(url, "FAILOVER")...)
			c := runClient(b, node, map[string]any{"urls": []string{a.wsURL(), other.wsURL()}, "subs": []map[string]any{{"pattern": "app.>", "from": "first"}}}, nil)
			c.waitFor("connected", clientWait, func(l []jsLine) bool { return count(l, "state", "connected") > 0 })
			pub := startPublisher(b, jsPublish(js), time.Millisecond)
			c.waitEvents(200, clientWait)
			from := len(c.all())
			t0 := time.Now()
			a.signal(syscall.SIGTERM)
			var connected, first time.Time
			c.waitFor("an event on the other node", clientWait, func(l []jsLine) bool {
				for _, x := range l[from:] {
					if x.K == "state" && x.State == "connected" && x.URL == other.wsURL() && connected.IsZero() {
						connected = x.at
					}
					if x.K == "event" && !connected.IsZero() && x.at.After(connected) {
						first = x.at
						return true
					}
				}
				return false
			})
			n := pub.stop()
			c.waitEvents(n, clientWait)
			checkSequence(b, c.events(), n)
			a.stop(syscall.SIGTERM)
			b.ReportMetric(float64(connected.Sub(t0).Microseconds())/1000, "ms-to-connected")
			b.ReportMetric(float64(first.Sub(t0).Microseconds())/1000, "ms-to-first-event")
		}
	})
}

// benchReport is one line of bench.mjs.
type benchReport struct {
	Events    int     `json:"events"`
	Ms        float64 `json:"ms"`
	CPUMs     float64 `json:"cpuMs"`
	HandlerMs float64 `json:"handlerMs"`
	LastN     int     `json:"lastN"`
}

func (r *benchReport) add(o benchReport) {
	r.Events += o.Events
	r.Ms += o.Ms
	r.CPUMs += o.CPUMs
	r.HandlerMs += o.HandlerMs
	r.LastN = o.LastN
}

// benchPage is bench.html's window.bench.
type benchPage struct {
	Events     int     `json:"events"`
	HandlerMs  float64 `json:"handlerMs"`
	LastN      int     `json:"lastN"`
	Subscribed bool    `json:"subscribed"`
}

func pollBench(b *testing.B, p *browsertest.Page, cond func(benchPage) bool) {
	b.Helper()
	for {
		if cond(browsertest.Eval[benchPage](p, `window.bench || {}`)) {
			return
		}
		select {
		case <-p.Context().Done():
			p.Fatal(p.Context().Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// pageMetrics returns the page's CDP performance metrics by name.
func pageMetrics(b *testing.B, p *browsertest.Page) map[string]float64 {
	b.Helper()
	r, err := chromedp.Call(p.Context(), performance.GetMetrics, cdp.Empty{})
	if err != nil {
		p.Fatal(err)
	}
	m := map[string]float64{}
	for _, x := range r.Metrics {
		m[x.Name] = x.Value
	}
	return m
}

// publishAt publishes {"n":0,...}, {"n":1,...}, ... to app.<n mod 4> at
// rate events per second for d, asynchronously in 10 ms rounds, and
// returns how many once every one is stored.
func publishAt(b *testing.B, js jetstream.JetStream, rate int, d time.Duration) int {
	b.Helper()
	perRound := rate / 100
	rounds := int(d / (10 * time.Millisecond))
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	n := 0
	for range rounds {
		<-tick.C
		for range perRound {
			data := fmt.Appendf(nil, `{"n":%d,"order":"ord-%07d","status":"paid","amount":1234.5,"items":[{"sku":"a-1","qty":2}]}`, n, n)
			if _, err := js.PublishAsync(fmt.Sprintf("app.%d", n%4), data); err != nil {
				b.Fatal(err)
			}
			n++
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(30 * time.Second):
		b.Fatal("publishes not acknowledged within 30s")
	}
	return n
}
