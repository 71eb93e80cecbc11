package cdc_test

import (
	"context"
	"testing"
	"time"

	"github.com/fanwire/fanwire/cdc"
	"github.com/fanwire/fanwire/cdc/pgtest"
	"github.com/jackc/pgx/v5"
)

// Failing tests of bugs found by TestProjectionRandomConsistency, each
// reduced to its smallest case.

// TestProjectionEmbedsOrderedByValue: order_by orders by the column's
// value, not by its text: items 9 and 10 come as [9, 10] (and notes, by
// their primary key by default, likewise).
func TestProjectionEmbedsOrderedByValue(t *testing.T) {
	t.Parallel()
	pg := pgtest.Start(t, pgtest.Config{})
	pg.Exec("postgres", ordersSchema...)
	pg.Exec("postgres",
		"INSERT INTO customers VALUES (1, 'Ada')",
		"INSERT INTO orders VALUES (1, 'new', 1)",
		"INSERT INTO order_items VALUES (9, 1, 'a', 1), (10, 1, 'b', 1)",
		"INSERT INTO notes VALUES (9, 9, 'x'), (10, 9, 'y')",
	)
	r := newRig(t, pg, func(c *cdc.Config) { c.Projections = ordersProjection(cdc.ModeSQL) })
	want := `{"id":1,"status":"new","customer_id":1,"items":[{"id":9,"sku":"a","qty":1,"notes":[{"body":"x"},{"body":"y"}]},{"id":10,"sku":"b","qty":1,"notes":[]}],"customer":{"id":1,"name":"Ada"}}`
	jsonEq(t, "bootstrap doc", r.events(1)[0].Doc, want)
}

// TestProjectionReadsItsOwnCommit: a document's event shows the database
// as of its transaction's commit, or later. The ingest re-reads a document
// as soon as the commit has been decoded, but a commit is decoded (and sent
// by the walsender) once its WAL is flushed, before the transaction becomes
// visible to other sessions: the committing backend first waits for
// synchronous standbys, still "running" in the proc array. The event then
// shows the document before the change. With a synchronous standby the
// window is a round trip to it on every commit; without one it is a
// scheduling gap, which TestProjectionRandomConsistency hits now and then.
// Here a synchronous standby that never answers holds the commit invisible
// for 2 s (or until the event is out), then it is let go.
func TestProjectionReadsItsOwnCommit(t *testing.T) {
	t.Parallel()
	pg := pgtest.Start(t, pgtest.Config{})
	pg.Exec("postgres", ordersSchema...)
	pg.Exec("postgres", "INSERT INTO customers VALUES (1, 'Ada')", "INSERT INTO orders VALUES (1, 'new', 1)", "CREATE TABLE probe (id int)")
	r := newRig(t, pg, func(c *cdc.Config) { c.Projections = ordersProjection(cdc.ModeSQL) })
	r.events(1)
	pg.Exec("postgres", "ALTER SYSTEM SET synchronous_standby_names = 'nobody'", "SELECT pg_reload_conf()")
	release := func() {
		pg.Exec("postgres", "ALTER SYSTEM RESET synchronous_standby_names", "SELECT pg_reload_conf()")
	}
	defer release()
	// The checkpointer applies the setting: until it has, commits do not
	// wait. A probe commit that waits (its wait cancelled after 200 ms,
	// committed locally) shows that it has.
	waitFor(t, "synchronous_standby_names to apply", 10*time.Second, func() bool {
		// The 200 ms bound the commit's wait, not the connect: a loaded
		// machine may take them to connect, and a failed connect is fatal.
		cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer ccancel()
		conn, err := pgx.Connect(cctx, pg.DSN("postgres"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(context.Background())
		ctx, cancel := context.WithTimeout(cctx, 200*time.Millisecond)
		defer cancel()
		_, err = conn.Exec(ctx, "INSERT INTO probe VALUES (1)")
		return err != nil && ctx.Err() != nil
	})
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		conn, err := pgx.Connect(ctx, pg.DSN("postgres"))
		if err != nil {
			done <- err
			return
		}
		defer conn.Close(context.Background())
		_, err = conn.Exec(ctx, "UPDATE orders SET status = 'paid' WHERE id = 1") // waits for the standby
		done <- err
	}()
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) && len(allEvents(t, r.b)) < 2 {
		time.Sleep(20 * time.Millisecond)
	}
	release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	e := r.events(2)[1]
	jsonEq(t, "the document of the UPDATE's event", e.Doc, `{"id":1,"status":"paid","customer_id":1,"items":[],"customer":{"id":1,"name":"Ada"}}`)
}

