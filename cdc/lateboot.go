package cdc

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/fanwire/fanwire/cdc/pgjson"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"
)

// Late bootstraps: a table published after its slot was bootstrapped (one
// added to the publication, created later under FOR ALL TABLES, or named
// by --tables at a restart) has rows the tail never saw. Its rows are read
// from a snapshot of its own, taken with a temporary replication slot at
// an LSN "at", and the tail drops the table's changes committed at or
// before at (the snapshot has them) and publishes those after it. The
// reader goes on with every other table meanwhile; only a transaction
// committed after at waits until the snapshot's rows are handed to the
// publisher, so that the table's rows come before its later changes. Once
// they are acknowledged, the table is recorded as bootstrapped at at
// (stateTable's tables), and stays so across restarts.

// lateBoot is the bootstrap of one table, run by lateBootstrap.
type lateBoot struct {
	oid   uint32
	name  string        // "schema.table" when asked, for logs
	after pglogrepl.LSN // the server's WAL position when it was asked: at is not before it
	ready chan struct{} // closed once at (or err) is set
	done  chan struct{} // closed once the rows are acknowledged and recorded (or err is set)
	at    pglogrepl.LSN // set before ready closes
	// readyErr is set before ready closes when there is no snapshot; err
	// before done closes.
	readyErr, err error
}

// requestLate starts the late bootstrap of table t (by OID: its name may
// change before the snapshot), unless it is bootstrapped or under way.
func (r *reader) requestLate(ctx context.Context, oid uint32, name string) error {
	if r.booted == nil {
		return nil
	}
	if _, ok := r.booted[oid]; ok || r.late[oid] != nil {
		return nil
	}
	// A table created by the transaction being read (a migration's CREATE
	// TABLE and its INSERTs, CREATE TABLE AS) has every row in the WAL
	// after it: no snapshot. Still uncommitted (a streamed transaction),
	// its catalog row is not visible yet.
	var xmin int64
	var end string
	err := r.hbConn.QueryRow(ctx, "SELECT coalesce((SELECT xmin::text::bigint FROM pg_class WHERE oid = $1), -1), pg_current_wal_lsn()::text", oid).Scan(&xmin, &end)
	if err != nil {
		return fmt.Errorf("postgres: current WAL position: %w", err)
	}
	if xid, ok := r.currentXid(); ok && (xmin < 0 || uint32(xmin) == xid) {
		r.booted[oid] = 0
		return nil
	}
	after, err := pglogrepl.ParseLSN(end)
	if err != nil {
		return fmt.Errorf("postgres: current WAL position %q: %w", end, err)
	}
	lb := &lateBoot{oid: oid, name: name, after: after, ready: make(chan struct{}), done: make(chan struct{})}
	r.late[oid] = lb
	r.in.log.Info("ingest: a table not bootstrapped yet is published: its rows are read from a snapshot of their own", zap.String("table", name), zap.Uint32("oid", oid))
	r.lateRun(lb)
	return nil
}

// currentXid is the top-level xid of the transaction being received.
func (r *reader) currentXid() (uint32, bool) {
	switch {
	case r.inStream:
		return r.streamXid, true
	case r.cur != nil:
		return r.cur.xid, true
	}
	return 0, false
}

// waitLate makes a transaction committed at lsn wait for the late
// bootstraps whose snapshot may be before it: their rows go first. It
// keeps the replication connection alive meanwhile.
func (r *reader) waitLate(ctx context.Context, lsn pglogrepl.LSN) error {
	for oid, lb := range r.late {
		if lsn <= lb.after {
			continue
		}
		if err := r.waitFor(ctx, lb.ready); err != nil {
			return err
		}
		if lb.readyErr != nil {
			return lb.readyErr
		}
		if lsn <= lb.at {
			continue
		}
		if err := r.waitFor(ctx, lb.done); err != nil {
			return err
		}
		if lb.err != nil {
			return lb.err
		}
		r.booted[oid] = lb.at
		delete(r.late, oid)
	}
	return nil
}

// waitFor waits until ch is closed, sending standby status updates while
// it waits (a big table's snapshot takes long).
func (r *reader) waitFor(ctx context.Context, ch <-chan struct{}) error {
	tick := time.NewTicker(r.in.cfg.StatusInterval)
	defer tick.Stop()
	for {
		select {
		case <-ch:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
			if err := r.keepAlive(ctx); err != nil {
				return err
			}
		}
	}
}

