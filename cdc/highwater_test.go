package cdc_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fanwire/fanwire/cdc/pgtest"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestLostMarkIsReported: the stream loses the ingest's events (an
// operator's purge) while it is stopped; at its next start the broker has
// no mark of it, though it stored events before: the ingest says so (an
// error, fanwire_ingest_high_water_lost_total), and publishes what it reads
// again. Before, a missing mark was taken for a new ingest, silently.
func TestLostMarkIsReported(t *testing.T) {
	t.Parallel()
	pg := pgtest.Start(t, pgtest.Config{})
	pg.Exec("postgres", "CREATE TABLE t (id int PRIMARY KEY, v int)", "INSERT INTO t VALUES (1, 0)")
	b, url := jetStream(t)
	r := &rig{t: t, pg: pg, b: b}
	r.start(nil)
	r.events(1)
	r.stop()
	r.start(nil) // finds its mark: the registry records that it stored events
	pg.Exec("postgres", "UPDATE t SET v = 1")
	r.events(2)
	r.stop()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, "CDC")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Purge(ctx); err != nil {
		t.Fatal(err)
	}
	r.start(nil)
	pg.Exec("postgres", "UPDATE t SET v = 2")
	evs := r.events(1)
	if !strings.Contains(string(evs[0].Doc), `"v":2`) {
		t.Fatalf("after the purge: %s", evs[0].Doc)
	}
	if got := metricValue(t, r.in, "fanwire_ingest_high_water_lost_total"); got != 1 {
		t.Fatalf("fanwire_ingest_high_water_lost_total = %v, want 1", got)
	}
}
