package cdc

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"
)

// The sql mode: a change to any table of a projection is mapped to the
// primary keys of the documents it affects (reverse lookup: directly from
// the changed row where the join reaches the primary key, otherwise with
// batched queries), the affected documents of a transaction are
// coalesced, re-read with batched `= ANY($1)` queries, one per relation
// level, and published after the transaction's table events, in commit
// order.

// Defaults of the sql mode. 512 keys per query rather than 128: each
// chunk is a transaction (BEGIN, a query per level, ROLLBACK), and on the
// 100,000-row UPDATE PostgreSQL's backends spent 6.3 µs per document
// against 7.7–8.2, the ingest 12.1–14.0 µs against 14.9–16.0
// (BenchmarkDeployed/projection-update/sql, 3 alternated runs).
const (
	docChunk   = 512 // keys per query
	docWorkers = 8   // concurrent queries
)

// sqlComposer is the sql mode's composer.
type sqlComposer struct {
	projs   []*docProjection      // the sql-mode projections
	byTable map[string][]*docNode // "schema.table" → their nodes on that table
	pool    *pgxpool.Pool         // where documents are re-read
	chunk   int                   // keys per query
	workers int                   // concurrent queries
}

// prepare waits until transaction t is visible and runs the lookups d
// holds, so that its documents are known by their keys.
func (s *sqlComposer) prepare(ctx context.Context, d *docChanges, t *txn) error {
	if len(d.pending) > 0 || slices.ContainsFunc(s.projs, func(p *docProjection) bool { return len(d.keys[p]) > 0 }) {
		// The sql mode reads the database: first wait until the
		// transaction is visible to new snapshots. Its commit reaches
		// logical decoding once it is in the WAL, a moment before other
		// sessions see it, and a read in that moment sees the rows as
		// they were before it.
		if err := s.waitVisible(ctx, t.xid); err != nil {
			return err
		}
	}
	return s.resolve(ctx, d)
}

// recompose re-reads the documents of keys (sqlCompose); buf is not used.
func (s *sqlComposer) recompose(ctx context.Context, p *docProjection, keys, docs [][]byte, bad []error, buf []byte) ([]byte, error) {
	return buf, s.sqlCompose(ctx, p, keys, docs, bad)
}

