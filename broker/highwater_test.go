package broker_test

import (
	"context"
	"errors"
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

// checkLastID asserts what hw says writer stores last on subjects.
func checkLastID(t *testing.T, hw broker.HighWater, writer string, subjects []string, want, when string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	got, err := hw.LastID(ctx, writer, subjects)
	if err != nil || got != want {
		t.Fatalf("%s: LastID(%q, %q) = %q, %v; want %q", when, writer, subjects, got, err, want)
	}
}

// appendEventsAs appends, as writer, events from..to (ids
// "<writer>:ev-<n>") on <table>.<n%3>, each followed by one without an id
// on app.x, in one Append.
func appendEventsAs(t *testing.T, b broker.Appender, writer, table string, from, to int) {
	t.Helper()
	var out []broker.Outgoing
	for i := from; i <= to; i++ {
		out = append(out,
			broker.Outgoing{Subject: fmt.Sprintf("%s.%d", table, i%3), Data: []byte(fmt.Sprint(i)), ID: broker.WriterID(writer, fmt.Sprint("ev-", i))},
			broker.Outgoing{Subject: "app.x", Data: []byte(`{}`)})
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := b.Append(ctx, out, broker.AppendOptions{Writer: writer}); err != nil {
		t.Fatal(err)
	}
}

var (
	subjT  = []string{"db.t.*"}
	subjTU = []string{"db.t.*", "db.u.*"}
)

// TestJetStreamLastID: a writer's last message on its subjects, whatever
// another writer (on subjects of its own) or a publisher without ids sends
// after it, unchanged by a repeat, and the same after the server restarts
// (a file stream keeps it).
func TestJetStreamLastID(t *testing.T) {
	t.Parallel()
	ns := brokertest.NATS(t)
	cfg := broker.JetStreamConfig{NATSConfig: broker.NATSConfig{URL: ns.ClientURL(), Subjects: []string{"db.>", "app.>"}}, Stream: "HW"}
	b := dialJS(t, cfg)
	checkLastID(t, b, "w1", subjT, "", "empty stream")
	appendEventsAs(t, b, "w1", "db.t", 1, 2500)
	appendEventsAs(t, b, "w2", "db.u", 1, 10) // another writer, after
	checkLastID(t, b, "w1", subjT, "w1:ev-2500", "after 2500 events")
	checkLastID(t, b, "w1", subjTU, "w1:ev-2500", "on its subjects and the other writer's")
	checkLastID(t, b, "w2", subjTU, "w2:ev-10", "the other writer")
	checkLastID(t, b, "w1", []string{"db.t.1"}, "w1:ev-2500", "one key")
	checkLastID(t, b, "w1", []string{"db.t.0"}, "w1:ev-2499", "another key")
	checkLastID(t, b, "w1", []string{"nothing.>"}, "", "subjects with no message")
	checkLastID(t, b, "w3", subjTU, "", "a writer with no message")
	appendEventsAs(t, b, "w1", "db.t", 10, 10) // a repeat: dropped as a duplicate
	checkLastID(t, b, "w1", subjT, "w1:ev-2500", "after a repeat")

	ns = brokertest.RestartNATS(t, ns)
	b2 := dialJS(t, cfg)
	checkLastID(t, b2, "w1", subjT, "w1:ev-2500", "after a restart")
	appendEventsAs(t, b2, "w1", "db.t", 2501, 2501)
	checkLastID(t, b2, "w1", subjT, "w1:ev-2501", "after a restart and an append")
}

// TestRedisLastID: the last message a writer appended, recorded with the
// append: unchanged by a repeat, by another writer's messages and others
// without an id, and by a kill and restart of the server.
func TestRedisLastID(t *testing.T) {
	t.Parallel()
	onRedis(t, func(t *testing.T, r redisTarget) {
		b := dialRedis(t, r.with(broker.RedisConfig{Stream: "{hw}"}))
		checkLastID(t, b, "w1", subjT, "", "empty stream")
		appendEventsAs(t, b, "w1", "db.t", 1, 300)
		appendEventsAs(t, b, "w2", "db.u", 1, 10)
		checkLastID(t, b, "w1", subjT, "w1:ev-300", "after 300 events")
		checkLastID(t, b, "w2", subjTU, "w2:ev-10", "the other writer")
		appendEventsAs(t, b, "w1", "db.t", 290, 310) // repeats, then new ones
		checkLastID(t, b, "w1", subjT, "w1:ev-310", "after repeats and more")
	})
	t.Run("restart", func(t *testing.T) {
		srv := brokertest.StartRedis(t, t.TempDir(), 0)
		cfg := broker.RedisConfig{URL: "redis://" + srv.Addr()}
		b := dialRedis(t, cfg)
		checkLastID(t, b, "w1", subjT, "", "empty stream")
		appendEventsAs(t, b, "w1", "db.t", 1, 50)
		srv.Kill()
		srv.Start()
		b2 := dialRedis(t, cfg)
		checkLastID(t, b2, "w1", subjT, "w1:ev-50", "after a kill and restart")
		appendEventsAs(t, b2, "w1", "db.t", 51, 51)
		checkLastID(t, b2, "w1", subjT, "w1:ev-51", "after a restart and an append")
	})
}

// TestRedisConditionalAppend: an append that names the writer's last
// stored id stores its messages, in parts chained to each other; one that
// names another (a stale leader's) is refused whole with ErrConflict.
func TestRedisConditionalAppend(t *testing.T) {
	t.Parallel()
	onRedis(t, func(t *testing.T, r redisTarget) {
		b := dialRedis(t, r.with(broker.RedisConfig{Stream: "{cond}"}))
		ctx := t.Context()
		batch := func(from, to int) []broker.Outgoing {
			var out []broker.Outgoing
			for i := from; i <= to; i++ {
				out = append(out, broker.Outgoing{Subject: "db.t.1", Data: []byte(fmt.Sprint(i)), ID: broker.WriterID("w", fmt.Sprint(i))})
			}
			return out
		}
		if err := b.Append(ctx, batch(1, 600), broker.AppendOptions{Writer: "w", Check: true, Last: ""}); err != nil {
			t.Fatalf("first append, expecting nothing stored: %v", err)
		}
		checkLastID(t, b, "w", nil, "w:600", "after 600 in three parts")
		// A stale writer that believes the last is w:100.
		err := b.Append(ctx, batch(101, 110), broker.AppendOptions{Writer: "w", Check: true, Last: "w:100"})
		if !errors.Is(err, broker.ErrConflict) {
			t.Fatalf("append after a stale last id: %v, want ErrConflict", err)
		}
		// One that expects nothing stored yet.
		if err := b.Append(ctx, batch(601, 601), broker.AppendOptions{Writer: "w", Check: true}); !errors.Is(err, broker.ErrConflict) {
			t.Fatalf("append expecting an empty mark: %v, want ErrConflict", err)
		}
		if err := b.Append(ctx, batch(601, 900), broker.AppendOptions{Writer: "w", Check: true, Last: "w:600"}); err != nil {
			t.Fatalf("append after w:600: %v", err)
		}
		checkLastID(t, b, "w", nil, "w:900", "after 900")
		got := redisData(t, b)
		for i, d := range got {
			if d != fmt.Sprint(i+1) {
				t.Fatalf("message %d is %s, want %d", i, d, i+1)
			}
		}
		if len(got) != 900 {
			t.Fatalf("the stream holds %d messages, want 1 … 900 once each", len(got))
		}
	})
}

// TestRegistry: the document beside a stream is replaced only by a writer
// that read its current revision; a stale one gets ErrConflict; it
// survives a new connection.
func TestRegistry(t *testing.T) {
	t.Parallel()
	test := func(t *testing.T, open func() broker.Registry) {
		ctx := t.Context()
		r := open()
		doc, rev, err := r.LoadRegistry(ctx)
		if err != nil || doc != nil || rev != 0 {
			t.Fatalf("empty registry: %q, %d, %v", doc, rev, err)
		}
		rev1, err := r.StoreRegistry(ctx, []byte(`{"a":1}`), 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.StoreRegistry(ctx, []byte(`{"b":1}`), 0); !errors.Is(err, broker.ErrConflict) {
			t.Fatalf("a second create: %v, want ErrConflict", err)
		}
		rev2, err := r.StoreRegistry(ctx, []byte(`{"a":2}`), rev1)
		if err != nil || rev2 == rev1 {
			t.Fatalf("update at revision %d: %d, %v", rev1, rev2, err)
		}
		if _, err := r.StoreRegistry(ctx, []byte(`{"a":3}`), rev1); !errors.Is(err, broker.ErrConflict) {
			t.Fatalf("a stale update: %v, want ErrConflict", err)
		}
		doc, rev, err = open().LoadRegistry(ctx)
		if err != nil || string(doc) != `{"a":2}` || rev != rev2 {
			t.Fatalf("registry = %s at %d, %v; want {\"a\":2} at %d", doc, rev, err, rev2)
		}
	}
	t.Run("jetstream", func(t *testing.T) {
		ns := brokertest.NATS(t)
		test(t, func() broker.Registry {
			return dialJS(t, broker.JetStreamConfig{NATSConfig: broker.NATSConfig{URL: ns.ClientURL(), Subjects: []string{"db.>"}}, Stream: "REG"})
		})
	})
	onRedis(t, func(t *testing.T, r redisTarget) {
		test(t, func() broker.Registry { return dialRedis(t, r.with(broker.RedisConfig{Stream: "{reg}"})) })
	})
}

// TestWriterNames: a writer's name never starts with the mark of other
// publishers' scoped ids nor holds ':' (either would let another
// publisher's id pass for the writer's); Append refuses such a writer
// before it stores anything.
func TestWriterNames(t *testing.T) {
	t.Parallel()
	ns := brokertest.NATS(t)
	js := dialJS(t, broker.JetStreamConfig{NATSConfig: broker.NATSConfig{URL: ns.ClientURL(), Subjects: []string{"db.>"}}, Stream: "WN"})
	rd := dialRedis(t, broker.RedisConfig{URL: "redis://" + brokertest.Redis(t), Stream: "{wn}"})
	for name, b := range map[string]broker.Appender{"jetstream": js, "redis": rd} {
		for _, writer := range []string{"~kabc~x", "slot.1:x"} {
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			err := b.Append(ctx, []broker.Outgoing{{Subject: "db.t.1", Data: []byte(`{}`), ID: broker.WriterID(writer, "1-0")}}, broker.AppendOptions{Writer: writer})
			cancel()
			if !errors.Is(err, broker.ErrBadWriter) {
				t.Errorf("%s: Append as %q: %v, want ErrBadWriter", name, writer, err)
			}
			checkLastID(t, b.(broker.HighWater), writer, []string{"db.t.*"}, "", name+": after the refused append")
		}
	}
}

// TestJetStreamNothingSentDuringAnOutageLandsLater: an Append or a
// Publish that fails while the server is down leaves nothing that the
// server stores once it is back. The high-water mark rests on it: the
// ingest reads its last stored event when a run starts, and takes every
// event after it as not stored. Before, the connection buffered what was
// published while it reconnected (nats.go's reconnect buffer, 8 MiB by
// default) and sent it on reconnecting: a failed run's events were stored
// after the next run had read the mark, and published again by that run
// (a fresh clone's make test saw 23 events stored twice after a 3 s
// outage, the duplicate window being 1 s).
func TestJetStreamNothingSentDuringAnOutageLandsLater(t *testing.T) {
	t.Parallel()
	ns := brokertest.NATS(t)
	b := dialJS(t, broker.JetStreamConfig{NATSConfig: broker.NATSConfig{URL: ns.ClientURL(), Subjects: []string{"db.>", "app.>"}}, Stream: "LATE"})
	appendEventsAs(t, b, "w", "db.t", 1, 10)
	port, dir := brokertest.Port(ns), brokertest.StoreDir(ns)
	ns.Shutdown()
	ns.WaitForShutdown()
	for b.Ready() { // the connection notices the server's close
		time.Sleep(5 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	if err := b.Append(ctx, []broker.Outgoing{{Subject: "db.t.0", Data: []byte("11"), ID: broker.WriterID("w", "ev-11")}}, broker.AppendOptions{Writer: "w"}); err == nil {
		t.Fatal("Append succeeded with the server down")
	}
	if _, err := b.Publish(ctx, []broker.Outgoing{{Subject: "db.t.1", Data: []byte("12"), ID: broker.WriterID("w", "ev-12")}}); err == nil {
		t.Fatal("Publish succeeded with the server down")
	}
	brokertest.NATSWithStore(t, dir, port)
	// A writer's append acknowledged after the reconnect: whatever the
	// connection had kept from the outage went before it.
	appendEventsAs(t, b, "m", "db.m", 1, 1)
	checkLastID(t, b, "w", subjT, "w:ev-10", "after the outage")
}
