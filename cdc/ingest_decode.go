package cdc

import (
	"encoding/binary"
	"fmt"

	"github.com/jackc/pglogrepl"
)

// Decoding pgoutput messages: an Insert, Update or Delete without
// pglogrepl's copies, into memory reused from change to change
// (changeDecoder), every other message through pglogrepl (decode).

// changeDecoder decodes Insert, Update and Delete messages into a change,
// tuples and columns it reuses: what decode returns points into the
// message and into the decoder, and is valid until its next decode. The
// reader checks each change at receipt (check: that it parses, and its
// table) and decodes it at its commit, to encode its event, with no
// allocation either time (a held change is its message's bytes: hold.go).
type changeDecoder struct {
	c    change
	rows [2]pglogrepl.TupleData // new, old
	cols [2][]pglogrepl.TupleDataColumn
	ptrs [2][]*pglogrepl.TupleDataColumn // to cols
}

// decode parses an Insert, Update or Delete message (data[0] is 'I', 'U'
// or 'D') as pglogrepl.ParseV2 does, into the change it holds and the
// (sub)transaction that made it (inStream: a streamed transaction's; 0
// otherwise). The values point into data (capped: nothing appends to
// them). A malformed message is an error.
func (cd *changeDecoder) decode(data []byte, inStream bool) (_ *change, xid uint32, err error) {
	return cd.parse(data, inStream, true)
}

// check is decode without the tuples: it walks the message as decode
// does, with the same errors, and returns its relation and
// (sub)transaction, storing no column (the receipt's check of a change:
// no pointer written, so no GC write barrier, per column).
func (cd *changeDecoder) check(data []byte, inStream bool) (rel, xid uint32, err error) {
	c, xid, err := cd.parse(data, inStream, false)
	if err != nil {
		return 0, 0, err
	}
	return c.rel, xid, nil
}

// parse is decode, and check when store is false: the change's tuples are
// then left as they were.
func (cd *changeDecoder) parse(data []byte, inStream, store bool) (_ *change, xid uint32, err error) {
	d := decoder{b: data[1:]}
	// pglogrepl's least lengths, kept: an insert of no columns is refused.
	least := 4 // 'D'
	switch data[0] {
	case 'I':
		least = 8
	case 'U':
		least = 6
	}
	if inStream {
		least += 4
	}
	if len(d.b) < least {
		return nil, 0, fmt.Errorf("%c message must have %d bytes, got %d bytes", data[0], least, len(d.b))
	}
	if inStream {
		xid = d.uint32()
	}
	c := &cd.c
	*c = change{kind: data[0], rel: d.uint32()}
	switch tt := d.byte(); {
	case c.kind == 'I':
		if tt != 'N' && !d.err {
			return nil, 0, fmt.Errorf("InsertMessage: invalid TupleType: expected N, got %q", tt)
		}
		c.newRow = cd.tuple(&d, 0, store)
	case c.kind == 'U':
		switch tt {
		case 'K', 'O':
			c.oldKind, c.oldRow = tt, cd.tuple(&d, 1, store)
			d.byte() // the new tuple's 'N'
			fallthrough
		case 'N':
			c.newRow = cd.tuple(&d, 0, store)
		default:
			if !d.err {
				return nil, 0, fmt.Errorf("UpdateMessage: invalid Tuple: expected K/O/N, got %q", tt)
			}
		}
	default: // 'D'
		if tt != 'K' && tt != 'O' && !d.err {
			return nil, 0, fmt.Errorf("DeleteMessage: invalid OldTupleType: expected K/O, got %q", tt)
		}
		c.oldKind, c.oldRow = tt, cd.tuple(&d, 1, store)
	}
	if d.err {
		return nil, 0, fmt.Errorf("malformed message (%d bytes, truncated)", len(data))
	}
	return c, xid, nil
}

// tuple reads a pgoutput TupleData into the decoder's tuple i (0 new, 1
// old), as pglogrepl's TupleData.Decode does: a text or binary column has
// its length and value; any other (null, unchanged TOAST, an unknown kind)
// its kind only. The columns' structs and the pointers to them are reused:
// they grow to the widest tuple seen and stay. Without store, it only
// walks the tuple.
func (cd *changeDecoder) tuple(d *decoder, i int, store bool) *pglogrepl.TupleData {
	n := int(d.uint16())
	if d.err {
		return nil
	}
	t := &cd.rows[i]
	if !store {
		if n > len(d.b) {
			d.err = true
			return nil
		}
		for range n {
			if k := d.byte(); k == pglogrepl.TupleDataTypeText || k == pglogrepl.TupleDataTypeBinary {
				l := d.uint32()
				if d.err || uint64(l) > uint64(len(d.b)) {
					d.err = true
					return nil
				}
				d.b = d.b[l:]
			}
		}
		return t
	}
	*t = pglogrepl.TupleData{ColumnNum: uint16(n)}
	if n == 0 {
		return t
	}
	if n > len(d.b) { // a column takes a byte at least
		d.err = true
		return nil
	}
	if cap(cd.cols[i]) < n {
		cd.cols[i] = make([]pglogrepl.TupleDataColumn, n)
		cd.ptrs[i] = make([]*pglogrepl.TupleDataColumn, 0, n)
	}
	cols := cd.cols[i][:n]
	t.Columns = cd.ptrs[i][:0]
	for j := range cols {
		col := &cols[j]
		*col = pglogrepl.TupleDataColumn{DataType: d.byte()}
		if col.DataType == pglogrepl.TupleDataTypeText || col.DataType == pglogrepl.TupleDataTypeBinary {
			l := d.uint32()
			if d.err || uint64(l) > uint64(len(d.b)) {
				d.err = true
				return nil
			}
			col.Length, col.Data = l, d.b[:l:l]
			d.b = d.b[l:]
		}
		t.Columns = append(t.Columns, col)
	}
	return t
}

// uint16 and uint32 read a pgoutput message's big-endian integers with the
// spill records' decoder (spill.go); past the end, they read zeros and set
// err.
func (d *decoder) uint16() uint16 {
	if len(d.b) < 2 {
		d.err = true
		return 0
	}
	v := binary.BigEndian.Uint16(d.b)
	d.b = d.b[2:]
	return v
}

func (d *decoder) uint32() uint32 {
	if len(d.b) < 4 {
		d.err = true
		return 0
	}
	v := binary.BigEndian.Uint32(d.b)
	d.b = d.b[4:]
	return v
}

// decode parses one pgoutput message. pglogrepl indexes into messages
// without checking their length (a truncated tuple panics), so a panic
// while parsing is turned into an error: a malformed message ends the
// connection with a clear error, not the process.
func decode(data []byte, inStream bool) (m pglogrepl.Message, err error) {
	defer func() {
		if p := recover(); p != nil {
			m, err = nil, fmt.Errorf("malformed message (%v)", p)
		}
	}()
	return pglogrepl.ParseV2(data, inStream)
}
