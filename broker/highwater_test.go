package broker_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fanwire/fanwire/broker"
	"github.com/fanwire/fanwire/broker/brokertest"
)

var (
	_ broker.HighWater = (*broker.JetStream)(nil)
	_ broker.HighWater = (*broker.Redis)(nil)
)

// checkLastID asserts what hw says it stores last on subjects.
func checkLastID(t *testing.T, hw broker.HighWater, subjects, want, when string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	got, err := hw.LastID(ctx, subjects)
	if err != nil || got != want {
		t.Fatalf("%s: LastID(%q) = %q, %v; want %q", when, subjects, got, err, want)
	}
}

// publishEvents publishes events from..to (ids ev-<n>) on db.t.<n%3>,
// each followed by one without an id on app.x, in one Publish.
func publishEvents(t *testing.T, b broker.Broker, from, to int) {
	t.Helper()
	var out []broker.Outgoing
	for i := from; i <= to; i++ {
		out = append(out,
			broker.Outgoing{Subject: fmt.Sprintf("db.t.%d", i%3), Data: []byte(fmt.Sprint(i)), ID: fmt.Sprint("ev-", i)},
			broker.Outgoing{Subject: "app.x", Data: []byte(`{}`)})
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if _, err := b.Publish(ctx, out); err != nil {
		t.Fatal(err)
	}
}

// TestJetStreamLastID: the stream's last message on the publisher's
// subjects, whatever others publish after it, unchanged by a repeat, and
// the same after the server restarts (a file stream keeps it).
func TestJetStreamLastID(t *testing.T) {
	ns := brokertest.NATS(t)
	cfg := broker.JetStreamConfig{NATSConfig: broker.NATSConfig{URL: ns.ClientURL(), Subjects: []string{"db.>", "app.>"}}, Stream: "HW"}
	b := dialJS(t, cfg)
	checkLastID(t, b, "db.>", "", "empty stream")
	publishEvents(t, b, 1, 2500) // three batches
	checkLastID(t, b, "db.>", "ev-2500", "after 2500 events")
	checkLastID(t, b, "db.t.1", "ev-2500", "one key")
	checkLastID(t, b, "db.t.0", "ev-2499", "another key")
	checkLastID(t, b, "nothing.>", "", "subjects with no message")
	publishEvents(t, b, 10, 10) // a repeat: dropped as a duplicate
	checkLastID(t, b, "db.>", "ev-2500", "after a repeat")

	ns = brokertest.RestartNATS(t, ns)
	b2 := dialJS(t, cfg)
	checkLastID(t, b2, "db.>", "ev-2500", "after a restart")
	publishEvents(t, b2, 2501, 2501)
	checkLastID(t, b2, "db.>", "ev-2501", "after a restart and a publish")
}

// TestRedisLastID: the last message appended on a pattern the broker was
// asked about, recorded with the append: unchanged by a repeat, by others'
// messages, and by a kill and restart of the server.
func TestRedisLastID(t *testing.T) {
	onRedis(t, func(t *testing.T, r redisTarget) {
		b := dialRedis(t, r.with(broker.RedisConfig{Stream: "{hw}"}))
		checkLastID(t, b, "db.>", "", "empty stream")
		publishEvents(t, b, 1, 300)
		checkLastID(t, b, "db.>", "ev-300", "after 300 events")
		publishEvents(t, b, 10, 10) // a repeat: not appended again
		checkLastID(t, b, "db.>", "ev-300", "after a repeat")
		// A pattern is recorded from its first LastID on.
		checkLastID(t, b, "db.t.1", "", "a pattern not asked about before")
		publishEvents(t, b, 301, 302)
		checkLastID(t, b, "db.t.1", "ev-301", "one key")
		checkLastID(t, b, "db.>", "ev-302", "all keys")
	})
	t.Run("restart", func(t *testing.T) {
		srv := brokertest.StartRedis(t, t.TempDir(), 0)
		cfg := broker.RedisConfig{URL: "redis://" + srv.Addr()}
		b := dialRedis(t, cfg)
		checkLastID(t, b, "db.>", "", "empty stream")
		publishEvents(t, b, 1, 50)
		srv.Kill()
		srv.Start()
		b2 := dialRedis(t, cfg)
		checkLastID(t, b2, "db.>", "ev-50", "after a kill and restart")
		publishEvents(t, b2, 51, 51)
		checkLastID(t, b2, "db.>", "ev-51", "after a restart and a publish")
	})
}
