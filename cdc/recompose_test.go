package cdc_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/fanwire/fanwire/cdc"
	"github.com/fanwire/fanwire/cdc/pgtest"
)

// ordersSchema is the schema of docs/projections.md's example.
var ordersSchema = []string{
	"CREATE TABLE customers (id int PRIMARY KEY, name text)",
	"CREATE TABLE orders (id int PRIMARY KEY, status text, customer_id int REFERENCES customers)",
	"CREATE INDEX ON orders (customer_id)",
	"CREATE TABLE order_items (id int PRIMARY KEY, order_id int REFERENCES orders, sku text, qty int)",
	"CREATE INDEX ON order_items (order_id)",
	"CREATE TABLE notes (id int PRIMARY KEY, item_id int, body text)",
	"CREATE INDEX ON notes (item_id)",
	"ALTER TABLE customers REPLICA IDENTITY FULL",
	"ALTER TABLE order_items REPLICA IDENTITY FULL",
	"ALTER TABLE notes REPLICA IDENTITY FULL",
}

// ordersProjection embeds items (with their notes, nested) and the
// customer, recomposed in mode.
func ordersProjection(mode string) []cdc.ProjectionSpec {
	return []cdc.ProjectionSpec{{
		Name: "orders", Table: "public.orders", Key: "id", Mode: mode,
		Embed: []cdc.EmbedSpec{
			{As: "items", Table: "order_items", On: map[string]string{"order_id": "id"}, Many: true, OrderBy: "id", Columns: []string{"id", "sku", "qty"},
				Embed: []cdc.EmbedSpec{{As: "notes", Table: "notes", On: map[string]string{"item_id": "id"}, Many: true, Columns: []string{"body"}}}},
			{As: "customer", Table: "customers", On: map[string]string{"id": "customer_id"}},
		},
	}}
}

// bothModes runs test as a subtest per projection mode, sql and memory.
func bothModes(t *testing.T, test func(t *testing.T, mode string)) {
	for _, mode := range []string{cdc.ModeSQL, cdc.ModeMemory} {
		t.Run(mode, func(t *testing.T) { test(t, mode) })
	}
}

// docs returns the events' "op subject doc" lines.
func docLines(evs []event) string {
	var b strings.Builder
	for _, e := range evs {
		fmt.Fprintf(&b, "%s %s %s\n", e.Op, e.Subject, e.Doc)
	}
	return b.String()
}

// TestProjectionRecomposes: every lookup direction of the sql mode, on a
// real PostgreSQL: the bootstrap publishes each document once; a change of
// the primary row, of a child, of a grandchild and of a shared parent
// (customer) recomposes exactly the affected documents; a child moving
// between parents recomposes both; changes within one transaction are
// coalesced; deletes at every level; a deleted primary row is op delete.
func TestProjectionRecomposes(t *testing.T) {
	t.Parallel()
	bothModes(t, testProjectionRecomposes)
}

