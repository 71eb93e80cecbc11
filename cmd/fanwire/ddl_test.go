package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/fanwire/fanwire/cdc/pgtest"
	"github.com/jackc/pgx/v5"
)

// ddlTable is one table of TestDDLUnderLoadKilled and the migration it
// goes through: its names (the subject's table part and the key column)
// before and after.
type ddlTable struct {
	name, key       string
	ddl             string // %s: the table's name
	newName, newKey string // after the DDL ("" : unchanged)
}

// TestDDLUnderLoadKilled: single-row updates keep committing on seven
// tables while each goes through a migration (a column added, dropped,
// renamed, retyped; the key column renamed; the table renamed, moved to
// another schema), each in a transaction that also updates every row of
// its table before the DDL and one after; the ingest is killed (kill -9)
// three times meanwhile and kept down past the duplicate window. Every
// row's changes are in the broker once each, in order, on the subject of
// its table's name at the time, from its bootstrap insert to its value
// now, and every id is there once.
func TestDDLUnderLoadKilled(t *testing.T) {
	t.Parallel() // a process-level test that mostly waits: beside the others (make test's time)
	bin := buildBinary(t)
	tables := []ddlTable{
		{name: "t_add", key: "id", ddl: "ALTER TABLE %s ADD COLUMN d int DEFAULT 7"},
		{name: "t_drop", key: "id", ddl: "ALTER TABLE %s DROP COLUMN b"},
		{name: "t_rename", key: "id", ddl: "ALTER TABLE %s RENAME COLUMN b TO b2"},
		{name: "t_retype", key: "id", ddl: "ALTER TABLE %s ALTER COLUMN b TYPE int USING length(b)"},
		{name: "t_key", key: "id", ddl: "ALTER TABLE %s RENAME COLUMN id TO item_id", newKey: "item_id"},
		{name: "t_table", key: "id", ddl: "ALTER TABLE %s RENAME TO t_table2", newName: "t_table2"},
		{name: "t_schema", key: "id", ddl: "ALTER TABLE %s SET SCHEMA sales", newName: "sales.t_schema"},
	}
	const rows = 30
	for _, kind := range []string{"jetstream", "redis"} {
		t.Run(kind, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
			defer cancel()
			pg := pgtest.Start(t, pgtest.Config{})
			pg.Exec("postgres", "CREATE SCHEMA sales")
			for _, tb := range tables {
				pg.Exec("postgres", fmt.Sprintf("CREATE TABLE %s (id int PRIMARY KEY, v int, b text)", tb.name),
					fmt.Sprintf("INSERT INTO %s SELECT g, 0, 'b' || g FROM generate_series(1, %d) g", tb.name, rows))
			}
			b := newRestartableBroker(ctx, t, kind, time.Second)
			var logs procLogs
			dump := logs.dump
			addr := listenAddr(t)
			start := logs.starter(t, bin, append([]string{"ingest", "--pg", pg.DSN("postgres"), "--listen", addr, "--log-level", "info", "--state-dir", t.TempDir()}, b.args...))
			cmd := start()
			defer func() {
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
			}()
			waitIngest(t, addr, "ready", dump)

			// The writer: single-row updates, and each table's migration in
			// turn, one every 150 updates.
			progress := make(chan int, 1000)
			written := make(chan error, 1)
			go func() {
				defer close(progress)
				written <- migrateUnderLoad(ctx, pg.DSN("postgres"), tables, rows, progress)
			}()
			kills := 0
			for n := range progress {
				if kills < 3 && n >= (kills+1)*250 {
					_ = cmd.Process.Kill()
					_ = cmd.Wait()
					time.Sleep(1500 * time.Millisecond) // past the duplicate window
					cmd = start()
					kills++
				}
			}
			if err := <-written; err != nil {
				t.Fatal(err)
			}
			waitIngest(t, addr, "ready", dump)
			// Each row's value now, by its table's first name.
			final := map[string]map[int]int{}
			conn, err := pgx.Connect(ctx, pg.DSN("postgres"))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(context.Background())
			for _, tb := range tables {
				name, key := tb.name, tb.key
				if tb.newName != "" {
					name = tb.newName
				}
				if tb.newKey != "" {
					key = tb.newKey
				}
				final[tb.name] = map[int]int{}
				res, err := conn.Query(ctx, fmt.Sprintf("SELECT %s, v FROM %s", key, name))
				if err != nil {
					t.Fatal(err)
				}
				for res.Next() {
					var id, v int
					_ = res.Scan(&id, &v)
					final[tb.name][id] = v
				}
				res.Close()
			}
			// A subject's table part → the table's first name.
			first := map[string]string{}
			for _, tb := range tables {
				first[tb.name] = tb.name
				if tb.newName != "" {
					first[tb.newName] = tb.name
				}
			}
			type keyed struct {
				table string
				key   int
			}
			var evs []storedEvent
			var last map[keyed]int
			check := func() error {
				last = map[keyed]int{}
				ids := map[string]bool{}
				for _, e := range evs {
					var ev struct {
						ID  string
						Op  string
						Key int
						Doc struct{ V int }
					}
					if err := json.Unmarshal(e.Data, &ev); err != nil {
						return err
					}
					if ids[ev.ID] {
						return fmt.Errorf("%s: id %s twice", e.Subject, ev.ID)
					}
					ids[ev.ID] = true
					part := strings.TrimPrefix(e.Subject[:strings.LastIndexByte(e.Subject, '.')], "db.")
					tb, ok := first[part]
					if !ok {
						return fmt.Errorf("an event on %s (%s %s)", e.Subject, ev.Op, e.Data)
					}
					k := keyed{tb, ev.Key}
					prev, seen := last[k]
					if !seen && ev.Op != "insert" || seen && (ev.Op != "update" || ev.Doc.V != prev+1) {
						return fmt.Errorf("%s: %s v %d after v %d (seen %v): a gap, a repeat or out of order: %s", e.Subject, ev.Op, ev.Doc.V, prev, seen, e.Data)
					}
					last[k] = ev.Doc.V
				}
				return nil
			}
			caughtUp := func() bool {
				for tb, vals := range final {
					for k, v := range vals {
						if last[keyed{tb, k}] != v {
							return false
						}
					}
				}
				return true
			}
			for deadline := time.Now().Add(40 * time.Second); ; time.Sleep(100 * time.Millisecond) {
				evs = b.stored(ctx, t)
				if err := check(); err != nil {
					t.Fatalf("%v; logs:\n%s", err, dump())
				}
				if caughtUp() {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("not every row's last value is in the broker after 40s; logs:\n%s", dump())
				}
			}
			t.Logf("%d events over %d kills, each once, every change in order; %s", len(evs), kills, grepLines(dump(), "past the high-water mark"))
		})
	}
}

