package cdc_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/fanwire/fanwire/cdc/pgtest"
	"github.com/jackc/pgx/v5"
)

// lateWrites updates random rows of tables (each with keys rows, v counting
// its updates) until stop, one row a transaction, and returns how many
// updates committed per table.
func lateWrites(ctx context.Context, t *testing.T, dsn string, tables map[string]int, stop <-chan struct{}) <-chan map[string]int {
	out := make(chan map[string]int, 1)
	go func() {
		n := map[string]int{}
		defer func() { out <- n }()
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close(context.Background())
		rng := rand.New(rand.NewPCG(1, 2))
		names := []string{}
		for tb := range tables {
			names = append(names, tb)
		}
		for {
			select {
			case <-stop:
				return
			default:
			}
			tb := names[rng.IntN(len(names))]
			if _, err := conn.Exec(ctx, "UPDATE "+tb+" SET v = v + 1 WHERE id = $1", 1+rng.IntN(tables[tb])); err != nil {
				t.Error(err)
				return
			}
			n[tb]++
		}
	}()
	return out
}

// checkTableEvents checks that the events on db.<table>.* give every row
// once as it was (an insert, from a bootstrap) and then each of its updates
// once, in order (v up by one each), up to the value the table holds now.
func checkTableEvents(t *testing.T, pg *pgtest.Server, evs []event, table string, rows int) {
	t.Helper()
	final := map[int]int{}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, pg.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	res, err := conn.Query(ctx, "SELECT id, v FROM "+table)
	if err != nil {
		t.Fatal(err)
	}
	for res.Next() {
		var id, v int
		if err := res.Scan(&id, &v); err != nil {
			t.Fatal(err)
		}
		final[id] = v
	}
	res.Close()
	last := map[int]int{}
	for _, e := range evs {
		var key int
		if _, err := fmt.Sscanf(e.Subject, "db."+table+".%d", &key); err != nil {
			continue
		}
		var doc struct{ V int }
		if err := json.Unmarshal(e.Doc, &doc); err != nil {
			t.Fatalf("%s: %v", e.Subject, err)
		}
		prev, seen := last[key]
		switch {
		case !seen && e.Op != "insert":
			t.Fatalf("%s: first event is %s (v %d), want the row's insert", e.Subject, e.Op, doc.V)
		case seen && (e.Op != "update" || doc.V != prev+1):
			t.Fatalf("%s: %s v %d after v %d: a repeat, a gap or out of order", e.Subject, e.Op, doc.V, prev)
		}
		last[key] = doc.V
	}
	if len(last) != rows {
		t.Fatalf("%s: events for %d rows, want %d", table, len(last), rows)
	}
	for k, v := range final {
		if last[k] != v {
			t.Fatalf("%s.%d: the last event says v %d, the table %d", table, k, last[k], v)
		}
	}
}

// TestTableAddedToThePublicationIsBootstrapped: a table with rows is added
// to the ingest's publication while its rows and another table's keep
// changing. Its rows are published from a snapshot of their own, then
// every change after that snapshot, once, in order; the other table's
// changes go on meanwhile. Before, only the changes after the addition
// were published: the rows that did not change were never.
func TestTableAddedToThePublicationIsBootstrapped(t *testing.T) {
	t.Parallel()
	const aRows, bRows = 10, 2000
	pg := pgtest.Start(t, pgtest.Config{})
	pg.Exec("postgres",
		"CREATE TABLE a (id int PRIMARY KEY, v int)",
		"CREATE TABLE b (id int PRIMARY KEY, v int, pad text)",
		fmt.Sprintf("INSERT INTO a SELECT g, 0 FROM generate_series(1, %d) g", aRows),
		fmt.Sprintf("INSERT INTO b SELECT g, 0, repeat('p', 100) FROM generate_series(1, %d) g", bRows),
		"CREATE PUBLICATION fanwire FOR TABLE a",
	)
	r := newRig(t, pg, nil)
	r.events(aRows)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stop := make(chan struct{})
	written := lateWrites(ctx, t, pg.DSN("postgres"), map[string]int{"a": aRows, "b": bRows}, stop)
	time.Sleep(300 * time.Millisecond)
	pg.Exec("postgres", "ALTER PUBLICATION fanwire ADD TABLE b")
	time.Sleep(500 * time.Millisecond)
	close(stop)
	n := <-written
	pg.Exec("postgres", "CREATE TABLE done (id int PRIMARY KEY)", "ALTER PUBLICATION fanwire ADD TABLE done", "INSERT INTO done VALUES (1)")
	var evs []event
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		evs = allEvents(t, r.b)
		if len(evs) > 0 && evs[len(evs)-1].Subject == "db.done.1" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the last transaction is not published after 30s (%d events)", len(evs))
		}
	}
	checkTableEvents(t, pg, evs, "a", aRows)
	checkTableEvents(t, pg, evs, "b", bRows)
	t.Logf("%d updates of a and %d of b; %d events", n["a"], n["b"], len(evs))
}
