package cdc

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"strconv"
	"time"

	"github.com/fanwire/fanwire/cdc/pgjson"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"
)

// Failover: any number of ingests may run for one slot. Each takes a
// session-level advisory lock named after the slot on its main
// connection before touching anything (publication, slot, bootstrap,
// memory state); the one holding it streams, the others wait in
// pg_advisory_lock. PostgreSQL releases the lock the moment the holder's
// session ends, so a standby's wait returns as soon as the leader's
// backend sees its connection close: at once for a killed process (the
// kernel closes its sockets), within the keepalive settings below for a
// host that vanished.
//
// The lock orders the ingests; the slot itself is what keeps two from
// streaming at once (PostgreSQL lets one walsender use a slot), so a
// leader that lost its lock's connection but still streams cannot be
// joined by another: the new holder waits for the slot to be free.

// lockKey is the advisory lock key of a slot: a hash, so it collides with
// no lock an application takes by small numbers.
func lockKey(slot string) int64 {
	h := fnv.New64a()
	h.Write([]byte("fanwire ingest slot " + slot))
	return int64(h.Sum64())
}

// sessionParams are set on both of the ingest's connections unless the
// DSN sets them. The keepalives make PostgreSQL notice a leader whose
// host vanished (no FIN) in about 5+3×2 s instead of the OS default of
// two hours, releasing its lock and its slot for a standby; a killed
// process is noticed at once either way.
var sessionParams = map[string]string{
	"application_name":        "fanwire-ingest",
	"tcp_keepalives_idle":     "5",
	"tcp_keepalives_interval": "2",
	"tcp_keepalives_count":    "3",
	"statement_timeout":       "0", // a standby waits in one statement
}

// connConfig is the configuration of the ingest's connections to dsn,
// with sessionParams.
func connConfig(dsn string) (*pgx.ConnConfig, error) {
	c, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, errFatal{fmt.Errorf("postgres: %w", err)}
	}
	withSessionParams(c.RuntimeParams)
	return c, nil
}

// replicationConfig is the configuration of a replication connection to
// dsn, with sessionParams, whose pgoutput writes values with the output
// settings the ingest reads them in.
func replicationConfig(dsn string) (*pgconn.Config, error) {
	c, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return nil, errFatal{fmt.Errorf("postgres: %w", err)}
	}
	withSessionParams(c.RuntimeParams)
	c.RuntimeParams["replication"] = "database"
	maps.Copy(c.RuntimeParams, pgjson.OutputParams())
	return c, nil
}

func withSessionParams(params map[string]string) {
	for k, v := range sessionParams {
		if _, ok := params[k]; !ok {
			params[k] = v
		}
	}
}

