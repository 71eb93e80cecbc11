package broker_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/fanwire/fanwire/broker"
	"github.com/fanwire/fanwire/broker/brokertest"
)

// BenchmarkLastID measures the ingest's high-water check at start: the
// last event of a writer publishing on three tables' subjects, in a stream
// holding the standard data set's shape (410,000 events, one subject per
// row: db.<table>.<key>), after which another publisher wrote 1,000 events
// on app.>. One op = one LastID (JetStream: a get per table).
func BenchmarkLastID(b *testing.B) {
	b.Run("jetstream", func(b *testing.B) {
		ns := brokertest.NATS(b)
		js, err := broker.DialJetStream(context.Background(), broker.JetStreamConfig{NATSConfig: broker.NATSConfig{URL: ns.ClientURL(), Subjects: []string{"db.>", "app.>"}}, Stream: "BENCH"})
		if err != nil {
			b.Fatal(err)
		}
		defer js.Close()
		benchmarkLastID(b, js)
	})
	b.Run("redis", func(b *testing.B) {
		url := "redis://" + brokertest.Redis(b)
		rd, err := broker.DialRedis(context.Background(), broker.RedisConfig{URL: url, Stream: "bench", MaxLen: 2_000_000})
		if err != nil {
			b.Fatal(err)
		}
		defer rd.Close()
		benchmarkLastID(b, rd)
	})
}

func benchmarkLastID(b *testing.B, br interface {
	broker.Appender
	broker.HighWater
}) {
	ctx := context.Background()
	data := []byte(`{"pad":"` + strings.Repeat("p", 246) + `"}`)
	tables := []struct {
		name string
		n    int
	}{{"customers", 10_000}, {"orders", 100_000}, {"order_items", 300_000}}
	batch := make([]broker.Outgoing, 0, 1000)
	seq := 0
	writer := "w"
	flush := func() {
		if err := br.Append(ctx, batch, broker.AppendOptions{Writer: writer}); err != nil {
			b.Fatal(err)
		}
		batch = batch[:0]
	}
	for _, t := range tables {
		for k := 1; k <= t.n; k++ {
			seq++
			batch = append(batch, broker.Outgoing{Subject: fmt.Sprintf("db.%s.%d", t.name, k), Data: data, ID: broker.WriterID("w", fmt.Sprintf("%x-0", seq))})
			if len(batch) == cap(batch) {
				flush()
			}
		}
	}
	flush()
	writer = "" // another publisher's
	for i := range 1000 {
		batch = append(batch, broker.Outgoing{Subject: "app.x", Data: data, ID: fmt.Sprintf("app-%d", i)})
	}
	flush()
	want := broker.WriterID("w", fmt.Sprintf("%x-0", seq))
	subjects := []string{"db.customers.*", "db.orders.*", "db.order_items.*"}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		id, err := br.LastID(ctx, "w", subjects)
		if err != nil {
			b.Fatal(err)
		}
		if id != want {
			b.Fatalf("LastID = %q, want %q", id, want)
		}
	}
}
