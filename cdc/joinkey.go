package cdc

import (
	"bytes"

	"github.com/jackc/pgx/v5/pgtype"
)

// Join keys: the composers match rows on join columns by their text, which
// is one text per value for most types but not all.

// textVaries reports whether equal values of type oid can be written
// differently: numeric keeps its scale (1.5 = 1.50), char(n) the padding
// of its length (char(4) 'ab' = char(8) 'ab'), floats their sign of zero.
// Joins on such a type match by joinText, not by the text.
func textVaries(oid uint32) bool {
	switch oid {
	case pgtype.NumericOID, pgtype.BPCharOID, pgtype.Float4OID, pgtype.Float8OID:
		return true
	}
	return false
}

// joinText is v (a value of type oid) written so that equal values have
// equal text: a numeric without the trailing zeros of its fraction, a
// char(n) without its padding, a float's -0 as 0. Other types' output is
// one text per value already (for the types a join usually has: integers,
// text in a deterministic collation, uuid, dates and times in UTC).
func joinText(oid uint32, v []byte) []byte {
	switch oid {
	case pgtype.NumericOID:
		if bytes.IndexByte(v, '.') >= 0 {
			v = bytes.TrimRight(v, "0")
			v = bytes.TrimSuffix(v, []byte("."))
		}
	case pgtype.BPCharOID:
		v = bytes.TrimRight(v, " ")
	case pgtype.Float4OID, pgtype.Float8OID:
		if string(v) == "-0" {
			v = v[1:]
		}
	}
	return v
}

// joinKey is the map key of a tuple of join values of types oids (nil:
// NULL), matching equal values.
func joinKey(oids []uint32, vals [][]byte) string {
	for i, v := range vals {
		if v != nil && textVaries(oids[i]) {
			norm := make([][]byte, len(vals))
			for j, w := range vals {
				if w != nil {
					norm[j] = joinText(oids[j], w)
				}
			}
			return tupleKey(norm)
		}
	}
	return tupleKey(vals)
}
