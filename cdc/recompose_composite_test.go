package cdc_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/fanwire/fanwire/cdc"
	"github.com/fanwire/fanwire/cdc/pgtest"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
)

// TestProjectionCompositeJoinsAgree: both modes over tables whose keys are
// text or several columns and whose joins take two columns, one of them
// sometimes NULL (joining nothing): the memory state finds such rows by
// hash, not by an integer's value. Random transactions insert, update,
// re-key (an item moves to another order: its primary key changes),
// delete and now and then truncate the items; the ingest restarts halfway
// (the memory state is loaded from its file). At the end the last document
// of every order is the same in both modes and as the database composes it.
func TestProjectionCompositeJoinsAgree(t *testing.T) {
	t.Parallel()
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	pg := pgtest.Start(t, pgtest.Config{})
	pg.Exec("postgres",
		"CREATE TABLE customers (tenant text, id int, name text, PRIMARY KEY (tenant, id))",
		"CREATE TABLE orders (code text PRIMARY KEY, tenant text NOT NULL, cust int)",
		"CREATE TABLE items (tenant text, order_code text, n int, qty int NOT NULL, PRIMARY KEY (tenant, order_code, n))",
		"ALTER TABLE items REPLICA IDENTITY FULL",
		"ALTER TABLE customers REPLICA IDENTITY FULL",
		"INSERT INTO customers SELECT t, g, t || '-c' || g FROM generate_series(1, 4) g, unnest(ARRAY['a', 'b']) t",
		"INSERT INTO orders SELECT 'o-' || g, CASE WHEN g % 2 = 0 THEN 'a' ELSE 'b' END, g % 4 + 1 FROM generate_series(1, 12) g",
	)
	spec := func(name, mode string) cdc.ProjectionSpec {
		return cdc.ProjectionSpec{Name: name, Table: "orders", Key: "code", Mode: mode, Embed: []cdc.EmbedSpec{
			{As: "items", Table: "items", On: map[string]string{"tenant": "tenant", "order_code": "code"}, Many: true},
			{As: "customer", Table: "customers", On: map[string]string{"tenant": "tenant", "id": "cust"}},
		}}
	}
	state := t.TempDir()
	mutate := func(c *cdc.Config) {
		c.Projections = []cdc.ProjectionSpec{spec("osql", cdc.ModeSQL), spec("omem", cdc.ModeMemory)}
		c.StateDir = state
	}
	r := newRig(t, pg, mutate)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, pg.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	exec := txExec(t, ctx, conn)
	orders := 12
	for step := range 250 {
		if step == 125 {
			r.stop()
			r.start(mutate)
		}
		var stmts []string
		for range 1 + rng.IntN(3) {
			o := fmt.Sprintf("o-%d", 1+rng.IntN(orders))
			n := rng.IntN(6)
			switch rng.IntN(10) {
			case 0, 1, 2: // a new item (or a new quantity)
				stmts = append(stmts, fmt.Sprintf("INSERT INTO items SELECT tenant, code, %d, %d FROM orders WHERE code = '%s' ON CONFLICT (tenant, order_code, n) DO UPDATE SET qty = excluded.qty", n, 1+rng.IntN(9), o))
			case 3: // an item moves to another order of its tenant
				stmts = append(stmts, fmt.Sprintf("UPDATE items SET order_code = '%s' WHERE (tenant, order_code, n) = (SELECT tenant, order_code, n FROM items WHERE n = %d AND order_code <> '%s' AND tenant = (SELECT tenant FROM orders WHERE code = '%s') LIMIT 1) AND NOT EXISTS (SELECT 1 FROM items WHERE order_code = '%s' AND n = %d)", o, n, o, o, o, n))
			case 4:
				stmts = append(stmts, fmt.Sprintf("DELETE FROM items WHERE order_code = '%s' AND n = %d", o, n))
			case 5: // a customer, no customer, or none at all
				c := "NULL"
				if rng.IntN(3) > 0 {
					c = fmt.Sprint(1 + rng.IntN(5)) // 5: no such customer
				}
				stmts = append(stmts, fmt.Sprintf("UPDATE orders SET cust = %s WHERE code = '%s'", c, o))
			case 6:
				stmts = append(stmts, fmt.Sprintf("UPDATE customers SET name = name || '+' WHERE id = %d", 1+rng.IntN(4)))
			case 7: // an order moves to the other tenant: its items no longer join it
				stmts = append(stmts, fmt.Sprintf("UPDATE orders SET tenant = CASE tenant WHEN 'a' THEN 'b' ELSE 'a' END WHERE code = '%s'", o))
			case 8:
				if rng.IntN(2) == 0 {
					stmts = append(stmts, fmt.Sprintf("DELETE FROM orders WHERE code = '%s'", o))
				} else {
					orders++
					stmts = append(stmts, fmt.Sprintf("INSERT INTO orders VALUES ('o-%d', 'a', %d)", orders, 1+rng.IntN(4)))
				}
			case 9:
				if rng.IntN(8) == 0 {
					stmts = append(stmts, "TRUNCATE items")
				}
			}
		}
		exec(stmts...)
	}
	var lsnText string
	if err := conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsnText); err != nil {
		t.Fatal(err)
	}
	end, err := pglogrepl.ParseLSN(lsnText)
	if err != nil {
		t.Fatal(err)
	}
	for r.in.Confirmed() < end {
		if ctx.Err() != nil {
			t.Fatalf("the ingest confirmed %s, the WAL is at %s", r.in.Confirmed(), end)
		}
		time.Sleep(20 * time.Millisecond)
	}
	canon := func(raw []byte) string {
		var v any
		if err := json.Unmarshal(raw, &v); err != nil {
			t.Fatalf("%v: %s", err, raw)
		}
		b, _ := json.Marshal(v) // map keys sorted
		return string(b)
	}
	last := map[string]map[string]string{"osql": {}, "omem": {}}
	for _, e := range allEvents(t, r.b) {
		parts := strings.Split(e.Subject, ".")
		proj, key := parts[1], parts[2]
		if last[proj] == nil {
			t.Fatalf("event on %s", e.Subject)
		}
		last[proj][key] = canon(e.Doc)
	}
	want := dbDocs(t, ctx, conn, canon, `SELECT o.code, json_build_object('code', o.code, 'tenant', o.tenant, 'cust', o.cust,
		'items', coalesce((SELECT json_agg(json_build_object('tenant', i.tenant, 'order_code', i.order_code, 'n', i.n, 'qty', i.qty) ORDER BY i.n)
			FROM items i WHERE i.tenant = o.tenant AND i.order_code = o.code), '[]'),
		'customer', (SELECT json_build_object('tenant', c.tenant, 'id', c.id, 'name', c.name) FROM customers c WHERE c.tenant = o.tenant AND c.id = o.cust))::text FROM orders o`)
	for id := 1; id <= orders; id++ {
		k := fmt.Sprintf("o-%d", id)
		w, ok := want[k]
		if !ok {
			w = "null" // deleted
		}
		for _, proj := range []string{"osql", "omem"} {
			got, ok := last[proj][k]
			if !ok {
				got = "null" // never published: inserted and deleted within a transaction
			}
			if got != w {
				t.Errorf("%s order %s: last document %s, database %s", proj, k, got, w)
			}
		}
	}
}
