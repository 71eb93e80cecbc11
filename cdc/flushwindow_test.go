package cdc_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fanwire/fanwire/cdc"
	"github.com/fanwire/fanwire/cdc/pgtest"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
)

// TestDocumentWaitsOnlyTheFlushWindow: two ingests on one database, each
// on a slot of its own, both with the default prefix and into one stream
// (a sql-mode projection with a table of its own, and a memory-mode
// projection, as a new user tries them). A transaction's documents are
// published within the flush window of its commit, each alone in its
// window: they do not wait for the next transaction, 0.5 s later. Fresh,
// and after the memory ingest was stopped while a change of its committed
// and then one of the other's. Before, that restarted ingest took the
// other's later event as its high-water mark and held the change's window
// open until a transaction past that mark came: the document went out
// with the next one's.
func TestDocumentWaitsOnlyTheFlushWindow(t *testing.T) {
	t.Parallel()
	for _, restart := range []bool{false, true} {
		name := "fresh"
		if restart {
			name = "restarted"
		}
		t.Run(name, func(t *testing.T) { testDocumentWaitsOnlyTheFlushWindow(t, restart) })
	}
}

func testDocumentWaitsOnlyTheFlushWindow(t *testing.T, restart bool) {
	pg := pgtest.Start(t, pgtest.Config{})
	pg.Exec("postgres", ordersSchema...)
	pg.Exec("postgres", "CREATE TABLE audit (id int PRIMARY KEY, v int)", "INSERT INTO audit VALUES (1, 0)")
	pg.Exec("postgres",
		"INSERT INTO customers VALUES (1, 'Ada')",
		"INSERT INTO orders VALUES (10, 'new', 1)",
		"INSERT INTO order_items VALUES (100, 10, 'a', 1)",
	)
	dirs := map[string]string{"orders_sql": t.TempDir(), "orders_memory": t.TempDir()}
	proj := func(name, mode string) func(*cdc.Config) {
		dir := dirs[name]
		return func(c *cdc.Config) {
			p := ordersProjection(mode)
			p[0].Name = name
			c.Slot, c.Publication, c.Projections, c.StateDir = name, name, p, dir
			if mode == cdc.ModeSQL {
				c.Tables = []string{"audit"} // and a table of its own
			}
		}
	}
	sqlRig := newRig(t, pg, proj("orders_sql", cdc.ModeSQL))
	memRig := &rig{t: t, pg: pg, b: sqlRig.b}
	memRig.start(proj("orders_memory", cdc.ModeMemory))
	sqlRig.events(3) // both bootstraps
	pg.Exec("postgres", "UPDATE orders SET status = 'paid' WHERE id = 10")
	sqlRig.events(5)
	want := 9
	if restart {
		// The memory ingest stops; a change of its commits meanwhile,
		// then one of the other's own table: the last event in the stream
		// is the other's, and later than the change it reads again.
		memRig.stop()
		pg.Exec("postgres", "UPDATE order_items SET qty = 2 WHERE id = 100")
		sqlRig.events(6) // the sql projection's document
		pg.Exec("postgres", "UPDATE audit SET v = 1")
		sqlRig.events(7)
		memRig.start(proj("orders_memory", cdc.ModeMemory))
		want = 10
	} else {
		pg.Exec("postgres", "UPDATE order_items SET qty = 2 WHERE id = 100")
	}
	// Both documents of that transaction are out before the next one.
	sqlRig.events(want - 2)
	time.Sleep(500 * time.Millisecond)
	pg.Exec("postgres", "UPDATE customers SET name = 'Ada L.' WHERE id = 1")
	evs := sqlRig.events(want)
	for i, e := range evs {
		if !strings.Contains(string(e.Doc), `"qty":2`) {
			continue
		}
		// <writer>:<L>-d<W>-<projection>-<key>: one transaction's window
		// has L = W.
		_, id, _ := strings.Cut(e.ID, ":")
		l, rest, _ := strings.Cut(id, "-d")
		w, _, _ := strings.Cut(rest, "-")
		if l != w && !strings.Contains(string(e.Doc), "Ada L.") {
			t.Errorf("event %d (%s) %s: its window spans transactions %s to %s", i, e.Subject, e.ID, w, l)
		}
	}
}

// TestStopConfirmsWhatIsPublished: an ingest asked to stop (SIGTERM) while
// transactions commit hands over what it decoded, waits for the broker
// and confirms: the slot's confirmed position is past the last event in
// the broker, so the next start has nothing to read again that the broker
// holds. Before, a stop confirmed nothing more: every deploy read again
// what was published since the last status update.
func TestStopConfirmsWhatIsPublished(t *testing.T) {
	t.Parallel()
	pg := pgtest.Start(t, pgtest.Config{})
	pg.Exec("postgres", "CREATE TABLE t (id int PRIMARY KEY, v int)", "INSERT INTO t SELECT g, 0 FROM generate_series(1, 10) g")
	r := newRig(t, pg, func(c *cdc.Config) { c.StatusInterval = time.Hour }) // no status update but the stop's
	r.events(10)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, pg.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	for i := range 200 {
		if _, err := conn.Exec(ctx, "UPDATE t SET v = v + 1 WHERE id = $1", i%10+1); err != nil {
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(20 * time.Second); r.in.Published() < 100; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no events published")
		}
	}
	r.stop()
	evs := allEvents(t, r.b)
	last, err := pglogrepl.ParseLSN(evs[len(evs)-1].LSN)
	if err != nil {
		t.Fatal(err)
	}
	var confirmed string
	if err := conn.QueryRow(ctx, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'fanwire'").Scan(&confirmed); err != nil {
		t.Fatal(err)
	}
	c, err := pglogrepl.ParseLSN(confirmed)
	if err != nil {
		t.Fatal(err)
	}
	if c <= last {
		t.Fatalf("the slot confirms %s; the last event in the broker (of %d) committed at %s", c, len(evs), last)
	}
	t.Logf("%d events in the broker; the slot confirms %s, past the last one's commit %s", len(evs), c, last)
}