// lead takes the slot's lock on a connection of its own, waiting while
// another ingest holds it; while it waits, the ingest reports standby. It
// returns once this ingest leads, with a function that gives the lock up
// (stops the keeper, closes the connection).
//
// The lock's connection then sits idle, so on PostgreSQL 14 and later it
// is opened with idle_session_timeout = Config.LeaderTimeout and a keeper
// pings it every quarter of that. A leader that freezes (SIGSTOP, a paused
// VM, a process stuck whole) stops pinging, PostgreSQL ends its session
// and a standby takes over; a connection that keeps its TCP peer alive
// would otherwise hold the lock forever. When a ping fails, the keeper
// calls lost: this ingest no longer leads and must stop streaming. The
// lease it returns (nil without a timeout) fences a leader that wakes up
// after a standby took over: the publisher checks it before publishing.
func (in *Ingest) lead(ctx context.Context, ccfg *pgx.ConnConfig, version int, lost func(error)) (_ *lease, release func(), err error) {
	lcfg := ccfg.Copy()
	timeout := in.cfg.LeaderTimeout
	if version >= 140000 && timeout > 0 {
		if _, set := lcfg.RuntimeParams["idle_session_timeout"]; !set {
			lcfg.RuntimeParams["idle_session_timeout"] = strconv.FormatInt(timeout.Milliseconds(), 10)
		}
	}
	conn, err := pgx.ConnectConfig(ctx, lcfg)
	if err != nil {
		return nil, nil, fmt.Errorf("postgres: connect (the slot's lock): %w", err)
	}
	closeConn := func() { _ = conn.Close(context.WithoutCancel(ctx)) }
	key := lockKey(in.cfg.Slot)
	var ok bool
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", key).Scan(&ok); err != nil {
		closeConn()
		return nil, nil, fmt.Errorf("postgres: take the slot's lock: %w", err)
	}
	if !ok {
		holder := in.lockHolder(ctx, conn, key)
		in.log.Info("ingest: standby: another ingest leads this slot; waiting to take over", zap.String("slot", in.cfg.Slot), zap.String("leader", holder))
		in.standby.Store(true)
		waitStart := time.Now()
		_, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", key)
		in.standby.Store(false)
		if err != nil {
			closeConn()
			return nil, nil, fmt.Errorf("postgres: wait for the slot's lock: %w", err)
		}
		in.takeovers.Add(1)
		in.log.Info("ingest: taking over the slot", zap.String("slot", in.cfg.Slot), zap.String("previous_leader", holder), zap.Duration("waited", time.Since(waitStart)))
	}
	if timeout <= 0 {
		return nil, closeConn, nil
	}
	l := newLease(conn, timeout, lost)
	kctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.keep(kctx)
	}()
	return l, func() {
		stop()
		<-done
		closeConn()
	}, nil
}

// lockHolder describes the session holding the slot's lock, for the log.
func (in *Ingest) lockHolder(ctx context.Context, conn *pgx.Conn, key int64) string {
	var desc string
	err := conn.QueryRow(ctx, `SELECT format('pid %s, %s, %s', a.pid, coalesce(a.application_name, ''), coalesce(host(a.client_addr), 'local'))
		FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'advisory' AND l.granted AND l.classid = (($1 >> 32) & 4294967295)::oid AND l.objid = ($1 & 4294967295)::oid AND l.objsubid = 1`, key).Scan(&desc)
	if err != nil {
		return "unknown"
	}
	return desc
}

// waitSlotFree waits while the slot is active: after a takeover, the old
// leader's walsender may end a moment after its lock was released. One
// whose application_name is this ingest's own belongs to an ingest that
// lost the lock (frozen, or its lock's connection ended): it is
// terminated, since holding the lock makes this ingest the leader. A slot
// still active after Config.SlotWait is used by something that does not
// take the lock (pg_recvlogical, an older fanwire): an error.
func (in *Ingest) waitSlotFree(ctx context.Context, conn *pgx.Conn) (slotState, error) {
	slot := in.cfg.Slot
	deadline := time.Now().Add(in.cfg.SlotWait)
	for {
		var pid int
		var app string
		err := conn.QueryRow(ctx, `SELECT s.active_pid, coalesce(a.application_name, '')
			FROM pg_replication_slots s LEFT JOIN pg_stat_activity a ON a.pid = s.active_pid
			WHERE s.slot_name = $1 AND s.active`, slot).Scan(&pid, &app)
		if errors.Is(err, pgx.ErrNoRows) {
			return lookupSlot(ctx, conn, slot) // missing or free
		}
		if err != nil {
			return slotState{}, fmt.Errorf("postgres: look up slot %q: %w", slot, err)
		}
		if app == conn.Config().RuntimeParams["application_name"] {
			in.log.Warn("ingest: the slot is still streamed by an ingest that lost its lock; terminating its walsender", zap.String("slot", slot), zap.Int("pid", pid))
			if _, err := conn.Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
				in.log.Warn("ingest: could not terminate the old walsender; waiting for it to end", zap.Int("pid", pid), zap.Error(err))
			}
		}
		if time.Now().After(deadline) {
			return slotState{}, fmt.Errorf("postgres: slot %q is in use by backend pid %d (%q), which does not hold fanwire's lock (pg_recvlogical? another program?)", slot, pid, app)
		}
		select {
		case <-ctx.Done():
			return slotState{}, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
