package cdc

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pglogrepl"

	"github.com/fanwire/fanwire/cdc/pgjson"
)

// table is what the ingest knows of a table: its columns (as the last
// Relation message, or the bootstrap's query, described them) and, when it
// is published, its primary key, subject and projection.
type table struct {
	columns []column
	key     []int  // indexes into columns of the primary key, in key order
	subject string // "<prefix>.<table>" or "<prefix>.<schema>.<table>"
	// errSubject is where its error events go; maxEvent is the broker's
	// message size limit (0: none).
	errSubject string
	maxEvent   int
	nameKey    string     // "schema.table", how --tables and errors name it
	proj       projection // what its changes become; nil when it is not published
}

type column struct {
	name     string
	ctype    pgjson.Type // how its values are encoded
	jsonName []byte      // the quoted JSON key, with its colon: "name":
}

func newColumn(name string, ct pgjson.Type) column {
	return column{name: name, ctype: ct, jsonName: append(pgjson.AppendJSONString(nil, []byte(name)), ':')}
}

// publish makes t a published table: its key columns (by name), its
// subject, and the table's own projection.
func (t *table) publish(prefix, schema, name string, keyCols []string, maxEvent int) error {
	for _, k := range keyCols {
		i := t.column(k)
		if i < 0 {
			return fmt.Errorf("table %s: primary key column %q is not in the replicated columns (a column list on the publication?)", t.nameKey, k)
		}
		t.key = append(t.key, i)
	}
	t.subject = tableSubject(prefix, schema, name)
	t.errSubject, t.maxEvent = errorSubject(prefix, t.subject), maxEvent
	t.proj = tableProjection{}
	return nil
}

// qualified names a table the way errors and --tables do.
func qualified(schema, name string) string { return schema + "." + name }

// relations holds the tables by relation id, as Relation messages define
// them; keys come from the catalog (pgoutput marks replica identity
// columns, which for REPLICA IDENTITY FULL are all of them).
type relations struct {
	prefix   string
	maxEvent int                 // the broker's message size limit (0: none)
	keys     map[string][]string // "schema.table" → primary key columns (the published tables)
	byID     map[uint32]*table
	types    *pgjson.TypeCache // the columns' types
	q        querier           // where types are looked up (nil: not at all, every type is taken as is)
}

func newRelations(prefix string, keys map[string][]string, maxEvent int, types *pgjson.TypeCache, q querier) *relations {
	return &relations{prefix: prefix, maxEvent: maxEvent, keys: keys, byID: make(map[uint32]*table), types: types, q: q}
}

// define records (or replaces) a relation. A table that is not published
// (a publication FOR ALL TABLES, or a table added to it after start-up) is
// recorded too: its changes are skipped. Column types pgoutput names by an
// OID the ingest does not know yet (a domain, say) are looked up in the
// catalog.
func (r *relations) define(ctx context.Context, m *pglogrepl.RelationMessage) error {
	q := qualified(m.Namespace, m.RelationName)
	if r.q != nil {
		oids := make([]uint32, len(m.Columns))
		for i, c := range m.Columns {
			oids[i] = c.DataType
		}
		if err := r.types.Lookup(ctx, r.q, oids); err != nil {
			return fmt.Errorf("table %s: %w", q, err)
		}
	}
	t := &table{nameKey: q}
	for _, c := range m.Columns {
		t.columns = append(t.columns, newColumn(c.Name, r.types.Get(c.DataType)))
	}
	if keyCols, ok := r.keys[q]; ok {
		if err := t.publish(r.prefix, m.Namespace, m.RelationName, keyCols, r.maxEvent); err != nil {
			return err
		}
	}
	r.byID[m.RelationID] = t
	return nil
}

func (t *table) column(name string) int {
	for i, c := range t.columns {
		if c.name == name {
			return i
		}
	}
	return -1
}

// published reports whether the table's changes become events.
func (t *table) published() bool { return t.proj != nil }

// tableSubject is the subject of a table's events, before the key token.
func tableSubject(prefix, schema, name string) string {
	if schema == "public" {
		return prefix + "." + subjectToken(name)
	}
	return prefix + "." + subjectToken(schema) + "." + subjectToken(name)
}

// subjectToken makes s one subject token: bytes other than ASCII letters,
// digits, '_' and '-' become %XX (so '.', '*', '>' and spaces, which NATS
// reserves, cannot split or widen a subject, and the mapping is
// reversible). "%truncate" cannot be the token of any key.
func subjectToken(s string) string {
	ok := true
	for i := 0; i < len(s); i++ {
		if !tokenByte(s[i]) {
			ok = false
			break
		}
	}
	if ok && s != "" {
		return s
	}
	return string(appendSubjectToken(nil, s))
}

// appendSubjectToken appends subjectToken(s) to b.
func appendSubjectToken[S ~string | ~[]byte](b []byte, s S) []byte {
	if len(s) == 0 {
		return append(b, '%') // the empty key
	}
	const hexDigits = "0123456789ABCDEF"
	for i := 0; i < len(s); i++ {
		c := s[i]
		if tokenByte(c) {
			b = append(b, c)
			continue
		}
		b = append(b, '%', hexDigits[c>>4], hexDigits[c&0xF])
	}
	return b
}

// keyToken is the subject token of a key: each value made a token of its
// own by subjectToken, then joined with ',' (which subjectToken escapes
// inside a value), so that two composite keys never share a token: ("a,b",
// "c") is "a%2Cb,c" and ("a", "b,c") is "a,b%2Cc".
func keyToken(vals []string) string {
	if len(vals) == 1 {
		return subjectToken(vals[0])
	}
	toks := make([]string, len(vals))
	for i, v := range vals {
		toks[i] = subjectToken(v)
	}
	return strings.Join(toks, ",")
}

func tokenByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
}

// truncateToken is the last token of a truncate event's subject.
const truncateToken = "%truncate"
