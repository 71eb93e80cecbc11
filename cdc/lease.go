package cdc

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// lease fences a leader that froze. PostgreSQL ends the lock's session
// once it has been idle for the leader timeout, and a standby then takes
// the slot over; but a leader that wakes up after that (SIGCONT, a resumed
// VM) still holds batches it decoded before, and its keeper notices the
// lost lock only at its next ping, up to a quarter of the timeout later:
// meanwhile it would publish stale batches after the new leader's events.
// So the publisher asks the lease before every publish. The lease knows
// until when the lock is surely held: a ping that succeeded proves the
// session alive when it was sent, and PostgreSQL ends it no sooner than
// the timeout after that. Past that time (the process was frozen) the
// lease pings first, and publishes nothing if the session is gone. Time is
// the monotonic clock, which runs on while a process is stopped, and the
// wall clock too: a paused virtual machine's monotonic clock does not
// advance, but its wall clock is set forward when it resumes. The lease
// runs out when either says so.
//
// The keeper pings every quarter of the timeout and the lease counts three
// quarters from each ping, so a leader that runs never pings from the
// publish path; a quarter of the timeout is left for a publish under way.
type lease struct {
	timeout time.Duration // static; 0: the lock does not expire (no fencing needed)
	lost    func(error)   // static: ends this ingest's run

	mu   sync.Mutex // serializes the keeper's and the publisher's pings
	conn *pgx.Conn  // guarded by mu: the lock's session

	base  time.Time    // static: the monotonic origin of until
	until atomic.Int64 // nanoseconds after base until which the lock is held
	wall  atomic.Int64 // the same, as Unix nanoseconds of the wall clock
	// wallNow reads the wall clock (static; tests move it).
	wallNow func() int64
}

func newLease(conn *pgx.Conn, timeout time.Duration, lost func(error)) *lease {
	l := &lease{timeout: timeout, lost: lost, conn: conn, base: time.Now(), wallNow: func() int64 { return time.Now().UnixNano() }}
	l.until.Store(int64(time.Since(l.base) + timeout*3/4)) // the lock was just taken
	l.wall.Store(l.wallNow() + int64(timeout*3/4))
	return l
}

// ping checks the lock's session and extends the lease; a failed ping
// calls lost.
func (l *lease) ping(ctx context.Context) error {
	sent, sentWall := time.Since(l.base), l.wallNow()
	pctx, cancel := context.WithTimeout(ctx, l.timeout/2)
	defer cancel()
	l.mu.Lock()
	_, err := l.conn.Exec(pctx, "SELECT 1")
	l.mu.Unlock()
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		err = fmt.Errorf("postgres: lost the slot's lock (its session ended: frozen for over %v, or the connection broke): %w", l.timeout, err)
		l.lost(err)
		return err
	}
	l.extend(&l.until, int64(sent+l.timeout*3/4))
	l.extend(&l.wall, sentWall+int64(l.timeout*3/4))
	return nil
}

func (l *lease) extend(v *atomic.Int64, until int64) {
	for {
		old := v.Load()
		if until <= old || v.CompareAndSwap(old, until) {
			return
		}
	}
}

// check returns nil when this ingest still leads: at once while the lease
// runs, after a ping once it has run out. A nil lease (no leader timeout)
// never runs out.
func (l *lease) check(ctx context.Context) error {
	if l == nil || l.timeout <= 0 || int64(time.Since(l.base)) < l.until.Load() && l.wallNow() < l.wall.Load() {
		return nil
	}
	return l.ping(ctx)
}

// keep pings every quarter of the timeout until ctx is done or a ping
// fails.
func (l *lease) keep(ctx context.Context) {
	tick := time.NewTicker(l.timeout / 4)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if err := l.ping(ctx); err != nil {
			return
		}
	}
}
