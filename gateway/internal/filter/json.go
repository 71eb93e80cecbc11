package filter

import (
	"encoding/json"
	"math"
	"strconv"
	"unicode/utf8"
	"unsafe"
)

// parseJSON parses an event's data, which NewEvent has validated, into the
// values filters see: objects as map[string]any, arrays as []any, integers
// that fit as int64, other numbers as float64, strings, bools and nil. It
// is encoding/json's Unmarshal into any without reflection and without a
// json.Number per number, about half the allocations: parsing is most of
// what a filtered event costs (docs/benchmarks.md, "Live views"). ok is
// false on anything NewEvent would not have let through.
func parseJSON(b []byte) (v any, ok bool) {
	p := jsonParser{b: b}
	v, ok = p.value()
	if !ok {
		return nil, false
	}
	p.space()
	return v, p.i == len(p.b)
}

type jsonParser struct {
	b []byte
	i int
}

func (p *jsonParser) space() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

func (p *jsonParser) value() (any, bool) {
	p.space()
	if p.i >= len(p.b) {
		return nil, false
	}
	switch c := p.b[p.i]; {
	case c == '{':
		p.i++
		m := make(map[string]any)
		p.space()
		if p.i < len(p.b) && p.b[p.i] == '}' {
			p.i++
			return m, true
		}
		for {
			p.space()
			k, ok := p.str()
			if !ok {
				return nil, false
			}
			p.space()
			if p.i >= len(p.b) || p.b[p.i] != ':' {
				return nil, false
			}
			p.i++
			v, ok := p.value()
			if !ok {
				return nil, false
			}
			m[k] = v
			p.space()
			if p.i >= len(p.b) {
				return nil, false
			}
			switch p.b[p.i] {
			case ',':
				p.i++
			case '}':
				p.i++
				return m, true
			default:
				return nil, false
			}
		}
	case c == '[':
		p.i++
		var l []any
		p.space()
		if p.i < len(p.b) && p.b[p.i] == ']' {
			p.i++
			return []any{}, true
		}
		for {
			v, ok := p.value()
			if !ok {
				return nil, false
			}
			l = append(l, v)
			p.space()
			if p.i >= len(p.b) {
				return nil, false
			}
			switch p.b[p.i] {
			case ',':
				p.i++
			case ']':
				p.i++
				return l, true
			default:
				return nil, false
			}
		}
	case c == '"':
		s, ok := p.str()
		return s, ok
	case c == 't':
		return true, p.lit("true")
	case c == 'f':
		return false, p.lit("false")
	case c == 'n':
		return nil, p.lit("null")
	}
	return p.num()
}

func (p *jsonParser) lit(s string) bool {
	if len(p.b)-p.i < len(s) || string(p.b[p.i:p.i+len(s)]) != s {
		return false
	}
	p.i += len(s)
	return true
}

// str reads a string; one with escapes is decoded by encoding/json.
func (p *jsonParser) str() (string, bool) {
	if p.i >= len(p.b) || p.b[p.i] != '"' {
		return "", false
	}
	start := p.i
	escaped := false // escapes, or bytes that may not be valid UTF-8 (encoding/json replaces them)
	for j := p.i + 1; j < len(p.b); j++ {
		switch c := p.b[j]; {
		case c == '\\':
			escaped = true
			j++
		case c >= utf8.RuneSelf:
			if r, size := utf8.DecodeRune(p.b[j:]); r == utf8.RuneError && size == 1 {
				escaped = true
			} else {
				j += size - 1
			}
		case c == '"':
			p.i = j + 1
			if !escaped {
				return string(p.b[start+1 : j]), true
			}
			var s string
			if json.Unmarshal(p.b[start:j+1], &s) != nil {
				return "", false
			}
			return s, true
		}
	}
	return "", false
}

