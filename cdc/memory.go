package cdc

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"fmt"
	"math/big"
	"slices"
	"strconv"
	"sync/atomic"

	"github.com/jackc/pglogrepl"
)

// The memory mode keeps the projected columns of every row of a
// projection's tables in memory, with the indexes its joins need, and
// applies each change as it is decoded: a document is composed from that
// state as of its transaction's commit, with no query, so every document
// published existed at some commit (the sql mode re-reads the database,
// which may have moved on). The state is persisted with the LSN it is at
// (memstore.go), so a restart resumes from there.

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
		ix.oids = append(ix.oids, t.cols[c].ctype.oid)
	}
	t.indexes = append(t.indexes, ix)
	return ix
}

// memState is every memory-mode table, owned by the reader.
type memState struct {
	rows   atomic.Int64 // rows held, for metrics (read by other goroutines)
	bytes  atomic.Int64 // bytes of their encoded values
	tables map[string]*memTable
	lsn    pglogrepl.LSN // the end of the last transaction applied
	// deltas not yet persisted, by transaction (memstore.go)
	deltas []memTxDelta
	// scratch space of applying changes: keys being looked up, a row's values
	key, ixOld, ixNew []byte
	vals              [][]byte
}

// memTxDelta is what one transaction changed in the state.
type memTxDelta struct {
	end pglogrepl.LSN
	ops []memOp
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
	s := &memState{tables: make(map[string]*memTable)}
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
				if !(n.parent.parent == nil && len(pc) == 1 && pc[0] == p.key.name && !textVaries(p.key.ctype.oid)) {
					info.parentIx = s.tables[n.parent.nameKey].index(pc)
				}
			}
			for _, c := range n.cols {
				info.docCols = append(info.docCols, info.t.colIdx[c.name])
			}
			for _, j := range n.on {
				info.onParent = append(info.onParent, s.tables[n.parent.nameKey].colIdx[j.parent.name])
				info.onOID = append(info.onOID, j.parent.ctype.oid)
			}
			for _, c := range n.orderCols {
				info.order = append(info.order, info.t.colIdx[c])
				info.orderOID = append(info.orderOID, info.t.cols[info.t.colIdx[c]].ctype.oid)
			}
			n.mem = info
		}
	}
	return s
}

