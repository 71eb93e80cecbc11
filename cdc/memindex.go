package cdc

import "bytes"

// memIndex finds a table's rows by the values of some columns (a tuple,
// as appendTuple writes it). The rows with one tuple are a circular doubly
// linked list of row ids, in the order they were linked; heads maps the
// tuple to the list's first row. Tuples heads finds by hash share a list
// when their hashes collide: walking such a list (next) checks each row's
// tuple (match).
type memIndex struct {
	t     *memTable
	cols  []int
	oids  []uint32 // the columns' types
	heads memKeyMap
	links []memLink // by row id; next 0: the row is in no list (a NULL)
	tup   []byte    // scratch: a row's tuple
}

// memLink is a row's neighbours in its index list.
type memLink struct{ prev, next uint32 }

// appendTuple appends the index key of row to dst (as joinKey writes it);
// ok is false when a value is NULL (NULL joins nothing).
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

// link appends row id (whose row is row) to the list of its tuple.
func (ix *memIndex) link(id uint32, row []byte) {
	var ok bool
	if ix.tup, ok = ix.appendTuple(ix.tup[:0], row); !ok {
		return
	}
	if n := len(ix.t.slots); len(ix.links) < n {
		ix.links = append(ix.links, make([]memLink, max(n, 2*len(ix.links))-len(ix.links))...)
	}
	head, _ := ix.heads.get(ix.tup)
	if head == 0 {
		ix.heads.set(ix.tup, id)
		ix.links[id] = memLink{prev: id, next: id}
		return
	}
	tail := ix.links[head].prev
	ix.links[id] = memLink{prev: tail, next: head}
	ix.links[tail].next = id
	ix.links[head].prev = id
}

// unlink removes row id (whose row is row) from its list.
func (ix *memIndex) unlink(id uint32, row []byte) {
	if int(id) >= len(ix.links) || ix.links[id].next == 0 {
		return
	}
	l := ix.links[id]
	ix.links[id] = memLink{}
	if l.next == id { // alone in its list
		ix.tup, _ = ix.appendTuple(ix.tup[:0], row)
		ix.heads.del(ix.tup)
		return
	}
	ix.links[l.prev].next = l.next
	ix.links[l.next].prev = l.prev
	ix.tup, _ = ix.appendTuple(ix.tup[:0], row)
	if head, _ := ix.heads.get(ix.tup); head == id {
		ix.heads.set(ix.tup, l.next)
	}
}

// first returns the first row id of the list tuple tk is in (0: none).
// Walk on with next; the rows whose tuple is tk are those match accepts,
// or all of them when exact.
func (ix *memIndex) first(tk []byte) (id uint32, exact bool) { return ix.heads.get(tk) }

// next returns the row id after id in the list that starts at head (0:
// the end).
func (ix *memIndex) next(head, id uint32) uint32 {
	if n := ix.links[id].next; n != head {
		return n
	}
	return 0
}

// match reports whether row's tuple is tk.
func (ix *memIndex) match(row, tk []byte) bool {
	var ok bool
	ix.tup, ok = ix.appendTuple(ix.tup[:0], row)
	return ok && bytes.Equal(ix.tup, tk)
}

// appendRows appends the rows whose tuple is tk to dst, in list order.
func (ix *memIndex) appendRows(dst [][]byte, tk []byte) [][]byte {
	head, exact := ix.first(tk)
	for id := head; id != 0; id = ix.next(head, id) {
		if row := ix.t.row(id); exact || ix.match(row, tk) {
			dst = append(dst, row)
		}
	}
	return dst
}
