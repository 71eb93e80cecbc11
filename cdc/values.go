package cdc

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

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
// types up in the catalog first (colType, types.go): a domain is encoded
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
	return AppendJSONString(dst, text), nil
}

func malformed(kind string, text []byte) error {
	const max = 64 // a value can be megabytes; the start says enough
	if len(text) > max {
		return fmt.Errorf("%w: %s %q...", ErrMalformedValue, kind, text[:max])
	}
	return fmt.Errorf("%w: %s %q", ErrMalformedValue, kind, text)
}

// AppendJSONString appends s as a JSON string: quoted, with '"', '\' and
// control characters escaped, and each byte of invalid UTF-8 replaced by
// U+FFFD.
func AppendJSONString(dst []byte, s []byte) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	start := 0 // s[start:i] is pending, to be copied as is
	for i := 0; i < len(s); {
		c := s[i]
		if c >= utf8.RuneSelf {
			r, size := utf8.DecodeRune(s[i:])
			if r == utf8.RuneError && size == 1 {
				dst = append(dst, s[start:i]...)
				dst = append(dst, "\ufffd"...)
				i++
				start = i
				continue
			}
			i += size
			continue
		}
		if c >= 0x20 && c != '"' && c != '\\' {
			i++
			continue
		}
		dst = append(dst, s[start:i]...)
		switch c {
		case '"', '\\':
			dst = append(dst, '\\', c)
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\r':
			dst = append(dst, '\\', 'r')
		case '\t':
			dst = append(dst, '\\', 't')
		default:
			dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		}
		i++
		start = i
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
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

// isoDate is a date as DateStyle ISO writes it: "2024-05-01", "0044-03-15"
// (with " BC" at the very end of the value), "10000-01-01".
type isoDate struct {
	year       int // astronomical: 1 BC is 0
	month, day []byte
}

// parseISODate parses the date at the start of s and returns the rest.
func parseISODate(s []byte, bc bool) (d isoDate, rest []byte, ok bool) {
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	// At least 4 digits; at most 7: PostgreSQL's dates end in 5874897 AD,
	// so the year fits an int with room to spare.
	if i < 4 || i > 7 || len(s) < i+6 || s[i] != '-' || s[i+3] != '-' {
		return d, nil, false
	}
	for _, c := range s[:i] {
		d.year = d.year*10 + int(c-'0')
	}
	if bc {
		d.year = 1 - d.year
	}
	d.month, d.day = s[i+1:i+3], s[i+4:i+6]
	if !allDigits(d.month) || !allDigits(d.day) {
		return d, nil, false
	}
	return d, s[i+6:], true
}

// appendYear writes a year of RFC 3339 (4 digits) when it has one, else
// ISO 8601's expanded form: a sign and at least 6 digits.
func appendYear(dst []byte, year int) []byte {
	if year >= 1 && year <= 9999 {
		return appendPadded(dst, year, 4)
	}
	if year < 0 {
		dst = append(dst, '-')
		year = -year
	} else {
		dst = append(dst, '+')
	}
	return appendPadded(dst, year, 6)
}

// appendPadded writes v ≥ 0 in decimal, zero-padded to width digits.
func appendPadded(dst []byte, v, width int) []byte {
	var b [20]byte
	i := len(b)
	for v > 0 || i > len(b)-width {
		i--
		b[i] = byte('0' + v%10)
		v /= 10
	}
	return append(dst, b[i:]...)
}

// cutBC removes DateStyle ISO's era suffix.
func cutBC(s []byte) ([]byte, bool) {
	if n := len(s) - 3; n > 0 && string(s[n:]) == " BC" {
		return s[:n], true
	}
	return s, false
}

func isInfinity(s []byte) bool {
	return string(s) == "infinity" || string(s) == "-infinity"
}

func appendDate(dst, text []byte) ([]byte, error) {
	if isInfinity(text) {
		return appendQuoted(dst, text), nil
	}
	s, bc := cutBC(text)
	d, rest, ok := parseISODate(s, bc)
	if !ok || len(rest) != 0 {
		return dst, malformed("date", text)
	}
	dst = appendISODate(append(dst, '"'), d)
	return append(dst, '"'), nil
}

// appendISODate appends d as YYYY-MM-DD (expanded years outside 1–9999).
func appendISODate(dst []byte, d isoDate) []byte {
	dst = appendYear(dst, d.year)
	dst = append(dst, '-')
	dst = append(dst, d.month...)
	dst = append(dst, '-')
	return append(dst, d.day...)
}

// appendTimestamp converts timestamp[tz] in DateStyle ISO, "2024-05-01
// 12:34:56.789+05:30" (the offset only with tz; " BC" last), to RFC 3339.
func appendTimestamp(dst, text []byte, tz bool) ([]byte, error) {
	kind := "timestamp"
	if tz {
		kind = "timestamptz"
	}
	if isInfinity(text) {
		return appendQuoted(dst, text), nil
	}
	s, bc := cutBC(text)
	d, rest, ok := parseISODate(s, bc)
	// " HH:MM:SS"
	if !ok || len(rest) < 9 || rest[0] != ' ' || rest[3] != ':' || rest[6] != ':' ||
		!allDigits(rest[1:3]) || !allDigits(rest[4:6]) || !allDigits(rest[7:9]) {
		return dst, malformed(kind, text)
	}
	clock := rest[1:9]
	rest = rest[9:]
	var frac []byte // the digits after '.'
	if len(rest) > 0 && rest[0] == '.' {
		i := 1
		for i < len(rest) && rest[i] >= '0' && rest[i] <= '9' {
			i++
		}
		if i == 1 || i > 10 {
			return dst, malformed(kind, text)
		}
		frac = rest[1:i]
		rest = rest[i:]
	}
	// The offset: +HH, +HH:MM or +HH:MM:SS.
	var off []byte
	if tz {
		if len(rest) != 3 && len(rest) != 6 && len(rest) != 9 || rest[0] != '+' && rest[0] != '-' ||
			!allDigits(rest[1:3]) {
			return dst, malformed(kind, text)
		}
		for i := 3; i < len(rest); i += 3 {
			if rest[i] != ':' || !allDigits(rest[i+1:i+3]) {
				return dst, malformed(kind, text)
			}
		}
		off = rest
	} else if len(rest) != 0 {
		return dst, malformed(kind, text)
	}
	if len(off) == 9 {
		return appendTimestampUTC(dst, d, clock, frac, off), nil
	}
	dst = appendISODate(append(dst, '"'), d)
	dst = append(dst, 'T')
	dst = append(dst, clock...)
	if frac != nil {
		dst = append(dst, '.')
		dst = append(dst, frac...)
	}
	if off != nil {
		dst = append(dst, off...)
		if len(off) == 3 {
			dst = append(dst, ":00"...)
		}
	}
	return append(dst, '"'), nil
}

// appendTimestampUTC writes a timestamptz whose offset has seconds (such
// as Amsterdam's +00:19:32 before 1937), which RFC 3339 cannot write, in
// UTC.
func appendTimestampUTC(dst []byte, d isoDate, clock, frac, off []byte) []byte {
	num := func(b []byte) int {
		v := 0
		for _, c := range b {
			v = v*10 + int(c-'0')
		}
		return v
	}
	nsec := 0
	for i := range 9 {
		nsec *= 10
		if i < len(frac) {
			nsec += int(frac[i] - '0')
		}
	}
	t := time.Date(d.year, time.Month(num(d.month)), num(d.day),
		num(clock[0:2]), num(clock[3:5]), num(clock[6:8]), nsec, time.UTC)
	offset := time.Duration(num(off[1:3]))*time.Hour + time.Duration(num(off[4:6]))*time.Minute +
		time.Duration(num(off[7:9]))*time.Second
	if off[0] == '-' {
		offset = -offset
	}
	t = t.Add(-offset)
	dst = append(dst, '"')
	dst = appendYear(dst, t.Year())
	dst = append(dst, '-')
	dst = appendPadded(dst, int(t.Month()), 2)
	dst = append(dst, '-')
	dst = appendPadded(dst, t.Day(), 2)
	dst = append(dst, 'T')
	dst = appendPadded(dst, t.Hour(), 2)
	dst = append(dst, ':')
	dst = appendPadded(dst, t.Minute(), 2)
	dst = append(dst, ':')
	dst = appendPadded(dst, t.Second(), 2)
	if ns := t.Nanosecond(); ns != 0 {
		width := 9
		for ns%10 == 0 {
			ns /= 10
			width--
		}
		dst = append(dst, '.')
		dst = appendPadded(dst, ns, width)
	}
	return append(dst, "+00:00\""...)
}

// AppendArray appends the JSON array for an array in PostgreSQL's text
// output format whose elements have type elem and are separated by delim
// (pg_type.typdelim: ',' for every built-in type but box, ';').
// AppendValue calls it for the built-in array types; a caller that looks
// up a user-defined array type's typelem and typdelim (an array of enums,
// say) can call it directly.
//
// Each element is encoded as AppendValue encodes elem, an unquoted NULL as
// null (a quoted "NULL" is the string), each dimension as a nested array.
// Lower bounds other than 1 ("[0:2]={1,2,3}") are dropped.
func AppendArray(dst []byte, elem uint32, delim byte, text []byte) ([]byte, error) {
	p := text
	if len(p) > 0 && p[0] == '[' {
		// Dimension decoration: ("[" lower ":" upper "]")+ "=".
		for len(p) > 0 && p[0] == '[' {
			i := 1
			for i < len(p) && p[i] != ']' {
				i++
			}
			if i == len(p) || !isBounds(p[1:i]) {
				return dst, malformed("array bounds", text)
			}
			p = p[i+1:]
		}
		if len(p) == 0 || p[0] != '=' {
			return dst, malformed("array bounds", text)
		}
		p = p[1:]
	}
	if len(p) == 0 || p[0] != '{' {
		return dst, malformed("array", text)
	}
	dst, p, err := appendArrayLevel(dst, elem, delim, p, 1)
	if err != nil {
		return dst, err
	}
	if len(p) != 0 {
		return dst, malformed("array", text)
	}
	return dst, nil
}

// isBounds reports whether s is "lower:upper" (signed integers).
func isBounds(s []byte) bool {
	for i, c := range s {
		if c == ':' {
			return isJSONInteger(s[:i]) && isJSONInteger(s[i+1:])
		}
	}
	return false
}

// maxDims is PostgreSQL's MAXDIM: no array has more dimensions, and the
// limit bounds our recursion on hostile input.
const maxDims = 6

// appendArrayLevel appends the array at the start of p, which begins with
// '{', and returns the rest of p after its '}'.
func appendArrayLevel(dst []byte, elem uint32, delim byte, p []byte, dim int) ([]byte, []byte, error) {
	if dim > maxDims {
		return dst, p, malformed("array", p)
	}
	p = p[1:]
	dst = append(dst, '[')
	if len(p) > 0 && p[0] == '}' {
		return append(dst, ']'), p[1:], nil
	}
	for {
		var err error
		switch {
		case len(p) == 0:
			return dst, p, malformed("array", p)
		case p[0] == '{':
			dst, p, err = appendArrayLevel(dst, elem, delim, p, dim+1)
		case p[0] == '"':
			// A quoted element: '\' escapes the next byte.
			escaped := false
			i := 1
			for i < len(p) && p[i] != '"' {
				if p[i] == '\\' {
					escaped = true
					i++
				}
				i++
			}
			if i >= len(p) {
				return dst, p, malformed("array element", p)
			}
			raw := p[1:i]
			p = p[i+1:]
			if !escaped {
				dst, err = AppendValue(dst, elem, raw)
				break
			}
			// Unescape into dst past its end, encode after that, then
			// move the encoding down over the scratch bytes: no
			// allocation when dst has room. The scratch stays readable
			// even if AppendValue grows dst: it reads the old array.
			n := len(dst)
			for j := 0; j < len(raw); j++ {
				if raw[j] == '\\' {
					j++
				}
				dst = append(dst, raw[j])
			}
			m := len(dst)
			dst, err = AppendValue(dst, elem, dst[n:m])
			if err == nil {
				dst = dst[:n+copy(dst[n:], dst[m:])]
			}
		default:
			// An unquoted element: array_out quotes anything holding the
			// delimiter, braces, quotes, backslashes or spaces.
			i := 0
			for i < len(p) && p[i] != delim && p[i] != '}' {
				if c := p[i]; c == '{' || c == '"' || c == '\\' {
					return dst, p, malformed("array element", p)
				}
				i++
			}
			raw := p[:i]
			if len(raw) == 0 {
				return dst, p, malformed("array element", p)
			}
			p = p[i:]
			if len(raw) == 4 && raw[0]|0x20 == 'n' && raw[1]|0x20 == 'u' && raw[2]|0x20 == 'l' && raw[3]|0x20 == 'l' {
				dst = append(dst, "null"...)
				break
			}
			dst, err = AppendValue(dst, elem, raw)
		}
		if err != nil {
			return dst, p, err
		}
		switch {
		case len(p) == 0:
			return dst, p, malformed("array", p)
		case p[0] == '}':
			return append(dst, ']'), p[1:], nil
		case p[0] != delim:
			return dst, p, malformed("array", p)
		}
		p = p[1:]
		dst = append(dst, ',')
	}
}

// arrayElem maps the OID of every built-in array type to its element's
// OID (pg_type.typarray → pg_type.oid for oid < 10000; TestArrayTypes
// checks it against the server). Built-in OIDs are fixed across versions;
// user-defined types get OIDs ≥ 16384 and are not here.
var arrayElem = map[uint32]uint32{
	143:   142,  // xml[]
	199:   114,  // json[]
	210:   71,   // pg_type[]
	270:   75,   // pg_attribute[]
	271:   5069, // xid8[]
	272:   81,   // pg_proc[]
	273:   83,   // pg_class[]
	629:   628,  // line[]
	651:   650,  // cidr[]
	719:   718,  // circle[]
	775:   774,  // macaddr8[]
	791:   790,  // money[]
	1000:  16,   // bool[]
	1001:  17,   // bytea[]
	1002:  18,   // char[]
	1003:  19,   // name[]
	1005:  21,   // int2[]
	1006:  22,   // int2vector[]
	1007:  23,   // int4[]
	1008:  24,   // regproc[]
	1009:  25,   // text[]
	1010:  27,   // tid[]
	1011:  28,   // xid[]
	1012:  29,   // cid[]
	1013:  30,   // oidvector[]
	1014:  1042, // bpchar[]
	1015:  1043, // varchar[]
	1016:  20,   // int8[]
	1017:  600,  // point[]
	1018:  601,  // lseg[]
	1019:  602,  // path[]
	1020:  603,  // box[]
	1021:  700,  // float4[]
	1022:  701,  // float8[]
	1027:  604,  // polygon[]
	1028:  26,   // oid[]
	1034:  1033, // aclitem[]
	1040:  829,  // macaddr[]
	1041:  869,  // inet[]
	1115:  1114, // timestamp[]
	1182:  1082, // date[]
	1183:  1083, // time[]
	1185:  1184, // timestamptz[]
	1187:  1186, // interval[]
	1231:  1700, // numeric[]
	1263:  2275, // cstring[]
	1270:  1266, // timetz[]
	1561:  1560, // bit[]
	1563:  1562, // varbit[]
	2201:  1790, // refcursor[]
	2207:  2202, // regprocedure[]
	2208:  2203, // regoper[]
	2209:  2204, // regoperator[]
	2210:  2205, // regclass[]
	2211:  2206, // regtype[]
	2287:  2249, // record[]
	2949:  2970, // txid_snapshot[]
	2951:  2950, // uuid[]
	3221:  3220, // pg_lsn[]
	3643:  3614, // tsvector[]
	3644:  3642, // gtsvector[]
	3645:  3615, // tsquery[]
	3735:  3734, // regconfig[]
	3770:  3769, // regdictionary[]
	3807:  3802, // jsonb[]
	3905:  3904, // int4range[]
	3907:  3906, // numrange[]
	3909:  3908, // tsrange[]
	3911:  3910, // tstzrange[]
	3913:  3912, // daterange[]
	3927:  3926, // int8range[]
	4073:  4072, // jsonpath[]
	4090:  4089, // regnamespace[]
	4097:  4096, // regrole[]
	4192:  4191, // regcollation[]
	5039:  5038, // pg_snapshot[]
	6150:  4451, // int4multirange[]
	6151:  4532, // nummultirange[]
	6152:  4533, // tsmultirange[]
	6153:  4534, // tstzmultirange[]
	6155:  4535, // datemultirange[]
	6157:  4536, // int8multirange[]
	10052: 1248, // pg_database[]
	10057: 2842, // pg_authid[]
	10058: 2843, // pg_auth_members[]
	10093: 4066, // pg_shseclabel[]
	10112: 6101, // pg_subscription[]
}
