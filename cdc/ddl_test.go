package cdc_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fanwire/fanwire/cdc"
	"github.com/fanwire/fanwire/cdc/pgtest"
	"go.uber.org/zap/zaptest"
)

// ddlRows is how many rows each table of TestDDLInsideATransaction has,
// each updated before the DDL: with a 200-byte pad, over the 64kB of
// logical_decoding_work_mem, so that the streamed run streams them.
const ddlRows = 500

// ddlCase is one DDL statement run in the middle of a transaction that
// updates every row of its table before it and one row after it.
type ddlCase struct {
	name   string
	before []string // set-up, before the ingest starts (besides the table)
	ddl    []string // %[1]s is the table
	after  []string // the statements after the DDL, in the same transaction
	// want checks the events on the table's subjects (and others the DDL
	// made): the ddlRows updates from before the DDL, then what after made.
	want func(t *testing.T, tbl string, evs []event)
}

// beforeDoc is the document an update before the DDL gives row k.
func beforeDoc(k int) string {
	return fmt.Sprintf(`{"id":%d,"a":%d,"b":"b%d","c":"c%d","pad":%q}`, k, k+1, k, k, strings.Repeat("p", 200))
}

// checkBefore checks that the first ddlRows events are the updates from
// before the DDL, with the columns the table had then, on subject.
func checkBefore(t *testing.T, tbl string, evs []event) []event {
	t.Helper()
	if len(evs) < ddlRows {
		t.Fatalf("%s: %d events, want at least %d: %s", tbl, len(evs), ddlRows, docLines(evs))
	}
	for k := 1; k <= ddlRows; k++ {
		e := evs[k-1]
		if e.Op != "update" || e.Subject != fmt.Sprintf("db.%s.%d", tbl, k) {
			t.Fatalf("%s: event %d is %s on %s (%s), want the update of row %d from before the DDL", tbl, k-1, e.Op, e.Subject, e.Error, k)
		}
		jsonEq(t, fmt.Sprintf("%s: row %d updated before the DDL", tbl, k), e.Doc, beforeDoc(k))
	}
	return evs[ddlRows:]
}

// padJSON is the pad column's value in the documents.
var padJSON = fmt.Sprintf("%q", strings.Repeat("p", 200))

