package cdc

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fanwire/fanwire/cdc/pgtest"
	"github.com/jackc/pgx/v5"
)

// TestLeaseFencesAFrozenLeader: the lease a leader's publisher asks runs
// without a round trip while the keeper pings; once the keeper has not
// pinged for longer than the lease (the process was frozen: here the keeper
// is simply not running) and PostgreSQL has ended the lock's idle session,
// asking the lease pings, fails, reports the lock lost and refuses the
// publish. (The publisher published without asking before: a leader woken
// after a takeover published until its keeper's next ping.)
func TestLeaseFencesAFrozenLeader(t *testing.T) {
	t.Parallel()
	pg := pgtest.Start(t, pgtest.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const timeout = time.Second
	open := func() *pgx.Conn {
		conn, err := pgx.Connect(ctx, pg.DSN("postgres"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, "SET idle_session_timeout = 1000"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close(context.Background()) })
		return conn
	}

	// Kept: the lease holds past several timeouts.
	var lost error
	kept := newLease(open(), timeout, func(err error) { lost = err })
	kctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); kept.keep(kctx) }()
	time.Sleep(3 * timeout) // the time a frozen leader would be gone
	if err := kept.check(ctx); err != nil {
		t.Fatalf("a kept lease: %v", err)
	}
	stop()
	<-done
	if lost != nil {
		t.Fatalf("a kept lease was lost: %v", lost)
	}

	// Frozen: no keeper; the session ends after its idle timeout.
	conn := open()
	frozen := newLease(conn, timeout, func(err error) { lost = err })
	if err := frozen.check(ctx); err != nil {
		t.Fatalf("a fresh lease: %v", err)
	}
	pid := conn.PgConn().PID()
	waitGone(t, pg, pid)
	err := frozen.check(ctx)
	if err == nil || lost == nil || err.Error() != lost.Error() {
		t.Fatalf("check after the session ended = %v, lost with %v; want both the lost lock", err, lost)
	}
}

// waitGone waits until backend pid has ended.
func waitGone(t *testing.T, pg *pgtest.Server, pid uint32) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, pg.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	for {
		var n int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", int(pid)).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("backend %d never ended", pid)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// TestLeaseFencesAPausedVM: a paused virtual machine's monotonic clock
// does not advance while it is paused, but its wall clock is set forward
// when it resumes: the lease runs out by either. Here the monotonic clock
// says the lease holds (a minute-long timeout, just taken), the wall
// clock has moved on past it, and the lock's session is gone: asking the
// lease pings, fails and reports the lock lost. Before, the lease trusted
// the monotonic clock alone and the woken leader published.
func TestLeaseFencesAPausedVM(t *testing.T) {
	t.Parallel()
	pg := pgtest.Start(t, pgtest.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, pg.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var lost error
	l := newLease(conn, time.Minute, func(err error) { lost = err })
	var shift int64
	wall := l.wallNow
	l.wallNow = func() int64 { return wall() + shift }
	pg.Exec("postgres", fmt.Sprintf("SELECT pg_terminate_backend(%d)", conn.PgConn().PID()))
	waitGone(t, pg, conn.PgConn().PID())
	if err := l.check(ctx); err != nil {
		t.Fatalf("by both clocks the lease holds: %v", err)
	}
	shift = int64(time.Hour) // the VM resumes: its wall clock is set forward
	if err := l.check(ctx); err == nil || lost == nil {
		t.Fatalf("check after the wall clock passed the lease = %v, lost with %v; want the lost lock", err, lost)
	}
}