// dropsChange reports whether a change of table oid committed at lsn is
// in the table's bootstrap (its snapshot was taken after it).
func (r *reader) dropsChange(oid uint32, lsn pglogrepl.LSN) bool {
	if at, ok := r.booted[oid]; ok {
		return lsn <= at
	}
	// Under way: waitLate let through only transactions before its
	// snapshot.
	return r.late[oid] != nil
}

// lateSlotName names a late bootstrap's temporary slot: one per slot and
// table, within PostgreSQL's 63 bytes.
func lateSlotName(slot string, oid uint32) string {
	name := slot + "_boot_" + strconv.FormatUint(uint64(oid), 10)
	if len(name) <= 63 {
		return name
	}
	sum := sha256.Sum256([]byte(slot))
	return "fanwire_" + hex.EncodeToString(sum[:8]) + "_boot_" + strconv.FormatUint(uint64(oid), 10)
}

// lateBootstrap takes lb's snapshot, publishes the table's rows as of it,
// waits for the broker's acks and records the table as bootstrapped.
func (in *Ingest) lateBootstrap(ctx context.Context, lb *lateBoot, pub *publisher) {
	readied := false
	err := func() error {
		rcfg, err := replicationConfig(in.cfg.DSN)
		if err != nil {
			return err
		}
		rconn, err := pgconn.ConnectConfig(ctx, rcfg)
		if err != nil {
			return fmt.Errorf("postgres: late bootstrap of %s: replication connection: %w", lb.name, err)
		}
		defer rconn.Close(context.WithoutCancel(ctx)) // drops the temporary slot
		res, err := pglogrepl.CreateReplicationSlot(ctx, rconn, lateSlotName(in.cfg.Slot, lb.oid), "pgoutput",
			pglogrepl.CreateReplicationSlotOptions{Temporary: true, SnapshotAction: "EXPORT_SNAPSHOT"})
		if err != nil {
			return fmt.Errorf("postgres: late bootstrap of %s: create a temporary slot: %w", lb.name, err)
		}
		if lb.at, err = pglogrepl.ParseLSN(res.ConsistentPoint); err != nil {
			return fmt.Errorf("postgres: late bootstrap of %s: consistent point %q: %w", lb.name, res.ConsistentPoint, err)
		}
		close(lb.ready)
		readied = true
		ccfg, err := connConfig(in.cfg.DSN)
		if err != nil {
			return err
		}
		conn, err := pgx.ConnectConfig(ctx, ccfg)
		if err != nil {
			return fmt.Errorf("postgres: late bootstrap of %s: %w", lb.name, err)
		}
		defer conn.Close(context.WithoutCancel(ctx))
		tx, err := beginSnapshot(ctx, conn, res.SnapshotName)
		if err != nil {
			return fmt.Errorf("postgres: late bootstrap of %s: %w", lb.name, err)
		}
		defer tx.Rollback(context.WithoutCancel(ctx))
		q, key, err := tableByOID(ctx, tx, lb.oid)
		if err != nil {
			return err
		}
		n := 0
		switch {
		case q == "":
			in.log.Info("ingest: late bootstrap: the table is gone at its snapshot: no rows", zap.String("table", lb.name))
		case len(key) == 0:
			in.log.Warn("ingest: late bootstrap: the table has no key (no primary key nor replica identity index): its rows are not published", zap.String("table", q))
		default:
			tx0 := &txn{commitLSN: lb.at, commitTime: time.Now()}
			if n, err = in.bootstrapTables(ctx, tx, pgjson.NewTypeCache(), map[string][]string{q: key}, tx0, pub); err != nil {
				return err
			}
		}
		if err := tx.Commit(ctx); err != nil {
			return fmt.Errorf("postgres: late bootstrap of %s: %w", lb.name, err)
		}
		if err := pub.sync(ctx); err != nil {
			return err
		}
		if err := recordTables(ctx, conn, in.cfg.Slot, map[uint32]pglogrepl.LSN{lb.oid: lb.at}); err != nil {
			return err
		}
		in.log.Info("ingest: late bootstrap done", zap.String("table", lb.name), zap.Int("rows", n), zap.Stringer("at", lb.at))
		return nil
	}()
	if !readied {
		lb.readyErr = err
		close(lb.ready)
	}
	lb.err = err
	close(lb.done)
	if err != nil && !errors.Is(err, context.Canceled) {
		in.log.Warn("ingest: late bootstrap failed", zap.String("table", lb.name), zap.Error(err))
	}
}

