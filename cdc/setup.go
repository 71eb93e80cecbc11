package cdc

import (
	"context"
	"errors"
	"fmt"
	"github.com/jackc/pglogrepl"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// stateTable records, per slot, that its bootstrap finished: a slot that
// exists without its row was created by a run that died mid-bootstrap, and
// is dropped and made again. (The slot alone cannot tell: its confirmed
// position says nothing about the snapshot scan.)
const stateTable = "fanwire_ingest_state"

// server describes the PostgreSQL server, checked up front.
type server struct {
	version int // server_version_num, e.g. 150019
}

// checkServer checks what logical replication needs and says what to
// change.
func checkServer(ctx context.Context, conn *pgx.Conn) (server, error) {
	var s server
	var walLevel string
	if err := conn.QueryRow(ctx, "SELECT current_setting('server_version_num')::int, current_setting('wal_level')").Scan(&s.version, &walLevel); err != nil {
		return s, fmt.Errorf("postgres: read settings: %w", err)
	}
	if s.version < 120000 {
		return s, fmt.Errorf("postgres: server version %d.%d is too old: fanwire needs PostgreSQL 12 or later", s.version/10000, s.version%10000)
	}
	if walLevel != "logical" {
		return s, fmt.Errorf("postgres: wal_level is %q: set wal_level = logical in postgresql.conf (or ALTER SYSTEM SET wal_level = logical) and restart PostgreSQL", walLevel)
	}
	return s, nil
}

// ensurePublication creates the publication if it is missing (for the
// configured tables, or for all tables), and returns the published tables
// with their keys, "schema.table" → key columns (the replica identity
// index's, else the primary key's: what pgoutput sends of a deleted row),
// and their OIDs. A published table without a primary key (or a replica
// identity index) is an error naming it; the ingest's own state table is
// left out.
func ensurePublication(ctx context.Context, conn *pgx.Conn, name string, tables []string) (map[string][]string, map[string]uint32, error) {
	// --tables names "table" (in public) or "schema.table": qualify them
	// once, as the publication's tables are named below.
	quals := make([]string, 0, len(tables))
	want := make([]string, 0, len(tables))
	for _, t := range tables {
		schema, rel, ok := strings.Cut(t, ".")
		if !ok {
			schema, rel = "public", t
		}
		quals = append(quals, qualified(schema, rel))
		want = append(want, pgx.Identifier{schema, rel}.Sanitize())
	}
	var exists, all bool
	if err := conn.QueryRow(ctx, "SELECT count(*) > 0, coalesce(bool_or(puballtables), false) FROM pg_publication WHERE pubname = $1", name).Scan(&exists, &all); err != nil {
		return nil, nil, fmt.Errorf("postgres: look up publication %q: %w", name, err)
	}
	if exists && !all && len(want) > 0 {
		// A table named by --tables since the publication was made (a
		// configuration change across a restart) is added to it; its
		// rows are then bootstrapped late (lateboot.go).
		var missing []string
		for i, q := range quals {
			schema, rel := splitTable(q)
			var in bool
			if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_publication_tables WHERE pubname = $1 AND schemaname = $2 AND tablename = $3)", name, schema, rel).Scan(&in); err != nil {
				return nil, nil, fmt.Errorf("postgres: look up publication %q: %w", name, err)
			}
			if !in {
				missing = append(missing, want[i])
			}
		}
		if len(missing) > 0 {
			q := "ALTER PUBLICATION " + pgx.Identifier{name}.Sanitize() + " ADD TABLE " + strings.Join(missing, ", ")
			if _, err := conn.Exec(ctx, q); err != nil {
				return nil, nil, fmt.Errorf("postgres: --tables names tables publication %q does not hold: %s: %w", name, q, err)
			}
		}
	}
	if !exists {
		q := "CREATE PUBLICATION " + pgx.Identifier{name}.Sanitize() + " FOR ALL TABLES"
		if len(want) > 0 {
			q = "CREATE PUBLICATION " + pgx.Identifier{name}.Sanitize() + " FOR TABLE " + strings.Join(want, ", ")
		}
		if _, err := conn.Exec(ctx, q); err != nil {
			return nil, nil, fmt.Errorf("postgres: %s: %w", q, err)
		}
	}
	rows, err := conn.Query(ctx, `
		SELECT p.schemaname, p.tablename, c.oid, c.relreplident, `+keyColumnsSQL+`
		FROM pg_publication_tables p
		JOIN pg_namespace n ON n.nspname = p.schemaname
		JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = p.tablename
		WHERE p.pubname = $1
		ORDER BY 1, 2`, name)
	if err != nil {
		return nil, nil, fmt.Errorf("postgres: list the tables of publication %q: %w", name, err)
	}
	keys := make(map[string][]string)
	oids := make(map[string]uint32)
	var noKey []string
	for rows.Next() {
		var schema, rel string
		var oid uint32
		var ident byte
		var key []string
		if err := rows.Scan(&schema, &rel, &oid, &ident, &key); err != nil {
			rows.Close()
			return nil, nil, fmt.Errorf("postgres: %w", err)
		}
		if rel == stateTable {
			continue
		}
		q := qualified(schema, rel)
		if len(quals) > 0 && !slices.Contains(quals, q) {
			continue
		}
		if len(key) == 0 {
			noKey = append(noKey, q)
			continue
		}
		keys[q], oids[q] = key, oid
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("postgres: %w", err)
	}
	if len(noKey) > 0 {
		return nil, nil, fmt.Errorf("postgres: table(s) %s have no primary key (nor a replica identity index): events need a key; add one, or leave them out with --tables", strings.Join(noKey, ", "))
	}
	for _, q := range quals {
		if _, ok := keys[q]; !ok {
			return nil, nil, fmt.Errorf("postgres: table %s is not in publication %q (does it exist? ALTER PUBLICATION %s ADD TABLE %s)", q, name, name, q)
		}
	}
	if len(keys) == 0 {
		return nil, nil, fmt.Errorf("postgres: publication %q publishes no table: create one, or name tables with --tables", name)
	}
	return keys, oids, nil
}