func testProjectionRecomposes(t *testing.T, mode string) {
	pg := pgtest.Start(t, pgtest.Config{})
	pg.Exec("postgres", ordersSchema...)
	pg.Exec("postgres",
		"INSERT INTO customers VALUES (1, 'Ada'), (2, 'Bob')",
		"INSERT INTO orders VALUES (10, 'new', 1), (11, 'new', 1), (12, 'new', 2)",
		"INSERT INTO order_items VALUES (100, 10, 'a', 1), (101, 10, 'b', 2), (102, 11, 'c', 3)",
		"INSERT INTO notes VALUES (1000, 100, 'gift')",
	)
	r := newRig(t, pg, func(c *cdc.Config) { c.Projections, c.StateDir = ordersProjection(mode), t.TempDir() })
	evs := r.events(3)
	want := `upsert db.orders.10 {"id":10,"status":"new","customer_id":1,"items":[{"id":100,"sku":"a","qty":1,"notes":[{"body":"gift"}]},{"id":101,"sku":"b","qty":2,"notes":[]}],"customer":{"id":1,"name":"Ada"}}
upsert db.orders.11 {"id":11,"status":"new","customer_id":1,"items":[{"id":102,"sku":"c","qty":3,"notes":[]}],"customer":{"id":1,"name":"Ada"}}
upsert db.orders.12 {"id":12,"status":"new","customer_id":2,"items":[],"customer":{"id":2,"name":"Bob"}}
`
	if got := docLines(evs); got != want {
		t.Fatalf("bootstrap:\n%s\nwant:\n%s", got, want)
	}
	n := 3
	step := func(what string, sqls []string, want string) {
		t.Helper()
		pg.Exec("postgres", sqls...)
		k := strings.Count(want, "\n")
		evs := r.events(n + k)[n:]
		n += k
		if got := docLines(evs); got != want {
			t.Fatalf("%s:\n%s\nwant:\n%s", what, got, want)
		}
	}
	step("primary row", []string{"UPDATE orders SET status = 'paid' WHERE id = 12"},
		`upsert db.orders.12 {"id":12,"status":"paid","customer_id":2,"items":[],"customer":{"id":2,"name":"Bob"}}
`)
	step("child inserted", []string{"INSERT INTO order_items VALUES (103, 12, 'd', 4)"},
		`upsert db.orders.12 {"id":12,"status":"paid","customer_id":2,"items":[{"id":103,"sku":"d","qty":4,"notes":[]}],"customer":{"id":2,"name":"Bob"}}
`)
	step("grandchild", []string{"UPDATE notes SET body = 'wrap it' WHERE id = 1000"},
		`upsert db.orders.10 {"id":10,"status":"new","customer_id":1,"items":[{"id":100,"sku":"a","qty":1,"notes":[{"body":"wrap it"}]},{"id":101,"sku":"b","qty":2,"notes":[]}],"customer":{"id":1,"name":"Ada"}}
`)
	step("shared parent: a customer recomposes all of its orders", []string{"UPDATE customers SET name = 'Ada L.' WHERE id = 1"},
		`upsert db.orders.10 {"id":10,"status":"new","customer_id":1,"items":[{"id":100,"sku":"a","qty":1,"notes":[{"body":"wrap it"}]},{"id":101,"sku":"b","qty":2,"notes":[]}],"customer":{"id":1,"name":"Ada L."}}
upsert db.orders.11 {"id":11,"status":"new","customer_id":1,"items":[{"id":102,"sku":"c","qty":3,"notes":[]}],"customer":{"id":1,"name":"Ada L."}}
`)
	step("a child moves from 10 to 11: both recomposed", []string{"UPDATE order_items SET order_id = 11 WHERE id = 101"},
		`upsert db.orders.10 {"id":10,"status":"new","customer_id":1,"items":[{"id":100,"sku":"a","qty":1,"notes":[{"body":"wrap it"}]}],"customer":{"id":1,"name":"Ada L."}}
upsert db.orders.11 {"id":11,"status":"new","customer_id":1,"items":[{"id":101,"sku":"b","qty":2,"notes":[]},{"id":102,"sku":"c","qty":3,"notes":[]}],"customer":{"id":1,"name":"Ada L."}}
`)
	step("one transaction, many changes to one document: one event", []string{
		"BEGIN",
		"UPDATE orders SET status = 'packed' WHERE id = 11",
		"UPDATE order_items SET qty = 9 WHERE id = 102",
		"INSERT INTO notes VALUES (1001, 102, 'fragile')",
		"COMMIT",
	}, `upsert db.orders.11 {"id":11,"status":"packed","customer_id":1,"items":[{"id":101,"sku":"b","qty":2,"notes":[]},{"id":102,"sku":"c","qty":9,"notes":[{"body":"fragile"}]}],"customer":{"id":1,"name":"Ada L."}}
`)
	step("a deleted grandchild recomposes its document", []string{"DELETE FROM notes WHERE id = 1001"},
		`upsert db.orders.11 {"id":11,"status":"packed","customer_id":1,"items":[{"id":101,"sku":"b","qty":2,"notes":[]},{"id":102,"sku":"c","qty":9,"notes":[]}],"customer":{"id":1,"name":"Ada L."}}
`)
	step("a deleted child recomposes its document", []string{"DELETE FROM order_items WHERE id = 101"},
		`upsert db.orders.11 {"id":11,"status":"packed","customer_id":1,"items":[{"id":102,"sku":"c","qty":9,"notes":[]}],"customer":{"id":1,"name":"Ada L."}}
`)
	step("a deleted primary row, with its children, in one transaction", []string{"BEGIN", "DELETE FROM order_items WHERE order_id = 12", "DELETE FROM orders WHERE id = 12", "COMMIT"},
		`delete db.orders.12 null
`)
	step("a child moving to another parent inside one transaction", []string{
		"BEGIN",
		"UPDATE order_items SET order_id = 10 WHERE id = 102",
		"UPDATE order_items SET order_id = 11 WHERE id = 102",
		"UPDATE order_items SET order_id = 10 WHERE id = 102",
		"COMMIT",
	}, `upsert db.orders.10 {"id":10,"status":"new","customer_id":1,"items":[{"id":100,"sku":"a","qty":1,"notes":[{"body":"wrap it"}]},{"id":102,"sku":"c","qty":9,"notes":[]}],"customer":{"id":1,"name":"Ada L."}}
upsert db.orders.11 {"id":11,"status":"packed","customer_id":1,"items":[],"customer":{"id":1,"name":"Ada L."}}
`)
}

