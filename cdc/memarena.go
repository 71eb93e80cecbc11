package cdc

import "encoding/binary"

// memArena holds the memory state's rows as flat encoded records in big
// byte chunks, addressed by integers. A chunk has no pointers, so the
// garbage collector never scans the rows: with 410,000 rows as map values
// (a string key and a slice each) marking the state took 38-52% of the
// ingest's CPU during a 100,000-row UPDATE (docs/benchmarks.md,
// "Memory-mode documents (issue 27)").
//
// Chunks are append-only: a row written is never written over, so a slice
// of it (a transaction's delta waiting to be persisted, a document being
// composed) stays valid for as long as it is held. A replaced or removed
// row leaves its bytes behind as garbage; the table compacts (copies its
// live rows into fresh chunks, memTable.compact) once the garbage outgrows
// half of what is live.
type memArena struct {
	chunks [][]byte // each filled up to its length, never beyond
	used   int64    // bytes written to chunks
	live   int64    // bytes of the rows in use
}

// memChunk is the size of an arena chunk: big enough that the chunks are
// few (a 41 MiB state is 41 of them), small enough that the last one's
// unused tail is noise.
const memChunk = 1 << 20

// memRef is where a row is in an arena: its chunk (high 32 bits) and its
// offset in the chunk.
type memRef uint64

// alloc returns n bytes of the arena to write a row into, and their place.
func (a *memArena) alloc(n int) (memRef, []byte) {
	last := len(a.chunks) - 1
	if last < 0 || cap(a.chunks[last])-len(a.chunks[last]) < n {
		a.chunks = append(a.chunks, make([]byte, 0, max(memChunk, n)))
		last++
	}
	c := a.chunks[last]
	off := len(c)
	a.chunks[last] = c[:off+n]
	a.used += int64(n)
	a.live += int64(n)
	return memRef(uint64(last)<<32 | uint64(off)), c[off : off+n : off+n]
}

// at returns the n bytes at ref.
func (a *memArena) at(ref memRef, n uint32) []byte {
	c := a.chunks[ref>>32]
	off := uint32(ref)
	return c[off : off+n : off+n]
}

// free records that n bytes written are no longer in use.
func (a *memArena) free(n int) { a.live -= int64(n) }

// garbage reports whether the bytes no longer in use should be reclaimed:
// more than a chunk of them, and more than half of what is live.
func (a *memArena) garbage() bool {
	dead := a.used - a.live
	return dead > memChunk && dead > a.live/2
}

// encodedLen is the length of vals encoded as a row (encodeRow).
func encodedLen(vals [][]byte) int {
	n := 0
	for _, v := range vals {
		n++
		if v != nil {
			n += uvarintLen(uint64(len(v))) + len(v)
		}
	}
	return n
}

// appendEncoded appends vals (nil: NULL) encoded as one row to dst: per
// value a flag byte, then a uvarint length and the bytes.
func appendEncoded(dst []byte, vals [][]byte) []byte {
	for _, v := range vals {
		if v == nil {
			dst = append(dst, 0)
			continue
		}
		dst = append(dst, 1)
		dst = binary.AppendUvarint(dst, uint64(len(v)))
		dst = append(dst, v...)
	}
	return dst
}

// encodeRow encodes vals as a row, in a slice of its own.
func encodeRow(vals [][]byte) []byte {
	return appendEncoded(make([]byte, 0, encodedLen(vals)), vals)
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
