package cdc_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fanwire/fanwire/broker"
	"github.com/fanwire/fanwire/cdc"
	"github.com/fanwire/fanwire/cdc/pgtest"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
)

// projSeed repeats a run of TestProjectionRandomConsistency (the test logs
// the seed it drew). FANWIRE_PROJECTION_SEED does the same.
var projSeed = flag.Uint64("projection-seed", 0, "seed of TestProjectionRandomConsistency (0: random)")

// composeOrdersSQL composes, in one query, every order's document exactly
// as ordersProjection(cdc.ModeSQL) defines it, independently of the ingest: an object
// of order id → document.
const composeOrdersSQL = `SELECT coalesce(json_object_agg(o.id, json_build_object(
	'id', o.id, 'status', o.status, 'customer_id', o.customer_id,
	'items', coalesce((SELECT json_agg(json_build_object('id', i.id, 'sku', i.sku, 'qty', i.qty,
		'notes', coalesce((SELECT json_agg(json_build_object('body', n.body) ORDER BY n.id) FROM notes n WHERE n.item_id = i.id), '[]'))
		ORDER BY i.id) FROM order_items i WHERE i.order_id = o.id), '[]'),
	'customer', (SELECT json_build_object('id', c.id, 'name', c.name) FROM customers c WHERE c.id = o.customer_id))), '{}')::text,
	pg_current_wal_insert_lsn()::text
FROM orders o`

// randomSchema is ordersSchema without its foreign keys: rows may then
// refer to parents that do not exist (yet, or any more), which the reverse
// lookups must get right too (an order inserted under existing items, a
// customer created for its orders, notes outliving their item), and any
// statement order is allowed.
func randomSchema() []string {
	out := make([]string, len(ordersSchema))
	for i, s := range ordersSchema {
		s = strings.Replace(s, " REFERENCES customers", "", 1)
		out[i] = strings.Replace(s, " REFERENCES orders", "", 1)
	}
	return out
}

// randomWorkload draws the random transactions' statements.
type randomWorkload struct {
	rng   *rand.Rand
	fresh int // next never-used order id (above the reused range)
}

var randomTexts = []string{"Ada", "O'Brien", `back\slash`, "Zoë", "😀 emoji", "line\nbreak", "tab\there", `"quoted"`, "", "new", "paid", "shipped"}

