package cdc

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pglogrepl"

	"github.com/fanwire/fanwire/cdc/pgjson"
	"github.com/fanwire/fanwire/jsonstr"
)

// table is what the ingest knows of a table: its columns (as a Relation
// message, or the bootstrap's query, described them) and, when it is
// published, its key, subject and projection. A definition never changes:
// a Relation message after a DDL makes a new one, and the changes that
// came before it keep theirs.
type table struct {
	columns []column
	key     []int  // indexes into columns of the key, in key order
	subject string // "<prefix>.<table>" or "<prefix>.<schema>.<table>"
	// errSubject is where its error events go; maxEvent is the broker's
	// message size limit (0: none).
	errSubject string
	maxEvent   int
	nameKey    string     // "schema.table", how --tables and errors name it
	proj       projection // what its changes become; nil when it is not published
	oid        uint32     // the relation's OID (stable across RENAME and SET SCHEMA; 0 for the bootstrap's)
	gen        uint64     // the definition's generation (relations.generations)
	noKey      string     // a published table without a key: why (its rows become error events)
}

// generation is t's generation (0 for none).
func (t *table) generation() uint64 {
	if t == nil {
		return 0
	}
	return t.gen
}

type column struct {
	name     string
	ctype    pgjson.Type // how its values are encoded
	jsonName []byte      // the quoted JSON key, with its colon: "name":
}

func newColumn(name string, ct pgjson.Type) column {
	return column{name: name, ctype: ct, jsonName: append(jsonstr.AppendBytes(nil, []byte(name)), ':')}
}

// publish makes t a published table: its key columns (by name), its
// subject, and the table's own projection.
func (t *table) publish(prefix, schema, name string, keyCols []string, maxEvent int) error {
	key := make([]int, 0, len(keyCols))
	for _, k := range keyCols {
		i := t.column(k)
		if i < 0 {
			return fmt.Errorf("table %s: primary key column %q is not in the replicated columns (a column list on the publication?)", t.nameKey, k)
		}
		key = append(key, i)
	}
	t.publishKey(prefix, schema, name, key, maxEvent)
	return nil
}

// publishKey makes t a published table with key columns key.
func (t *table) publishKey(prefix, schema, name string, key []int, maxEvent int) {
	t.key = key
	t.subject = tableSubject(prefix, schema, name)
	t.errSubject, t.maxEvent = errorSubject(prefix, t.subject), maxEvent
	t.proj = tableProjection{}
}

// qualified names a table the way errors and --tables do.
func qualified(schema, name string) string { return schema + "." + name }

// relations holds the tables by relation id, as Relation messages define
// them. pgoutput sends a Relation message before a table's first change
// in a session and again after each DDL that changes it, also in the
// middle of a transaction; it decodes with the catalog as it was then, so
// a transaction read again after a restart brings its definitions again.
// Which tables publish table events is decided by OID (only), so a table
// renamed or moved to another schema goes on, under its new subject, and
// a table created later (a publication FOR ALL TABLES) is published from
// its first change. Keys come from the message: pgoutput marks the
// replica identity's columns (the primary key's, or the identity
// index's); for REPLICA IDENTITY FULL it marks them all, and the catalog
// names the primary key.
type relations struct {
	prefix   string
	maxEvent int             // the broker's message size limit (0: none)
	only     map[uint32]bool // the tables whose table events are published, by OID; nil: every table pgoutput sends
	byID     map[uint32]*table
	// generations holds every definition a held change may point to, by
	// generation: a spilled change names its table's so (spill.go). prune
	// lets go of the old ones when no transaction is held.
	generations map[uint64]*table
	lastGen     uint64
	types       *pgjson.TypeCache // the columns' types
	q           querier           // where types and keys are looked up (nil: not at all, every type is taken as is)
	// claim registers the subjects of a table about to be published (a
	// new table, or a renamed one) before its first event: nil for none.
	claim func(ctx context.Context, subjects []string) error
	// renamed is told of a table renamed (or moved) in this session: a
	// projection naming it stops with an error. nil: nothing to tell.
	renamed func(from, to string) error
}

func newRelations(prefix string, only map[uint32]bool, maxEvent int, types *pgjson.TypeCache, q querier) *relations {
	return &relations{prefix: prefix, maxEvent: maxEvent, only: only, byID: make(map[uint32]*table), generations: make(map[uint64]*table), types: types, q: q}
}

// define records a definition of a relation, from its Relation message;
// the relation's changes after it are decoded with it. A table that is not
// published (not among only) is recorded too: its changes are skipped, and
// projections may read them. Column types pgoutput names by an OID the
// ingest does not know yet (a domain, say) are looked up in the catalog.
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
	r.lastGen++
	t := &table{nameKey: q, oid: m.RelationID, gen: r.lastGen}
	for _, c := range m.Columns {
		t.columns = append(t.columns, newColumn(c.Name, r.types.Get(c.DataType)))
	}
	if prev := r.byID[m.RelationID]; prev != nil && prev.nameKey != q && r.renamed != nil {
		if err := r.renamed(prev.nameKey, q); err != nil {
			return err
		}
	}
	if r.only == nil && m.RelationName != stateTable || r.only[m.RelationID] {
		key, err := r.keyOf(ctx, m)
		if err != nil {
			return fmt.Errorf("table %s: %w", q, err)
		}
		t.publishKey(r.prefix, m.Namespace, m.RelationName, key, r.maxEvent)
		if len(key) == 0 {
			t.noKey = fmt.Sprintf("replica identity %q", m.ReplicaIdentity)
		}
		if r.claim != nil {
			if err := r.claim(ctx, subjectsOf(r.prefix, t.subject)); err != nil {
				return err
			}
		}
	}
	r.byID[m.RelationID] = t
	r.generations[t.gen] = t
	return nil
}