var ddlCases = []ddlCase{
	{
		name: "add_column",
		ddl:  []string{"ALTER TABLE %[1]s ADD COLUMN d int DEFAULT 7"},
		after: []string{
			"UPDATE %[1]s SET a = a + 1 WHERE id = 1",
			"INSERT INTO %[1]s (id, a, b, c, pad, d) VALUES (1000, 0, 'x', 'y', 'z', NULL)",
		},
		want: func(t *testing.T, tbl string, evs []event) {
			evs = checkBefore(t, tbl, evs)
			wantEvents(t, tbl, evs,
				`update 1 {"id":1,"a":3,"b":"b1","c":"c1","pad":`+padJSON+`,"d":7}`,
				`insert 1000 {"id":1000,"a":0,"b":"x","c":"y","pad":"z","d":null}`)
		},
	},
	{
		name: "drop_column",
		ddl:  []string{"ALTER TABLE %[1]s DROP COLUMN b"},
		after: []string{
			"UPDATE %[1]s SET a = a + 1 WHERE id = 1",
			"DELETE FROM %[1]s WHERE id = 2",
		},
		want: func(t *testing.T, tbl string, evs []event) {
			evs = checkBefore(t, tbl, evs)
			wantEvents(t, tbl, evs,
				`update 1 {"id":1,"a":3,"c":"c1","pad":`+padJSON+`}`,
				`delete 2 null`)
		},
	},
	{
		name:  "rename_column",
		ddl:   []string{"ALTER TABLE %[1]s RENAME COLUMN c TO c2"},
		after: []string{"UPDATE %[1]s SET a = a + 1 WHERE id = 1"},
		want: func(t *testing.T, tbl string, evs []event) {
			evs = checkBefore(t, tbl, evs)
			wantEvents(t, tbl, evs, `update 1 {"id":1,"a":3,"b":"b1","c2":"c1","pad":`+padJSON+`}`)
		},
	},
	{
		// A new type rewrites the table: its rows are not changes.
		name:  "retype_column",
		ddl:   []string{"ALTER TABLE %[1]s ALTER COLUMN a TYPE text USING a::text"},
		after: []string{"UPDATE %[1]s SET a = a || '!' WHERE id = 1"},
		want: func(t *testing.T, tbl string, evs []event) {
			evs = checkBefore(t, tbl, evs)
			wantEvents(t, tbl, evs, `update 1 {"id":1,"a":"2!","b":"b1","c":"c1","pad":`+padJSON+`}`)
		},
	},
	{
		name:  "rename_key_column",
		ddl:   []string{"ALTER TABLE %[1]s RENAME COLUMN id TO item_id"},
		after: []string{"UPDATE %[1]s SET a = a + 1 WHERE item_id = 1", "DELETE FROM %[1]s WHERE item_id = 2"},
		want: func(t *testing.T, tbl string, evs []event) {
			evs = checkBefore(t, tbl, evs)
			wantEvents(t, tbl, evs, `update 1 {"item_id":1,"a":3,"b":"b1","c":"c1","pad":`+padJSON+`}`, `delete 2 null`)
		},
	},
	{
		name:  "rename_table",
		ddl:   []string{"ALTER TABLE %[1]s RENAME TO %[1]s_v2"},
		after: []string{"UPDATE %[1]s_v2 SET a = a + 1 WHERE id = 1"},
		want: func(t *testing.T, tbl string, evs []event) {
			evs = checkBefore(t, tbl, evs)
			wantEvents(t, tbl+"_v2", evs, `update 1 {"id":1,"a":3,"b":"b1","c":"c1","pad":`+padJSON+`}`)
		},
	},
	{
		name:   "set_schema",
		before: []string{"CREATE SCHEMA sales"},
		ddl:    []string{"ALTER TABLE %[1]s SET SCHEMA sales"},
		after:  []string{"UPDATE sales.%[1]s SET a = a + 1 WHERE id = 1"},
		want: func(t *testing.T, tbl string, evs []event) {
			evs = checkBefore(t, tbl, evs)
			wantEvents(t, "sales."+tbl, evs, `update 1 {"id":1,"a":3,"b":"b1","c":"c1","pad":`+padJSON+`}`)
		},
	},
	{
		name: "create_table",
		ddl: []string{
			"CREATE TABLE %[1]s_new (id int PRIMARY KEY, v text)",
		},
		after: []string{"INSERT INTO %[1]s_new VALUES (1, 'one'), (2, NULL)", "UPDATE %[1]s_new SET v = 'two' WHERE id = 2"},
		want: func(t *testing.T, tbl string, evs []event) {
			evs = checkBefore(t, tbl, evs)
			wantEvents(t, tbl+"_new", evs, `insert 1 {"id":1,"v":"one"}`, `insert 2 {"id":2,"v":null}`, `update 2 {"id":2,"v":"two"}`)
		},
	},
	{
		name: "drop_table",
		ddl:  []string{"DROP TABLE %[1]s"},
		want: func(t *testing.T, tbl string, evs []event) {
			evs = checkBefore(t, tbl, evs)
			wantEvents(t, tbl, evs)
		},
	},
}

// wantEvents checks that evs are exactly want, each "op key doc", on
// subjects db.<tbl>.<key>.
func wantEvents(t *testing.T, tbl string, evs []event, want ...string) {
	t.Helper()
	if len(evs) != len(want) {
		t.Fatalf("%s: %d events after the DDL, want %d:\n%s", tbl, len(evs), len(want), docLines(evs))
	}
	for i, w := range want {
		op, rest, _ := strings.Cut(w, " ")
		key, doc, _ := strings.Cut(rest, " ")
		e := evs[i]
		if e.Op != op || e.Subject != "db."+tbl+"."+key {
			t.Fatalf("%s: event %d after the DDL is %s on %s (%s %s), want %s on db.%s.%s", tbl, i, e.Op, e.Subject, e.Reason, e.Error, op, tbl, key)
		}
		jsonEq(t, fmt.Sprintf("%s: event %d after the DDL", tbl, i), e.Doc, doc)
	}
}

