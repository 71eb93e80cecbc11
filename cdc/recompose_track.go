package cdc

import (
	"bytes"
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pglogrepl"
)

// Change tracking: each change of a transaction is mapped to the
// documents it affects (docChanges), by each mode's composer. The sql mode
// records the key itself when the changed row is a primary row, otherwise
// the parent-column values to look the parents up by (resolve,
// recompose_sql.go); the memory mode finds them in its state
// (memory_apply.go).

// docChanges collects, for one transaction, the primary keys of the
// documents its changes affect, and the lookups still to run.
type docChanges struct {
	bytes   int64                              // what keys and pending take (estimated)
	delta   memTxDelta                         // memory mode: what the transaction changed in the state
	keys    map[*docProjection]map[string]bool // document key → whether its primary row changed
	trunc   map[*docProjection]bool            // sql mode: the primary table was truncated
	pending map[*docNode]map[string][][]byte   // node → parent-column values (tuple key → values) to find parents by
}

// docKeyMem is what a document's key takes in a docChanges beyond its
// bytes: a map entry and a string header.
const docKeyMem = 48

func newDocChanges() *docChanges {
	return &docChanges{keys: make(map[*docProjection]map[string]bool), trunc: make(map[*docProjection]bool), pending: make(map[*docNode]map[string][][]byte)}
}

func (d *docChanges) empty() bool {
	return len(d.keys) == 0 && len(d.pending) == 0 && d.delta.n == 0 && len(d.trunc) == 0
}

// merge adds o's documents and lookups to d (o's delta is already
// committed).
func (d *docChanges) merge(o *docChanges) {
	for p, set := range o.keys {
		for k, root := range set {
			d.addKey(p, []byte(k), root)
		}
	}
	for p := range o.trunc {
		d.trunc[p] = true
	}
	for n, m := range o.pending {
		for _, vals := range m {
			d.addParentLookup(n, vals)
		}
	}
}

// size is how many documents and lookups d holds.
func (d *docChanges) size() int {
	n := 0
	for _, set := range d.keys {
		n += len(set)
	}
	for _, m := range d.pending {
		n += len(m)
	}
	return n
}

// addKey records that the document of p with key is affected; root says
// its primary row changed. A document whose primary row does not exist is
// published as deleted only if its primary row changed: a child that
// points at no parent (no foreign key) makes no document.
func (d *docChanges) addKey(p *docProjection, key []byte, root bool) {
	m := d.keys[p]
	if m == nil {
		m = make(map[string]bool)
		d.keys[p] = m
	}
	had, ok := m[string(key)]
	if ok && (had || !root) {
		return // already recorded (no allocation)
	}
	if !ok {
		d.bytes += docKeyMem + int64(len(key))
	}
	m[string(key)] = root
}

// addParentLookup records that the parent rows of n whose join columns hold
// vals are affected.
func (d *docChanges) addParentLookup(n *docNode, vals [][]byte) {
	m := d.pending[n]
	if m == nil {
		m = make(map[string][][]byte)
		d.pending[n] = m
	}
	k := tupleKey(vals)
	if _, ok := m[k]; !ok {
		m[k] = cloneAll(vals)
		d.bytes += docKeyMem + 2*int64(len(k)) + 24*int64(len(vals))
	}
}

func tupleKey(vals [][]byte) string {
	var b strings.Builder
	for _, v := range vals {
		if v == nil {
			b.WriteString("\x00N")
			continue
		}
		b.WriteString("\x00V")
		b.Write(v)
	}
	return b.String()
}

// appendTupleValue appends value v (nil: NULL) of a tuple's key to b, as
// tupleKey writes it.
func appendTupleValue(b, v []byte) []byte {
	if v == nil {
		return append(b, "\x00N"...)
	}
	return append(append(b, "\x00V"...), v...)
}

// cloneAll copies vals (nil: NULL), their bytes in one allocation.
func cloneAll(vals [][]byte) [][]byte {
	n := 0
	for _, v := range vals {
		n += len(v)
	}
	buf := make([]byte, 0, n)
	out := make([][]byte, len(vals))
	for i, v := range vals {
		if v != nil {
			buf = append(buf, v...)
			out[i] = buf[len(buf)-len(v) : len(buf) : len(buf)]
		}
	}
	return out
}

// rowValue returns the text of column name in row, and whether the row has
// it (nil for NULL).
func rowValue(t *table, row *pglogrepl.TupleData, name string) ([]byte, bool) {
	i := t.column(name)
	if row == nil || i < 0 || i >= len(row.Columns) {
		return nil, false
	}
	c := row.Columns[i]
	switch c.DataType {
	case pglogrepl.TupleDataTypeText:
		return c.Data, true
	case pglogrepl.TupleDataTypeNull:
		return nil, true
	}
	return nil, false // unchanged TOAST: not sent
}

// observe maps change c of table t to the documents it affects (and, in
// memory mode, applies it to the state).
func (e *docEngine) observe(d *docChanges, t *table, c *change) error {
	for _, m := range e.composers {
		if err := m.observe(d, t, c); err != nil {
			return err
		}
	}
	return nil
}

// observeTruncate maps a truncate of table t to the documents it affects
// (and, in memory mode, empties the state's table).
func (e *docEngine) observeTruncate(ctx context.Context, d *docChanges, t *table) error {
	for _, m := range e.composers {
		if err := m.observeTruncate(ctx, d, t); err != nil {
			return err
		}
	}
	return nil
}

// observe maps change c of table t to the sql-mode documents it affects:
// a primary row by its key, a child row by its join values (the lookups
// resolve runs), as it is and as it was.
func (s *sqlComposer) observe(d *docChanges, t *table, c *change) error {
	for _, n := range s.byTable[t.nameKey] {
		for _, row := range []*pglogrepl.TupleData{c.newRow, c.oldRow} {
			if row == nil {
				continue
			}
			if n.parent == nil {
				if v, ok := rowValue(t, row, n.proj.key.name); ok && v != nil {
					d.addKey(n.proj, v, true)
				}
				continue
			}
			vals := make([][]byte, len(n.on))
			ok := true
			for i, j := range n.on {
				v, has := rowValue(t, row, j.child.name)
				if !has || v == nil { // a NULL join value joins no parent
					ok = false
					break
				}
				vals[i] = v
			}
			if ok {
				d.addParentLookup(n, vals)
			}
		}
	}
	return nil
}

// observeTruncate: a truncated table of a projection affects every one of
// its documents whose relations it holds; the simplest exact answer is to
// recompose them all, which the sql mode does by reading every key.
func (s *sqlComposer) observeTruncate(ctx context.Context, d *docChanges, t *table) error {
	for _, n := range s.byTable[t.nameKey] {
		p := n.proj
		if n.parent == nil {
			d.trunc[p] = true // the documents are gone, and their keys unknown: one truncate event
			continue
		}
		rows, err := s.pool.Query(ctx, "SELECT "+p.key.ident+" FROM "+p.root.ident, textResults)
		if err != nil {
			return fmt.Errorf("postgres: projection %q: %w", p.spec.Name, err)
		}
		for rows.Next() {
			d.addKey(p, bytes.Clone(rows.RawValues()[0]), false)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
	}
	return nil
}
