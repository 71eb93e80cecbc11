package cdc_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fanwire/fanwire/cdc"
	"github.com/fanwire/fanwire/cdc/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
)

// metricValue is the value of an ingest metric without labels.
func metricValue(t *testing.T, in *cdc.Ingest, name string) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(in.Collector())
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			m := mf.GetMetric()[0]
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// spillFiles lists the spill files in dir.
func spillFiles(t *testing.T, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "spill-*"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// waitEvents waits until the ingest has published n events (the broker
// acknowledged them) and returns the stream's events.
func (r *rig) waitEvents(n int) []event {
	r.t.Helper()
	waitFor(r.t, fmt.Sprintf("%d events published", n), 2*time.Minute, func() bool { return r.in.Published() >= uint64(n) })
	evs := allEvents(r.t, r.b)
	if len(evs) != n {
		r.t.Fatalf("%d events in the stream, want %d", len(evs), n)
	}
	// Acknowledged more often than stored: some were published again
	// (the ingest reconnected and re-read a transaction).
	if got := r.in.Published(); got != uint64(n) {
		r.t.Fatalf("%d events published, %d in the stream: some were published twice", got, n)
	}
	return evs
}

// checkRows checks that evs are the events of rows from, from+1, … of
// table, once each and in order, each with op and v = want(id).
func checkRows(t *testing.T, evs []event, table, op string, from int, want func(id int) string) {
	t.Helper()
	ids := make(map[string]bool, len(evs))
	for i, e := range evs {
		var doc struct {
			ID int    `json:"id"`
			V  string `json:"v"`
		}
		if err := json.Unmarshal(e.Doc, &doc); err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
		row := from + i
		if e.Op != op || e.Subject != fmt.Sprintf("db.%s.%d", table, row) || doc.ID != row || doc.V != want(row) {
			t.Fatalf("event %d: %s on %s, id %d, v %.40q…; want %s of row %d with its own values", i, e.Op, e.Subject, doc.ID, doc.V, op, row)
		}
		if ids[e.ID] {
			t.Fatalf("event %d: id %s twice", i, e.ID)
		}
		ids[e.ID] = true
	}
}

// TestBigTransactionSpills: with a 64 KiB MaxTxnMemory, a 20,000-row
// UPDATE (about 2 MB of changes) goes to a spill file under StateDir and
// is read back at its commit: every row's event is published once, in
// order, with its own values; the file is gone afterwards. The commit,
// held back by a queue of 1,024 events, takes longer than the 2s
// wal_sender_timeout: the reader keeps the replication connection alive
// meanwhile (it would be cut, and the transaction read again). Spill files
// left in StateDir by an earlier run of the slot are removed at start,
// another slot's are not.
func TestBigTransactionSpills(t *testing.T) {
	t.Parallel()
	const n = 20000
	pg := pgtest.Start(t, pgtest.Config{Settings: map[string]string{"wal_sender_timeout": "2s"}})
	pg.Exec("postgres",
		"CREATE TABLE sp (id int PRIMARY KEY, v text)",
		fmt.Sprintf("INSERT INTO sp SELECT g, 'value-' || g FROM generate_series(1, %d) g", n))
	dir := t.TempDir()
	left := filepath.Join(dir, "spill-fanwire-1234-567.tmp")
	other := filepath.Join(dir, "spill-other-1234-567.tmp")
	for _, f := range []string{left, other} {
		if err := os.WriteFile(f, []byte("left by a crash"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	r := newRig(t, pg, func(c *cdc.Config) { c.StateDir = dir; c.MaxTxnMemory = 64 << 10; c.QueueEvents = 1024 })
	if _, err := os.Stat(left); !os.IsNotExist(err) {
		t.Fatalf("the slot's spill file left by an earlier run is still there (%v)", err)
	}
	if _, err := os.Stat(other); err != nil {
		t.Fatalf("another slot's spill file was removed: %v", err)
	}
	if err := os.Remove(other); err != nil {
		t.Fatal(err)
	}
	r.waitEvents(n) // the bootstrap
	want := func(id int) string { return "updated-" + fmt.Sprint(id) + strings.Repeat("y", id%89) }
	start := time.Now()
	pg.Exec("postgres", "UPDATE sp SET v = 'updated-' || id || repeat('y', id % 89)")
	evs := r.waitEvents(2 * n)
	t.Logf("the UPDATE's %d events published in %v", n, time.Since(start))
	checkRows(t, evs[n:], "sp", "update", 1, want)
	if got := metricValue(t, r.in, "fanwire_ingest_spilled_transactions_total"); got != 1 {
		t.Fatalf("%v transactions spilled, want 1", got)
	}
	if got := metricValue(t, r.in, "fanwire_ingest_spilled_bytes_total"); got < 1<<20 {
		t.Fatalf("%v bytes spilled, want the UPDATE's 20,000 rows (over 1 MB)", got)
	}
	waitFor(t, "the spill file removed", 10*time.Second, func() bool { return len(spillFiles(t, dir)) == 0 })
}

// TestStreamedTransactionSpills: a transaction PostgreSQL streams
// (logical_decoding_work_mem = 64kB) outgrows a 64 KiB MaxTxnMemory and
// is spilled per xid, while a small transaction commits in the middle of
// it. Inside it, a subtransaction rolled back after the spill leaves none
// of its rows; an aborted streamed transaction leaves nothing. Every
// committed row is published once, in commit order, and no spill file is
// left.
func TestStreamedTransactionSpills(t *testing.T) {
	t.Parallel()
	pg := pgtest.Start(t, pgtest.Config{Settings: map[string]string{"logical_decoding_work_mem": "64kB"}})
	pg.Exec("postgres", "CREATE TABLE st (id int PRIMARY KEY, v text)")
	dir := t.TempDir()
	r := newRig(t, pg, func(c *cdc.Config) { c.StateDir = dir; c.MaxTxnMemory = 64 << 10 })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	big, err := pgx.Connect(ctx, pg.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer big.Close(context.Background())
	exec := func(sql string) {
		t.Helper()
		if _, err := big.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	val := func(id int) string { return "v-" + fmt.Sprint(id) + strings.Repeat("p", 100+id%50) }
	ins := func(from, to int) string {
		return fmt.Sprintf("INSERT INTO st SELECT g, 'v-' || g || repeat('p', 100 + g %% 50) FROM generate_series(%d, %d) g", from, to)
	}
	exec("BEGIN")
	exec(ins(1, 5000))
	// Streamed and spilled by now: wait for it, so the small transaction
	// commits in the middle of the stream.
	waitFor(t, "the transaction spilled", time.Minute, func() bool {
		return metricValue(t, r.in, "fanwire_ingest_spilled_transactions_total") >= 1
	})
	pg.Exec("postgres", "INSERT INTO st VALUES (0, '"+val(0)+"')")
	exec("SAVEPOINT s")
	exec(ins(30001, 33000))
	exec("ROLLBACK TO SAVEPOINT s")
	exec(ins(5001, 10000))
	exec("COMMIT")
	exec("BEGIN")
	exec(ins(20001, 24000))
	exec("ROLLBACK")
	pg.Exec("postgres", "INSERT INTO st VALUES (10001, '"+val(10001)+"')") // after the abort: all of it is through
	evs := r.waitEvents(1 + 10000 + 1)
	checkRows(t, evs[:1], "st", "insert", 0, val)
	checkRows(t, evs[1:], "st", "insert", 1, val)
	var streamed int
	if err := pgQuery(pg, "SELECT coalesce(sum(stream_txns), 0) FROM pg_stat_replication_slots", &streamed); err != nil {
		t.Fatal(err)
	}
	if streamed < 2 {
		t.Fatalf("%d transactions streamed, want 2: the test did not test streaming", streamed)
	}
	if got := metricValue(t, r.in, "fanwire_ingest_spilled_transactions_total"); got != 2 {
		t.Fatalf("%v transactions spilled, want 2 (the committed one and the aborted one)", got)
	}
	waitFor(t, "the spill files removed", 10*time.Second, func() bool { return len(spillFiles(t, dir)) == 0 })
}