// TestDDLInsideATransaction: every DDL a migration runs (a column added,
// dropped, renamed, retyped; the key column renamed; the table renamed,
// moved to another schema, dropped; a table created), in the middle of a
// transaction that updates every row of the table before it and writes
// rows after it, streamed and not. Every row change comes out with the
// columns its table had when it was written, on the table's subject of
// that moment, and the ingest goes on. Before, the changes before the DDL
// were encoded with the table as it was at the commit (error events, or
// values under the wrong names), a renamed key column stopped the ingest
// for good, and the rows of a renamed, moved or new table were dropped.
func TestDDLInsideATransaction(t *testing.T) {
	t.Parallel()
	for _, v := range []struct {
		name     string
		work     string // logical_decoding_work_mem
		maxTxn   int64  // Config.MaxTxnMemory (0: the default)
		spilled  bool
		streamed bool
	}{
		{name: "whole", work: "1GB"},
		{name: "streamed", work: "64kB", streamed: true},
		{name: "spilled", work: "1GB", maxTxn: 64 << 10, spilled: true},
		{name: "streamed_spilled", work: "64kB", maxTxn: 64 << 10, streamed: true, spilled: true},
	} {
		t.Run(v.name, func(t *testing.T) {
			pg := pgtest.Start(t, pgtest.Config{Settings: map[string]string{"logical_decoding_work_mem": v.work}})
			for _, c := range ddlCases {
				tbl := "t_" + c.name
				pg.Exec("postgres", c.before...)
				pg.Exec("postgres",
					fmt.Sprintf("CREATE TABLE %s (id int PRIMARY KEY, a int, b text, c text, pad text)", tbl),
					fmt.Sprintf("INSERT INTO %s SELECT g, g, 'b' || g, 'c' || g, repeat('p', 200) FROM generate_series(1, %d) g", tbl, ddlRows),
				)
			}
			r := newRig(t, pg, func(c *cdc.Config) { c.StateDir, c.MaxTxnMemory = t.TempDir(), v.maxTxn })
			r.events(len(ddlCases) * ddlRows) // the bootstrap
			for _, c := range ddlCases {
				tbl := "t_" + c.name
				stmts := []string{"BEGIN", fmt.Sprintf("UPDATE %s SET a = a + 1", tbl)}
				for _, s := range append(c.ddl, c.after...) {
					stmts = append(stmts, fmt.Sprintf(s, tbl))
				}
				pg.Exec("postgres", append(stmts, "COMMIT")...)
			}
			// A last transaction after them all: the ingest goes on.
			pg.Exec("postgres", "CREATE TABLE done (id int PRIMARY KEY)", "INSERT INTO done VALUES (1)")
			var all []event
			for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
				all = allEvents(t, r.b)
				if len(all) > 0 && all[len(all)-1].Subject == "db.done.1" {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the last transaction's event is not in the stream after 60s (%d events); the last ones:\n%s", len(all), docLines(all[max(0, len(all)-5):]))
				}
			}
			all = all[len(ddlCases)*ddlRows:]
			for _, c := range ddlCases {
				tbl := "t_" + c.name
				var evs []event
				for _, e := range all {
					if strings.HasPrefix(e.Subject, "db."+tbl) || strings.HasPrefix(e.Subject, "db.sales."+tbl) || strings.HasPrefix(e.Subject, "db.%errors") {
						evs = append(evs, e)
					}
				}
				t.Run(c.name, func(t *testing.T) { c.want(t, tbl, evs) })
			}
			if v.streamed {
				var n int
				if err := pgQuery(pg, "SELECT coalesce(sum(stream_txns), 0) FROM pg_stat_replication_slots", &n); err != nil {
					t.Fatal(err)
				}
				if n < len(ddlCases) {
					t.Fatalf("%d transactions streamed, want %d: the test did not test streaming", n, len(ddlCases))
				}
			}
			if got := metricValue(t, r.in, "fanwire_ingest_spilled_transactions_total"); v.spilled && got < float64(len(ddlCases)) || !v.spilled && got != 0 {
				t.Fatalf("%v transactions spilled (want spilled: %v)", got, v.spilled)
			}
		})
	}
}