// TestProjectionNoEventForMissingParent: a child row whose parent does not
// exist (no foreign key, as the projection allows) belongs to no document;
// inserting, changing or deleting it publishes nothing. The direct lookup
// (the join reaches the primary key) takes the child's order_id as a
// document key without checking that the order exists, and the document
// then read as missing is published as op delete.
func TestProjectionNoEventForMissingParent(t *testing.T) {
	t.Parallel()
	bothModes(t, testProjectionNoEventForMissingParent)
}

func testProjectionNoEventForMissingParent(t *testing.T, mode string) {
	pg := pgtest.Start(t, pgtest.Config{})
	pg.Exec("postgres", randomSchema()...)
	pg.Exec("postgres", "INSERT INTO orders VALUES (1, 'new', NULL)")
	r := newRig(t, pg, func(c *cdc.Config) { c.Projections = ordersProjection(mode); c.StateDir = t.TempDir() })
	r.events(1)
	pg.Exec("postgres",
		"INSERT INTO order_items VALUES (7, 99, 'orphan', 1)", // order 99 never exists
		"UPDATE order_items SET qty = 2 WHERE id = 7",
		"DELETE FROM order_items WHERE id = 7",
		"UPDATE orders SET status = 'paid' WHERE id = 1", // the one event due
	)
	// Events keep the WAL's order: once order 1's is the last event, any
	// event of the orphan is in the stream, before it.
	var evs []event
	waitFor(t, "order 1's event", 20*time.Second, func() bool {
		evs = allEvents(t, r.b)
		return len(evs) > 1 && evs[len(evs)-1].Subject == "db.orders.1"
	})
	if got := docLines(evs[1:]); got != `upsert db.orders.1 {"id":1,"status":"paid","customer_id":null,"items":[],"customer":null}`+"\n" {
		t.Fatalf("events after the bootstrap:\n%s", got)
	}
}

// TestProjectionValuesAsTheOutputFunctionWritesThem: a projection reads
// values the way pgoutput sends them. It cast them to text, and three types
// cast differently from their output: a boolean customer column ("false"
// instead of "f") was malformed and the ingest crash-looped at start; an
// inet lost nothing but gained its netmask; a char(n) key lost its padding,
// so its document was never found again.
func TestProjectionValuesAsTheOutputFunctionWritesThem(t *testing.T) {
	t.Parallel()
	bothModes(t, testProjectionValuesAsTheOutputFunctionWritesThem)
}

func testProjectionValuesAsTheOutputFunctionWritesThem(t *testing.T, mode string) {
	pg := pgtest.Start(t, pgtest.Config{})
	pg.Exec("postgres",
		"CREATE TABLE customers (id char(4) PRIMARY KEY, vip boolean, ip inet)",
		"CREATE TABLE orders (id int PRIMARY KEY, customer_id char(4), paid boolean)",
		"CREATE TABLE order_items (id int PRIMARY KEY, order_id int, gift boolean)",
		"ALTER TABLE customers REPLICA IDENTITY FULL",
		"ALTER TABLE order_items REPLICA IDENTITY FULL",
		"INSERT INTO customers VALUES ('c1', false, '10.0.0.1')",
		"INSERT INTO orders VALUES (1, 'c1', true)",
		"INSERT INTO order_items VALUES (7, 1, false)",
	)
	spec := []cdc.ProjectionSpec{{Name: "orders", Table: "orders", Key: "id", Mode: mode, Embed: []cdc.EmbedSpec{
		{As: "items", Table: "order_items", On: map[string]string{"order_id": "id"}, Many: true},
		{As: "customer", Table: "customers", On: map[string]string{"id": "customer_id"}},
	}}}
	r := newRig(t, pg, func(c *cdc.Config) { c.Projections = spec; c.StateDir = t.TempDir() })
	want := func(vip string) string {
		return `{"id":1,"customer_id":"c1  ","paid":true,"items":[{"id":7,"order_id":1,"gift":false}],"customer":{"id":"c1  ","vip":` + vip + `,"ip":"10.0.0.1"}}`
	}
	jsonEq(t, "bootstrap doc", r.events(1)[0].Doc, want("false"))
	pg.Exec("postgres", "UPDATE customers SET vip = true")
	jsonEq(t, "doc after the customer's change", r.events(2)[1].Doc, want("true"))
}
