package gateway_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fanwire/fanwire/broker"
)

// BenchmarkResumeCatchUp measures the gateway's catch-up path in one
// process: a client subscribes from a cursor 10,000 events (256 B) behind
// and reads until it has them all (it counts events, it does not decode
// them). One op = one whole catch-up. Issue 3's target is ≥ 200,000
// events/s; `fanwire loadtest --resume-behind` measures the same across
// processes, with the client verifying every event.
func BenchmarkResumeCatchUp(b *testing.B) {
	const n = 10000
	for _, kind := range []string{"jetstream", "redis"} {
		b.Run(kind, func(b *testing.B) {
			e := newEnvJS(b, kind, func(c *broker.JetStreamConfig) { c.Storage = "file" }, nil)
			pad := strings.Repeat("p", 240)
			// Each op publishes its own n events (untimed): replayed events
			// are not already in the gateway's event cache.
			publish := func() string {
				out := make([]broker.Outgoing, 0, n+1)
				for i := range n + 1 {
					out = append(out, broker.Outgoing{Subject: "orders.x", Data: []byte(`{"i":` + strconv.Itoa(i) + `,"p":"` + pad + `"}`)})
				}
				cursors, err := e.b.Publish(context.Background(), out)
				if err != nil {
					b.Fatal(err)
				}
				return cursors[0]
			}
			var total time.Duration
			received := 0.0
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				from := publish()
				received += n + 1
				waitFor(b, "the live feed to pass the events", func() bool {
					return e.metric("fanwire_events_received_total", nil) >= received
				})
				cl := e.dial()
				b.StartTimer()
				start := time.Now()
				cl.send(`{"type":"subscribe","id":"s","subject":"orders.*","from":"` + from + `"}`)
				got := -1 // the subscribed reply
				for got < n {
					_, p, err := cl.c.Read(context.Background())
					if err != nil {
						b.Fatal(err)
					}
					got += strings.Count(string(p), "\n") + 1
				}
				total += time.Since(start)
				b.StopTimer()
				_ = cl.c.CloseNow()
				b.StartTimer()
			}
			b.ReportMetric(float64(b.N*n)/total.Seconds(), "events/s")
		})
	}
}