// rowFrom builds the kept columns of table t (a memTable) from a change's
// tuple as rel (the relation) describes it; a column not sent (unchanged
// TOAST) is taken from old, the row's stored version.
func (t *memTable) rowFrom(rel *table, tuple *pglogrepl.TupleData, old []byte) ([]byte, error) {
	vals := append(t.st.vals[:0], make([][]byte, len(t.cols))...)
	defer func() { clear(vals); t.st.vals = vals }()
	for i, c := range t.cols {
		j := rel.column(c.name)
		if j < 0 || j >= len(tuple.Columns) {
			return nil, fmt.Errorf("table %s: column %s is not replicated", t.nameKey, c.name)
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
	return encodeRow(vals), nil
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

// apply applies change c of relation rel to the state and records in d the
// documents it affects: those of the row as it was, before, and as it is,
// after (a child moving between parents affects both).
func (e *docEngine) memApply(d *docChanges, rel *table, c *change, delta *memTxDelta) error {
	t := e.mem.tables[rel.nameKey]
	if t == nil {
		return nil
	}
	st := e.mem
	var oldOK bool
	if c.oldRow != nil {
		st.key, oldOK = t.appendKeyFrom(st.key[:0], rel, c.oldRow)
	} else if c.newRow != nil && c.kind == 'U' {
		st.key, oldOK = t.appendKeyFrom(st.key[:0], rel, c.newRow) // the key did not change
	}
	var old []byte
	if oldOK {
		old = t.rows[string(st.key)]
	}
	if old != nil && c.kind == 'U' {
		row, err := t.rowFrom(rel, c.newRow, old)
		if st.key = t.appendKey(st.key[:0], row); err == nil && string(st.key) == string(t.appendKey(st.ixOld[:0], old)) {
			// The key kept: the row is replaced in place (what removing
			// and inserting it does, without rebuilding its keys), and
			// persisted by one put, which overwrites it.
			k := string(st.key)
			e.memAffected(d, t, old)
			t.replace(k, old, row)
			delta.ops = append(delta.ops, memOp{table: t.nameKey, key: k, row: row})
			e.memAffected(d, t, row)
			return nil
		}
	}
	if old != nil {
		oldKey := t.key(old)
		e.memAffected(d, t, old)
		t.remove(oldKey)
		delta.ops = append(delta.ops, memOp{table: t.nameKey, key: oldKey})
	}
	if c.kind == 'I' || c.kind == 'U' {
		row, err := t.rowFrom(rel, c.newRow, old)
		if err != nil {
			return err
		}
		k := t.key(row)
		if prev := t.remove(k); prev != nil { // an insert over a row the state has (a re-read transaction)
			e.memAffected(d, t, prev)
		}
		t.insert(k, row)
		delta.ops = append(delta.ops, memOp{table: t.nameKey, key: k, row: row})
		e.memAffected(d, t, row)
	}
	return nil
}

// memTruncate empties a table: every document that had one of its rows is
// affected.
func (e *docEngine) memTruncate(d *docChanges, rel *table, delta *memTxDelta) {
	t := e.mem.tables[rel.nameKey]
	if t == nil {
		return
	}
	for _, row := range t.rows {
		e.memAffected(d, t, row)
	}
	t.reset()
	delta.ops = append(delta.ops, memOp{table: t.nameKey, clear: true})
}

// memAffected records the documents row (of table t) is part of, in every
// memory-mode projection, by walking up the joins in the state.
func (e *docEngine) memAffected(d *docChanges, t *memTable, row []byte) {
	for _, n := range e.byTable[t.nameKey] {
		if n.mem == nil {
			continue
		}
		e.memUp(d, n, row)
	}
}

func (e *docEngine) memUp(d *docChanges, n *docNode, row []byte) {
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
	st := info.t.st
	st.key = st.key[:0]
	for i, j := range n.on {
		v := rowField(row, info.t.colIdx[j.child.name])
		if v == nil {
			return
		}
		st.key = appendTupleValue(st.key, joinText(info.parentIx.oids[i], v))
	}
	for _, prow := range info.parentIx.m[string(st.key)] {
		e.memUp(d, n.parent, prow)
	}
}

// memCompose composes the document of p with key from the state (nil: the
// primary row does not exist).
func (e *docEngine) memCompose(p *docProjection, key []byte) ([]byte, error) {
	doc, ok, err := e.appendMemDoc(nil, p, key)
	if !ok || err != nil {
		return nil, err
	}
	return doc, nil
}

// memScratch is what composing documents from the state reuses from one
// document to the next (the reader's goroutine owns it, with the state):
// the map key being looked up, and per nesting depth the fields of the row
// being appended and the rows of one of its children.
type memScratch struct {
	key    []byte
	levels []memLevel
}

type memLevel struct {
	fields [][]byte
	kids   [][]byte
}

// appendMemDoc appends the document of p with key, composed from the
// state, to b; ok is false when its primary row does not exist. On an
// error, b is returned as it was.
func (e *docEngine) appendMemDoc(b []byte, p *docProjection, key []byte) (_ []byte, ok bool, _ error) {
	root := p.root
	sc := &e.memScratch
	sc.key = appendTupleValue(sc.key[:0], key)
	row := root.mem.t.rows[string(sc.key)]
	if row == nil {
		return b, false, nil
	}
	out, err := sc.appendRow(b, root, row, 0)
	if err != nil {
		return b, true, err
	}
	return out, true, nil
}

// appendRow appends row (of node n, at nesting depth) as a JSON object
// with its embeds, as appendDoc does a composedRow.
func (sc *memScratch) appendRow(b []byte, n *docNode, row []byte, depth int) ([]byte, error) {
	for len(sc.levels) <= depth {
		sc.levels = append(sc.levels, memLevel{})
	}
	lv := &sc.levels[depth]
	lv.fields = rowFields(lv.fields[:0], row)
	fields := lv.fields
	info := n.mem
	b = append(b, '{')
	var err error
	for i, c := range n.cols {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, c.jsonName...)
		v := fields[info.docCols[i]]
		if v == nil {
			b = append(b, "null"...)
			continue
		}
		if b, err = c.ctype.appendValue(b, v); err != nil {
			return nil, fmt.Errorf("projection %q, %s column %s: %w", n.proj.spec.Name, n.nameKey, c.name, err)
		}
	}
	for ci, child := range n.children {
		if len(n.cols) > 0 || ci > 0 {
			b = append(b, ',')
		}
		b = append(b, child.as...)
		// The child's rows: by the values it joins on (NULL joins nothing).
		kids := lv.kids[:0]
		sc.key = sc.key[:0]
		joined := true
		for i, c := range child.mem.onParent {
			v := fields[c]
			if v == nil {
				joined = false
				break
			}
			sc.key = appendTupleValue(sc.key, joinText(child.mem.onOID[i], v))
		}
		if joined { // a copy: sorting it must not reorder the index
			kids = append(kids, child.mem.byJoin.m[string(sc.key)]...)
		}
		lv.kids = kids
		if !child.many {
			if len(kids) == 0 {
				b = append(b, "null"...)
				continue
			}
			if b, err = sc.appendRow(b, child, kids[0], depth+1); err != nil {
				return nil, err
			}
			continue
		}
		if len(kids) > 1 {
			info := child.mem
			slices.SortFunc(kids, func(a, b []byte) int {
				for i, c := range info.order {
					if x := compareText(info.orderOID[i], rowField(a, c), rowField(b, c)); x != 0 {
						return x
					}
				}
				return 0
			})
		}
		b = append(b, '[')
		for k, cr := range kids {
			if k > 0 {
				b = append(b, ',')
			}
			if b, err = sc.appendRow(b, child, cr, depth+1); err != nil {
				return nil, err
			}
		}
		b = append(b, ']')
	}
	return append(b, '}'), nil
}

// rowFields appends the values of an encoded row (nil for NULL) to dst.
func rowFields(dst [][]byte, row []byte) [][]byte {
	for len(row) > 0 {
		flag := row[0]
		row = row[1:]
		if flag == 0 {
			dst = append(dst, nil)
			continue
		}
		l, n := binary.Uvarint(row)
		row = row[n:]
		dst = append(dst, row[:l:l])
		row = row[l:]
	}
	return dst
}

// compareText orders two values of a type as PostgreSQL's ORDER BY does for
// the types a key or an ordering column usually has: numbers numerically
// (-Infinity first, then NaN last), dates and timestamps by time (BC years
// and years past 9999 included, -infinity first, infinity last), everything
// else by bytes (the C collation). NULLs sort last.
func compareText(oid uint32, a, b []byte) int {
	switch {
	case a == nil && b == nil:
		return 0
	case a == nil:
		return 1
	case b == nil:
		return -1
	}
	switch oid {
	case 20, 21, 23, 26: // int8, int2, int4, oid
		x, err1 := strconv.ParseInt(string(a), 10, 64)
		y, err2 := strconv.ParseInt(string(b), 10, 64)
		if err1 == nil && err2 == nil {
			switch {
			case x < y:
				return -1
			case x > y:
				return 1
			}
			return 0
		}
	case 700, 701, 1700: // float4, float8, numeric
		if x := cmp.Compare(numberRank(a), numberRank(b)); x != 0 || numberRank(a) != 0 {
			return x
		}
		x, ok1 := new(big.Float).SetString(string(a))
		y, ok2 := new(big.Float).SetString(string(b))
		if ok1 && ok2 {
			return x.Cmp(y)
		}
	case 1082, 1114, 1184: // date, timestamp, timestamptz (in UTC: every offset is +00)
		if x := cmp.Compare(infinityRank(a), infinityRank(b)); x != 0 || infinityRank(a) != 0 {
			return x
		}
		sa, bca := cutBC(a)
		sb, bcb := cutBC(b)
		da, ra, ok1 := parseISODate(sa, bca)
		db, rb, ok2 := parseISODate(sb, bcb)
		if ok1 && ok2 {
			if x := cmp.Compare(da.year, db.year); x != 0 {
				return x
			}
			// The rest has a fixed layout: "-MM-DD HH:MM:SS", then
			// ".ffffff" when not 0 ('.' sorts after '+' and the end).
			if x := bytes.Compare(sa[len(sa)-len(ra)-6:len(sa)-len(ra)], sb[len(sb)-len(rb)-6:len(sb)-len(rb)]); x != 0 {
				return x
			}
			return bytes.Compare(ra, rb)
		}
	}
	return bytes.Compare(a, b)
}

// numberRank places a number's text among the special values: -Infinity
// (-1) and the finite numbers (0) before Infinity (1) and NaN (2), as
// PostgreSQL sorts them.
func numberRank(s []byte) int {
	switch string(s) {
	case "-Infinity":
		return -1
	case "Infinity":
		return 1
	case "NaN":
		return 2
	}
	return 0
}

// infinityRank places a date's or timestamp's text: -infinity (-1), the
// finite ones (0), infinity (1).
func infinityRank(s []byte) int {
	switch string(s) {
	case "-infinity":
		return -1
	case "infinity":
		return 1
	}
	return 0
}

// memKeys lists the keys of every document of p in the state, in order.
func (e *docEngine) memKeys(p *docProjection) [][]byte {
	t := p.root.mem.t
	kc := t.colIdx[p.key.name]
	keys := make([][]byte, 0, len(t.rows))
	for _, row := range t.rows {
		keys = append(keys, rowField(row, kc))
	}
	slices.SortFunc(keys, func(a, b []byte) int { return compareText(p.key.ctype.oid, a, b) })
	return keys
}

// stats reports the state's rows and the bytes their encoded values take.
func (s *memState) stats() (rows, valueBytes int64) {
	return s.rows.Load(), s.bytes.Load()
}
