package pgjson

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"unicode/utf8"

	"github.com/fanwire/fanwire/jsonstr"
	"github.com/jackc/pgx/v5/pgtype"
)

// outputParams are the session settings every value the ingest reads is
// written with: the walsender's, so that the replication stream, the
// bootstrap and the projections' re-reads encode a value the same way (a
// server set to extra_float_digits = 0 would round floats).
var outputParams = map[string]string{
	"DateStyle":          "ISO",
	"TimeZone":           "UTC",
	"bytea_output":       "hex",
	"extra_float_digits": "3",
}

// OutputParams returns the session settings (run-time parameters) to set
// on every connection whose values are encoded here: the walsender's
// DateStyle ISO, TimeZone UTC, bytea_output hex and extra_float_digits 3.
// AppendValue needs DateStyle ISO (it reports other styles malformed); the
// others make every path write a value the same way. It returns a new map
// each time.
func OutputParams() map[string]string { return maps.Clone(outputParams) }

// Column values arrive in PostgreSQL's text output format (pgoutput sends
// every value through the type's output function) together with the
// column's type OID from the Relation message. AppendValue turns one into
// JSON, keeping the JSON type where one fits. docs/ingest.md has the same
// mapping as a table, with examples; keep the two in step.
//
//   - int2, int4, int8, oid: numbers, as PostgreSQL prints them. int8
//     beyond ±2^53 loses precision in JavaScript clients; the issue asks
//     for integers to stay numbers, so they do.
//   - float4, float8: numbers (the shortest text that reads back the same,
//     with extra_float_digits 3); NaN, Infinity and -Infinity, which JSON
//     cannot express as numbers, become the strings "NaN", "Infinity",
//     "-Infinity".
//   - numeric: a string holding the exact decimal ("12.50", "NaN",
//     "Infinity"). A JSON number would be parsed into a float64 by
//     JavaScript (and by most decoders' defaults): money amounts and
//     numerics of more than 15–17 significant digits would silently change.
//     A string keeps every digit and the scale; clients convert on purpose.
//   - bool: true, false.
//   - json, jsonb: the document verbatim (validated; invalid UTF-8 inside
//     its strings becomes U+FFFD): json as written, jsonb as PostgreSQL
//     normalized it.
//   - timestamptz: RFC 3339 with PostgreSQL's offset, "2024-05-01
//     12:34:56.789+02" → "2024-05-01T12:34:56.789+02:00" (the ingest reads
//     in UTC: "+00:00"); an offset with seconds (local mean time of old
//     dates in some zones), which RFC 3339 cannot write, is converted to
//     +00:00. timestamp: the same without an offset (it has none). date:
//     "2024-05-01". Years outside 1–9999 (BC, or past 9999) use ISO 8601's
//     expanded form with astronomical numbering, as JavaScript's Date.parse
//     reads it: 44 BC is "-000043", 10000 AD "+010000". infinity and
//     -infinity stay the strings "infinity", "-infinity". These need
//     DateStyle ISO on the replication connection; other styles are
//     reported malformed.
//   - bytea: standard base64 with padding, from the hex ("\x0a0b") or the
//     escape output format.
//   - arrays of built-in types: JSON arrays, nested per dimension, each
//     element encoded by its element type, NULL elements as null. The
//     lower bounds of an array not starting at 1 ("[0:2]={1,2,3}") are
//     dropped: a JSON array is positional.
//   - everything else (text, varchar, bpchar with its padding, name, uuid,
//     inet, cidr, macaddr, interval, money, xml, time, timetz, ranges,
//     geometric types, tsvector, bit, composite types, enums, any OID not
//     listed): a string of the text.
//
// AppendValue knows built-in OIDs only. The ingest looks user-defined
// types up in the catalog first (Type, types.go): a domain is encoded
// as its base type (a domain over an integer is a number, on every path),
// and an array of a user-defined type (enum[], a domain's array, a
// composite's) goes to AppendArray with its element type, so it is a JSON
// array too.
//
// All output is valid JSON: strings are escaped and invalid UTF-8 becomes
// U+FFFD.

// ErrMalformedValue reports column text that is not what PostgreSQL's
// output function for the type writes.
var ErrMalformedValue = errors.New("malformed column value")

// AppendValue appends the JSON encoding of one column value, given in
// PostgreSQL's text output format, of the type with OID oid, to dst.
// NULL is not passed here (the caller writes null). An error says what is
// malformed; dst is then unspecified.
//
// It allocates only when dst must grow.
func AppendValue(dst []byte, oid uint32, text []byte) ([]byte, error) {
	switch oid {
	case pgtype.BoolOID:
		if len(text) == 1 {
			switch text[0] {
			case 't':
				return append(dst, "true"...), nil
			case 'f':
				return append(dst, "false"...), nil
			}
		}
		return dst, malformed("bool", text)
	case pgtype.Int2OID, pgtype.Int4OID, pgtype.Int8OID, pgtype.OIDOID:
		if !isJSONInteger(text) {
			return dst, malformed("integer", text)
		}
		return append(dst, text...), nil
	case pgtype.Float4OID, pgtype.Float8OID:
		return appendFloat(dst, text)
	case pgtype.NumericOID:
		return appendNumeric(dst, text)
	case pgtype.JSONOID, pgtype.JSONBOID:
		return appendJSON(dst, text)
	case pgtype.ByteaOID:
		return appendBytea(dst, text)
	case pgtype.TimestamptzOID:
		return appendTimestamp(dst, text, true)
	case pgtype.TimestampOID:
		return appendTimestamp(dst, text, false)
	case pgtype.DateOID:
		return appendDate(dst, text)
	}
	if elem, ok := arrayElem[oid]; ok {
		delim := byte(',')
		if elem == pgtype.BoxOID {
			delim = ';'
		}
		return AppendArray(dst, elem, delim, text)
	}
	return jsonstr.AppendBytes(dst, text), nil
}

