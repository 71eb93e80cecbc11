package broker_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fanwire/fanwire/broker"
	"github.com/fanwire/fanwire/broker/brokertest"
)

// BenchmarkReplay measures catching up 10,000 stored 256-byte events from
// a cursor, as a resuming client does (issue target: ≥ 200,000 events/s
// through the gateway). One op = one whole replay.
func BenchmarkReplay(b *testing.B) {
	const n = 10000
	data := []byte(`{"pad":"` + strings.Repeat("p", 246) + `"}`)
	out := make([]broker.Outgoing, n)
	for i := range out {
		out[i] = broker.Outgoing{Subject: "db.t.hot", Data: data}
	}
	run := func(b *testing.B, d broker.Durable) {
		ctx := context.Background()
		cursors, err := d.Publish(ctx, out)
		if err != nil {
			b.Fatal(err)
		}
		after, until := cursors[0], cursors[n-1]
		b.ReportAllocs()
		b.ResetTimer()
		start := time.Now()
		for range b.N {
			got := 0
			err := d.Replay(ctx, []string{"db.t.hot"}, after, until, func(ms []broker.Message) error {
				got += len(ms)
				return nil
			})
			if err != nil || got != n-1 {
				b.Fatalf("replay: %d events, %v; want %d", got, err, n-1)
			}
		}
		b.ReportMetric(float64(b.N*(n-1))/time.Since(start).Seconds(), "events/s")
	}
	b.Run("jetstream", func(b *testing.B) {
		ns := brokertest.NATS(b)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		d, err := broker.DialJetStream(ctx, broker.JetStreamConfig{NATSConfig: broker.NATSConfig{URL: ns.ClientURL(), Subjects: []string{"db.>"}}, Stream: "B"})
		if err != nil {
			b.Fatal(err)
		}
		defer d.Close()
		run(b, d)
	})
	b.Run("redis", func(b *testing.B) {
		addr := brokertest.Redis(b)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		d, err := broker.DialRedis(ctx, broker.RedisConfig{URL: fmt.Sprintf("redis://%s", addr), Stream: "B"})
		if err != nil {
			b.Fatal(err)
		}
		defer d.Close()
		run(b, d)
	})
}