// (The ingest's own state table, under a publication FOR ALL TABLES, is
// never published.)

// generation returns the definition of generation gen (nil: unknown).
func (r *relations) generation(gen uint64) *table { return r.generations[gen] }

// prune forgets the definitions no longer current: call it when no
// transaction is held, so no change points to them.
func (r *relations) prune() {
	if len(r.generations) == len(r.byID) {
		return
	}
	clear(r.generations)
	for _, t := range r.byID {
		r.generations[t.gen] = t
	}
}

// keyOf returns the indexes of a relation's key columns in m, in key
// order: the columns pgoutput marks as the replica identity's, ordered as
// the primary key (or the identity index) orders them; for REPLICA
// IDENTITY FULL, which marks every column, the primary key's columns. It
// returns none for a table without a key (no primary key, or REPLICA
// IDENTITY NOTHING): its rows become error events.
func (r *relations) keyOf(ctx context.Context, m *pglogrepl.RelationMessage) ([]int, error) {
	var marked []int
	for i, c := range m.Columns {
		if c.Flags&1 != 0 {
			marked = append(marked, i)
		}
	}
	if m.ReplicaIdentity != 'f' && len(marked) <= 1 {
		return marked, nil // the common case: no catalog to read
	}
	attnums, names, err := r.catalogKey(ctx, m.RelationID)
	if err != nil {
		return nil, err
	}
	if m.ReplicaIdentity == 'f' {
		// The primary key by its columns' names now; a change from before
		// one was renamed (read again after a restart) finds them by
		// their places among the columns, which a rename keeps.
		key := make([]int, 0, len(names))
		for _, n := range names {
			i := slices.IndexFunc(m.Columns, func(c *pglogrepl.RelationMessageColumn) bool { return c.Name == n })
			if i < 0 {
				return r.keyByPlace(ctx, m, attnums)
			}
			key = append(key, i)
		}
		return key, nil
	}
	if len(attnums) != len(marked) {
		return marked, nil // the table is gone, or its key changed since: table order
	}
	// marked is in attnum order: the key's k-th column is the marked one
	// whose attnum is k-th in rank among the key's.
	sorted := slices.Sorted(slices.Values(attnums))
	key := make([]int, len(attnums))
	for k, a := range attnums {
		key[k] = marked[slices.Index(sorted, a)]
	}
	return key, nil
}

// keyByPlace finds the key columns (attnums) of m by their places among
// the table's columns now, when it has as many as m (a rename keeps the
// places; a column added or dropped since does not: then there is no key,
// and the change becomes an error event).
func (r *relations) keyByPlace(ctx context.Context, m *pglogrepl.RelationMessage, attnums []int) ([]int, error) {
	rows, err := r.q.Query(ctx, `SELECT attnum FROM pg_attribute WHERE attrelid = $1 AND attnum > 0 AND NOT attisdropped AND attgenerated = '' ORDER BY attnum`, m.RelationID)
	if err != nil {
		return nil, fmt.Errorf("postgres: read the columns of relation %d: %w", m.RelationID, err)
	}
	defer rows.Close()
	var cols []int
	for rows.Next() {
		var a int16
		if err := rows.Scan(&a); err != nil {
			return nil, fmt.Errorf("postgres: read the columns of relation %d: %w", m.RelationID, err)
		}
		cols = append(cols, int(a))
	}
	if err := rows.Err(); err != nil || len(cols) != len(m.Columns) {
		return nil, err
	}
	key := make([]int, len(attnums))
	for k, a := range attnums {
		if key[k] = slices.Index(cols, a); key[k] < 0 {
			return nil, nil
		}
	}
	return key, nil
}

// catalogKey reads a table's key from the catalog by OID: its columns'
// attnums and names in key order, of its replica identity index when it
// has one, else of its primary key (none: the table is gone, or has no
// key).
func (r *relations) catalogKey(ctx context.Context, oid uint32) (attnums []int, names []string, err error) {
	if r.q == nil {
		return nil, nil, nil
	}
	rows, err := r.q.Query(ctx, `
		SELECT a.attnum, a.attname
		FROM pg_class c
		JOIN pg_index i ON i.indrelid = c.oid AND (i.indisprimary OR (c.relreplident = 'i' AND i.indisreplident))
		CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
		JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum
		WHERE c.oid = $1 AND i.indexrelid = (
			SELECT i2.indexrelid FROM pg_index i2
			WHERE i2.indrelid = c.oid AND (i2.indisprimary OR (c.relreplident = 'i' AND i2.indisreplident))
			ORDER BY (c.relreplident = 'i' AND i2.indisreplident) DESC, i2.indisprimary DESC LIMIT 1)
		ORDER BY k.ord`, oid)
	if err != nil {
		return nil, nil, fmt.Errorf("postgres: read the key of relation %d: %w", oid, err)
	}
	defer rows.Close()
	for rows.Next() {
		var a int16
		var n string
		if err := rows.Scan(&a, &n); err != nil {
			return nil, nil, fmt.Errorf("postgres: read the key of relation %d: %w", oid, err)
		}
		attnums, names = append(attnums, int(a)), append(names, n)
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("postgres: read the key of relation %d: %w", oid, err)
	}
	return attnums, names, nil
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
