package cdc_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
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
	pg := pgtest.Start(t, pgtest.Config{})
	pg.Exec("postgres", ordersSchema...)
	pg.Exec("postgres",
		"INSERT INTO customers VALUES (1, 'Ada')",
		"INSERT INTO orders VALUES (1, 'new', 1)",
		"INSERT INTO order_items VALUES (9, 1, 'a', 1), (10, 1, 'b', 1)",
		"INSERT INTO notes VALUES (9, 9, 'x'), (10, 9, 'y')",
	)
	r := newRig(t, pg, func(c *cdc.Config) { c.Projections = ordersProjection() })
	want := `{"id":1,"status":"new","customer_id":1,"items":[{"id":9,"sku":"a","qty":1,"notes":[{"body":"x"},{"body":"y"}]},{"id":10,"sku":"b","qty":1,"notes":[]}],"customer":{"id":1,"name":"Ada"}}`
	jsonEq(t, "bootstrap doc", r.events(1)[0].Doc, want)
}

// TestProjectionReadsItsOwnCommit: a document's event shows at least the
// transaction it is the event of. 200 transactions (BEGIN; UPDATE; COMMIT)
// each set one order's status to the next number and read it back, as an
// application would; event i must show status i or later. The ingest keeps
// up, so it re-reads each document as soon as the commit is decoded, and
// then sees the database before that commit: the commit record is flushed
// (and sent by the walsender) before the transaction becomes visible to
// other sessions' snapshots.
func TestProjectionReadsItsOwnCommit(t *testing.T) {
	pg := pgtest.Start(t, pgtest.Config{})
	pg.Exec("postgres", ordersSchema...)
	pg.Exec("postgres", "INSERT INTO customers VALUES (1, 'Ada')", "INSERT INTO orders VALUES (1, '0', 1)")
	r := newRig(t, pg, func(c *cdc.Config) { c.Projections = ordersProjection() })
	r.events(1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, pg.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	const n = 200
	for i := 1; i <= n; i++ {
		for _, q := range []string{"BEGIN", fmt.Sprintf("UPDATE orders SET status = '%d' WHERE id = 1", i), "COMMIT"} {
			if _, err := conn.Exec(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
		var docs, lsn string // the test reads its write back, as an application would
		if err := conn.QueryRow(ctx, composeOrdersSQL).Scan(&docs, &lsn); err != nil {
			t.Fatal(err)
		}
	}
	evs := r.events(1 + n)[1:]
	stale := 0
	for i, e := range evs {
		var doc struct{ Status string }
		if err := json.Unmarshal(e.Doc, &doc); err != nil {
			t.Fatal(err)
		}
		if s, _ := strconv.Atoi(doc.Status); s < i+1 {
			stale++
			if stale <= 5 {
				t.Errorf("event %d (lsn %s) shows status %s: the database before its own commit", i+1, e.LSN, doc.Status)
			}
		}
	}
	if stale > 0 {
		t.Errorf("%d of %d events show a state older than their transaction; the last shows %s", stale, n, evs[n-1].Doc)
	}
}

// TestProjectionNoEventForMissingParent: a child row whose parent does not
// exist (no foreign key, as the projection allows) belongs to no document;
// inserting, changing or deleting it publishes nothing. The direct lookup
// (the join reaches the primary key) takes the child's order_id as a
// document key without checking that the order exists, and the document
// then read as missing is published as op delete.
func TestProjectionNoEventForMissingParent(t *testing.T) {
	pg := pgtest.Start(t, pgtest.Config{})
	pg.Exec("postgres", randomSchema()...)
	pg.Exec("postgres", "INSERT INTO orders VALUES (1, 'new', NULL)")
	r := newRig(t, pg, func(c *cdc.Config) { c.Projections = ordersProjection() })
	r.events(1)
	pg.Exec("postgres",
		"INSERT INTO order_items VALUES (7, 99, 'orphan', 1)", // order 99 never exists
		"UPDATE order_items SET qty = 2 WHERE id = 7",
		"DELETE FROM order_items WHERE id = 7",
		"UPDATE orders SET status = 'paid' WHERE id = 1", // the one event due
	)
	time.Sleep(time.Second) // any event of the orphan comes before order 1's
	evs := allEvents(t, r.b)
	if got := docLines(evs[1:]); got != `upsert db.orders.1 {"id":1,"status":"paid","customer_id":null,"items":[],"customer":null}`+"\n" {
		t.Fatalf("events after the bootstrap:\n%s", got)
	}
}