// migrateUnderLoad commits single-row updates of random rows of tables and,
// every 150 of them, the next table's migration, with an update of every
// row before the DDL and one after it, in one transaction. It sends its
// progress (updates committed) after each one.
func migrateUnderLoad(ctx context.Context, dsn string, tables []ddlTable, rows int, progress chan<- int) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	rng := rand.New(rand.NewPCG(3, 4))
	migrated := 0
	name := func(tb ddlTable, i int) (string, string) {
		if i < migrated {
			n, k := tb.name, tb.key
			if tb.newName != "" {
				n = tb.newName
			}
			if tb.newKey != "" {
				k = tb.newKey
			}
			return n, k
		}
		return tb.name, tb.key
	}
	for n := 1; migrated < len(tables) || n%150 != 0; n++ {
		i := rng.IntN(len(tables))
		tn, key := name(tables[i], i)
		if _, err := conn.Exec(ctx, fmt.Sprintf("UPDATE %s SET v = v + 1 WHERE %s = $1", tn, key), 1+rng.IntN(rows)); err != nil {
			return err
		}
		progress <- n
		if n%150 == 0 && migrated < len(tables) {
			tb := tables[migrated]
			migrated++
			tn, key := name(tb, migrated-1)
			tx, err := conn.Begin(ctx)
			if err != nil {
				return err
			}
			for _, q := range []string{"UPDATE " + tb.name + " SET v = v + 1", fmt.Sprintf(tb.ddl, tb.name), fmt.Sprintf("UPDATE %s SET v = v + 1 WHERE %s = 1", tn, key)} {
				if _, err := tx.Exec(ctx, q); err != nil {
					_ = tx.Rollback(ctx)
					return fmt.Errorf("%s: %w", q, err)
				}
			}
			if err := tx.Commit(ctx); err != nil {
				return err
			}
		}
		if n%25 == 0 {
			time.Sleep(2 * time.Millisecond)
		}
	}
	return nil
}