// keyColumnsSQL selects the key columns of the table c (pg_class) as an
// array of names in key order: its replica identity index's (what pgoutput
// sends of a deleted row when it has one), else its primary key's; empty
// when it has neither.
const keyColumnsSQL = `coalesce((SELECT array_agg(a.attname ORDER BY k.ord)
		FROM pg_index i
		CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
		JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
		WHERE i.indrelid = c.oid AND (i.indisprimary OR (c.relreplident = 'i' AND i.indisreplident))
		GROUP BY i.indexrelid, i.indisprimary, i.indisreplident
		ORDER BY (c.relreplident = 'i' AND i.indisreplident) DESC, i.indisprimary DESC LIMIT 1), '{}')`

// slotState is what start-up finds of the slot.
type slotState struct {
	exists       bool
	bootstrapped bool
	active       bool
	confirmed    pglogrepl.LSN // the slot's confirmed_flush_lsn
	// tables are the tables whose rows were bootstrapped, by OID, each
	// with the LSN its snapshot was taken at (lateboot.go); nil when the
	// record predates it.
	tables map[uint32]pglogrepl.LSN
	// projections are the projections whose documents were bootstrapped,
	// by name, with a hash of their specs (projectionHashes); nil when the
	// record predates it.
	projections map[string]string
}

func lookupSlot(ctx context.Context, conn *pgx.Conn, slot string) (slotState, error) {
	var st slotState
	if _, err := conn.Exec(ctx, "CREATE TABLE IF NOT EXISTS "+stateTable+" (slot text PRIMARY KEY, bootstrapped_lsn pg_lsn NOT NULL, bootstrapped_at timestamptz NOT NULL DEFAULT now())"); err != nil {
		return st, fmt.Errorf("postgres: create %s (the ingest's bootstrap record): %w", stateTable, err)
	}
	var plugin, confirmed string
	err := conn.QueryRow(ctx, "SELECT plugin, active, coalesce(confirmed_flush_lsn::text, '0/0') FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&plugin, &st.active, &confirmed)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return st, fmt.Errorf("postgres: look up slot %q: %w", slot, err)
	case plugin != "pgoutput":
		return st, fmt.Errorf("postgres: slot %q exists with plugin %q, not pgoutput: drop it or choose another --slot", slot, plugin)
	default:
		st.exists = true
		if st.confirmed, err = pglogrepl.ParseLSN(confirmed); err != nil {
			return st, fmt.Errorf("postgres: slot %q confirmed_flush_lsn %q: %w", slot, confirmed, err)
		}
	}
	if _, err := conn.Exec(ctx, "ALTER TABLE "+stateTable+" ADD COLUMN IF NOT EXISTS tables jsonb, ADD COLUMN IF NOT EXISTS projections jsonb"); err != nil {
		return st, fmt.Errorf("postgres: add the columns tables and projections to %s: %w", stateTable, err)
	}
	var tables map[string]string
	err = conn.QueryRow(ctx, "SELECT tables, projections FROM "+stateTable+" WHERE slot = $1", slot).Scan(&tables, &st.projections)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return st, nil
	case err != nil:
		return st, fmt.Errorf("postgres: read %s: %w", stateTable, err)
	}
	st.bootstrapped = true
	if tables != nil {
		st.tables = make(map[uint32]pglogrepl.LSN, len(tables))
		for oid, lsn := range tables {
			o, err1 := strconv.ParseUint(oid, 10, 32)
			l, err2 := pglogrepl.ParseLSN(lsn)
			if err1 != nil || err2 != nil {
				return st, fmt.Errorf("postgres: %s: slot %q: a table %q bootstrapped at %q", stateTable, slot, oid, lsn)
			}
			st.tables[uint32(o)] = l
		}
	}
	return st, nil
}

// recordProjections records the projections whose documents are
// bootstrapped (projectionHashes), replacing the record.
func recordProjections(ctx context.Context, conn *pgx.Conn, slot string, projections map[string]string) error {
	if _, err := conn.Exec(ctx, "UPDATE "+stateTable+" SET projections = $2 WHERE slot = $1", slot, projections); err != nil {
		return fmt.Errorf("postgres: record the projections bootstrapped: %w", err)
	}
	return nil
}

// recordTables records that tables were bootstrapped at the LSNs given.
func recordTables(ctx context.Context, conn *pgx.Conn, slot string, tables map[uint32]pglogrepl.LSN) error {
	rec := make(map[string]string, len(tables))
	for oid, lsn := range tables {
		rec[strconv.FormatUint(uint64(oid), 10)] = lsn.String()
	}
	if _, err := conn.Exec(ctx, "UPDATE "+stateTable+" SET tables = coalesce(tables, '{}') || $2 WHERE slot = $1", slot, rec); err != nil {
		return fmt.Errorf("postgres: record the tables bootstrapped: %w", err)
	}
	return nil
}

// dropSlot drops the slot and forgets its bootstrap.
func dropSlot(ctx context.Context, conn *pgx.Conn, slot string) error {
	if _, err := conn.Exec(ctx, "SELECT pg_drop_replication_slot($1) FROM pg_replication_slots WHERE slot_name = $1", slot); err != nil {
		return fmt.Errorf("postgres: drop slot %q: %w", slot, err)
	}
	if _, err := conn.Exec(ctx, "DELETE FROM "+stateTable+" WHERE slot = $1", slot); err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	return nil
}
