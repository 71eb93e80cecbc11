package pgjson

import "time"

// Dates and timestamps (values.go lists the mapping): DateStyle ISO text
// (outputParams) becomes RFC 3339, with ISO 8601's expanded years outside
// 1–9999.

// ISODate is a date as DateStyle ISO writes it: "2024-05-01", "0044-03-15"
// (with " BC" at the very end of the value), "10000-01-01".
type ISODate struct {
	Year       int    // astronomical: 1 BC is 0
	Month, Day []byte // two digits each, as written
}

// ParseISODate parses the date that starts a date or timestamp[tz] value
// in DateStyle ISO ("2024-05-01", "0044-03-15 12:00:00+00 BC") and returns
// the rest of the value, without its era suffix. ok is false when the
// value does not start with such a date (infinity, another DateStyle).
func ParseISODate(text []byte) (d ISODate, rest []byte, ok bool) {
	s, bc := cutBC(text)
	return parseISODate(s, bc)
}

// parseISODate parses the date at the start of s and returns the rest.
func parseISODate(s []byte, bc bool) (d ISODate, rest []byte, ok bool) {
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
		d.Year = d.Year*10 + int(c-'0')
	}
	if bc {
		d.Year = 1 - d.Year
	}
	d.Month, d.Day = s[i+1:i+3], s[i+4:i+6]
	if !allDigits(d.Month) || !allDigits(d.Day) {
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
func appendISODate(dst []byte, d ISODate) []byte {
	dst = appendYear(dst, d.Year)
	dst = append(dst, '-')
	dst = append(dst, d.Month...)
	dst = append(dst, '-')
	return append(dst, d.Day...)
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
func appendTimestampUTC(dst []byte, d ISODate, clock, frac, off []byte) []byte {
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
	t := time.Date(d.Year, time.Month(num(d.Month)), num(d.Day),
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
