package cdc

import (
	"bytes"
	"slices"
)

// memTable is one table's rows: the columns any projection needs of it,
// keyed by primary key. A row is a flat encoded record in the table's
// arena, named by a row id (an index into slots, from 1); it is found by
// key through a memKeyMap, and by join columns through the table's indexes
// (memindex.go). Maps of integers to integers and slices of integers hold
// no pointers: the garbage collector scans neither them nor the rows.
type memTable struct {
	st      *memState
	nameKey string
	cols    []docCol       // kept columns, in a fixed order
	colIdx  map[string]int // name → index in cols
	pk      []int          // indexes into cols of the primary key
	indexes []*memIndex

	arena memArena
	slots []memSlot // by row id; slots[0] is never used
	free  []uint32  // row ids of removed rows, to reuse
	byKey memKeyMap // row key (appendKey) → the first row id of its chain (memSlot.next)
	n     int       // rows held
	kbuf  []byte    // scratch: a stored row's key, compared with the one looked up
}

// memSlot is a row id's row.
type memSlot struct {
	ref  memRef // where the row is in the arena
	n    uint32 // the row's length + 1; 0: the id is free
	next uint32 // the next row whose key has the same hash (0: none; memKeyMap)
}

// newMemTable makes the table name keeping cols of ct, its catalog entry.
func newMemTable(st *memState, name string, cols []string, ct *catalogTable) *memTable {
	t := &memTable{st: st, nameKey: name, colIdx: make(map[string]int), slots: make([]memSlot, 1)}
	for _, c := range cols {
		t.colIdx[c] = len(t.cols)
		t.cols = append(t.cols, mkCol(c, ct.cols[c]))
	}
	for _, c := range ct.pkey {
		t.pk = append(t.pk, t.colIdx[c])
	}
	t.byKey = newMemKeyMap(st.seed, len(t.pk) == 1 && isIntOID(t.cols[t.pk[0]].ctype.OID))
	return t
}

// row returns the row of id.
func (t *memTable) row(id uint32) []byte {
	s := t.slots[id]
	return t.arena.at(s.ref, s.n-1)
}

// rowAt returns the row of id, if id holds one (for iterating over the
// table: ids run from 1 to len(slots)-1).
func (t *memTable) rowAt(id uint32) ([]byte, bool) {
	if t.slots[id].n == 0 {
		return nil, false
	}
	return t.row(id), true
}

// appendKey appends the row key of row to dst (as tupleKey writes it).
func (t *memTable) appendKey(dst, row []byte) []byte {
	for _, c := range t.pk {
		dst = appendTupleValue(dst, rowField(row, c))
	}
	return dst
}

// find returns the id of the row with key (0: none).
func (t *memTable) find(key []byte) uint32 {
	id, exact := t.byKey.get(key)
	if exact {
		return id
	}
	for ; id != 0; id = t.slots[id].next {
		t.kbuf = t.appendKey(t.kbuf[:0], t.row(id))
		if bytes.Equal(t.kbuf, key) {
			return id
		}
	}
	return 0
}

// insert stores a copy of enc (an encoded row whose key, key, the table
// does not hold) and returns the stored row.
func (t *memTable) insert(key, enc []byte) []byte {
	ref, row := t.arena.alloc(len(enc))
	copy(row, enc)
	var id uint32
	if n := len(t.free); n > 0 {
		id, t.free = t.free[n-1], t.free[:n-1]
	} else {
		id = uint32(len(t.slots))
		t.slots = append(t.slots, memSlot{})
	}
	head, _ := t.byKey.get(key)
	t.slots[id] = memSlot{ref: ref, n: uint32(len(row)) + 1, next: head}
	t.byKey.set(key, id)
	t.n++
	t.st.rows.Add(1)
	t.st.bytes.Add(int64(len(row)))
	for _, ix := range t.indexes {
		ix.link(id, row)
	}
	t.compactIfGarbage()
	return row
}