// TestDDLUnderProjections: in both modes, DDL on a projection's tables
// that leaves its columns alone (a column added, another dropped, one it
// does not name renamed) in the middle of a transaction changes nothing
// of its documents; one that renames a column it names stops the ingest
// at once with an error naming the column and saying a DDL changed it
// (before, the change failed, the ingest reconnected logging only
// "context canceled", and stopped at its next start-up's check).
func TestDDLUnderProjections(t *testing.T) { bothModes(t, testDDLUnderProjections) }

func testDDLUnderProjections(t *testing.T, mode string) {
	pg := pgtest.Start(t, pgtest.Config{})
	pg.Exec("postgres",
		"CREATE TABLE orders (id int PRIMARY KEY, status text, note text)",
		"CREATE TABLE order_items (id int PRIMARY KEY, order_id int NOT NULL, qty int, extra text)",
		"CREATE INDEX ON order_items (order_id)",
		"ALTER TABLE order_items REPLICA IDENTITY FULL",
		"INSERT INTO orders VALUES (1, 'new', 'n')",
		"INSERT INTO order_items VALUES (10, 1, 1, 'e')",
	)
	specs := []cdc.ProjectionSpec{{Name: "orders", Table: "orders", Key: "id", Mode: mode, Columns: []string{"id", "status"},
		Embed: []cdc.EmbedSpec{{As: "items", Table: "order_items", On: map[string]string{"order_id": "id"}, Many: true, OrderBy: "id", Columns: []string{"id", "qty"}}}}}
	b, _ := jetStream(t)
	in, err := cdc.New(cdc.Config{DSN: pg.DSN("postgres"), Broker: b, Logger: zaptest.NewLogger(t), StatusInterval: 100 * time.Millisecond, Retry: 100 * time.Millisecond,
		Projections: specs, StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- in.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()
	r := &rig{t: t, pg: pg, b: b, in: in}
	r.events(1)
	pg.Exec("postgres",
		"BEGIN",
		"UPDATE order_items SET qty = 2",
		"ALTER TABLE order_items ADD COLUMN added int DEFAULT 5",
		"ALTER TABLE order_items DROP COLUMN extra",
		"UPDATE orders SET status = 'paid'",
		"ALTER TABLE orders RENAME COLUMN note TO memo",
		"UPDATE order_items SET qty = 3",
		"UPDATE orders SET memo = 'm'",
		"COMMIT",
	)
	evs := r.events(2)
	jsonEq(t, "the document after the transaction", evs[1].Doc, `{"id":1,"status":"paid","items":[{"id":10,"qty":3}]}`)
	pg.Exec("postgres", "BEGIN", "UPDATE order_items SET qty = 4", "ALTER TABLE order_items RENAME COLUMN qty TO quantity", "UPDATE order_items SET quantity = 5", "COMMIT")
	select {
	case err := <-done:
		done <- err
		if err == nil || !strings.Contains(err.Error(), "qty") || !strings.Contains(err.Error(), "DDL") {
			t.Fatalf("the ingest ended with %v; want an error naming the column qty and the DDL, at once (not from a reconnect's start-up)", err)
		}
		t.Logf("stopped: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("a DDL renaming a column the projection names did not stop the ingest")
	}
}
