package cdc

import (
	"encoding/binary"
	"fmt"

	"github.com/jackc/pglogrepl"
)

// Decoding pgoutput messages: an Insert, Update or Delete without
// pglogrepl's copies (parseChange), every other message through pglogrepl
// (decode).

// parseChange parses an Insert, Update or Delete message (data[0] is 'I',
// 'U' or 'D') as pglogrepl.ParseV2 does, into the change it holds and
// the (sub)transaction that made it (inStream: a streamed transaction's;
// 0 otherwise). pglogrepl copies every column's value out of the message
// and allocates each column, the tuple and the message on its own; the
// reader already holds a copy of the message, so the values point into
// data (capped: nothing appends to them), and a tuple's columns take two
// allocations, the change's tuples one. A malformed message is an error.
func parseChange(data []byte, inStream bool) (c change, xid uint32, err error) {
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
		return change{}, 0, fmt.Errorf("%c message must have %d bytes, got %d bytes", data[0], least, len(d.b))
	}
	if inStream {
		xid = d.uint32()
	}
	c.kind, c.rel = data[0], d.uint32()
	rows := new([2]pglogrepl.TupleData)
	switch tt := d.byte(); {
	case c.kind == 'I':
		if tt != 'N' && !d.err {
			return change{}, 0, fmt.Errorf("InsertMessage: invalid TupleType: expected N, got %q", tt)
		}
		c.newRow = d.pgTuple(&rows[0])
	case c.kind == 'U':
		switch tt {
		case 'K', 'O':
			c.oldKind, c.oldRow = tt, d.pgTuple(&rows[1])
			d.byte() // the new tuple's 'N'
			fallthrough
		case 'N':
			c.newRow = d.pgTuple(&rows[0])
		default:
			if !d.err {
				return change{}, 0, fmt.Errorf("UpdateMessage: invalid Tuple: expected K/O/N, got %q", tt)
			}
		}
	default: // 'D'
		if tt != 'K' && tt != 'O' && !d.err {
			return change{}, 0, fmt.Errorf("DeleteMessage: invalid OldTupleType: expected K/O, got %q", tt)
		}
		c.oldKind, c.oldRow = tt, d.pgTuple(&rows[1])
	}
	if d.err {
		return change{}, 0, fmt.Errorf("malformed message (%d bytes, truncated)", len(data))
	}
	return c, xid, nil
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

// pgTuple reads a pgoutput TupleData into t, as pglogrepl's
// TupleData.Decode does: a text or binary column has its length and value;
// any other (null, unchanged TOAST, an unknown kind) its kind only.
func (d *decoder) pgTuple(t *pglogrepl.TupleData) *pglogrepl.TupleData {
	n := int(d.uint16())
	if d.err {
		return nil
	}
	t.ColumnNum = uint16(n)
	if n == 0 {
		return t
	}
	if n > len(d.b) { // a column takes a byte at least
		d.err = true
		return nil
	}
	cols := make([]pglogrepl.TupleDataColumn, n)
	t.Columns = make([]*pglogrepl.TupleDataColumn, n)
	for i := range cols {
		col := &cols[i]
		col.DataType = d.byte()
		if col.DataType == pglogrepl.TupleDataTypeText || col.DataType == pglogrepl.TupleDataTypeBinary {
			l := d.uint32()
			if d.err || uint64(l) > uint64(len(d.b)) {
				d.err = true
				return nil
			}
			col.Length, col.Data = l, d.b[:l:l]
			d.b = d.b[l:]
		}
		t.Columns[i] = col
	}
	return t
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
