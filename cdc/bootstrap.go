package cdc

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fanwire/fanwire/broker"
	"github.com/fanwire/fanwire/cdc/pgjson"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
)

// bootstrap publishes every row of every published table as of the slot's
// exported snapshot, then records that the slot is bootstrapped. The tail
// starts at the slot's consistent point, which is exactly that snapshot:
// nothing is missed or doubled between the two.
// The record goes through state, a connection outside the snapshot's
// read-only transaction.
func (in *Ingest) bootstrap(ctx context.Context, state *pgx.Conn, keys map[string][]string, oids map[string]uint32, docs *docEngine, types *pgjson.TypeCache, snapshot string, at pglogrepl.LSN, pub *publisher) error {
	cfg := &in.cfg
	conn, err := pgx.Connect(ctx, cfg.DSN)
	if err != nil {
		return fmt.Errorf("postgres: bootstrap connection: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	tx, err := beginSnapshot(ctx, conn, snapshot)
	if err != nil {
		return fmt.Errorf("postgres: bootstrap: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	now := time.Now()
	tx0 := &txn{commitLSN: at, commitTime: now} // bootstrap rows are "as of" the consistent point
	total, err := in.bootstrapTables(ctx, tx, types, keys, tx0, pub)
	if err != nil {
		return err
	}
	if docs != nil {
		n, err := in.bootstrapDocs(ctx, tx, docs, tx0, pub)
		if err != nil {
			return err
		}
		total += n
	}
	if err := pub.sync(ctx); err != nil {
		return err
	}
	if docs != nil && docs.store != nil { // the memory state, as of the snapshot
		if err := docs.store.writeAll(docs.mem, at); err != nil {
			return err
		}
	}
	booted := make(map[string]string, len(keys))
	for q := range keys {
		booted[strconv.FormatUint(uint64(oids[q]), 10)] = at.String()
	}
	if _, err := state.Exec(ctx, "INSERT INTO "+stateTable+" (slot, bootstrapped_lsn, tables, projections) VALUES ($1, $2, $3, $4) ON CONFLICT (slot) DO UPDATE SET bootstrapped_lsn = EXCLUDED.bootstrapped_lsn, bootstrapped_at = now(), tables = EXCLUDED.tables, projections = EXCLUDED.projections", cfg.Slot, at.String(), booted, projectionHashes(cfg.Projections)); err != nil {
		return fmt.Errorf("postgres: record the bootstrap: %w", err)
	}
	in.log.Info("ingest: bootstrap done", zap.Int("rows", total), zap.Duration("took", time.Since(now)))
	return nil
}

// beginSnapshot begins a read-only repeatable-read transaction on conn, in
// the exported snapshot (none: ""), whose values come in text format as
// pgoutput sends them, in the same session settings.
func beginSnapshot(ctx context.Context, conn *pgx.Conn, snapshot string) (pgx.Tx, error) {
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, err
	}
	if snapshot != "" {
		if _, err := tx.Exec(ctx, "SET TRANSACTION SNAPSHOT "+quoteString(snapshot)); err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
			return nil, fmt.Errorf("set snapshot: %w", err)
		}
	}
	for k, v := range pgjson.OutputParams() {
		set := "SET LOCAL " + k + " = " + quoteString(v)
		if _, err := tx.Exec(ctx, set); err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
			return nil, fmt.Errorf("%s: %w", set, err)
		}
	}
	return tx, nil
}

// bootstrapTables publishes every row of the tables keys names (schema.table
// → key columns), read in tx, as of tx0, and returns how many.
func (in *Ingest) bootstrapTables(ctx context.Context, tx pgx.Tx, types *pgjson.TypeCache, keys map[string][]string, tx0 *txn, pub *publisher) (int, error) {
	names := make([]string, 0, len(keys))
	for q := range keys {
		names = append(names, q)
	}
	slices.Sort(names)
	total := 0
	for ti, q := range names {
		schema, rel, _ := strings.Cut(q, ".")
		ident := pgx.Identifier{schema, rel}.Sanitize()
		order := make([]string, len(keys[q]))
		for i, k := range keys[q] {
			order[i] = pgx.Identifier{k}.Sanitize()
		}
		t, err := in.bootstrapTable(ctx, tx, types, q, schema, rel, keys[q])
		if err != nil {
			return total, err
		}
		sel := make([]string, len(t.columns))
		for i, c := range t.columns {
			sel[i] = pgx.Identifier{c.name}.Sanitize()
		}
		cur := fmt.Sprintf("fanwire_bootstrap_%d", ti)
		if _, err := tx.Exec(ctx, "DECLARE "+cur+" NO SCROLL CURSOR FOR SELECT "+strings.Join(sel, ", ")+" FROM "+ident+" ORDER BY "+strings.Join(order, ", ")); err != nil {
			return total, fmt.Errorf("postgres: bootstrap %s: %w", q, err)
		}
		n := 0
		enc := newBootEncoder(in.writer, t, tx0)
		for {
			evs, err := in.bootstrapChunk(ctx, tx, cur, enc, &n)
			if err != nil {
				return total, err
			}
			if len(evs) == 0 {
				break
			}
			if err := pub.add(ctx, evs, 0, time.Time{}); err != nil {
				return total, err
			}
		}
		total += n
		in.bootRows.Add(uint64(n))
		in.log.Info("ingest: bootstrapped table", zap.String("table", q), zap.Int("rows", n))
	}
	return total, nil
}

// bootstrapTable describes a published table as the tail's Relation
// messages will: the columns pgoutput sends (not the generated ones), with
// their types from the catalog (a query's row description would name a
// domain's base type, not the domain).
func (in *Ingest) bootstrapTable(ctx context.Context, tx pgx.Tx, types *pgjson.TypeCache, q, schema, rel string, key []string) (*table, error) {
	cat, err := loadCatalog(ctx, tx, types, []string{q})
	if err != nil {
		return nil, fmt.Errorf("postgres: bootstrap %s: %w", q, err)
	}
	ct := cat[q]
	if ct == nil {
		return nil, fmt.Errorf("postgres: bootstrap %s: not in the catalog", q)
	}
	t := &table{nameKey: q}
	for _, name := range ct.order {
		if !ct.cols[name].generated {
			t.columns = append(t.columns, newColumn(name, ct.cols[name].ctype))
		}
	}
	if err := t.publish(in.cfg.Prefix, schema, rel, key, in.maxEvent); err != nil {
		return nil, err
	}
	return t, nil
}

// bootstrapChunk fetches the next chunk of rows of the table e encodes
// (its cursor cur selects the table's columns) and returns their events.
func (in *Ingest) bootstrapChunk(ctx context.Context, tx pgx.Tx, cur string, e *bootEncoder, n *int) ([]broker.Outgoing, error) {
	t, q := e.t, e.t.nameKey
	// The simple protocol returns every value in text format.
	rows, err := tx.Query(ctx, "FETCH FORWARD "+strconv.Itoa(in.cfg.BootstrapChunk)+" FROM "+cur, pgx.QueryExecModeSimpleProtocol)
	if err != nil {
		return nil, fmt.Errorf("postgres: bootstrap %s: %w", q, err)
	}
	defer rows.Close()
	fds := rows.FieldDescriptions()
	if len(fds) != len(t.columns) {
		return nil, fmt.Errorf("postgres: bootstrap %s: %d columns, the catalog has %d", q, len(fds), len(t.columns))
	}
	for i, fd := range fds {
		if fd.Name != t.columns[i].name {
			return nil, fmt.Errorf("postgres: bootstrap %s: column %d is %q, the catalog says %q", q, i+1, fd.Name, t.columns[i].name)
		}
	}
	var evs []broker.Outgoing
	for rows.Next() {
		if evs == nil {
			evs = make([]broker.Outgoing, 0, in.cfg.BootstrapChunk)
		}
		if evs, err = e.add(evs, rows.RawValues()); err != nil {
			bad, ok := asBadRow(err)
			if !ok {
				return nil, err
			}
			in.reportBad(bad)
		}
		*n++
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("postgres: bootstrap %s: %w", q, err)
	}
	return evs, nil
}

// bootEncoder builds the events of a table's bootstrapped rows, "as of"
// tx0, the slot's consistent point. The events are the ones the table's
// projection makes of an insert of the row, byte for byte, built by an
// eventEncoder with next to no allocations per row.
type bootEncoder struct {
	t   *table
	tx0 *txn
	// row is one row's columns, reused: an event is built from them at
	// once (the values point into pgx's buffer, valid until the next row);
	// ins is its insert.
	cols []pglogrepl.TupleDataColumn
	row  pglogrepl.TupleData
	ins  change
	// hashIn is scratch space for the id hash's input, reused.
	hashIn []byte
	enc    eventEncoder
}

func newBootEncoder(writer string, t *table, tx0 *txn) *bootEncoder {
	e := &bootEncoder{t: t, tx0: tx0, cols: make([]pglogrepl.TupleDataColumn, len(t.columns))}
	e.enc.writer = writer
	e.enc.begin(tx0.commitLSN, tx0.commitTime, 0)
	e.row.Columns = make([]*pglogrepl.TupleDataColumn, len(t.columns))
	for i := range e.cols {
		e.row.Columns[i] = &e.cols[i]
	}
	e.ins = change{kind: 'I', newRow: &e.row}
	return e
}

// add appends the event of the row whose text values are raw. A row that
// cannot be published is appended as its error event, and reported with
// a *badRowError.
func (e *bootEncoder) add(evs []broker.Outgoing, raw [][]byte) ([]broker.Outgoing, error) {
	t := e.t
	if len(raw) != len(t.columns) {
		return evs, fmt.Errorf("postgres: bootstrap %s: a row of %d columns, the catalog has %d", t.nameKey, len(raw), len(t.columns))
	}
	for i, v := range raw {
		e.cols[i] = pglogrepl.TupleDataColumn{DataType: pglogrepl.TupleDataTypeText, Data: v}
		if v == nil {
			e.cols[i].DataType = pglogrepl.TupleDataTypeNull
		}
	}
	var sum [sha256.Size]byte
	e.hashIn, sum = bootstrapHash(e.hashIn[:0], t.nameKey, raw)
	e.enc.strTmp = appendBootstrapID(e.enc.strTmp[:0], e.enc.writer, &sum)
	id := e.enc.keepString(e.enc.strTmp)
	if _, ok := t.proj.(tableProjection); ok { // another projection makes its own events
		if ev, ok := e.enc.rowEvent(t, &e.ins, id, opNames['I']); ok {
			return append(evs, ev), nil
		}
	}
	// The rare row that cannot be published (a value that cannot be
	// encoded, an event over the broker's limit), or another projection:
	// the projection's own path makes its events, or its error event.
	return t.proj.project(evs, e.tx0, t, &change{kind: 'I', newRow: &e.row}, id)
}

// bootstrapDocs publishes every document of every projection, composed in
// the bootstrap's snapshot, and returns how many.
func (in *Ingest) bootstrapDocs(ctx context.Context, tx pgx.Tx, docs *docEngine, tx0 *txn, pub *publisher) (int, error) {
	return in.bootstrapSomeDocs(ctx, tx, docs, nil, tx0, pub)
}

// bootstrapSomeDocs is bootstrapDocs for the projections want accepts (nil:
// all; the memory state is loaded only for all).
func (in *Ingest) bootstrapSomeDocs(ctx context.Context, tx pgx.Tx, docs *docEngine, want func(*docProjection) bool, tx0 *txn, pub *publisher) (int, error) {
	total := 0
	if docs.mem != nil && want == nil {
		if err := in.bootstrapMem(ctx, tx, docs); err != nil {
			return 0, err
		}
	}
	for pi, p := range docs.projs {
		if want != nil && !want(p) {
			continue
		}
		if _, ok := p.composer.(*memState); ok {
			n, err := in.bootstrapMemDocs(ctx, docs, p, tx0, pub)
			if err != nil {
				return total, err
			}
			total += n
			continue
		}
		cur := fmt.Sprintf("fanwire_bootstrap_doc_%d", pi)
		if _, err := tx.Exec(ctx, "DECLARE "+cur+" NO SCROLL CURSOR FOR SELECT "+p.key.ident+" FROM "+p.root.ident+" ORDER BY "+p.key.ident); err != nil {
			return total, fmt.Errorf("postgres: bootstrap projection %q: %w", p.spec.Name, err)
		}
		n := 0
		for {
			rows, err := tx.Query(ctx, fmt.Sprintf("FETCH FORWARD %d FROM %s", in.cfg.BootstrapChunk, cur), pgx.QueryExecModeSimpleProtocol)
			if err != nil {
				return total, fmt.Errorf("postgres: bootstrap projection %q: %w", p.spec.Name, err)
			}
			var keys [][]byte
			for rows.Next() {
				keys = append(keys, bytes.Clone(rows.RawValues()[0]))
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				return total, fmt.Errorf("postgres: bootstrap projection %q: %w", p.spec.Name, err)
			}
			if len(keys) == 0 {
				break
			}
			var evs []broker.Outgoing
			for start := 0; start < len(keys); start += docs.sql.chunk {
				part := keys[start:min(start+docs.sql.chunk, len(keys))]
				out, bad, err := docs.sql.compose(ctx, tx, p, part)
				if err != nil {
					return total, err
				}
				for i, doc := range out {
					var docErr error
					if bad != nil {
						docErr = bad[i]
					}
					if doc == nil && docErr == nil {
						continue // cannot happen in one snapshot
					}
					id := bootstrapID(in.writer, "projection "+p.spec.Name, [][]byte{part[i], doc})
					evs = append(evs, docs.docEvent(p, part[i], doc, docErr, id, tx0.commitLSN, tx0.commitTime))
				}
			}
			if err := pub.add(ctx, evs, 0, time.Time{}); err != nil {
				return total, err
			}
			n += len(evs)
		}
		total += n
		in.log.Info("ingest: bootstrapped projection", zap.String("projection", p.spec.Name), zap.Int("documents", n))
	}
	return total, nil
}

// bootstrapMem loads the memory-mode tables from the snapshot into a fresh
// state.
func (in *Ingest) bootstrapMem(ctx context.Context, tx pgx.Tx, docs *docEngine) error {
	for name, t := range docs.mem.tables {
		t.reset()
		schema, rel := splitTable(name)
		sel := make([]string, len(t.cols))
		for i, c := range t.cols {
			sel[i] = c.ident
		}
		rows, err := tx.Query(ctx, "SELECT "+strings.Join(sel, ", ")+" FROM "+pgx.Identifier{schema, rel}.Sanitize(), pgx.QueryExecModeSimpleProtocol)
		if err != nil {
			return fmt.Errorf("postgres: bootstrap the memory state of %s: %w", name, err)
		}
		for rows.Next() {
			t.insertVals(rows.RawValues())
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("postgres: bootstrap the memory state of %s: %w", name, err)
		}
	}
	docs.mem.deltas = nil
	rows, bytes := docs.mem.stats()
	in.log.Info("ingest: memory state loaded", zap.Int64("rows", rows), zap.Int64("value_bytes", bytes))
	return nil
}

// bootstrapMemDocs publishes every document of memory projection p,
// composed from the state just loaded.
func (in *Ingest) bootstrapMemDocs(ctx context.Context, docs *docEngine, p *docProjection, tx0 *txn, pub *publisher) (int, error) {
	keys := docs.mem.memKeys(p)
	var evs []broker.Outgoing
	for _, k := range keys {
		doc, docErr := docs.mem.memCompose(p, k)
		id := bootstrapID(in.writer, "projection "+p.spec.Name, [][]byte{k, doc})
		if evs = append(evs, docs.docEvent(p, k, doc, docErr, id, tx0.commitLSN, tx0.commitTime)); len(evs) >= in.cfg.MaxBatch {
			if err := pub.add(ctx, evs, 0, time.Time{}); err != nil {
				return 0, err
			}
			evs = nil
		}
	}
	if err := pub.add(ctx, evs, 0, time.Time{}); err != nil {
		return 0, err
	}
	in.log.Info("ingest: bootstrapped projection", zap.String("projection", p.spec.Name), zap.Int("documents", len(keys)))
	return len(keys), nil
}

func quoteString(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// bootstrapID is a bootstrap event's idempotency id: a hash of the table
// and the row's values. A bootstrap that dies and starts over (with a new
// slot and snapshot) publishes the rows that have not changed under the
// same ids, which the broker drops within its duplicate window; a row that
// changed in between gets a new id, and its new state is published.
func bootstrapID(writer, table string, raw [][]byte) string {
	_, sum := bootstrapHash(nil, table, raw)
	return string(appendBootstrapID(nil, writer, &sum))
}

// bootstrapHash is the SHA-256 of the table and the row's values (each
// value's length before it, and NULL apart from the empty string). in is
// scratch space for the hash's input, returned for reuse.
func bootstrapHash(in []byte, table string, raw [][]byte) ([]byte, [sha256.Size]byte) {
	in = append(in, table...)
	for _, v := range raw {
		if v == nil {
			in = append(in, 0) // NULL differs from the empty string
			continue
		}
		in = append(in, 1)
		in = binary.BigEndian.AppendUint32(in, uint32(len(v)))
		in = append(in, v...)
	}
	return in, sha256.Sum256(in)
}

// appendBootstrapID appends the id of writer's row whose bootstrapHash is
// sum: the writer, ":b-" and the first 12 bytes of sum in hexadecimal.
func appendBootstrapID(b []byte, writer string, sum *[sha256.Size]byte) []byte {
	b = append(append(b, writer...), ":b-"...)
	return hex.AppendEncode(b, sum[:12])
}