func sqlText(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

func (w *randomWorkload) text() string {
	if w.rng.IntN(12) == 0 {
		return "NULL"
	}
	return sqlText(randomTexts[w.rng.IntN(len(randomTexts))])
}

func (w *randomWorkload) customer() int { return 1 + w.rng.IntN(14) }
func (w *randomWorkload) item() int     { return 1 + w.rng.IntN(160) }
func (w *randomWorkload) note() int     { return 1 + w.rng.IntN(220) }

// order is an id in the reused range, or now and then one never used.
func (w *randomWorkload) order() int {
	if w.rng.IntN(10) == 0 {
		w.fresh++
		return w.fresh
	}
	return 1 + w.rng.IntN(50)
}

// ref is a join value: mostly one of n's range, sometimes NULL.
func (w *randomWorkload) ref(n func() int) string {
	if w.rng.IntN(15) == 0 {
		return "NULL"
	}
	return strconv.Itoa(n())
}

func (w *randomWorkload) body() string {
	if w.rng.IntN(10) == 0 { // 3.2 kB, incompressible: stored out of line (TOAST)
		return "(SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 100))"
	}
	return w.text()
}

// statements returns one random operation's statements (usually one).
// Statements on orders return the ids they touch.
func (w *randomWorkload) statements() []string {
	r := w.rng
	switch r.IntN(30) {
	case 0, 1:
		return []string{fmt.Sprintf("INSERT INTO customers VALUES (%d, %s) ON CONFLICT (id) DO NOTHING", w.customer(), w.text())}
	case 2, 3:
		return []string{fmt.Sprintf("UPDATE customers SET name = %s WHERE id = %d", w.text(), w.customer())}
	case 4:
		return []string{fmt.Sprintf("DELETE FROM customers WHERE id = %d", w.customer())}
	case 5: // a customer with its orders and their items
		c := w.customer()
		return []string{
			fmt.Sprintf("DELETE FROM order_items WHERE order_id IN (SELECT id FROM orders WHERE customer_id = %d)", c),
			fmt.Sprintf("DELETE FROM orders WHERE customer_id = %d RETURNING id", c),
			fmt.Sprintf("DELETE FROM customers WHERE id = %d", c),
		}
	case 6: // a customer's key changes: its orders lose it, others may gain it
		a, b := w.customer(), w.customer()
		return []string{fmt.Sprintf("UPDATE customers SET id = %d WHERE id = %d AND NOT EXISTS (SELECT 1 FROM customers WHERE id = %d)", b, a, b)}
	case 7, 8, 9:
		return []string{fmt.Sprintf("INSERT INTO orders VALUES (%d, %s, %s) ON CONFLICT (id) DO NOTHING RETURNING id", w.order(), w.text(), w.ref(w.customer))}
	case 10, 11:
		return []string{fmt.Sprintf("UPDATE orders SET status = %s WHERE id = %d RETURNING id", w.text(), w.order())}
	case 12: // an order changes customer
		return []string{fmt.Sprintf("UPDATE orders SET customer_id = %s WHERE id = %d RETURNING id", w.ref(w.customer), w.order())}
	case 13: // alone: its items stay, orphaned
		return []string{fmt.Sprintf("DELETE FROM orders WHERE id = %d RETURNING id", w.order())}
	case 14: // with its items
		o := w.order()
		return []string{fmt.Sprintf("DELETE FROM order_items WHERE order_id = %d", o), fmt.Sprintf("DELETE FROM orders WHERE id = %d RETURNING id", o)}
	case 15: // an order's key changes
		a, b := w.order(), w.order()
		return []string{fmt.Sprintf("UPDATE orders SET id = %d WHERE id = %d AND NOT EXISTS (SELECT 1 FROM orders WHERE id = %d) RETURNING id", b, a, b)}
	case 16, 17, 18:
		return []string{fmt.Sprintf("INSERT INTO order_items VALUES (%d, %s, %s, %d) ON CONFLICT (id) DO NOTHING", w.item(), w.ref(w.order), w.text(), r.IntN(10))}
	case 19:
		return []string{fmt.Sprintf("UPDATE order_items SET qty = %d, sku = %s WHERE id = %d", r.IntN(10), w.text(), w.item())}
	case 20, 21: // an item moves to another order
		return []string{fmt.Sprintf("UPDATE order_items SET order_id = %s WHERE id = %d", w.ref(w.order), w.item())}
	case 22: // all of an order's items move
		return []string{fmt.Sprintf("UPDATE order_items SET order_id = %d WHERE order_id = %d", w.order(), w.order())}
	case 23: // an item's key changes: its notes stay behind
		a, b := w.item(), w.item()
		return []string{fmt.Sprintf("UPDATE order_items SET id = %d WHERE id = %d AND NOT EXISTS (SELECT 1 FROM order_items WHERE id = %d)", b, a, b)}
	case 24:
		return []string{fmt.Sprintf("DELETE FROM order_items WHERE id = %d", w.item())}
	case 25, 26:
		return []string{fmt.Sprintf("INSERT INTO notes VALUES (%d, %s, %s) ON CONFLICT (id) DO NOTHING", w.note(), w.ref(w.item), w.body())}
	case 27:
		if r.IntN(2) == 0 {
			return []string{fmt.Sprintf("UPDATE notes SET body = %s WHERE id = %d", w.body(), w.note())}
		}
		return []string{fmt.Sprintf("UPDATE notes SET item_id = %s WHERE id = %d", w.ref(w.item), w.note())}
	case 28:
		return []string{fmt.Sprintf("DELETE FROM notes WHERE id = %d", w.note())}
	default: // bulk: many rows in one statement (with the TOASTed notes, big enough to stream)
		switch r.IntN(3) {
		case 0:
			return []string{"UPDATE order_items SET qty = qty + 1"}
		case 1:
			return []string{fmt.Sprintf("UPDATE notes SET item_id = item_id + 1 WHERE item_id %% 4 = %d", r.IntN(4))}
		}
		return []string{fmt.Sprintf("UPDATE orders SET status = %s WHERE id %% 3 = %d RETURNING id", w.text(), r.IntN(3))}
	}
}

// TestProjectionRandomConsistency: ~300 seeded random transactions of 1–5
// statements on every table of ordersProjection(cdc.ModeSQL) (inserts, updates and
// deletes, children moving between parents, keys changing, orphans, rolled
// back transactions and savepoints, bulk statements that stream) while the
// ingest runs. Once it has confirmed the WAL, for every order that ever
// existed, its last event equals the document the test composes itself
// with json_build_object (or is a delete when the order is gone); every
// change of a document was followed by an event of it; and no order that
// never existed has an event. This checks that the reverse lookups miss
// nothing.
func TestProjectionRandomConsistency(t *testing.T) {
	t.Parallel()
	bothModes(t, testProjectionRandomConsistency)
}

func testProjectionRandomConsistency(t *testing.T, mode string) {
	seed := *projSeed
	if s := os.Getenv("FANWIRE_PROJECTION_SEED"); seed == 0 && s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("FANWIRE_PROJECTION_SEED=%q: %v", s, err)
		}
	}
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (repeat with -projection-seed %d or FANWIRE_PROJECTION_SEED=%d)", seed, seed, seed)
	w := &randomWorkload{rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), fresh: 1000}

	pg := pgtest.Start(t, pgtest.Config{Settings: map[string]string{"logical_decoding_work_mem": "64kB"}})
	pg.Exec("postgres", randomSchema()...)
	pg.Exec("postgres",
		"INSERT INTO customers SELECT g, 'c' || g FROM generate_series(1, 10) g",
		"INSERT INTO orders SELECT g, 'new', 1 + g % 12 FROM generate_series(1, 30) g", // customers 11, 12: missing
		"INSERT INTO order_items SELECT g, 1 + g % 35, 'sku' || g, g % 7 FROM generate_series(1, 90) g",
		"INSERT INTO notes SELECT g, 1 + g % 100, 'n' || g FROM generate_series(1, 60) g",
	)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, pg.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())

	// snapshot composes every order now, with the WAL position.
	snapshot := func() (map[string]json.RawMessage, pglogrepl.LSN) {
		t.Helper()
		var docs, lsn string
		if err := conn.QueryRow(ctx, composeOrdersSQL).Scan(&docs, &lsn); err != nil {
			t.Fatal(err)
		}
		m := make(map[string]json.RawMessage)
		if err := json.Unmarshal([]byte(docs), &m); err != nil {
			t.Fatal(err)
		}
		l, err := pglogrepl.ParseLSN(lsn)
		if err != nil {
			t.Fatal(err)
		}
		return m, l
	}
	// existed: the orders visible after some commit; touched: the ids
	// statements of committed transactions returned (an order inserted and
	// deleted inside one transaction never existed, but its delete event
	// is harmless).
	existed := make(map[string]bool)
	touched := make(map[string]bool)
	before, _ := snapshot()
	for k := range before {
		existed[k] = true
	}

	r := newRig(t, pg, func(c *cdc.Config) { c.Projections, c.StateDir = ordersProjection(mode), t.TempDir() })
	r.events(len(before)) // the bootstrap
	prev, prevLSN := snapshot()

	// A document that changed in the transaction committed after LSN
	// `after` must have an event at a later LSN.
	type changed struct {
		key   string
		after pglogrepl.LSN
		txn   int
	}
	var changes []changed
	const txns = 300
	var committed, rolledBack, savepoints, stmts, padded int
	exec := func(sql string) []string {
		t.Helper()
		rows, err := conn.Query(ctx, sql)
		if err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		var ids []string
		for rows.Next() {
			if len(rows.FieldDescriptions()) == 1 {
				var id int
				if err := rows.Scan(&id); err != nil {
					t.Fatalf("%s: %v", sql, err)
				}
				ids = append(ids, strconv.Itoa(id))
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		return ids
	}
	var trace strings.Builder // FANWIRE_PROJECTION_TRACE: the transactions and events, written to that file
	for i := range txns {
		fmt.Fprintf(&trace, "txn %d after %s\n", i, prevLSN)
		exec("BEGIN")
		var ids []string
		if w.rng.IntN(12) == 0 {
			// Rows of no document, enough to pass logical_decoding_work_mem
			// (64kB): the transaction streams, and its changes below go the
			// streamed way (savepoints included).
			padded++
			exec("INSERT INTO notes SELECT 100000 + g, NULL, repeat('p', 100) FROM generate_series(1, 1000) g")
			exec("DELETE FROM notes WHERE id > 100000")
		}
		for n := 1 + w.rng.IntN(3); n > 0; n-- { // 1–3 operations: 1–5 statements, mostly
			st := w.statements()
			stmts += len(st)
			if w.rng.IntN(12) == 0 { // undone by a savepoint
				savepoints++
				exec("SAVEPOINT s")
				for _, s := range st {
					exec(s)
				}
				exec("ROLLBACK TO SAVEPOINT s")
				continue
			}
			for _, s := range st {
				fmt.Fprintf(&trace, "  %s\n", s)
				ids = append(ids, exec(s)...)
			}
		}
		if w.rng.IntN(15) == 0 {
			exec("ROLLBACK")
			rolledBack++
			continue
		}
		exec("COMMIT")
		committed++
		fmt.Fprintf(&trace, "  COMMIT\n")
		for _, id := range ids {
			touched[id] = true
		}
		now, lsn := snapshot()
		for k, d := range now {
			existed[k] = true
			if p, ok := prev[k]; !ok || !jsonSame(p, d) {
				changes = append(changes, changed{k, prevLSN, i})
			}
		}
		for k := range prev {
			if _, ok := now[k]; !ok {
				changes = append(changes, changed{k, prevLSN, i})
			}
		}
		prev, prevLSN = now, lsn
	}
	final, end := snapshot()

	// Everything committed is confirmed: published and acknowledged.
	waitFor(t, "the ingest confirming "+end.String(), 30*time.Second, func() bool { return r.in.Confirmed() >= end })
	evs := allEvents(t, r.b)

	if f := os.Getenv("FANWIRE_PROJECTION_TRACE"); f != "" {
		for _, e := range evs {
			fmt.Fprintf(&trace, "event %s %s %s %s\n", e.LSN, e.Op, e.Subject, e.Doc)
		}
		if err := os.WriteFile(f, []byte(trace.String()), 0o644); err != nil {
			t.Error(err)
		}
	}
	last := make(map[string]event)
	seenIDs := make(map[string]bool)
	var deletes, upserts int
	for _, e := range evs {
		key, ok := strings.CutPrefix(e.Subject, "db.orders.")
		if !ok {
			t.Fatalf("an event on %s: only the orders projection publishes", e.Subject)
		}
		if !existed[key] && !(touched[key] && e.Op == "delete") {
			t.Errorf("an event for order %s, which never existed: %s %s", key, e.Op, e.Doc)
		}
		if seenIDs[e.ID] {
			t.Errorf("event id %s twice", e.ID)
		}
		seenIDs[e.ID] = true
		if string(e.Key) != key {
			t.Errorf("event on %s has key %s", e.Subject, e.Key)
		}
		switch e.Op {
		case "upsert":
			upserts++
			if string(e.Doc) == "null" {
				t.Errorf("upsert of %s without a doc", key)
			}
		case "delete":
			deletes++
			if string(e.Doc) != "null" {
				t.Errorf("delete of %s with doc %s", key, e.Doc)
			}
		default:
			t.Errorf("event on %s: op %q", e.Subject, e.Op)
		}
		if p, ok := last[key]; ok && lsnOf(t, e) < lsnOf(t, p) {
			t.Errorf("order %s: event at %s after one at %s", key, e.LSN, p.LSN)
		}
		last[key] = e
	}
	// Every order's last event is its document now; a document that
	// changed had an event after the change.
	keys := make([]string, 0, len(existed))
	for k := range existed {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int { x, _ := strconv.Atoi(a); y, _ := strconv.Atoi(b); return x - y })
	for _, k := range keys {
		e, ok := last[k]
		if !ok {
			t.Errorf("order %s: no event at all", k)
			continue
		}
		want, exists := final[k]
		if !exists {
			if e.Op != "delete" || string(e.Doc) != "null" {
				t.Errorf("order %s is gone, but its last event is %s %s (at %s)", k, e.Op, e.Doc, e.LSN)
			}
			continue
		}
		if e.Op != "upsert" || !jsonSame(e.Doc, want) {
			t.Errorf("order %s: last event (at %s) is %s %s\nthe database composes %s", k, e.LSN, e.Op, e.Doc, want)
		}
	}
	missed := 0
	for _, c := range changes {
		if e, ok := last[c.key]; !ok || lsnOf(t, e) <= c.after {
			missed++
			if missed <= 10 {
				t.Errorf("order %s changed in transaction %d (after %s), but has no event after it", c.key, c.txn, c.after)
			}
		}
	}
	var streamed int
	if err := conn.QueryRow(ctx, "SELECT coalesce(sum(stream_txns), 0) FROM pg_stat_replication_slots").Scan(&streamed); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d transactions committed, %d rolled back, %d statements, %d savepoints rolled back, %d padded to stream, %d streamed; %d orders existed, %d now; %d document changes; %d events (%d upserts, %d deletes)",
		committed, rolledBack, stmts, savepoints, padded, streamed, len(existed), len(final), len(changes), len(evs), upserts, deletes)
}

// jsonSame compares two JSON texts semantically.
func jsonSame(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	xb, _ := json.Marshal(x)
	yb, _ := json.Marshal(y)
	return string(xb) == string(yb)
}

func lsnOf(t *testing.T, e event) pglogrepl.LSN {
	t.Helper()
	l, err := pglogrepl.ParseLSN(e.LSN)
	if err != nil {
		t.Fatalf("event %s: lsn %q: %v", e.ID, e.LSN, err)
	}
	return l
}

// allEvents returns every event in the stream.
func allEvents(t *testing.T, b *broker.JetStream) []event {
	t.Helper()
	var got []event
	err := b.Replay(context.Background(), []string{"db.>"}, "", "js:100000000", func(ms []broker.Message) error {
		for _, m := range ms {
			var e event
			if err := json.Unmarshal(m.Data, &e); err != nil {
				return fmt.Errorf("event %s is not JSON: %v: %s", m.Cursor, err, m.Data)
			}
			e.Subject, e.Cursor = m.Subject, m.Cursor
			got = append(got, e)
		}
		return nil
	})
	if err != nil && !strings.Contains(err.Error(), "ahead of the stream") {
		t.Fatal(err)
	}
	return got
}
