package cdc

import (
	"bytes"
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pglogrepl"
)

// Applying changes to the memory state: each change of a memory-mode
// table updates its rows and indexes as it is decoded, and the documents
// the row was and is part of are found by walking up the joins in the
// state (memAffected).

// rowFrom encodes the kept columns of table t (a memTable) from a
// change's tuple as rel (the relation) describes it, into scratch space
// valid until the next call; a column not sent (unchanged TOAST) is taken
// from old, the row's stored version.
func (t *memTable) rowFrom(rel *table, tuple *pglogrepl.TupleData, old []byte) ([]byte, error) {
	vals := append(t.st.vals[:0], make([][]byte, len(t.cols))...)
	defer func() { clear(vals); t.st.vals = vals }()
	for i, c := range t.cols {
		j := rel.column(c.name)
		if j < 0 || j >= len(tuple.Columns) {
			// A DDL dropped or renamed it: the state cannot be kept, and
			// reconnecting would meet the same change again.
			return nil, errFatal{fmt.Errorf("memory projection: table %s has no column %s any more (a DDL dropped or renamed it; its columns are now %s): change --config to match the table, and restart (the memory state is then bootstrapped again)", t.nameKey, c.name, columnNames(rel))}
		}
		col := tuple.Columns[j]
		switch col.DataType {
		case pglogrepl.TupleDataTypeText:
			vals[i] = col.Data
		case pglogrepl.TupleDataTypeNull:
		case pglogrepl.TupleDataTypeToast:
			if old == nil {
				return nil, fmt.Errorf("table %s: column %s was not sent (unchanged TOAST) and the row is not in the state", t.nameKey, c.name)
			}
			vals[i] = rowField(old, i)
		default:
			return nil, fmt.Errorf("table %s column %s: tuple data type %q", t.nameKey, c.name, col.DataType)
		}
	}
	t.st.enc = appendEncoded(t.st.enc[:0], vals)
	return t.st.enc, nil
}

// keyFrom is the row key of a change's tuple (the key columns are always
// sent: a key-only old tuple holds them).
func (t *memTable) appendKeyFrom(dst []byte, rel *table, tuple *pglogrepl.TupleData) ([]byte, bool) {
	for _, c := range t.pk {
		j := rel.column(t.cols[c].name)
		if j < 0 || j >= len(tuple.Columns) || tuple.Columns[j].DataType != pglogrepl.TupleDataTypeText {
			return dst, false
		}
		dst = appendTupleValue(dst, tuple.Columns[j].Data)
	}
	return dst, true
}

// observe applies change c of table t to the state and records in d the
// documents it affects (memApply).
func (s *memState) observe(d *docChanges, t *table, c *change) error {
	return s.memApply(d, t, c, &d.delta)
}

// observeTruncate empties table t in the state and records in d the
// documents it affects (memTruncate).
func (s *memState) observeTruncate(_ context.Context, d *docChanges, t *table) error {
	s.memTruncate(d, t, &d.delta)
	return nil
}

// memApply applies change c of relation rel to the state and records in d
// the documents it affects: those of the row as it was, before, and as it
// is, after (a child moving between parents affects both).
func (s *memState) memApply(d *docChanges, rel *table, c *change, delta *memTxDelta) error {
	t := s.tables[rel.nameKey]
	if t == nil {
		return nil
	}
	var oldOK bool
	if c.oldRow != nil {
		s.key, oldOK = t.appendKeyFrom(s.key[:0], rel, c.oldRow)
	} else if c.newRow != nil && c.kind == 'U' {
		s.key, oldOK = t.appendKeyFrom(s.key[:0], rel, c.newRow) // the key did not change
	}
	var oldID uint32
	var old []byte
	if oldOK {
		if oldID = t.find(s.key); oldID != 0 {
			old = t.row(oldID)
		}
	}
	if old != nil && c.kind == 'U' {
		enc, err := t.rowFrom(rel, c.newRow, old)
		if s.ixOld = t.appendKey(s.ixOld[:0], enc); err == nil && bytes.Equal(s.ixOld, s.key) {
			// The key kept: the row is replaced in place (what removing
			// and inserting it does, without rebuilding its keys), and
			// persisted by one put, which overwrites it.
			s.memAffected(d, t, old)
			row := t.replace(oldID, old, enc)
			delta.add(t.nameKey, s.key, row, false)
			s.memAffected(d, t, row)
			return nil
		}
	}
	if old != nil {
		s.memAffected(d, t, old)
		t.remove(oldID, s.key)
		delta.add(t.nameKey, s.key, nil, false)
	}
	if c.kind == 'I' || c.kind == 'U' {
		enc, err := t.rowFrom(rel, c.newRow, old)
		if err != nil {
			return err
		}
		s.key = t.appendKey(s.key[:0], enc)
		if prev := t.find(s.key); prev != 0 { // an insert over a row the state has (a re-read transaction)
			s.memAffected(d, t, t.row(prev))
			t.remove(prev, s.key)
		}
		row := t.insert(s.key, enc)
		delta.add(t.nameKey, s.key, row, false)
		s.memAffected(d, t, row)
	}
	return nil
}

// memTruncate empties a table: every document that had one of its rows is
// affected.
func (s *memState) memTruncate(d *docChanges, rel *table, delta *memTxDelta) {
	t := s.tables[rel.nameKey]
	if t == nil {
		return
	}
	for id := uint32(1); id < uint32(len(t.slots)); id++ {
		if row, ok := t.rowAt(id); ok {
			s.memAffected(d, t, row)
		}
	}
	t.reset()
	delta.add(t.nameKey, nil, nil, true)
}

// memAffected records the documents row (of table t) is part of, in every
// memory-mode projection, by walking up the joins in the state.
func (s *memState) memAffected(d *docChanges, t *memTable, row []byte) {
	for _, n := range s.byTable[t.nameKey] {
		s.memUp(d, n, row, 0)
	}
}

// memUp records the documents row (of node n) is part of; depth is how
// many joins it walked up, and names its scratch tuple.
func (s *memState) memUp(d *docChanges, n *docNode, row []byte, depth int) {
	info := n.mem
	if n.parent == nil {
		if k := rowField(row, info.t.colIdx[n.proj.key.name]); k != nil {
			d.addKey(n.proj, k, true)
		}
		return
	}
	if info.parentIx == nil { // the join reaches the primary key
		if v := rowField(row, info.t.colIdx[n.on[0].child.name]); v != nil {
			d.addKey(n.proj, v, false)
		}
		return
	}
	for len(s.upKeys) <= depth {
		s.upKeys = append(s.upKeys, nil)
	}
	tk := s.upKeys[depth][:0]
	for i, j := range n.on {
		v := rowField(row, info.t.colIdx[j.child.name])
		if v == nil {
			return
		}
		tk = appendTupleValue(tk, joinText(info.parentIx.oids[i], v))
	}
	s.upKeys[depth] = tk
	ix := info.parentIx
	head, exact := ix.first(tk)
	for id := head; id != 0; id = ix.next(head, id) {
		if prow := ix.t.row(id); exact || ix.match(prow, tk) {
			s.memUp(d, n.parent, prow, depth+1)
		}
	}
}

// columnNames lists t's columns, for errors.
func columnNames(t *table) string {
	names := make([]string, len(t.columns))
	for i, c := range t.columns {
		names[i] = c.name
	}
	return strings.Join(names, ", ")
}
