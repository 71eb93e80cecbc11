package broker_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/fanwire/fanwire/broker"
	"github.com/fanwire/fanwire/broker/brokertest"
)

// BenchmarkJetStreamPublish measures Publish: batches of 1,000 events of
// 256 bytes, each with an id (atomic batches) or none (ids=false: fast
// batches, with the cursors read back), to a stream on a server over
// loopback TCP. One op = one Publish of the whole batch.
func BenchmarkJetStreamPublish(b *testing.B) {
	for _, storage := range []string{"file", "memory"} {
		b.Run(storage, func(b *testing.B) {
			benchmarkJetStreamPublish(b, storage, func(ctx context.Context, js *broker.JetStream, out []broker.Outgoing) error {
				_, err := js.Publish(ctx, out)
				return err
			})
		})
		b.Run(storage+"/ids=false", func(b *testing.B) {
			benchmarkJetStreamPublish(b, storage, func(ctx context.Context, js *broker.JetStream, out []broker.Outgoing) error {
				for i := range out {
					out[i].ID = ""
				}
				_, err := js.Publish(ctx, out)
				return err
			})
		})
	}
}

// BenchmarkJetStreamAppend is BenchmarkJetStreamPublish for Append (fast
// batches, no cursors): one op = one Append of 1,000 events.
func BenchmarkJetStreamAppend(b *testing.B) {
	for _, storage := range []string{"file", "memory"} {
		b.Run(storage, func(b *testing.B) {
			benchmarkJetStreamPublish(b, storage, func(ctx context.Context, js *broker.JetStream, out []broker.Outgoing) error {
				return js.Append(ctx, out, broker.AppendOptions{})
			})
		})
	}
}

func benchmarkJetStreamPublish(b *testing.B, storage string, publish func(context.Context, *broker.JetStream, []broker.Outgoing) error) {
	const n = 1000
	data := []byte(`{"pad":"` + strings.Repeat("p", 246) + `"}`)
	ns := brokertest.NATS(b)
	ctx := context.Background()
	js, err := broker.DialJetStream(ctx, broker.JetStreamConfig{NATSConfig: broker.NATSConfig{URL: ns.ClientURL(), Subjects: []string{"db.>"}}, Stream: "BENCH", Storage: storage})
	if err != nil {
		b.Fatal(err)
	}
	defer js.Close()
	out := make([]broker.Outgoing, n)
	b.ReportAllocs()
	b.ResetTimer()
	for op := range b.N {
		b.StopTimer() // the ids are the caller's cost, not Publish's
		for i := range out {
			out[i] = broker.Outgoing{Subject: fmt.Sprintf("db.t.%d", i%50), Data: data, ID: broker.WriterID("w", fmt.Sprintf("%x-%d", op, i))}
		}
		b.StartTimer()
		if err := publish(ctx, js, out); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkRedisPublish and BenchmarkRedisAppend: the same 1,000 events of
// 256 B with ids per op, into a redis-server of its own (one script call
// per event against one per 256), as writer "w".
func BenchmarkRedisPublish(b *testing.B) {
	benchmarkRedis(b, func(ctx context.Context, r *broker.Redis, out []broker.Outgoing) error {
		_, err := r.Publish(ctx, out)
		return err
	})
}

// BenchmarkRedisAppend/conditional is the ingest's append: each call
// names the writer's last stored id (the one before it), which the script
// checks before it stores anything; unconditional is the same without.
func BenchmarkRedisAppend(b *testing.B) {
	for _, check := range []bool{false, true} {
		name := "unconditional"
		if check {
			name = "conditional"
		}
		b.Run(name, func(b *testing.B) {
			last := ""
			benchmarkRedis(b, func(ctx context.Context, r *broker.Redis, out []broker.Outgoing) error {
				err := r.Append(ctx, out, broker.AppendOptions{Writer: "w", Check: check, Last: last})
				last = out[len(out)-1].ID
				return err
			})
		})
	}
}

func benchmarkRedis(b *testing.B, publish func(context.Context, *broker.Redis, []broker.Outgoing) error) {
	const n = 1000
	data := []byte(`{"pad":"` + strings.Repeat("p", 246) + `"}`)
	ctx := context.Background()
	r, err := broker.DialRedis(ctx, broker.RedisConfig{URL: "redis://" + brokertest.Redis(b), Stream: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	out := make([]broker.Outgoing, n)
	b.ReportAllocs()
	b.ResetTimer()
	for op := range b.N {
		b.StopTimer()
		for i := range out {
			out[i] = broker.Outgoing{Subject: fmt.Sprintf("db.t.%d", i%50), Data: data, ID: broker.WriterID("w", fmt.Sprintf("%x-%d", op, i))}
		}
		b.StartTimer()
		if err := publish(ctx, r, out); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "events/s")
}