// resolve runs the pending parent lookups, deepest relations first, until
// every affected document is known by its primary key.
func (s *sqlComposer) resolve(ctx context.Context, d *docChanges) error {
	for len(d.pending) > 0 {
		var deepest *docNode
		for n := range d.pending {
			if deepest == nil || n.depth > deepest.depth || (n.depth == deepest.depth && n.nameKey < deepest.nameKey) {
				deepest = n
			}
		}
		tuples := d.pending[deepest]
		delete(d.pending, deepest)
		parent := deepest.parent
		p := deepest.proj
		// Direct: the join reaches the primary key itself, and the
		// child's value is the key's text (for a type whose equal values
		// can be written differently, the query below reads the key's).
		if parent.parent == nil && len(deepest.on) == 1 && deepest.on[0].parent.name == p.key.name && !textVaries(p.key.ctype.OID) {
			for _, vals := range tuples {
				d.addKey(p, vals[0], false)
			}
			continue
		}
		// Query the parent rows by the join columns: the root's keys, or
		// the parent's own join values towards its parent.
		var sel []string
		if parent.parent == nil {
			sel = []string{p.key.ident}
		} else {
			for _, j := range parent.on {
				sel = append(sel, j.child.ident)
			}
		}
		cols := make([]docCol, len(deepest.on))
		for i, j := range deepest.on {
			cols[i] = j.parent
		}
		list := make([][][]byte, 0, len(tuples))
		for _, v := range tuples {
			list = append(list, v)
		}
		err := s.queryByTuples(ctx, s.pool, parent, sel, cols, list, "", func(raw [][]byte) {
			if parent.parent == nil {
				if raw[0] != nil {
					d.addKey(p, raw[0], false)
				}
				return
			}
			for _, v := range raw {
				if v == nil {
					return
				}
			}
			d.addParentLookup(parent, raw)
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// textResults asks for every column of a query's result in text format:
// the type's output function writes it, as pgoutput does. A cast to text
// would not do: bool::text is "true" where the output is "t",
// inet::text always adds the netmask, char(n)::text drops the padding.
var textResults = pgx.QueryResultFormats{pgx.TextFormatCode}

// queryByTuples selects sel (as text) from n's rows whose cols hold one of
// tuples, in chunks, calling fn for each row (its values are valid during
// the call only).
func (s *sqlComposer) queryByTuples(ctx context.Context, q querier, n *docNode, sel []string, cols []docCol, tuples [][][]byte, order string, fn func(raw [][]byte)) error {
	chunk := s.chunk
	for start := 0; start < len(tuples); start += chunk {
		part := tuples[start:min(start+chunk, len(tuples))]
		args := make([]any, 1+len(cols))
		args[0] = textResults
		for ci := range cols {
			args[1+ci] = textArray(part, ci)
		}
		sql := "SELECT " + strings.Join(sel, ", ") + " FROM " + n.ident + " AS x WHERE " + tupleFilter(cols)
		if order != "" {
			sql += " ORDER BY " + order
		}
		rows, err := q.Query(ctx, sql, args...)
		if err != nil {
			return projectionQueryError(n, err)
		}
		for rows.Next() {
			raw := rows.RawValues()
			fn(raw)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return projectionQueryError(n, err)
		}
	}
	return nil
}

// projectionQueryError is the error of a query of projection node n. A
// table or column the projection names that no longer exists (a DDL
// dropped or renamed it) or changed type stops the ingest, naming it:
// reconnecting cannot make the query work, the configuration must change.
func projectionQueryError(n *docNode, err error) error {
	err = fmt.Errorf("postgres: projection %q, %s: %w", n.proj.spec.Name, n.nameKey, err)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "42703", "42P01", "42883", "42804": // undefined column, undefined table, undefined function (a type's operator), datatype mismatch
			return errFatal{fmt.Errorf("%w: the table changed (a DDL?): change --config to match it, and restart", err)}
		}
	}
	return err
}

// tupleFilter is the WHERE condition "cols equal one of the tuples passed
// as one text array per column".
func tupleFilter(cols []docCol) string {
	if len(cols) == 1 {
		return cols[0].ident + " = ANY($1::text[]::" + cols[0].typ + "[])"
	}
	var lhs, un []string
	for i, c := range cols {
		lhs = append(lhs, c.ident)
		un = append(un, fmt.Sprintf("$%d::text[]::%s[]", i+1, c.typ))
	}
	return "(" + strings.Join(lhs, ", ") + ") IN (SELECT * FROM unnest(" + strings.Join(un, ", ") + "))"
}

// composedRow is one row of a relation, read for composing documents.
type composedRow struct {
	vals     [][]byte // the node's cols, text (nil: NULL)
	extra    [][]byte // the node's extras (joinExtras), text
	children [][]*composedRow
}

// joinExtras lists the columns of n its children join on that are not in
// its document columns: they are read too.
func joinExtras(n *docNode) []docCol {
	var out []docCol
	for _, c := range n.children {
		for _, j := range c.on {
			if !slices.ContainsFunc(n.cols, func(x docCol) bool { return x.name == j.parent.name }) &&
				!slices.ContainsFunc(out, func(x docCol) bool { return x.name == j.parent.name }) {
				out = append(out, j.parent)
			}
		}
	}
	return out
}

// value returns column name of row r of node n (from its columns or its
// extras).
func (n *docNode) value(r *composedRow, extras []docCol, name string) []byte {
	if i := slices.IndexFunc(n.cols, func(c docCol) bool { return c.name == name }); i >= 0 {
		return r.vals[i]
	}
	if i := slices.IndexFunc(extras, func(c docCol) bool { return c.name == name }); i >= 0 {
		return r.extra[i]
	}
	return nil
}

func idents(cols []docCol) []string {
	out := make([]string, len(cols))
	for i, c := range cols {
		out[i] = c.ident
	}
	return out
}

// compose reads the documents of p with the given keys and returns, for
// each key in order, its document (nil when the primary row is gone), and
// why a document could not be encoded (nil when every one could).
func (s *sqlComposer) compose(ctx context.Context, q querier, p *docProjection, keys [][]byte) (_ [][]byte, bad []error, _ error) {
	root := p.root
	tuples, flat := make([][][]byte, len(keys)), make([][]byte, len(keys))
	for i, k := range keys {
		flat[i] = k
		tuples[i] = flat[i : i+1 : i+1]
	}
	extras := joinExtras(root)
	slab := &rowSlab{}
	byKey := make(map[string]*composedRow, len(keys))
	var rows []*composedRow
	sel := append(append(idents(root.cols), idents(extras)...), p.key.ident)
	nc, nx := len(root.cols), len(extras)
	err := s.queryByTuples(ctx, q, root, sel, []docCol{p.key}, tuples, "", func(raw [][]byte) {
		r := slab.row(raw, nc, nx)
		byKey[string(raw[nc+nx])] = r
		rows = append(rows, r)
	})
	if err != nil {
		return nil, nil, err
	}
	if err := s.fill(ctx, q, slab, root, extras, rows); err != nil {
		return nil, nil, err
	}
	out := make([][]byte, len(keys))
	for i, k := range keys {
		r := byKey[string(k)]
		if r == nil {
			continue
		}
		b, err := appendDoc(make([]byte, 0, 512), root, r)
		if err != nil {
			if bad == nil {
				bad = make([]error, len(keys))
			}
			bad[i] = err
			continue
		}
		out[i] = b
	}
	return out, bad, nil
}

// fill reads the children of rows (of node n, read with extras),
// recursively, into slab.
func (s *sqlComposer) fill(ctx context.Context, q querier, slab *rowSlab, n *docNode, extras []docCol, rows []*composedRow) error {
	if len(rows) == 0 {
		return nil
	}
	kids := make([][]*composedRow, len(rows)*len(n.children))
	for i, r := range rows {
		r.children = kids[i*len(n.children) : (i+1)*len(n.children) : (i+1)*len(n.children)]
	}
	for ci, child := range n.children {
		// The parents by the values the child joins on (equal values,
		// not equal text: joinKey).
		oids := make([]uint32, len(child.on))
		for i, j := range child.on {
			oids[i] = j.parent.ctype.OID
		}
		parents := make(map[string][]*composedRow)
		var tuples [][][]byte
		flat := make([][]byte, len(rows)*len(child.on))
		for ri, r := range rows {
			vals := flat[ri*len(child.on) : (ri+1)*len(child.on) : (ri+1)*len(child.on)]
			ok := true
			for i, j := range child.on {
				if vals[i] = n.value(r, extras, j.parent.name); vals[i] == nil {
					ok = false // NULL joins nothing
					break
				}
			}
			if !ok {
				continue
			}
			k := joinKey(oids, vals)
			if _, seen := parents[k]; !seen {
				tuples = append(tuples, vals)
			}
			parents[k] = append(parents[k], r)
		}
		cx := joinExtras(child)
		joinCols := make([]docCol, len(child.on))
		for i, j := range child.on {
			joinCols[i] = j.child
		}
		sel := append(append(idents(child.cols), idents(cx)...), idents(joinCols)...)
		nc, nx, nj := len(child.cols), len(cx), len(joinCols)
		var kids []*composedRow
		err := s.queryByTuples(ctx, q, child, sel, joinCols, tuples, child.orderBy, func(raw [][]byte) {
			kr := slab.row(raw, nc, nx)
			for _, pr := range parents[joinKey(oids, raw[nc+nx:nc+nx+nj])] {
				pr.children[ci] = append(pr.children[ci], kr)
			}
			kids = append(kids, kr)
		})
		if err != nil {
			return err
		}
		if err := s.fill(ctx, q, slab, child, cx, kids); err != nil {
			return err
		}
	}
	return nil
}

// sqlCompose re-reads the documents of keys into docs, and why one could
// not be encoded into bad: chunks of s.chunk
// keys, s.workers at a time. A chunk's queries (one per relation level)
// share one snapshot, so each document is the document at some commit, if
// not always the one that triggered it.
func (s *sqlComposer) sqlCompose(ctx context.Context, p *docProjection, keys, docs [][]byte, bad []error) error {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(s.workers)
	for start := 0; start < len(keys); start += s.chunk {
		end := min(start+s.chunk, len(keys))
		g.Go(func() error {
			var q querier = s.pool
			if len(p.root.children) > 0 {
				tx, err := s.pool.BeginTx(gctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
				if err != nil {
					return fmt.Errorf("postgres: projection %q: %w", p.spec.Name, err)
				}
				defer tx.Rollback(context.WithoutCancel(gctx))
				q = tx
			}
			out, b, err := s.compose(gctx, q, p, keys[start:end])
			copy(docs[start:end], out)
			copy(bad[start:end], b)
			return err
		})
	}
	return g.Wait()
}

// visibleSQL reports whether 32-bit xid $1 (committed) is visible to a new
// snapshot: the xid is extended with the epoch of the snapshot's xmax.
const visibleSQL = `
	SELECT txid_visible_in_snapshot(
	         (txid_snapshot_xmax(s) >> 32 << 32) + $1::bigint
	           - CASE WHEN $1::bigint > (txid_snapshot_xmax(s) & 4294967295) THEN 4294967296 ELSE 0 END,
	         s)
	FROM txid_current_snapshot() AS s`

// waitVisible waits until transaction xid is visible to new snapshots.
func (s *sqlComposer) waitVisible(ctx context.Context, xid uint32) error {
	if xid == 0 {
		return nil
	}
	for wait := 100 * time.Microsecond; ; wait = min(2*wait, 10*time.Millisecond) {
		rows, err := s.pool.Query(ctx, visibleSQL, int64(xid))
		if err != nil {
			return fmt.Errorf("postgres: transaction visibility: %w", err)
		}
		var visible bool
		for rows.Next() {
			if err := rows.Scan(&visible); err != nil {
				rows.Close()
				return err
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("postgres: transaction visibility: %w", err)
		}
		if visible {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
}