func malformed(kind string, text []byte) error {
	const max = 64 // a value can be megabytes; the start says enough
	if len(text) > max {
		return fmt.Errorf("%w: %s %q...", ErrMalformedValue, kind, text[:max])
	}
	return fmt.Errorf("%w: %s %q", ErrMalformedValue, kind, text)
}

// appendQuoted appends s, known to need no escaping, as a JSON string.
func appendQuoted(dst []byte, s []byte) []byte {
	dst = append(dst, '"')
	dst = append(dst, s...)
	return append(dst, '"')
}

// isJSONInteger reports whether s is -?(0|[1-9][0-9]*).
func isJSONInteger(s []byte) bool {
	if len(s) > 0 && s[0] == '-' {
		s = s[1:]
	}
	if len(s) == 0 || (s[0] == '0' && len(s) > 1) {
		return false
	}
	return allDigits(s)
}

func allDigits(s []byte) bool {
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// isJSONNumber reports whether s is a number in JSON's grammar.
func isJSONNumber(s []byte) bool {
	i := 0
	digits := func() bool {
		j := i
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		return i > j
	}
	if i < len(s) && s[i] == '-' {
		i++
	}
	if i < len(s) && s[i] == '0' {
		i++
	} else if !digits() {
		return false
	}
	if i < len(s) && s[i] == '.' {
		i++
		if !digits() {
			return false
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		if !digits() {
			return false
		}
	}
	return i == len(s)
}

func isSpecialNumber(s []byte) bool {
	switch string(s) {
	case "NaN", "Infinity", "-Infinity":
		return true
	}
	return false
}

func appendFloat(dst, text []byte) ([]byte, error) {
	if isSpecialNumber(text) {
		return appendQuoted(dst, text), nil
	}
	if !isJSONNumber(text) {
		return dst, malformed("float", text)
	}
	return append(dst, text...), nil
}

// appendNumeric writes numeric as an exact decimal string (see the top of
// this file for why not a number). numeric_out never writes an exponent.
func appendNumeric(dst, text []byte) ([]byte, error) {
	if isSpecialNumber(text) {
		return appendQuoted(dst, text), nil
	}
	s := text
	if len(s) > 0 && s[0] == '-' {
		s = s[1:]
	}
	for i, c := range s {
		if c == '.' {
			if i == 0 || i == len(s)-1 || !allDigits(s[:i]) || !allDigits(s[i+1:]) {
				return dst, malformed("numeric", text)
			}
			return appendQuoted(dst, text), nil
		}
	}
	if len(s) == 0 || !allDigits(s) {
		return dst, malformed("numeric", text)
	}
	return appendQuoted(dst, text), nil
}

// appendJSON copies a json or jsonb document. json.Valid does not check
// UTF-8; a database whose encoding is not UTF-8 could hand us other bytes,
// which can only sit inside strings of a valid document: replace them.
func appendJSON(dst, text []byte) ([]byte, error) {
	if !json.Valid(text) {
		return dst, malformed("json", text)
	}
	if utf8.Valid(text) {
		return append(dst, text...), nil
	}
	for len(text) > 0 {
		r, size := utf8.DecodeRune(text)
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, "\ufffd"...)
		} else {
			dst = append(dst, text[:size]...)
		}
		text = text[size:]
	}
	return dst, nil
}

// appendBytea decodes bytea's hex ("\x0a0b") or escape ("a\000\\") output
// format and writes the bytes base64-encoded, a chunk at a time through a
// buffer on the stack.
func appendBytea(dst, text []byte) ([]byte, error) {
	var buf [3 * 128]byte // a multiple of 3: chunks encode without padding
	n := 0
	dst = append(dst, '"')
	if len(text) >= 2 && text[0] == '\\' && text[1] == 'x' {
		h := text[2:]
		if len(h)%2 != 0 {
			return dst, malformed("bytea", text)
		}
		for i := 0; i < len(h); i += 2 {
			hi, lo := unhex(h[i]), unhex(h[i+1])
			if hi > 0xf || lo > 0xf {
				return dst, malformed("bytea", text)
			}
			if n == len(buf) {
				dst = base64.StdEncoding.AppendEncode(dst, buf[:])
				n = 0
			}
			buf[n] = hi<<4 | lo
			n++
		}
	} else {
		// The escape format: '\\' is a backslash, '\ooo' an octal byte,
		// anything else itself.
		for i := 0; i < len(text); {
			b := text[i]
			if b == '\\' {
				switch {
				case i+1 < len(text) && text[i+1] == '\\':
					i += 2
				case i+3 < len(text) && isOctal(text[i+1]) && text[i+1] <= '3' && isOctal(text[i+2]) && isOctal(text[i+3]):
					b = (text[i+1]-'0')<<6 | (text[i+2]-'0')<<3 | (text[i+3] - '0')
					i += 4
				default:
					return dst, malformed("bytea", text)
				}
			} else {
				i++
			}
			if n == len(buf) {
				dst = base64.StdEncoding.AppendEncode(dst, buf[:])
				n = 0
			}
			buf[n] = b
			n++
		}
	}
	dst = base64.StdEncoding.AppendEncode(dst, buf[:n])
	return append(dst, '"'), nil
}

func isOctal(c byte) bool { return c >= '0' && c <= '7' }

// unhex returns the value of a hex digit, or 0xff.
func unhex(c byte) byte {
	switch {
	case c >= '0' && c <= '9':
		return c - '0'
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10
	}
	return 0xff
}
