package broker_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/fanwire/fanwire/broker"
	"github.com/fanwire/fanwire/broker/brokertest"
	"github.com/redis/go-redis/v9"
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

// BenchmarkRedisTrimmed is BenchmarkRedisPublish and BenchmarkRedisAppend
// (unconditional) on a stream trimmed to about 10,000 entries (MAXLEN ~),
// where the index of each subject's newest entry is pruned as the stream
// is trimmed: with the events on 50 subjects (the index stays small) or
// each on a subject of its own (a field per event, the prune's worst
// case). index-fields/entry is HLEN over XLEN at the end; script-µs/event
// is the server's time in the scripts (INFO commandstats, eval and
// evalsha), less noisy than ns/op on a shared machine.
func BenchmarkRedisTrimmed(b *testing.B) {
	for _, path := range []string{"publish", "append"} {
		for _, subjects := range []string{"50", "new"} {
			b.Run(path+"/subjects="+subjects, func(b *testing.B) {
				benchmarkRedisTrimmed(b, path == "append", subjects == "new")
			})
		}
	}
}

func benchmarkRedisTrimmed(b *testing.B, appendPath, newSubjects bool) {
	const n, maxLen = 1000, 10_000
	data := []byte(`{"pad":"` + strings.Repeat("p", 246) + `"}`)
	ctx := context.Background()
	addr := brokertest.Redis(b)
	r, err := broker.DialRedis(ctx, broker.RedisConfig{URL: "redis://" + addr, Stream: "bench", MaxLen: maxLen})
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	raw := redis.NewClient(&redis.Options{Addr: addr})
	defer raw.Close()
	if err := raw.ConfigResetStat(ctx).Err(); err != nil {
		b.Fatal(err)
	}
	out := make([]broker.Outgoing, n)
	b.ReportAllocs()
	b.ResetTimer()
	for op := range b.N {
		b.StopTimer()
		for i := range out {
			subject := fmt.Sprintf("db.t.%d", i%50)
			if newSubjects {
				subject = fmt.Sprintf("db.t.%d", op*n+i)
			}
			out[i] = broker.Outgoing{Subject: subject, Data: data, ID: broker.WriterID("w", fmt.Sprintf("%x-%d", op, i))}
		}
		b.StartTimer()
		if appendPath {
			err = r.Append(ctx, out, broker.AppendOptions{Writer: "w"})
		} else {
			_, err = r.Publish(ctx, out)
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "events/s")
	b.ReportMetric(float64(raw.HLen(ctx, "bench:latest").Val())/float64(raw.XLen(ctx, "bench").Val()), "index-fields/entry")
	stats, err := raw.Info(ctx, "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	var usec float64
	for _, line := range strings.Split(stats, "\r\n") {
		if strings.HasPrefix(line, "cmdstat_eval:") || strings.HasPrefix(line, "cmdstat_evalsha:") {
			for _, kv := range strings.Split(line[strings.IndexByte(line, ':')+1:], ",") {
				if v, ok := strings.CutPrefix(kv, "usec="); ok {
					var u float64
					fmt.Sscan(v, &u)
					usec += u
				}
			}
		}
	}
	b.ReportMetric(usec/float64(b.N*n), "script-µs/event")
}
