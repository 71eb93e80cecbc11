package cdc

import (
	"bytes"
	"encoding/binary"
	"slices"
	"sync/atomic"
	"unsafe"

	"github.com/jackc/pglogrepl"
)

// The memory mode keeps the projected columns of every row of a
// projection's tables in memory, with the indexes its joins need, and
// applies each change as it is decoded: a document is composed from that
// state as of its transaction's commit, with no query, so every document
// published existed at some commit (the sql mode re-reads the database,
// which may have moved on). The state is persisted with the LSN it is at
// (memstore.go), so a restart resumes from there. This file is the state
// (its tables, their indexes); changes are applied to it in
// memory_apply.go, documents composed from it in memory_compose.go.

// memTable is one table's rows: the columns any projection needs of it,
// keyed by primary key.
type memTable struct {
	st      *memState
	nameKey string
	cols    []docCol       // kept columns, in a fixed order
	colIdx  map[string]int // name → index in cols
	pk      []int          // indexes into cols of the primary key
	rows    map[string][]byte
	indexes []*memIndex
}

// memIndex finds a table's rows by the values of some columns.
type memIndex struct {
	cols []int
	oids []uint32 // the columns' types
	// value tuple (joinKey) → the rows (the values of the table's rows
	// map, the same slices: a row is found in its list by its address)
	m map[string][][]byte
}

// sameRow reports whether a and b are the same stored row (not only equal
// bytes: every stored row is its own allocation, never empty).
func sameRow(a, b []byte) bool { return &a[0] == &b[0] }

// encodeRow packs values (nil: NULL) into one allocation: per value a
// flag byte, then a uvarint length and the bytes.
func encodeRow(vals [][]byte) []byte {
	n := 0
	for _, v := range vals {
		n++
		if v != nil {
			n += uvarintLen(uint64(len(v))) + len(v)
		}
	}
	b := make([]byte, 0, n)
	for _, v := range vals {
		if v == nil {
			b = append(b, 0)
			continue
		}
		b = append(b, 1)
		b = binary.AppendUvarint(b, uint64(len(v)))
		b = append(b, v...)
	}
	return b
}

// uvarintLen is the length of v's uvarint encoding.
func uvarintLen(v uint64) int {
	n := 1
	for ; v >= 0x80; v >>= 7 {
		n++
	}
	return n
}

// rowField returns value i of an encoded row (nil for NULL).
func rowField(row []byte, i int) []byte {
	for j := 0; ; j++ {
		if len(row) == 0 {
			return nil
		}
		flag := row[0]
		row = row[1:]
		if flag == 0 {
			if j == i {
				return nil
			}
			continue
		}
		l, n := binary.Uvarint(row)
		row = row[n:]
		if j == i {
			return row[:l:l]
		}
		row = row[l:]
	}
}

// appendKey appends the row key of row to dst (as key writes it).
func (t *memTable) appendKey(dst, row []byte) []byte {
	for _, c := range t.pk {
		dst = appendTupleValue(dst, rowField(row, c))
	}
	return dst
}

// appendTuple appends the index key of row to dst (as tuple writes it);
// ok is false when a value is NULL.
func (ix *memIndex) appendTuple(dst, row []byte) (_ []byte, ok bool) {
	for i, c := range ix.cols {
		v := rowField(row, c)
		if v == nil {
			return dst, false
		}
		dst = appendTupleValue(dst, joinText(ix.oids[i], v))
	}
	return dst, true
}

func (t *memTable) key(row []byte) string {
	vals := make([][]byte, len(t.pk))
	for i, c := range t.pk {
		vals[i] = rowField(row, c)
	}
	return tupleKey(vals)
}

func (ix *memIndex) tuple(row []byte) (string, bool) {
	vals := make([][]byte, len(ix.cols))
	for i, c := range ix.cols {
		if vals[i] = rowField(row, c); vals[i] == nil {
			return "", false // NULL joins nothing
		}
	}
	return joinKey(ix.oids, vals), true
}

func (t *memTable) insert(k string, row []byte) {
	t.rows[k] = row
	t.st.rows.Add(1)
	t.st.bytes.Add(int64(len(row)))
	for _, ix := range t.indexes {
		if tk, ok := ix.tuple(row); ok {
			ix.m[tk] = append(ix.m[tk], row)
		}
	}
}