// TestProjectionCatalogErrors: a configuration that does not fit the
// database is refused at start with every problem named.
func TestProjectionCatalogErrors(t *testing.T) {
	t.Parallel()
	pg := pgtest.Start(t, pgtest.Config{})
	pg.Exec("postgres", ordersSchema...)
	pg.Exec("postgres",
		"CREATE TABLE nokey (id int, x text)",
		"CREATE TABLE widgets (id int PRIMARY KEY, order_ref text)",
		"ALTER TABLE widgets REPLICA IDENTITY FULL",
		"CREATE TABLE plain (id int PRIMARY KEY, order_id int)",
	)
	b, _ := jetStream(t)
	specs := []cdc.ProjectionSpec{
		{Name: "a", Table: "missing", Key: "id"},
		{Name: "b", Table: "nokey", Key: "id"},
		{Name: "c", Table: "orders", Key: "status"},
		{Name: "d", Table: "orders", Key: "id", Columns: []string{"id", "nope"}, Embed: []cdc.EmbedSpec{
			{As: "w", Table: "widgets", On: map[string]string{"order_ref": "id"}, Many: true},
			{As: "p", Table: "plain", On: map[string]string{"order_id": "id"}, Many: true},
			{As: "x", Table: "order_items", On: map[string]string{"ghost": "id"}, Many: true},
		}},
	}
	in, err := cdc.New(cdc.Config{DSN: pg.DSN("postgres"), Broker: b, Projections: specs})
	if err != nil {
		t.Fatal(err)
	}
	err = in.Run(t.Context())
	if err == nil {
		t.Fatal("Run accepted a configuration that does not fit the database")
	}
	for _, want := range []string{
		`projection "a": table public.missing does not exist`,
		`projection "b": table public.nokey has no primary key`,
		`projection "c": key "status": the primary key of public.orders is (id)`,
		`projection "d": columns: public.orders has no column "nope"`,
		`projection "d": embed "w": on: public.widgets.order_ref is text but public.orders.id is integer: a join needs equal types`,
		`projection "d": embed "p": table public.plain must send its old rows`,
		`ALTER TABLE "public"."plain" REPLICA IDENTITY FULL`,
		`projection "d": embed "x": on: public.order_items has no column "ghost"`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
}

// TestProjectionFanOut: a customer with 1,000 orders; renaming it
// recomposes every one of them, once, in both modes.
func TestProjectionFanOut(t *testing.T) {
	t.Parallel()
	bothModes(t, func(t *testing.T, mode string) {
		pg := pgtest.Start(t, pgtest.Config{})
		pg.Exec("postgres", ordersSchema...)
		pg.Exec("postgres",
			"INSERT INTO customers VALUES (1, 'Ada'), (2, 'Bob')",
			"INSERT INTO orders SELECT g, 'new', 1 FROM generate_series(1, 1000) g",
			"INSERT INTO orders VALUES (5000, 'new', 2)",
		)
		r := newRig(t, pg, func(c *cdc.Config) { c.Projections, c.StateDir = ordersProjection(mode), t.TempDir() })
		r.events(1001)
		pg.Exec("postgres", "UPDATE customers SET name = 'Ada L.' WHERE id = 1")
		evs := r.events(2001)[1001:]
		seen := map[string]bool{}
		for _, e := range evs {
			if seen[e.Subject] {
				t.Fatalf("%s twice", e.Subject)
			}
			seen[e.Subject] = true
			if e.Op != "upsert" || !strings.Contains(string(e.Doc), `"customer":{"id":1,"name":"Ada L."}`) {
				t.Fatalf("%s: %s %s", e.Subject, e.Op, e.Doc)
			}
		}
		if seen["db.orders.5000"] {
			t.Fatal("order 5000 (another customer) recomposed")
		}
	})
}
