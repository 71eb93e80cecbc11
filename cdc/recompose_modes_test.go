package cdc_test

import (
	"context"
	"encoding/json"
	"flag"
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

var modesSeed = flag.Uint64("modes-seed", 0, "seed of TestProjectionModesAgree (0: random)")

// TestProjectionModesAgree runs one projection in each mode over the same
// tables, in one ingest, and drives random transactions: inserts, updates
// and deletes at every level, items moving between orders, orders changing
// customer, customers renamed. Every transaction keeps each order's total
// equal to the sum of its items' quantities, so a document that mixes two
// states breaks that: no document of either mode may. At the end, the last
// document of every order is the same in both modes and equal to a fresh
// composition from the database.
func TestProjectionModesAgree(t *testing.T) {
	t.Parallel()
	seed := *modesSeed
	if seed == 0 {
		seed = rand.Uint64()
	}
	t.Logf("seed %d (repeat with -modes-seed %d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	pg := pgtest.Start(t, pgtest.Config{})
	pg.Exec("postgres",
		"CREATE TABLE customers (id int PRIMARY KEY, name text)",
		"CREATE TABLE orders (id int PRIMARY KEY, customer_id int, total int NOT NULL)",
		"CREATE INDEX ON orders (customer_id)",
		"CREATE TABLE items (id int PRIMARY KEY, order_id int NOT NULL, qty int NOT NULL)",
		"CREATE INDEX ON items (order_id)",
		"ALTER TABLE items REPLICA IDENTITY FULL",
		"ALTER TABLE customers REPLICA IDENTITY FULL",
		"INSERT INTO customers SELECT g, 'c' || g FROM generate_series(1, 5) g",
		"INSERT INTO orders SELECT g, g % 5 + 1, 0 FROM generate_series(1, 15) g",
	)
	spec := func(name, mode string) cdc.ProjectionSpec {
		return cdc.ProjectionSpec{Name: name, Table: "orders", Key: "id", Mode: mode, Embed: []cdc.EmbedSpec{
			{As: "items", Table: "items", On: map[string]string{"order_id": "id"}, Many: true, OrderBy: "id", Columns: []string{"id", "qty"}},
			{As: "customer", Table: "customers", On: map[string]string{"id": "customer_id"}},
		}}
	}
	r := newRig(t, pg, func(c *cdc.Config) {
		c.Projections = []cdc.ProjectionSpec{spec("osql", cdc.ModeSQL), spec("omem", cdc.ModeMemory)}
		c.StateDir = t.TempDir()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, pg.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	exec := txExec(t, ctx, conn)
	nextItem, nextOrder := 1, 16
	for range 300 {
		var stmts []string
		for range 1 + rng.IntN(3) {
			o := 1 + rng.IntN(nextOrder-1)
			switch rng.IntN(8) {
			case 0, 1, 2: // a new item
				q := 1 + rng.IntN(9)
				stmts = append(stmts,
					fmt.Sprintf("INSERT INTO items SELECT %d, id, %d FROM orders WHERE id = %d", nextItem, q, o),
					fmt.Sprintf("UPDATE orders SET total = total + %d WHERE id = %d", q, o))
				nextItem++
			case 3: // an item moves to order o
				it := 1 + rng.IntN(nextItem)
				stmts = append(stmts,
					fmt.Sprintf("UPDATE orders SET total = total - coalesce((SELECT qty FROM items WHERE id = %d), 0) WHERE id = (SELECT order_id FROM items WHERE id = %d)", it, it),
					fmt.Sprintf("UPDATE items SET order_id = %d WHERE id = %d AND EXISTS (SELECT 1 FROM orders WHERE id = %d)", o, it, o),
					fmt.Sprintf("UPDATE orders SET total = total + coalesce((SELECT qty FROM items WHERE id = %d AND order_id = %d), 0) WHERE id = %d", it, o, o),
					// when o did not exist the item stayed: give its order its qty back
					fmt.Sprintf("UPDATE orders SET total = total + coalesce((SELECT qty FROM items WHERE id = %d), 0) WHERE id = (SELECT order_id FROM items WHERE id = %d) AND id <> %d", it, it, o))
			case 4: // an item's quantity changes
				it, q := 1+rng.IntN(nextItem), 1+rng.IntN(9)
				stmts = append(stmts,
					fmt.Sprintf("UPDATE orders SET total = total - coalesce((SELECT qty FROM items WHERE id = %d), 0) + %d WHERE id = (SELECT order_id FROM items WHERE id = %d)", it, q, it),
					fmt.Sprintf("UPDATE items SET qty = %d WHERE id = %d", q, it))
			case 5: // an item deleted
				it := 1 + rng.IntN(nextItem)
				stmts = append(stmts,
					fmt.Sprintf("UPDATE orders SET total = total - coalesce((SELECT qty FROM items WHERE id = %d), 0) WHERE id = (SELECT order_id FROM items WHERE id = %d)", it, it),
					fmt.Sprintf("DELETE FROM items WHERE id = %d", it))
			case 6: // an order changes customer, or a customer is renamed
				if rng.IntN(2) == 0 {
					stmts = append(stmts, fmt.Sprintf("UPDATE orders SET customer_id = %d WHERE id = %d", 1+rng.IntN(6), o)) // 6: no such customer
				} else {
					stmts = append(stmts, fmt.Sprintf("UPDATE customers SET name = 'c%d-%d' WHERE id = %d", o%5+1, rng.IntN(1000), o%5+1))
				}
			case 7: // an order deleted with its items, or a new one
				if rng.IntN(2) == 0 {
					stmts = append(stmts, fmt.Sprintf("DELETE FROM items WHERE order_id = %d", o), fmt.Sprintf("DELETE FROM orders WHERE id = %d", o))
				} else {
					stmts = append(stmts, fmt.Sprintf("INSERT INTO orders VALUES (%d, %d, 0)", nextOrder, 1+rng.IntN(5)))
					nextOrder++
				}
			}
		}
		exec(stmts...)
	}
	var end pglogrepl.LSN
	var lsnText string
	if err := conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsnText); err != nil {
		t.Fatal(err)
	}
	if end, err = pglogrepl.ParseLSN(lsnText); err != nil {
		t.Fatal(err)
	}
	for r.in.Confirmed() < end {
		if ctx.Err() != nil {
			t.Fatalf("the ingest confirmed %s, the WAL is at %s", r.in.Confirmed(), end)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Every event of both projections.
	type doc struct {
		CustomerID *int `json:"customer_id"`
		Total      int  `json:"total"`
		Items      []struct {
			ID  int `json:"id"`
			Qty int `json:"qty"`
		} `json:"items"`
		Customer *struct {
			ID   int    `json:"id"`
			Name string `json:"name"`
		} `json:"customer"`
	}
	canon := func(raw []byte) string {
		if string(raw) == "null" {
			return "null"
		}
		var d doc
		if err := json.Unmarshal(raw, &d); err != nil {
			t.Fatalf("%v: %s", err, raw)
		}
		b, _ := json.Marshal(d)
		return string(b)
	}
	last := map[string]map[string]string{"osql": {}, "omem": {}}
	count := map[string]int{}
	perKey := map[string][]string{} // "key" → lsn list per projection, for a report
	for _, e := range allEvents(t, r.b) {
		parts := strings.Split(e.Subject, ".")
		proj, key := parts[1], parts[2]
		count[proj]++
		perKey[key] = append(perKey[key], proj+"@"+e.LSN)
		if e.Op == "upsert" {
			var d doc
			_ = json.Unmarshal(e.Doc, &d)
			sum := 0
			for _, it := range d.Items {
				sum += it.Qty
			}
			if sum != d.Total {
				t.Errorf("%s %s: total %d but its items sum to %d: a document no commit had: %s", proj, key, d.Total, sum, e.Doc)
			}
		}
		last[proj][key] = canon(e.Doc)
	}
	// The database's documents.
	want := dbDocs(t, ctx, conn, canon, `SELECT o.id::text, json_build_object('customer_id', o.customer_id, 'total', o.total,
		'items', coalesce((SELECT json_agg(json_build_object('id', i.id, 'qty', i.qty) ORDER BY i.id) FROM items i WHERE i.order_id = o.id), '[]'),
		'customer', (SELECT json_build_object('id', c.id, 'name', c.name) FROM customers c WHERE c.id = o.customer_id))::text FROM orders o`)
	for id := 1; id < nextOrder; id++ {
		k := fmt.Sprint(id)
		w, ok := want[k]
		if !ok {
			w = "null" // deleted
		}
		for _, proj := range []string{"osql", "omem"} {
			if got := last[proj][k]; got != w {
				t.Errorf("%s order %s: last document %s, database %s", proj, k, got, w)
			}
		}
	}
	t.Logf("%d orders; events: sql %d, memory %d", nextOrder-1, count["osql"], count["omem"])
	for k, l := range perKey {
		n := map[string]int{}
		for _, x := range l {
			n[strings.SplitN(x, "@", 2)[0]]++
		}
		if n["osql"] != n["omem"] && testing.Verbose() {
			t.Logf("order %s: %v", k, l)
		}
	}
}

// txExec returns a function that runs its statements in one transaction on
// conn, failing t on an error.
func txExec(t *testing.T, ctx context.Context, conn *pgx.Conn) func(sqls ...string) {
	return func(sqls ...string) {
		t.Helper()
		b := &pgx.Batch{}
		b.Queue("BEGIN")
		for _, q := range sqls {
			b.Queue(q)
		}
		b.Queue("COMMIT")
		if err := conn.SendBatch(ctx, b).Close(); err != nil {
			t.Fatalf("%v: %v", sqls, err)
		}
	}
}

// dbDocs runs query, whose rows are a key and a JSON document, and returns
// the documents by key, as canon writes them.
func dbDocs(t *testing.T, ctx context.Context, conn *pgx.Conn, canon func([]byte) string, query string) map[string]string {
	t.Helper()
	rows, err := conn.Query(ctx, query)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	docs := map[string]string{}
	for rows.Next() {
		var k, j string
		if err := rows.Scan(&k, &j); err != nil {
			t.Fatal(err)
		}
		docs[k] = canon([]byte(j))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return docs
}
