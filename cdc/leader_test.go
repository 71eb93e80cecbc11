package cdc_test

import (
	"os"
	"testing"
	"time"

	"github.com/fanwire/fanwire/cdc"
	"github.com/fanwire/fanwire/cdc/pgtest"
	"github.com/jackc/pglogrepl"
)

// TestStandbyTakesOver runs two ingests for one slot: the second waits as
// a standby, not ready, until the first stops, then takes over where the
// first confirmed. (cmd/fanwire's TestIngestFailover kills processes.)
func TestStandbyTakesOver(t *testing.T) {
	t.Parallel()
	pg := pgtest.Start(t, pgtest.Config{})
	pg.Exec("postgres", "CREATE TABLE t (id int PRIMARY KEY, v text)", "INSERT INTO t VALUES (1, 'a')")
	r := newRig(t, pg, nil)
	r.events(1)
	leader, stopLeader := r.in, r.stop

	// A standby stopped while it waits ends at once (its wait is a query
	// the context cancels).
	r.startStandby(nil)
	stopped := make(chan struct{})
	go func() { r.stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("a waiting standby did not stop within 10 s")
	}

	r.startStandby(nil)
	if !r.in.Standby() || r.in.Ready() {
		t.Fatalf("second ingest: standby %v, ready %v; want a standby, not ready", r.in.Standby(), r.in.Ready())
	}
	pg.Exec("postgres", "INSERT INTO t VALUES (2, 'b')")
	r.events(2) // the leader still streams
	stopLeader()
	if leader.Ready() {
		t.Fatal("the stopped leader is ready")
	}
	r.waitReady()
	pg.Exec("postgres", "UPDATE t SET v = 'x' WHERE id = 1")
	evs := r.events(3)
	if got := ops(evs); got != "insert db.t.1\ninsert db.t.2\nupdate db.t.1\n" {
		t.Fatalf("events across the takeover:\n%s", got)
	}
}

// TestMemoryStateBehindTheSlotBootstraps: a memory state older than what
// its slot confirmed (another host's ingest led meanwhile with its own
// --state-dir, or a restored backup) missed changes; the ingest bootstraps
// again rather than compose documents from it. A state that is merely idle
// (the slot confirmed heartbeats past its last transaction) is kept.
func TestMemoryStateBehindTheSlotBootstraps(t *testing.T) {
	t.Parallel()
	pg := pgtest.Start(t, pgtest.Config{})
	pg.Exec("postgres", randomSchema()...)
	pg.Exec("postgres", "INSERT INTO orders VALUES (1, 'new', NULL)", "INSERT INTO order_items VALUES (7, 1, 'a', 1)")
	dir, stale := t.TempDir(), t.TempDir()
	cfg := func(dir string) func(*cdc.Config) {
		return func(c *cdc.Config) {
			c.Projections = ordersProjection(cdc.ModeMemory)
			c.StateDir = dir
			c.Heartbeat = 50 * time.Millisecond
		}
	}
	r := newRig(t, pg, cfg(dir))
	boot := r.events(1) // the bootstrap
	r.stop()
	if err := os.CopyFS(stale, os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}

	// Idle: heartbeats move the slot past the state's last transaction.
	r.start(cfg(dir))
	r.confirmedPast(boot[0].LSN)
	r.stop()
	r.start(cfg(dir))
	pg.Exec("postgres", "UPDATE orders SET status = 'paid' WHERE id = 1")
	evs := r.events(2) // no second bootstrap
	paid := `upsert db.orders.1 {"id":1,"status":"paid","customer_id":null,"items":[{"id":7,"sku":"a","qty":1,"notes":[]}],"customer":null}` + "\n"
	if got := docLines(evs[1:]); got != paid {
		t.Fatalf("after restarting on an idle state:\n%s", got)
	}
	// Published counts an event once the broker's ack reached the
	// ingest, which may be after a consumer saw it; the confirmation
	// comes after the ack.
	r.confirmedPast(evs[1].LSN)
	if n := r.in.Published(); n != 1 {
		t.Fatalf("after restarting on an idle state, %d events published; want 1: the update, no bootstrap (a repeated one is dropped by JetStream as a duplicate)", n)
	}
	r.stop()

	// The stale copy missed the update: it must not be used.
	r.start(cfg(stale))
	pg.Exec("postgres", "UPDATE order_items SET qty = 5 WHERE id = 7")
	evs = r.events(4) // the bootstrap again, then the update
	want := `upsert db.orders.1 {"id":1,"status":"paid","customer_id":null,"items":[{"id":7,"sku":"a","qty":5,"notes":[]}],"customer":null}` + "\n"
	if got := docLines(evs[2:]); got != paid+want {
		t.Fatalf("after starting on a stale state:\n%s", got)
	}
}

// confirmedPast waits until the ingest confirmed a position past lsn to
// PostgreSQL.
func (r *rig) confirmedPast(lsn string) {
	r.t.Helper()
	at, err := pglogrepl.ParseLSN(lsn)
	if err != nil {
		r.t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); r.in.Confirmed() <= at; {
		if time.Now().After(deadline) {
			r.t.Fatalf("confirmed %s, never past %s", r.in.Confirmed(), at)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestMemoryStateRestartsAfterOtherTablesChanged: a clean restart keeps
// the memory state when the last transactions confirmed touched only
// tables outside the memory projections. The state was stored at its last
// delta's LSN while the later LSN of those transactions was confirmed, so
// it looked behind its slot and every such restart bootstrapped again.
func TestMemoryStateRestartsAfterOtherTablesChanged(t *testing.T) {
	t.Parallel()
	pg := pgtest.Start(t, pgtest.Config{})
	pg.Exec("postgres", randomSchema()...)
	pg.Exec("postgres", "CREATE TABLE audit (id int PRIMARY KEY, what text)",
		"INSERT INTO orders VALUES (1, 'new', NULL)")
	cfg := func(c *cdc.Config) {
		c.Projections = ordersProjection(cdc.ModeMemory)
		c.Tables = []string{"audit"}
		c.StateDir = t.TempDir()
		c.Heartbeat = -1 // no heartbeats: only the audit row moves the slot
	}
	dir := ""
	r := newRig(t, pg, func(c *cdc.Config) { cfg(c); dir = c.StateDir })
	r.events(1) // the bootstrap: one document
	pg.Exec("postgres", "UPDATE orders SET status = 'paid' WHERE id = 1")
	pg.Exec("postgres", "INSERT INTO audit VALUES (1, 'paid')")
	evs := r.events(3)
	r.confirmedPast(evs[1].LSN) // past the order's transaction: the audit row's is confirmed
	r.stop()
	r.start(func(c *cdc.Config) { cfg(c); c.StateDir = dir })
	pg.Exec("postgres", "UPDATE orders SET status = 'sent' WHERE id = 1")
	evs = r.events(4)
	if got, want := docLines(evs[3:]), `upsert db.orders.1 {"id":1,"status":"sent","customer_id":null,"items":[],"customer":null}`+"\n"; got != want {
		t.Fatalf("after the restart:\n%s", got)
	}
	r.confirmedPast(evs[3].LSN) // the ack is counted before the confirmation, maybe after a consumer saw the event
	if n := r.in.Published(); n != 1 {
		t.Fatalf("after the restart, %d events published; want 1: the update, no bootstrap", n)
	}
}
