package cdc_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/fanwire/fanwire/broker"
	"github.com/fanwire/fanwire/broker/brokertest"
	"github.com/fanwire/fanwire/cdc"
	"github.com/fanwire/fanwire/cdc/pgtest"
	"github.com/jackc/pgx/v5"
	"go.uber.org/zap/zaptest"
)

// TestBrokerOutageLongerThanTheDuplicateWindow: the broker goes away for
// three times its duplicate window (1 s) while the ingest runs and rows
// commit; a publish not acknowledged within PublishTimeout ends the run,
// and the next one starts from the broker's high-water mark. Every row's
// event is in the stream once, in commit order.
func TestBrokerOutageLongerThanTheDuplicateWindow(t *testing.T) {
	t.Parallel()
	pg := pgtest.Start(t, pgtest.Config{})
	pg.Exec("postgres", "CREATE TABLE t (id int PRIMARY KEY)")
	ns := brokertest.NATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	dial := func() *broker.JetStream {
		b, err := broker.DialJetStream(ctx, broker.JetStreamConfig{NATSConfig: broker.NATSConfig{URL: ns.ClientURL(), Subjects: []string{"db.>"}},
			Stream: "CDC", Duplicates: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		return b
	}
	b := dial()
	in, err := cdc.New(cdc.Config{DSN: pg.DSN("postgres"), Broker: b, Logger: zaptest.NewLogger(t), StatusInterval: 100 * time.Millisecond,
		Retry: 100 * time.Millisecond, PublishTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ictx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- in.Run(ictx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	waitFor(t, "the ingest tailing", 20*time.Second, in.Ready)

	const n = 1200
	written := make(chan error, 1)
	go func() {
		conn, err := pgx.Connect(ctx, pg.DSN("postgres"))
		if err != nil {
			written <- err
			return
		}
		defer conn.Close(context.Background())
		for i := 1; i <= n; i++ {
			if _, err := conn.Exec(ctx, "INSERT INTO t VALUES ($1)", i); err != nil {
				written <- err
				return
			}
			if i%100 == 0 {
				time.Sleep(20 * time.Millisecond)
			}
		}
		written <- nil
	}()
	waitFor(t, "events before the outage", 20*time.Second, func() bool { return in.Published() >= 300 })
	port, dir := brokertest.Port(ns), brokertest.StoreDir(ns)
	ns.Shutdown()
	ns.WaitForShutdown()
	time.Sleep(3 * time.Second) // three duplicate windows
	ns = brokertest.NATSWithStore(t, dir, port)
	if err := <-written; err != nil {
		t.Fatal(err)
	}
	reader := dial()
	var ids []int
	waitFor(t, "every row in the stream", 60*time.Second, func() bool {
		ids = ids[:0]
		_ = reader.Replay(ctx, []string{"db.>"}, "", "js:100000000", func(ms []broker.Message) error {
			for _, m := range ms {
				var e struct {
					Key int `json:"key"`
				}
				if err := json.Unmarshal(m.Data, &e); err != nil {
					return err
				}
				ids = append(ids, e.Key)
			}
			return nil
		})
		return len(ids) >= n
	})
	for i, id := range ids {
		if id != i+1 {
			t.Fatalf("event %d is row %d, want %d (a repeat or a gap); %d events", i, id, i+1, len(ids))
		}
	}
	if len(ids) != n {
		t.Fatalf("%d events, want %d", len(ids), n)
	}
	t.Log(fmt.Sprintf("%d rows once each, in order, across a 3 s outage", n))
}
