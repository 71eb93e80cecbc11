package cdc

import (
	"context"
	"fmt"
	"hash/fnv"
	"time"

	"github.com/jackc/pgx/v5"
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

func withSessionParams(params map[string]string) {
	for k, v := range sessionParams {
		if _, ok := params[k]; !ok {
			params[k] = v
		}
	}
}

// lead takes the slot's lock on conn, waiting while another ingest holds
// it. While it waits, the ingest reports standby.
func (in *Ingest) lead(ctx context.Context, conn *pgx.Conn) error {
	key := lockKey(in.cfg.Slot)
	var ok bool
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", key).Scan(&ok); err != nil {
		return fmt.Errorf("postgres: take the slot's lock: %w", err)
	}
	if ok {
		return nil
	}
	holder := in.lockHolder(ctx, conn, key)
	in.log.Info("ingest: standby: another ingest leads this slot; waiting to take over", zap.String("slot", in.cfg.Slot), zap.String("leader", holder))
	in.standby.Store(true)
	defer in.standby.Store(false)
	waitStart := time.Now()
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", key); err != nil {
		return fmt.Errorf("postgres: wait for the slot's lock: %w", err)
	}
	in.takeovers.Add(1)
	in.log.Info("ingest: taking over the slot", zap.String("slot", in.cfg.Slot), zap.String("previous_leader", holder), zap.Duration("waited", time.Since(waitStart)))
	return nil
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

// waitSlotFree waits while the slot is active: after a takeover, the
// killed leader's walsender may end a moment after its lock was released.
// A slot still active after wait is used by something that does not take
// the lock (pg_recvlogical, an older fanwire): an error.
func waitSlotFree(ctx context.Context, conn *pgx.Conn, slot string, wait time.Duration) (slotState, error) {
	deadline := time.Now().Add(wait)
	for {
		st, err := lookupSlot(ctx, conn, slot)
		if err != nil || !st.active {
			return st, err
		}
		if time.Now().After(deadline) {
			var pid int
			_ = conn.QueryRow(ctx, "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&pid)
			return st, fmt.Errorf("postgres: slot %q is in use by backend pid %d, which does not hold fanwire's lock (pg_recvlogical? another program?)", slot, pid)
		}
		select {
		case <-ctx.Done():
			return st, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