// tableByOID names a table by OID and gives its key columns (its replica
// identity index's, else its primary key's), as q sees the catalog; "" for
// a table that does not exist there.
func tableByOID(ctx context.Context, q querier, oid uint32) (string, []string, error) {
	rows, err := q.Query(ctx, `
		SELECT n.nspname, c.relname, `+keyColumnsSQL+`
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.oid = $1`, oid)
	if err != nil {
		return "", nil, fmt.Errorf("postgres: the table of OID %d: %w", oid, err)
	}
	defer rows.Close()
	var schema, name string
	var key []string
	for rows.Next() {
		if err := rows.Scan(&schema, &name, &key); err != nil {
			return "", nil, fmt.Errorf("postgres: the table of OID %d: %w", oid, err)
		}
	}
	if err := rows.Err(); err != nil {
		return "", nil, fmt.Errorf("postgres: the table of OID %d: %w", oid, err)
	}
	if name == "" {
		return "", nil, nil
	}
	return qualified(schema, name), key, nil
}

// bootedTables is what the reader starts with as bootstrapped: what the
// slot's record says, or (a record from before it said) every table
// published now.
func bootedTables(st slotState, keys map[string][]string, oids map[string]uint32) (booted map[uint32]pglogrepl.LSN, legacy bool) {
	if st.tables != nil {
		return maps.Clone(st.tables), false
	}
	booted = make(map[uint32]pglogrepl.LSN, len(keys))
	for q := range keys {
		booted[oids[q]] = 0
	}
	return booted, true
}

// projectionHashes maps each projection to a hash of its spec: a projection
// whose spec changed is another projection to bootstrap.
func projectionHashes(specs []ProjectionSpec) map[string]string {
	out := make(map[string]string, len(specs))
	for _, p := range specs {
		b, _ := json.Marshal(p)
		sum := sha256.Sum256(b)
		out[p.Name] = hex.EncodeToString(sum[:8])
	}
	return out
}

// bootstrapNewProjections publishes the documents of the sql-mode
// projections the slot's record does not hold, or holds with another
// spec (added or changed across a restart), composed from the database as
// it is now (as the sql mode composes every document), before the tail
// starts: the tail's documents, composed later, are never older. The
// memory mode's state, built for other projections, makes the ingest
// bootstrap again instead (ingest.go). The record is then updated.
func (in *Ingest) bootstrapNewProjections(ctx context.Context, conn *pgx.Conn, docs *docEngine, st slotState, pub *publisher) error {
	want := projectionHashes(in.cfg.Projections)
	if st.projections == nil { // a record from before it said: take them as bootstrapped
		return recordProjections(ctx, conn, in.cfg.Slot, want)
	}
	fresh := func(p *docProjection) bool {
		_, sql := p.composer.(*sqlComposer)
		return sql && st.projections[p.spec.Name] != want[p.spec.Name]
	}
	if docs == nil || !slices.ContainsFunc(docs.projs, fresh) {
		if !maps.Equal(st.projections, want) {
			return recordProjections(ctx, conn, in.cfg.Slot, want)
		}
		return nil
	}
	tx, err := beginSnapshot(ctx, conn, "")
	if err != nil {
		return fmt.Errorf("postgres: bootstrap new projections: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	tx0 := &txn{commitLSN: st.confirmed, commitTime: time.Now()}
	n, err := in.bootstrapSomeDocs(ctx, tx, docs, fresh, tx0, pub)
	if err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("postgres: bootstrap new projections: %w", err)
	}
	if err := pub.sync(ctx); err != nil {
		return err
	}
	in.log.Info("ingest: bootstrapped the projections added or changed since the slot's bootstrap", zap.Int("documents", n))
	return recordProjections(ctx, conn, in.cfg.Slot, want)
}
