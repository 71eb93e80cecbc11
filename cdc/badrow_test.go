package cdc_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/fanwire/fanwire/cdc"
	"github.com/fanwire/fanwire/cdc/pgtest"
	"github.com/prometheus/client_golang/prometheus"
)

// deepJSON is JSON that PostgreSQL stores but the encoder refuses: nested
// deeper than encoding/json's 10,000 levels (PostgreSQL takes about 14,000
// with its default max_stack_depth).
var deepJSON = strings.Repeat("[", 10_001) + strings.Repeat("]", 10_001)

// TestBadRowsBecomeErrorEvents: a row whose value the encoder refuses, or
// whose event is larger than the broker takes, is published as an error
// event in its place, counted, and the ingest carries on: on bootstrap and
// on tail, for table events and for both projection modes. Either used to
// end the connection, and the ingest met the same row again after
// reconnecting, forever (a bootstrap started over each time).
func TestBadRowsBecomeErrorEvents(t *testing.T) {
	t.Parallel()
	bothModes(t, testBadRowsBecomeErrorEvents)
}

func testBadRowsBecomeErrorEvents(t *testing.T, mode string) {
	pg := pgtest.Start(t, pgtest.Config{})
	pg.Exec("postgres",
		"CREATE TABLE notes (id int PRIMARY KEY, body json, big text)",
		"CREATE TABLE orders (id int PRIMARY KEY, status text)",
		"CREATE TABLE order_items (id int PRIMARY KEY, order_id int, extra json)",
		"ALTER TABLE order_items REPLICA IDENTITY FULL",
		`INSERT INTO notes VALUES (1, '{"ok":1}', ''), (2, '`+deepJSON+`', '')`,
		"INSERT INTO orders VALUES (10, 'new'), (11, 'new')",
		`INSERT INTO order_items VALUES (100, 10, '{}'), (101, 11, '`+deepJSON+`')`,
	)
	spec := []cdc.ProjectionSpec{{Name: "orders", Table: "orders", Key: "id", Mode: mode, Embed: []cdc.EmbedSpec{
		{As: "items", Table: "order_items", On: map[string]string{"order_id": "id"}, Many: true, OrderBy: "id"},
	}}}
	r := newRig(t, pg, func(c *cdc.Config) {
		c.Tables = []string{"notes"}
		c.Projections = spec
		c.StateDir = t.TempDir()
	})
	r.events(4) // the bootstrap
	pg.Exec("postgres",
		`INSERT INTO notes VALUES (3, '`+deepJSON+`', '')`,
		`INSERT INTO notes VALUES (4, '{"ok":4}', repeat('x', 2000000))`, // over NATS's 1 MiB
		`INSERT INTO notes VALUES (5, '{"ok":5}', '')`,
		"UPDATE orders SET status = 'paid'", // order 11 is bad again; 10 is fine
	)
	evs := r.events(9)
	var got strings.Builder
	for _, e := range evs {
		fmt.Fprintf(&got, "%s %s %s", e.Op, e.Subject, e.Key)
		if e.Op == "error" {
			fmt.Fprintf(&got, " %s %s", e.Source, e.Reason)
			switch {
			case e.Reason == "bad_value" && !strings.Contains(e.Error, "malformed column value: json"),
				e.Reason == "too_large" && !strings.Contains(e.Error, "event too large for the broker"),
				e.LSN == "" || e.ID == "":
				t.Errorf("error event %+v", e)
			}
		}
		got.WriteByte('\n')
	}
	want := `insert db.notes.1 1
error db.%errors.notes 2 table public.notes bad_value
upsert db.orders.10 10
error db.%errors.orders 11 projection orders bad_value
error db.%errors.notes 3 table public.notes bad_value
error db.%errors.notes 4 table public.notes too_large
insert db.notes.5 5
upsert db.orders.10 10
error db.%errors.orders 11 projection orders bad_value
`
	if got.String() != want {
		t.Fatalf("events:\n%s\nwant:\n%s", got.String(), want)
	}
	if !r.in.Ready() {
		t.Fatal("the ingest is not tailing")
	}
	counts := errorCounts(t, r.in)
	if counts["bad_value"] != 4 || counts["too_large"] != 1 {
		t.Fatalf("fanwire_ingest_error_events_total = %v, want bad_value 4, too_large 1", counts)
	}
}

// errorCounts reads fanwire_ingest_error_events_total by reason.
func errorCounts(t *testing.T, in *cdc.Ingest) map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(in.Collector())
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "fanwire_ingest_error_events_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			out[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
		}
	}
	return out
}