func (p *jsonParser) num() (any, bool) {
	start := p.i
	isInt := true
	for p.i < len(p.b) {
		c := p.b[p.i]
		if c >= '0' && c <= '9' || c == '-' {
			p.i++
			continue
		}
		if c == '.' || c == 'e' || c == 'E' || c == '+' {
			isInt = false
			p.i++
			continue
		}
		break
	}
	if p.i == start {
		return nil, false
	}
	t := p.b[start:p.i]
	s := unsafe.String(unsafe.SliceData(t), len(t)) // parsed, not kept
	if isInt {
		if n, err := strconv.ParseInt(s, 10, 64); err == nil {
			return n, true
		}
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		if ne, ok := err.(*strconv.NumError); ok && ne.Err == strconv.ErrRange {
			return f, true // ±Inf, as encoding/json would refuse: keep the sign
		}
		return nil, false
	}
	return f, true
}

// ValueKey is the canonical key of a scalar JSON value, equal for values
// CEL's == holds equal (5, 5.0 and 5u are one number); ok is false for
// values that are not scalars (and for NaN, equal to nothing).
func ValueKey(v any) (string, bool) {
	switch x := v.(type) {
	case nil:
		return "n", true
	case bool:
		if x {
			return "t", true
		}
		return "f", true
	case string:
		return "s" + x, true
	case int64:
		return "i" + strconv.FormatInt(x, 10), true
	case float64:
		if math.IsNaN(x) {
			return "", false
		}
		if x == math.Trunc(x) && x >= -(1<<63) && x < 1<<63 {
			return "i" + strconv.FormatInt(int64(x), 10), true
		}
		return "d" + strconv.FormatFloat(x, 'g', -1, 64), true
	}
	return "", false
}

// LookupPath is the value at path under v (JSON objects only), and
// whether it is there.
func LookupPath(v any, path []string) (any, bool) {
	for _, p := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return nil, false
		}
		if v, ok = m[p]; !ok {
			return nil, false
		}
	}
	return v, true
}

// Parsed is an event's data as filters see it: parsed once per event
// (by the event, for every filter), with JSON integers as int64 and other numbers as float64.
// It is immutable once Parse returns.
type Parsed struct {
	Data     any
	Doc      any    // Data's "doc" member when it has one (ingest events), else Data
	Op       string // Data's "op" (ingest: insert, update, delete, truncate), else ""
	Valid    bool   // the data parsed (events are valid JSON; a failure is an internal error)
	Delete   bool   // an ingest delete: the document is gone
	Truncate bool   // an ingest truncate: every document under the subject's prefix is gone
}

// Parse parses an event's data; ingestTruncate says the event is on
// a truncate subject of the ingest's reserved subjects, the only place a truncate comes from: a
// truncate-shaped event published anywhere else is an ordinary event,
// which filters see like any other.
func Parse(subject string, b []byte, ingestTruncate bool) *Parsed {
	v, ok := parseJSON(b)
	if !ok {
		return &Parsed{}
	}
	p := &Parsed{Data: v, Doc: v, Valid: true}
	if m, ok := v.(map[string]any); ok {
		if d, ok := m["doc"]; ok {
			p.Doc = d
		}
		p.Op, _ = m["op"].(string)
	}
	p.Delete = p.Op == "delete"
	p.Truncate = ingestTruncate && p.Op == "truncate"
	return p
}

// TruncateToken is the last token of the ingest's truncate events
// (db.orders.%truncate).
const TruncateToken = "%truncate"

// NormalizeJSON turns json.Numbers into int64 (integers that fit) or
// float64, in place.
func NormalizeJSON(v any) any {
	switch x := v.(type) {
	case json.Number:
		if i, err := strconv.ParseInt(string(x), 10, 64); err == nil {
			return i
		}
		f, _ := strconv.ParseFloat(string(x), 64)
		return f
	case map[string]any:
		for k, e := range x {
			x[k] = NormalizeJSON(e)
		}
	case []any:
		for i, e := range x {
			x[i] = NormalizeJSON(e)
		}
	case float64: // claims decoded without UseNumber
		if x == math.Trunc(x) && math.Abs(x) < 1<<53 {
			return int64(x)
		}
	}
	return v
}