func (t *memTable) remove(k string) []byte {
	row, ok := t.rows[k]
	if !ok {
		return nil
	}
	delete(t.rows, k)
	t.st.rows.Add(-1)
	t.st.bytes.Add(-int64(len(row)))
	for _, ix := range t.indexes {
		tk, ok := ix.tuple(row)
		ix.drop(tk, ok, row)
	}
	return row
}

// replace replaces the row stored under k, old, by row: what remove(k)
// then insert(k, row) do, in place. An index list that keeps the row has
// it moved to its end, as removing and appending it would.
func (t *memTable) replace(k string, old, row []byte) {
	t.rows[k] = row
	t.st.bytes.Add(int64(len(row)) - int64(len(old)))
	for _, ix := range t.indexes {
		var ok1, ok2 bool
		t.st.ixOld, ok1 = ix.appendTuple(t.st.ixOld[:0], old)
		t.st.ixNew, ok2 = ix.appendTuple(t.st.ixNew[:0], row)
		if ok1 != ok2 || ok1 && !bytes.Equal(t.st.ixOld, t.st.ixNew) {
			ix.drop(string(t.st.ixOld), ok1, old)
			if ok2 {
				tk := string(t.st.ixNew)
				ix.m[tk] = append(ix.m[tk], row)
			}
			continue
		}
		if !ok1 {
			continue
		}
		l := ix.m[string(t.st.ixOld)]
		if i := slices.IndexFunc(l, func(r []byte) bool { return sameRow(r, old) }); i >= 0 {
			l[i] = l[len(l)-1]
			l[len(l)-1] = row
		}
	}
}

// drop removes row from the list of index key tk (ok: the row has one).
func (ix *memIndex) drop(tk string, ok bool, row []byte) {
	if !ok {
		return
	}
	l := ix.m[tk]
	if i := slices.IndexFunc(l, func(r []byte) bool { return sameRow(r, row) }); i >= 0 {
		l[i] = l[len(l)-1]
		l = l[:len(l)-1]
	}
	if len(l) == 0 {
		delete(ix.m, tk)
	} else {
		ix.m[tk] = l
	}
}

// reset empties the table.
func (t *memTable) reset() {
	for _, row := range t.rows {
		t.st.rows.Add(-1)
		t.st.bytes.Add(-int64(len(row)))
	}
	t.rows = make(map[string][]byte)
	for _, ix := range t.indexes {
		ix.m = make(map[string][][]byte)
	}
}

// index returns (creating it) the index on cols.
func (t *memTable) index(cols []string) *memIndex {
	idx := make([]int, len(cols))
	for i, c := range cols {
		idx[i] = t.colIdx[c]
	}
	for _, ix := range t.indexes {
		if slices.Equal(ix.cols, idx) {
			return ix
		}
	}
	ix := &memIndex{cols: idx, m: make(map[string][][]byte)}
	for _, c := range idx {
		ix.oids = append(ix.oids, t.cols[c].ctype.OID)
	}
	t.indexes = append(t.indexes, ix)
	return ix
}

// memState is every memory-mode table, owned by the reader: the memory
// mode's composer.
type memState struct {
	rows    atomic.Int64 // rows held, for metrics (read by other goroutines)
	bytes   atomic.Int64 // bytes of their encoded values
	tables  map[string]*memTable
	byTable map[string][]*docNode // "schema.table" → the memory-mode nodes on that table
	lsn     pglogrepl.LSN         // the end of the last transaction applied
	// deltas not yet persisted, by transaction (memstore.go), and what
	// they take (memTxDelta.bytes): held until the broker acknowledges
	// their transactions, they count in Config.MaxTxnMemory
	deltas     []memTxDelta
	deltaBytes int64
	// scratch space of applying changes: keys being looked up, a row's values
	key, ixOld, ixNew []byte
	vals              [][]byte
	// scratch is reused by every document composed from the state.
	scratch memScratch
}

// memTxDelta is what one transaction changed in the state.
type memTxDelta struct {
	end   pglogrepl.LSN
	ops   []memOp
	bytes int64 // what ops take beyond the rows, which the state holds anyway
}

