package cdc

import "strings"

// The sql mode's re-read rows and query parameters, in few allocations:
// copying each value of each row read, and passing each key as a string
// and a pointer, were most of the 61 allocations per document of the
// orders projection (now 18: BenchmarkComposeQueries).

// rowSlab allocates the rows one compose call reads, and their values,
// in blocks: a row cost three allocations and a value one (61 allocations
// per document of the orders projection, 10% of the sql mode's CPU in the
// ingest: BenchmarkDeployed/projection-update/sql). The rows live as long
// as the call (the documents are appended into buffers of their own).
type rowSlab struct {
	bytes []byte
	vals  [][]byte
	rows  []composedRow
}

// row copies a result row's first nc values (the node's cols) and the nx
// after them (its extras).
func (sl *rowSlab) row(raw [][]byte, nc, nx int) *composedRow {
	n := 0
	for _, v := range raw[:nc+nx] {
		n += len(v)
	}
	if cap(sl.bytes)-len(sl.bytes) < n {
		sl.bytes = make([]byte, 0, max(16<<10, n))
	}
	if cap(sl.vals)-len(sl.vals) < nc+nx {
		sl.vals = make([][]byte, 0, max(1024, nc+nx))
	}
	if len(sl.rows) == cap(sl.rows) {
		sl.rows = make([]composedRow, 0, 256)
	}
	start := len(sl.vals)
	for _, v := range raw[:nc+nx] {
		if v == nil {
			sl.vals = append(sl.vals, nil)
			continue
		}
		sl.bytes = append(sl.bytes, v...)
		sl.vals = append(sl.vals, sl.bytes[len(sl.bytes)-len(v):len(sl.bytes):len(sl.bytes)])
	}
	all := sl.vals[start:len(sl.vals):len(sl.vals)]
	sl.rows = append(sl.rows, composedRow{vals: all[:nc:nc], extra: all[nc:]})
	return &sl.rows[len(sl.rows)-1]
}

// textArray is value ci of every tuple, as a text[] parameter: strings
// cut from one string ([]*string where one is NULL), not one or two
// allocations per value.
func textArray(tuples [][][]byte, ci int) any {
	n, nulls := 0, false
	for _, t := range tuples {
		n += len(t[ci])
		nulls = nulls || t[ci] == nil
	}
	var b strings.Builder
	b.Grow(n)
	for _, t := range tuples {
		b.Write(t[ci])
	}
	all := b.String()
	if nulls {
		arr := make([]*string, len(tuples))
		strs := make([]string, len(tuples))
		off := 0
		for ti, t := range tuples {
			if t[ci] != nil {
				strs[ti] = all[off : off+len(t[ci])]
				arr[ti] = &strs[ti]
				off += len(t[ci])
			}
		}
		return arr
	}
	arr := make([]string, len(tuples))
	off := 0
	for ti, t := range tuples {
		arr[ti] = all[off : off+len(t[ci])]
		off += len(t[ci])
	}
	return arr
}