// insertVals encodes vals and inserts them as a row (a key the table does
// not hold: a bootstrap's).
func (t *memTable) insertVals(vals [][]byte) {
	t.st.enc = appendEncoded(t.st.enc[:0], vals)
	t.st.key = t.appendKey(t.st.key[:0], t.st.enc)
	t.insert(t.st.key, t.st.enc)
}

// remove removes the row of id, whose key is key.
func (t *memTable) remove(id uint32, key []byte) {
	row := t.row(id)
	for _, ix := range t.indexes {
		ix.unlink(id, row)
	}
	if head, _ := t.byKey.get(key); head == id {
		if next := t.slots[id].next; next != 0 {
			t.byKey.set(key, next)
		} else {
			t.byKey.del(key)
		}
	} else {
		prev := head
		for t.slots[prev].next != id {
			prev = t.slots[prev].next
		}
		t.slots[prev].next = t.slots[id].next
	}
	t.arena.free(len(row))
	t.slots[id] = memSlot{}
	t.free = append(t.free, id)
	t.n--
	t.st.rows.Add(-1)
	t.st.bytes.Add(-int64(len(row)))
	t.compactIfGarbage()
}

// replace replaces the row of id, old, by a copy of enc (an encoded row
// with the same key), and returns the stored row. The row keeps its id,
// and its place in the lists of the indexes whose columns kept their
// values; in the others it moves to the end, as when it is inserted.
func (t *memTable) replace(id uint32, old, enc []byte) []byte {
	ref, row := t.arena.alloc(len(enc))
	copy(row, enc)
	for _, ix := range t.indexes {
		var ok1, ok2 bool
		t.st.ixOld, ok1 = ix.appendTuple(t.st.ixOld[:0], old)
		t.st.ixNew, ok2 = ix.appendTuple(t.st.ixNew[:0], row)
		if ok1 != ok2 || ok1 && !bytes.Equal(t.st.ixOld, t.st.ixNew) {
			ix.unlink(id, old)
			ix.link(id, row)
		}
	}
	t.arena.free(len(old))
	t.slots[id].ref, t.slots[id].n = ref, uint32(len(row))+1
	t.st.bytes.Add(int64(len(row)) - int64(len(old)))
	t.compactIfGarbage()
	return row
}

// compactIfGarbage copies the live rows into fresh chunks when the
// garbage of replaced and removed rows outgrows them (memArena.garbage).
// Rows handed out before stay valid: they are in the old chunks, which
// the garbage collector frees once nothing holds them (the deltas not yet
// persisted hold theirs until the broker acknowledges their transactions).
func (t *memTable) compactIfGarbage() {
	if !t.arena.garbage() {
		return
	}
	var fresh memArena
	for id := range t.slots {
		s := &t.slots[id]
		if s.n == 0 {
			continue
		}
		ref, b := fresh.alloc(int(s.n - 1))
		copy(b, t.arena.at(s.ref, s.n-1))
		s.ref = ref
	}
	t.arena = fresh
}

// reset empties the table.
func (t *memTable) reset() {
	t.st.rows.Add(-int64(t.n))
	t.st.bytes.Add(-t.arena.live)
	t.arena = memArena{}
	t.slots = make([]memSlot, 1)
	t.free = nil
	t.byKey = newMemKeyMap(t.st.seed, t.byKey.ints)
	t.n = 0
	for _, ix := range t.indexes {
		ix.heads = newMemKeyMap(t.st.seed, ix.heads.ints)
		ix.links = nil
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
	ix := &memIndex{t: t, cols: idx}
	for _, c := range idx {
		ix.oids = append(ix.oids, t.cols[c].ctype.OID)
	}
	ix.heads = newMemKeyMap(t.st.seed, len(idx) == 1 && isIntOID(ix.oids[0]))
	t.indexes = append(t.indexes, ix)
	for id := uint32(1); id < uint32(len(t.slots)); id++ {
		if row, ok := t.rowAt(id); ok {
			ix.link(id, row)
		}
	}
	return ix
}
