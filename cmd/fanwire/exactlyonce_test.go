package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fanwire/fanwire/broker"
	"github.com/fanwire/fanwire/broker/brokertest"
	"github.com/fanwire/fanwire/cdc/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats-server/v2/server"
)

// TestIngestDownLongerThanTheDuplicateWindow: the ingest is killed (kill
// -9) while transactions commit and stays down for 3 s, three times the
// broker's duplicate window (1 s here), so the broker no longer recognizes
// the ids of what PostgreSQL sends again; the second time the broker is
// restarted too. Every key's events are still its updates once each, in
// order (v = 0, 1, 2, …): the ingest learns from the broker's high-water
// mark which of them it has. Before, everything since the last confirmed
// LSN was published again.
func TestIngestDownLongerThanTheDuplicateWindow(t *testing.T) {
	t.Parallel() // a process-level test that mostly waits: beside the others (make test's time)
	bin := buildBinary(t)
	for _, kind := range []string{"jetstream", "redis"} {
		t.Run(kind, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
			defer cancel()
			const keys, rounds = 20, 150
			pg := pgtest.Start(t, pgtest.Config{})
			pg.Exec("postgres", "CREATE TABLE t (id int PRIMARY KEY, v int)",
				fmt.Sprintf("INSERT INTO t SELECT g, 0 FROM generate_series(1, %d) g", keys))
			b := newRestartableBroker(ctx, t, kind, time.Second)
			var logs bytes.Buffer
			var logMu sync.Mutex
			dump := func() string {
				logMu.Lock()
				defer logMu.Unlock()
				return logs.String()
			}
			port, err := freePort()
			if err != nil {
				t.Fatal(err)
			}
			addr := fmt.Sprintf("127.0.0.1:%d", port)
			start := starter(t, bin, append([]string{"ingest", "--pg", pg.DSN("postgres"), "--listen", addr, "--log-level", "info"}, b.args...), &logs, &logMu)
			cmd := start()
			defer func() {
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
			}()
			waitIngest(t, addr, "ready", dump)

			written := make(chan error, 1)
			go func() { written <- updateRounds(ctx, pg.DSN("postgres"), keys, rounds) }()
			for down := 1; down <= 2; down++ {
				for deadline := time.Now().Add(30 * time.Second); len(b.stored(ctx, t)) < keys+down*keys*rounds/3 && time.Now().Before(deadline); {
					time.Sleep(5 * time.Millisecond)
				}
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
				if down == 2 {
					b.restart(t)
				}
				time.Sleep(3 * time.Second) // three duplicate windows
				cmd = start()
				waitIngest(t, addr, "ready", dump)
			}
			if err := <-written; err != nil {
				t.Fatal(err)
			}
			want := keys * (rounds + 1)
			var evs []storedEvent
			for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
				if evs = b.stored(ctx, t); len(evs) >= want {
					break
				}
			}
			next := map[int]int{} // key → the v its next event must have
			for _, e := range evs {
				var ev struct {
					Key int `json:"key"`
					Doc struct {
						V int `json:"v"`
					} `json:"doc"`
				}
				if err := json.Unmarshal(e.Data, &ev); err != nil {
					t.Fatal(err)
				}
				if ev.Doc.V != next[ev.Key] {
					t.Fatalf("key %d: v %d, want %d (a repeat, a gap or out of order); ingest logs:\n%s", ev.Key, ev.Doc.V, next[ev.Key], dump())
				}
				next[ev.Key]++
			}
			if len(evs) != want {
				t.Fatalf("%d events, want %d; ingest logs:\n%s", len(evs), want, dump())
			}
			t.Logf("%d events, each key's once and in order, over two restarts 3 s apart (one with the broker restarted); %s", len(evs), lastLine(dump(), "past the high-water mark"))
		})
	}
}

// updateRounds commits rounds × keys single-row transactions, each adding
// 1 to one key's v, key by key, pausing a little every keys×10.
func updateRounds(ctx context.Context, dsn string, keys, rounds int) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	for i := 0; i < keys*rounds; i++ {
		if _, err := conn.Exec(ctx, "UPDATE t SET v = v + 1 WHERE id = $1", i%keys+1); err != nil {
			return err
		}
		if i%(keys*10) == 0 {
			time.Sleep(20 * time.Millisecond)
		}
	}
	return nil
}

type storedEvent struct {
	Subject string
	Data    []byte
}

// restartableBroker is a JetStream or Redis Streams broker for an ingest
// process that a test can restart with its data.
type restartableBroker struct {
	kind  string
	args  []string       // the ingest's broker flags
	ns    *server.Server // jetstream
	redis *brokertest.RedisServer
	url   string
	dedup time.Duration
}

func newRestartableBroker(ctx context.Context, t *testing.T, kind string, dedup time.Duration) *restartableBroker {
	t.Helper()
	b := &restartableBroker{kind: kind, dedup: dedup}
	switch kind {
	case "jetstream":
		b.ns = brokertest.NATS(t)
		b.url = b.ns.ClientURL()
		b.args = []string{"--broker", "jetstream", "--nats-url", b.url, "--subjects", "db.>", "--stream", "CDC"}
	case "redis":
		b.redis = brokertest.StartRedis(t, t.TempDir(), 0)
		b.url = "redis://" + b.redis.Addr()
		b.args = []string{"--broker", "redis", "--redis-url", b.url, "--stream", "cdc"}
	}
	b.args = append(b.args, "--dedup-window", dedup.String())
	return b
}

func (b *restartableBroker) restart(t *testing.T) {
	t.Helper()
	if b.ns != nil {
		b.ns = brokertest.RestartNATS(t, b.ns)
		return
	}
	b.redis.Kill()
	b.redis.Start()
}

// stored reads every event the broker holds, in order.
func (b *restartableBroker) stored(ctx context.Context, t *testing.T) []storedEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var d broker.Durable
	until := "js:1000000000"
	var err error
	if b.ns != nil {
		d, err = broker.DialJetStream(ctx, broker.JetStreamConfig{NATSConfig: broker.NATSConfig{URL: b.url, Subjects: []string{"db.>"}}, Stream: "CDC", Duplicates: b.dedup})
	} else {
		until = "rs:99999999999999-0"
		d, err = broker.DialRedis(ctx, broker.RedisConfig{URL: b.url, Stream: "cdc"})
	}
	if err != nil {
		return nil // restarting
	}
	defer d.Close()
	var out []storedEvent
	_ = d.Replay(ctx, []string{"db.>"}, "", until, func(ms []broker.Message) error {
		for _, m := range ms {
			out = append(out, storedEvent{m.Subject, m.Data})
		}
		return nil
	})
	return out
}