// memOpMem is what a memOp takes, beyond its key's bytes.
const memOpMem = int64(unsafe.Sizeof(memOp{})) + 16

// add records op.
func (d *memTxDelta) add(op memOp) {
	d.ops = append(d.ops, op)
	d.bytes += memOpMem + int64(len(op.key))
}

type memOp struct {
	table string
	key   string
	row   []byte // nil: deleted
	clear bool   // the table was truncated
}

// memNodeInfo is what the memory mode needs of a node: its table, the
// index finding its rows by its join columns (children), and the index
// finding its parent's rows by the parent's join columns.
type memNodeInfo struct {
	t        *memTable
	byJoin   *memIndex // this node's rows by its child-side join columns
	parentIx *memIndex // the parent's rows by the parent-side join columns; nil when direct
	order    []int     // cols of t ordering a many list
	orderOID []uint32
	docCols  []int // cols of t holding the node's document columns, in their order
	// onParent are the cols of the parent's table holding the parent side
	// of the join, in the order of on, and onOID their types.
	onParent []int
	onOID    []uint32
}

// newMemState sizes the state for the memory-mode projections: the
// columns each table keeps (document columns, join columns, keys,
// ordering) and the indexes.
func newMemState(projs []*docProjection, cat map[string]*catalogTable) *memState {
	s := &memState{tables: make(map[string]*memTable), byTable: make(map[string][]*docNode)}
	need := make(map[string][]string)
	add := func(t string, cols ...string) {
		for _, c := range cols {
			if !slices.Contains(need[t], c) {
				need[t] = append(need[t], c)
			}
		}
	}
	for _, p := range projs {
		if p.spec.Mode != ModeMemory {
			continue
		}
		for _, n := range p.nodes {
			ct := cat[n.nameKey]
			add(n.nameKey, ct.pkey...)
			for _, c := range n.cols {
				add(n.nameKey, c.name)
			}
			for _, j := range n.on {
				add(n.nameKey, j.child.name)
				add(n.parent.nameKey, j.parent.name)
			}
			add(n.nameKey, n.orderCols...)
		}
	}
	for name, cols := range need {
		ct := cat[name]
		t := &memTable{st: s, nameKey: name, colIdx: make(map[string]int), rows: make(map[string][]byte)}
		for _, c := range cols {
			t.colIdx[c] = len(t.cols)
			t.cols = append(t.cols, mkCol(c, ct.cols[c]))
		}
		for _, c := range ct.pkey {
			t.pk = append(t.pk, t.colIdx[c])
		}
		s.tables[name] = t
	}
	for _, p := range projs {
		if p.spec.Mode != ModeMemory {
			continue
		}
		for _, n := range p.nodes {
			info := &memNodeInfo{t: s.tables[n.nameKey]}
			if n.parent != nil {
				var cc, pc []string
				for _, j := range n.on {
					cc = append(cc, j.child.name)
					pc = append(pc, j.parent.name)
				}
				info.byJoin = info.t.index(cc)
				// Direct to the document's key, unless equal keys can be
				// written differently: then through an index on the key.
				if !(n.parent.parent == nil && len(pc) == 1 && pc[0] == p.key.name && !textVaries(p.key.ctype.OID)) {
					info.parentIx = s.tables[n.parent.nameKey].index(pc)
				}
			}
			for _, c := range n.cols {
				info.docCols = append(info.docCols, info.t.colIdx[c.name])
			}
			for _, j := range n.on {
				info.onParent = append(info.onParent, s.tables[n.parent.nameKey].colIdx[j.parent.name])
				info.onOID = append(info.onOID, j.parent.ctype.OID)
			}
			for _, c := range n.orderCols {
				info.order = append(info.order, info.t.colIdx[c])
				info.orderOID = append(info.orderOID, info.t.cols[info.t.colIdx[c]].ctype.OID)
			}
			n.mem = info
			s.byTable[n.nameKey] = append(s.byTable[n.nameKey], n)
		}
	}
	return s
}

// stats reports the state's rows and the bytes their encoded values take.
func (s *memState) stats() (rows, valueBytes int64) {
	return s.rows.Load(), s.bytes.Load()
}
