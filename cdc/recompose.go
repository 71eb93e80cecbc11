package cdc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fanwire/fanwire/broker"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"
)

// A projection's documents are a primary row with embedded child rows
// (docs/projections.md). This file is the sql mode: a change to any table
// of a projection is mapped to the primary keys of the documents it
// affects (reverse lookup: directly from the changed row where the join
// reaches the primary key, otherwise with batched queries), the affected
// documents of a transaction are coalesced, re-read with batched
// `= ANY($1)` queries, one per relation level, and published after the
// transaction's table events, in commit order.

// docNode is one relation of a projection: the primary table (root) or an
// embedded one.
type docNode struct {
	nameKey   string   // "schema.table"
	ident     string   // quoted "schema"."table"
	as        []byte   // `"items":` (not the root)
	many      bool     // a list of rows
	orderBy   string   // quoted columns (many)
	orderCols []string // the same, unquoted
	cols      []docCol // the document's columns
	on        []docJoin
	parent    *docNode
	children  []*docNode
	depth     int
	proj      *docProjection
	mem       *memNodeInfo // memory mode
}

// docCol is a selected column.
type docCol struct {
	name     string
	ident    string  // quoted
	typ      string  // format_type, for casts of text arrays
	ctype    colType // how its values are encoded
	jsonName []byte  // "name":
}

// docJoin is one pair of a relation's on: child column = parent column.
type docJoin struct {
	child, parent docCol
}

// docProjection is one resolved ProjectionSpec.
type docProjection struct {
	spec       *ProjectionSpec
	root       *docNode
	key        docCol
	subject    string // <prefix>.<name>
	errSubject string // where its error events go
	nodes      []*docNode
}

// docEngine serves every projection of an ingest.
type docEngine struct {
	projs   []*docProjection
	byTable map[string][]*docNode // "schema.table" → the nodes on that table
	mem     *memState             // the memory-mode tables; nil without
	// memScratch is reused by every document composed from mem.
	memScratch memScratch
	store      *memStore     // where mem is persisted
	pool       *pgxpool.Pool // where documents are re-read
	chunk      int           // keys per query
	workers    int           // concurrent queries
	// maxEvent is the broker's message size limit (0: none); report counts
	// and logs a document published as an error event.
	maxEvent int
	report   func(*badRowError)
}

// querier runs queries: a pool, a connection or a transaction.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// catalogColumn is what the catalog says of a column.
type catalogColumn struct {
	oid       uint32  // pg_attribute.atttypid
	typ       string  // format_type
	ctype     colType // how its values are encoded
	generated bool    // a generated column: pgoutput does not send it
}

// catalogTable is what the catalog says of a table.
type catalogTable struct {
	cols      map[string]catalogColumn
	order     []string // attnum order
	pkey      []string
	replIdent byte     // relreplident: 'd' default, 'f' full, 'i' index, 'n' nothing
	indexed   []string // columns that lead some index
}

func splitTable(s string) (schema, name string) {
	if schema, name, ok := strings.Cut(s, "."); ok {
		return schema, name
	}
	return "public", s
}

// loadCatalog reads what resolving projections (and bootstrapping a
// table) needs of the named tables, with the columns' types looked up in
// types.
func loadCatalog(ctx context.Context, q querier, types *typeCache, tables []string) (map[string]*catalogTable, error) {
	out := make(map[string]*catalogTable)
	var oids []uint32
	for _, t := range tables {
		if _, ok := out[t]; ok {
			continue
		}
		schema, name := splitTable(t)
		rows, err := q.Query(ctx, `
			SELECT a.attname, a.atttypid, format_type(a.atttypid, a.atttypmod), c.relreplident,
			       coalesce(a.attnum = ANY((SELECT i.indkey::int2[] FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary)::int2[]), false),
			       EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indkey[0] = a.attnum),
			       a.attgenerated <> ''
			FROM pg_class c
			JOIN pg_namespace n ON n.oid = c.relnamespace
			JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
			WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind IN ('r', 'p')
			ORDER BY a.attnum`, schema, name)
		if err != nil {
			return nil, fmt.Errorf("postgres: read the catalog of %s: %w", t, err)
		}
		ct := &catalogTable{cols: make(map[string]catalogColumn)}
		for rows.Next() {
			var col, typ string
			var oid uint32
			var ident byte
			var pk, idx, gen bool
			if err := rows.Scan(&col, &oid, &typ, &ident, &pk, &idx, &gen); err != nil {
				rows.Close()
				return nil, fmt.Errorf("postgres: read the catalog of %s: %w", t, err)
			}
			ct.cols[col] = catalogColumn{oid: oid, typ: typ, generated: gen}
			oids = append(oids, oid)
			ct.order = append(ct.order, col)
			ct.replIdent = ident
			if pk {
				ct.pkey = append(ct.pkey, col)
			}
			if idx {
				ct.indexed = append(ct.indexed, col)
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("postgres: read the catalog of %s: %w", t, err)
		}
		if len(ct.order) == 0 {
			out[t] = nil // unknown
			continue
		}
		out[t] = ct
	}
	if err := types.lookup(ctx, q, oids); err != nil {
		return nil, err
	}
	for _, ct := range out {
		if ct == nil {
			continue
		}
		for name, c := range ct.cols {
			c.ctype = types.get(c.oid)
			ct.cols[name] = c
		}
	}
	return out, nil
}

// projectionTables lists every table the specs name, qualified.
func projectionTables(specs []ProjectionSpec) []string {
	var out []string
	var walk func(es []EmbedSpec)
	walk = func(es []EmbedSpec) {
		for i := range es {
			s, n := splitTable(es[i].Table)
			out = append(out, qualified(s, n))
			walk(es[i].Embed)
		}
	}
	for i := range specs {
		s, n := splitTable(specs[i].Table)
		out = append(out, qualified(s, n))
		walk(specs[i].Embed)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// resolveProjections checks the specs against the live catalog: every
// table and column exists, the key is the primary table's primary key,
// joins compare equal types, and every embedded table sends its old rows
// (REPLICA IDENTITY FULL: a child that moves or is deleted must recompose
// its former parent). Every problem is reported, each naming the
// projection and the field. Join columns a lookup filters on without an
// index are warned about, with the CREATE INDEX to run.
func resolveProjections(ctx context.Context, q querier, types *typeCache, specs []ProjectionSpec, prefix string, log *zap.Logger) ([]*docProjection, map[string]*catalogTable, error) {
	cat, err := loadCatalog(ctx, q, types, projectionTables(specs))
	if err != nil {
		return nil, nil, err
	}
	var errs []error
	var out []*docProjection
	for pi := range specs {
		ps := &specs[pi]
		where := fmt.Sprintf("projection %q", ps.Name)
		p := &docProjection{spec: ps, subject: prefix + "." + subjectToken(ps.Name)}
		p.errSubject = errorSubject(prefix, p.subject)
		root, rerrs := resolveNode(cat, where, ps.Table, ps.Columns, nil, p)
		errs = append(errs, rerrs...)
		if root == nil {
			continue
		}
		p.root = root
		ct := cat[root.nameKey]
		switch {
		case len(ct.pkey) == 0:
			errs = append(errs, fmt.Errorf("%s: table %s has no primary key: a document needs one (key: %q)", where, root.nameKey, ps.Key))
		case len(ct.pkey) != 1 || ct.pkey[0] != ps.Key:
			errs = append(errs, fmt.Errorf("%s: key %q: the primary key of %s is (%s); key must be that one column", where, ps.Key, root.nameKey, strings.Join(ct.pkey, ", ")))
		default:
			p.key = mkCol(ps.Key, ct.cols[ps.Key])
			if !slices.ContainsFunc(root.cols, func(c docCol) bool { return c.name == ps.Key }) {
				errs = append(errs, fmt.Errorf("%s: columns must include the key %q", where, ps.Key))
			}
		}
		errs = append(errs, resolveEmbeds(cat, where, root, ps.Embed, p)...)
		if ps.Mode == ModeMemory {
			errs = append(errs, memGeneratedColumns(cat, where, p)...)
		}
		out = append(out, p)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, nil, err
	}
	for _, p := range out {
		if p.spec.Mode == ModeMemory {
			continue // no lookup queries
		}
		for _, n := range p.nodes {
			warnIndexes(cat, n, log)
		}
	}
	return out, cat, nil
}

// memGeneratedColumns reports the generated columns a memory-mode
// projection would keep: pgoutput does not send them, so the state could
// never hold their values (the ingest failed on the first change).
func memGeneratedColumns(cat map[string]*catalogTable, where string, p *docProjection) []error {
	var errs []error
	seen := make(map[string]bool)
	check := func(n *docNode, col string) {
		if ct := cat[n.nameKey]; ct != nil && ct.cols[col].generated && !seen[n.nameKey+"."+col] {
			seen[n.nameKey+"."+col] = true
			errs = append(errs, fmt.Errorf("%s: %s.%s is a generated column, which pgoutput does not send: the memory mode cannot keep it (leave it out of columns, or use mode sql)", where, n.nameKey, col))
		}
	}
	for _, n := range p.nodes {
		for _, c := range n.cols {
			check(n, c.name)
		}
		for _, j := range n.on {
			check(n, j.child.name)
			check(n.parent, j.parent.name)
		}
		for _, c := range n.orderCols {
			check(n, c)
		}
	}
	return errs
}

func mkCol(name string, c catalogColumn) docCol {
	return docCol{name: name, ident: pgx.Identifier{name}.Sanitize(), typ: c.typ, ctype: c.ctype, jsonName: append(AppendJSONString(nil, []byte(name)), ':')}
}

func resolveNode(cat map[string]*catalogTable, where, table string, columns []string, parent *docNode, p *docProjection) (*docNode, []error) {
	schema, name := splitTable(table)
	n := &docNode{nameKey: qualified(schema, name), ident: pgx.Identifier{schema, name}.Sanitize(), parent: parent, proj: p}
	ct := cat[n.nameKey]
	if ct == nil {
		return nil, []error{fmt.Errorf("%s: table %s does not exist", where, n.nameKey)}
	}
	var errs []error
	if len(columns) == 0 {
		columns = ct.order
	}
	for _, c := range columns {
		cc, ok := ct.cols[c]
		if !ok {
			errs = append(errs, fmt.Errorf("%s: columns: %s has no column %q", where, n.nameKey, c))
			continue
		}
		n.cols = append(n.cols, mkCol(c, cc))
	}
	if parent != nil {
		n.depth = parent.depth + 1
	}
	p.nodes = append(p.nodes, n)
	return n, errs
}

func resolveEmbeds(cat map[string]*catalogTable, where string, parent *docNode, embeds []EmbedSpec, p *docProjection) []error {
	var errs []error
	pct := cat[parent.nameKey]
	for i := range embeds {
		es := &embeds[i]
		w := fmt.Sprintf("%s: embed %q", where, es.As)
		n, nerrs := resolveNode(cat, w, es.Table, es.Columns, parent, p)
		errs = append(errs, nerrs...)
		if n == nil {
			continue
		}
		ct := cat[n.nameKey]
		n.as = append(AppendJSONString(nil, []byte(es.As)), ':')
		n.many = es.Many
		if n.many {
			ob := es.OrderBy
			if ob == "" && len(ct.pkey) > 0 {
				n.orderCols = ct.pkey
			} else if ob != "" {
				if _, ok := ct.cols[ob]; !ok {
					errs = append(errs, fmt.Errorf("%s: order_by: %s has no column %q", w, n.nameKey, ob))
				}
				// Ties are broken by the primary key: rows with equal
				// values came in the order of the heap (sql) or of the
				// state's index (memory), which differ, and change when
				// a row is updated.
				n.orderCols = []string{ob}
				for _, k := range ct.pkey {
					if k != ob {
						n.orderCols = append(n.orderCols, k)
					}
				}
			}
			// Qualified: a bare name in ORDER BY means the select list's
			// column of that name, which is the value cast to text.
			if len(n.orderCols) > 0 {
				n.orderBy = "x." + strings.Join(quoteAll(n.orderCols), ", x.")
			}
		}
		childCols := make([]string, 0, len(es.On))
		for c := range es.On {
			childCols = append(childCols, c)
		}
		slices.Sort(childCols)
		if len(childCols) == 0 {
			errs = append(errs, fmt.Errorf("%s: on: needs at least one child column: parent column pair", w))
		}
		for _, c := range childCols {
			pc := es.On[c]
			cc, ok1 := ct.cols[c]
			pcc, ok2 := pct.cols[pc]
			if !ok1 {
				errs = append(errs, fmt.Errorf("%s: on: %s has no column %q", w, n.nameKey, c))
			}
			if !ok2 {
				errs = append(errs, fmt.Errorf("%s: on: %s has no column %q", w, parent.nameKey, pc))
			}
			if ok1 && ok2 && cc.oid != pcc.oid {
				errs = append(errs, fmt.Errorf("%s: on: %s.%s is %s but %s.%s is %s: a join needs equal types", w, n.nameKey, c, cc.typ, parent.nameKey, pc, pcc.typ))
			}
			if ok1 && ok2 {
				n.on = append(n.on, docJoin{child: mkCol(c, cc), parent: mkCol(pc, pcc)})
			}
		}
		// The sql mode finds a changed row's former parent from its old
		// tuple: it must hold the join columns (REPLICA IDENTITY FULL, or
		// the default identity when they are part of the primary key). The
		// memory mode has the old row in its state.
		joinInKey := true
		for c := range es.On {
			joinInKey = joinInKey && slices.Contains(ct.pkey, c)
		}
		if p.spec.Mode != ModeMemory && ct.replIdent != 'f' && !(ct.replIdent == 'd' && joinInKey) {
			errs = append(errs, fmt.Errorf("%s: table %s must send its old rows, so that a row that moves or is deleted recomposes its former parent: ALTER TABLE %s REPLICA IDENTITY FULL", w, n.nameKey, n.ident))
		}
		if n.depth > maxEmbedNesting {
			errs = append(errs, fmt.Errorf("%s: embeds nest at most %d deep", w, maxEmbedNesting))
		}
		parent.children = append(parent.children, n)
		errs = append(errs, resolveEmbeds(cat, w, n, es.Embed, p)...)
	}
	return errs
}

func quoteAll(names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = pgx.Identifier{n}.Sanitize()
	}
	return out
}

// warnIndexes warns about join columns that a query filters on without an
// index: the child's columns (composing a document reads its children by
// them) and the parent's, unless they are its key (a changed child finds
// its parents by them).
func warnIndexes(cat map[string]*catalogTable, n *docNode, log *zap.Logger) {
	if n.parent == nil || len(n.on) == 0 {
		return
	}
	check := func(t *docNode, col string) {
		ct := cat[t.nameKey]
		if ct == nil || slices.Contains(ct.indexed, col) {
			return
		}
		log.Warn("projection: a lookup column has no index; every lookup scans the table",
			zap.String("projection", n.proj.spec.Name), zap.String("table", t.nameKey), zap.String("column", col),
			zap.String("fix", fmt.Sprintf("CREATE INDEX ON %s (%s)", t.ident, pgx.Identifier{col}.Sanitize())))
	}
	check(n, n.on[0].child.name)
	if n.parent.parent != nil || n.on[0].parent.name != n.proj.key.name {
		check(n.parent, n.on[0].parent.name)
	}
}

// docChanges collects, for one transaction, the primary keys of the
// documents its changes affect, and the lookups still to run.
type docChanges struct {
	delta   memTxDelta                         // memory mode: what the transaction changed in the state
	keys    map[*docProjection]map[string]bool // document key → whether its primary row changed
	trunc   map[*docProjection]bool            // sql mode: the primary table was truncated
	pending map[*docNode]map[string][][]byte   // node → parent-column values (tuple key → values) to find parents by
}

func newDocChanges() *docChanges {
	return &docChanges{keys: make(map[*docProjection]map[string]bool), trunc: make(map[*docProjection]bool), pending: make(map[*docNode]map[string][][]byte)}
}

func (d *docChanges) empty() bool {
	return len(d.keys) == 0 && len(d.pending) == 0 && len(d.delta.ops) == 0 && len(d.trunc) == 0
}

// merge adds o's documents and lookups to d (o's delta is already
// committed).
func (d *docChanges) merge(o *docChanges) {
	for p, set := range o.keys {
		for k, root := range set {
			d.addKey(p, []byte(k), root)
		}
	}
	for p := range o.trunc {
		d.trunc[p] = true
	}
	for n, m := range o.pending {
		for _, vals := range m {
			d.addParentLookup(n, vals)
		}
	}
}

// size is how many documents and lookups d holds.
func (d *docChanges) size() int {
	n := 0
	for _, set := range d.keys {
		n += len(set)
	}
	for _, m := range d.pending {
		n += len(m)
	}
	return n
}

// addKey records that the document of p with key is affected; root says
// its primary row changed. A document whose primary row does not exist is
// published as deleted only if its primary row changed: a child that
// points at no parent (no foreign key) makes no document.
func (d *docChanges) addKey(p *docProjection, key []byte, root bool) {
	m := d.keys[p]
	if m == nil {
		m = make(map[string]bool)
		d.keys[p] = m
	}
	if had, ok := m[string(key)]; ok && (had || !root) {
		return // already recorded (no allocation)
	}
	m[string(key)] = root
}

// addParentLookup records that the parent rows of n whose join columns hold
// vals are affected.
func (d *docChanges) addParentLookup(n *docNode, vals [][]byte) {
	m := d.pending[n]
	if m == nil {
		m = make(map[string][][]byte)
		d.pending[n] = m
	}
	k := tupleKey(vals)
	if _, ok := m[k]; !ok {
		m[k] = cloneAll(vals)
	}
}

func tupleKey(vals [][]byte) string {
	var b strings.Builder
	for _, v := range vals {
		if v == nil {
			b.WriteString("\x00N")
			continue
		}
		b.WriteString("\x00V")
		b.Write(v)
	}
	return b.String()
}

// appendTupleValue appends value v (nil: NULL) of a tuple's key to b, as
// tupleKey writes it.
func appendTupleValue(b, v []byte) []byte {
	if v == nil {
		return append(b, "\x00N"...)
	}
	return append(append(b, "\x00V"...), v...)
}

func cloneAll(vals [][]byte) [][]byte {
	out := make([][]byte, len(vals))
	for i, v := range vals {
		if v != nil {
			out[i] = bytes.Clone(v)
		}
	}
	return out
}

// rowValue returns the text of column name in row, and whether the row has
// it (nil for NULL).
func rowValue(t *table, row *pglogrepl.TupleData, name string) ([]byte, bool) {
	i := t.column(name)
	if row == nil || i < 0 || i >= len(row.Columns) {
		return nil, false
	}
	c := row.Columns[i]
	switch c.DataType {
	case pglogrepl.TupleDataTypeText:
		return c.Data, true
	case pglogrepl.TupleDataTypeNull:
		return nil, true
	}
	return nil, false // unchanged TOAST: not sent
}

// observe maps change c of table t to the documents it affects (and, in
// memory mode, applies it to the state).
func (e *docEngine) observe(d *docChanges, t *table, c *change) error {
	if e.mem != nil {
		if err := e.memApply(d, t, c, &d.delta); err != nil {
			return err
		}
	}
	for _, n := range e.byTable[t.nameKey] {
		if n.mem != nil {
			continue
		}
		for _, row := range []*pglogrepl.TupleData{c.newRow, c.oldRow} {
			if row == nil {
				continue
			}
			if n.parent == nil {
				if v, ok := rowValue(t, row, n.proj.key.name); ok && v != nil {
					d.addKey(n.proj, v, true)
				}
				continue
			}
			vals := make([][]byte, len(n.on))
			ok := true
			for i, j := range n.on {
				v, has := rowValue(t, row, j.child.name)
				if !has || v == nil { // a NULL join value joins no parent
					ok = false
					break
				}
				vals[i] = v
			}
			if ok {
				d.addParentLookup(n, vals)
			}
		}
	}
	return nil
}

// observeTruncate: a truncated table of a projection affects every one of
// its documents whose relations it holds; the simplest exact answer is to
// recompose them all, which the engine does by reading every key.
func (e *docEngine) observeTruncate(ctx context.Context, d *docChanges, t *table) error {
	if e.mem != nil {
		e.memTruncate(d, t, &d.delta)
	}
	for _, n := range e.byTable[t.nameKey] {
		p := n.proj
		if n.mem != nil {
			continue
		}
		if n.parent == nil {
			d.trunc[p] = true // the documents are gone, and their keys unknown: one truncate event
			continue
		}
		rows, err := e.pool.Query(ctx, "SELECT "+p.key.ident+" FROM "+p.root.ident, textResults)
		if err != nil {
			return fmt.Errorf("postgres: projection %q: %w", p.spec.Name, err)
		}
		for rows.Next() {
			d.addKey(p, bytes.Clone(rows.RawValues()[0]), false)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
	}
	return nil
}

// resolve runs the pending parent lookups, deepest relations first, until
// every affected document is known by its primary key.
func (e *docEngine) resolve(ctx context.Context, d *docChanges) error {
	for len(d.pending) > 0 {
		var deepest *docNode
		for n := range d.pending {
			if deepest == nil || n.depth > deepest.depth || (n.depth == deepest.depth && n.nameKey < deepest.nameKey) {
				deepest = n
			}
		}
		tuples := d.pending[deepest]
		delete(d.pending, deepest)
		parent := deepest.parent
		p := deepest.proj
		// Direct: the join reaches the primary key itself, and the
		// child's value is the key's text (for a type whose equal values
		// can be written differently, the query below reads the key's).
		if parent.parent == nil && len(deepest.on) == 1 && deepest.on[0].parent.name == p.key.name && !textVaries(p.key.ctype.oid) {
			for _, vals := range tuples {
				d.addKey(p, vals[0], false)
			}
			continue
		}
		// Query the parent rows by the join columns: the root's keys, or
		// the parent's own join values towards its parent.
		var sel []string
		if parent.parent == nil {
			sel = []string{p.key.ident}
		} else {
			for _, j := range parent.on {
				sel = append(sel, j.child.ident)
			}
		}
		cols := make([]docCol, len(deepest.on))
		for i, j := range deepest.on {
			cols[i] = j.parent
		}
		list := make([][][]byte, 0, len(tuples))
		for _, v := range tuples {
			list = append(list, v)
		}
		err := e.queryByTuples(ctx, e.pool, parent, sel, cols, list, "", func(raw [][]byte) {
			if parent.parent == nil {
				if raw[0] != nil {
					d.addKey(p, raw[0], false)
				}
				return
			}
			for _, v := range raw {
				if v == nil {
					return
				}
			}
			d.addParentLookup(parent, raw)
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// textResults asks for every column of a query's result in text format:
// the type's output function writes it, as pgoutput does. A cast to text
// would not do: bool::text is "true" where the output is "t",
// inet::text always adds the netmask, char(n)::text drops the padding.
var textResults = pgx.QueryResultFormats{pgx.TextFormatCode}

// queryByTuples selects sel (as text) from n's rows whose cols hold one of
// tuples, in chunks, calling fn for each row (its values are valid during
// the call only).
func (e *docEngine) queryByTuples(ctx context.Context, q querier, n *docNode, sel []string, cols []docCol, tuples [][][]byte, order string, fn func(raw [][]byte)) error {
	chunk := e.chunk
	for start := 0; start < len(tuples); start += chunk {
		part := tuples[start:min(start+chunk, len(tuples))]
		args := make([]any, 1+len(cols))
		args[0] = textResults
		for ci := range cols {
			arr := make([]*string, len(part))
			for ti, t := range part {
				if t[ci] != nil {
					s := string(t[ci])
					arr[ti] = &s
				}
			}
			args[1+ci] = arr
		}
		sql := "SELECT " + strings.Join(sel, ", ") + " FROM " + n.ident + " AS x WHERE " + tupleFilter(cols)
		if order != "" {
			sql += " ORDER BY " + order
		}
		rows, err := q.Query(ctx, sql, args...)
		if err != nil {
			return fmt.Errorf("postgres: projection %q, %s: %w", n.proj.spec.Name, n.nameKey, err)
		}
		for rows.Next() {
			raw := rows.RawValues()
			fn(raw)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("postgres: projection %q, %s: %w", n.proj.spec.Name, n.nameKey, err)
		}
	}
	return nil
}

// tupleFilter is the WHERE condition "cols equal one of the tuples passed
// as one text array per column".
func tupleFilter(cols []docCol) string {
	if len(cols) == 1 {
		return cols[0].ident + " = ANY($1::text[]::" + cols[0].typ + "[])"
	}
	var lhs, un []string
	for i, c := range cols {
		lhs = append(lhs, c.ident)
		un = append(un, fmt.Sprintf("$%d::text[]::%s[]", i+1, c.typ))
	}
	return "(" + strings.Join(lhs, ", ") + ") IN (SELECT * FROM unnest(" + strings.Join(un, ", ") + "))"
}

// composedRow is one row of a relation, read for composing documents.
type composedRow struct {
	vals     [][]byte // the node's cols, text (nil: NULL)
	extra    [][]byte // the node's extras (joinExtras), text
	children [][]*composedRow
}

// joinExtras lists the columns of n its children join on that are not in
// its document columns: they are read too.
func joinExtras(n *docNode) []docCol {
	var out []docCol
	for _, c := range n.children {
		for _, j := range c.on {
			if !slices.ContainsFunc(n.cols, func(x docCol) bool { return x.name == j.parent.name }) &&
				!slices.ContainsFunc(out, func(x docCol) bool { return x.name == j.parent.name }) {
				out = append(out, j.parent)
			}
		}
	}
	return out
}

// value returns column name of row r of node n (from its columns or its
// extras).
func (n *docNode) value(r *composedRow, extras []docCol, name string) []byte {
	if i := slices.IndexFunc(n.cols, func(c docCol) bool { return c.name == name }); i >= 0 {
		return r.vals[i]
	}
	if i := slices.IndexFunc(extras, func(c docCol) bool { return c.name == name }); i >= 0 {
		return r.extra[i]
	}
	return nil
}

func idents(cols []docCol) []string {
	out := make([]string, len(cols))
	for i, c := range cols {
		out[i] = c.ident
	}
	return out
}

// compose reads the documents of p with the given keys and returns, for
// each key in order, its document (nil when the primary row is gone), and
// why a document could not be encoded (nil when every one could).
func (e *docEngine) compose(ctx context.Context, q querier, p *docProjection, keys [][]byte) (_ [][]byte, bad []error, _ error) {
	root := p.root
	tuples := make([][][]byte, len(keys))
	for i, k := range keys {
		tuples[i] = [][]byte{k}
	}
	extras := joinExtras(root)
	byKey := make(map[string]*composedRow, len(keys))
	var rows []*composedRow
	sel := append(append(idents(root.cols), idents(extras)...), p.key.ident)
	nc, nx := len(root.cols), len(extras)
	err := e.queryByTuples(ctx, q, root, sel, []docCol{p.key}, tuples, "", func(raw [][]byte) {
		r := &composedRow{vals: cloneAll(raw[:nc]), extra: cloneAll(raw[nc : nc+nx])}
		byKey[string(raw[nc+nx])] = r
		rows = append(rows, r)
	})
	if err != nil {
		return nil, nil, err
	}
	if err := e.fill(ctx, q, root, extras, rows); err != nil {
		return nil, nil, err
	}
	out := make([][]byte, len(keys))
	for i, k := range keys {
		r := byKey[string(k)]
		if r == nil {
			continue
		}
		b, err := appendDoc(make([]byte, 0, 512), root, r)
		if err != nil {
			if bad == nil {
				bad = make([]error, len(keys))
			}
			bad[i] = err
			continue
		}
		out[i] = b
	}
	return out, bad, nil
}

// fill reads the children of rows (of node n, read with extras),
// recursively.
func (e *docEngine) fill(ctx context.Context, q querier, n *docNode, extras []docCol, rows []*composedRow) error {
	if len(rows) == 0 {
		return nil
	}
	for _, r := range rows {
		r.children = make([][]*composedRow, len(n.children))
	}
	for ci, child := range n.children {
		// The parents by the values the child joins on (equal values,
		// not equal text: joinKey).
		oids := make([]uint32, len(child.on))
		for i, j := range child.on {
			oids[i] = j.parent.ctype.oid
		}
		parents := make(map[string][]*composedRow)
		var tuples [][][]byte
		for _, r := range rows {
			vals := make([][]byte, len(child.on))
			ok := true
			for i, j := range child.on {
				if vals[i] = n.value(r, extras, j.parent.name); vals[i] == nil {
					ok = false // NULL joins nothing
					break
				}
			}
			if !ok {
				continue
			}
			k := joinKey(oids, vals)
			if _, seen := parents[k]; !seen {
				tuples = append(tuples, vals)
			}
			parents[k] = append(parents[k], r)
		}
		cx := joinExtras(child)
		joinCols := make([]docCol, len(child.on))
		for i, j := range child.on {
			joinCols[i] = j.child
		}
		sel := append(append(idents(child.cols), idents(cx)...), idents(joinCols)...)
		nc, nx, nj := len(child.cols), len(cx), len(joinCols)
		var kids []*composedRow
		err := e.queryByTuples(ctx, q, child, sel, joinCols, tuples, child.orderBy, func(raw [][]byte) {
			kr := &composedRow{vals: cloneAll(raw[:nc]), extra: cloneAll(raw[nc : nc+nx])}
			for _, pr := range parents[joinKey(oids, raw[nc+nx:nc+nx+nj])] {
				pr.children[ci] = append(pr.children[ci], kr)
			}
			kids = append(kids, kr)
		})
		if err != nil {
			return err
		}
		if err := e.fill(ctx, q, child, cx, kids); err != nil {
			return err
		}
	}
	return nil
}

// appendDoc appends row r of node n as a JSON object with its embeds.
func appendDoc(b []byte, n *docNode, r *composedRow) ([]byte, error) {
	b = append(b, '{')
	var err error
	for i, c := range n.cols {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, c.jsonName...)
		if r.vals[i] == nil {
			b = append(b, "null"...)
			continue
		}
		if b, err = c.ctype.appendValue(b, r.vals[i]); err != nil {
			return nil, fmt.Errorf("projection %q, %s column %s: %w", n.proj.spec.Name, n.nameKey, c.name, err)
		}
	}
	for ci, child := range n.children {
		if len(n.cols) > 0 || ci > 0 {
			b = append(b, ',')
		}
		b = append(b, child.as...)
		kids := r.children[ci]
		if child.many {
			b = append(b, '[')
			for k, kr := range kids {
				if k > 0 {
					b = append(b, ',')
				}
				if b, err = appendDoc(b, child, kr); err != nil {
					return nil, err
				}
			}
			b = append(b, ']')
			continue
		}
		if len(kids) == 0 {
			b = append(b, "null"...)
			continue
		}
		if b, err = appendDoc(b, child, kids[0]); err != nil {
			return nil, err
		}
	}
	return append(b, '}'), nil
}

// events recomposes every document d names and appends their events, in
// the order of the projections and, within one, of their keys (a
// projection's truncate event first). id gives an event's id from its
// projection and key (nil: the truncate event).
func (e *docEngine) events(ctx context.Context, evs []broker.Outgoing, d *docChanges, t *txn, id func(p *docProjection, key []byte) string, flush func([]broker.Outgoing) ([]broker.Outgoing, error)) ([]broker.Outgoing, error) {
	lsn, commitTime := t.commitLSN, t.commitTime
	if len(d.pending) > 0 || slices.ContainsFunc(e.projs, func(p *docProjection) bool { return p.root.mem == nil && len(d.keys[p]) > 0 }) {
		// The sql mode reads the database: first wait until the
		// transaction is visible to new snapshots. Its commit reaches
		// logical decoding once it is in the WAL, a moment before other
		// sessions see it, and a read in that moment sees the rows as
		// they were before it.
		if err := e.waitVisible(ctx, t.xid); err != nil {
			return evs, err
		}
	}
	if err := e.resolve(ctx, d); err != nil {
		return evs, err
	}
	for _, p := range e.projs {
		if d.trunc[p] {
			evs = append(evs, truncateEventOn(p.subject, id(p, nil), lsn, commitTime))
		}
		set := d.keys[p]
		if len(set) == 0 {
			continue
		}
		keys := sortedKeys(set)
		// In groups, each handed to the publisher as it is composed: a
		// 100,000-document transaction is neither held whole nor waited
		// for before the first documents go.
		group := max(e.chunk*e.workers, 1024)
		var buf []byte
		docs, bad := make([][]byte, min(group, len(keys))), make([]error, min(group, len(keys)))
		for start := 0; start < len(keys); start += group {
			part := keys[start:min(start+group, len(keys))]
			docs, bad := docs[:len(part)], bad[:len(part)]
			clear(docs)
			clear(bad)
			if p.root.mem != nil { // memory mode: as of this commit, no query
				// The group's documents in one buffer, reused by the next
				// group: each is copied into its event.
				buf = buf[:0]
				for i, k := range part {
					start := len(buf)
					var ok bool
					buf, ok, bad[i] = e.appendMemDoc(buf, p, k)
					if ok && bad[i] == nil {
						docs[i] = buf[start:len(buf):len(buf)]
					}
				}
			} else if err := e.sqlCompose(ctx, p, part, docs, bad); err != nil {
				return evs, err
			}
			for i, k := range part {
				if docs[i] == nil && bad[i] == nil && !set[string(k)] {
					continue // no such document, and its primary row did not change
				}
				evs = append(evs, e.docEvent(p, k, docs[i], bad[i], id(p, k), lsn, commitTime))
			}
			var err error
			if evs, err = flush(evs); err != nil {
				return evs, err
			}
		}
	}
	return evs, nil
}

// sortedKeys lists the keys of set in byte order, in one allocation (and
// the slice's).
func sortedKeys(set map[string]bool) [][]byte {
	n := 0
	for k := range set {
		n += len(k)
	}
	arena := make([]byte, 0, n)
	keys := make([][]byte, 0, len(set))
	for k := range set {
		arena = append(arena, k...)
		keys = append(keys, arena[len(arena)-len(k):len(arena):len(arena)])
	}
	slices.SortFunc(keys, bytes.Compare)
	return keys
}

// sqlCompose re-reads the documents of keys into docs, and why one could
// not be encoded into bad: chunks of e.chunk
// keys, e.workers at a time. A chunk's queries (one per relation level)
// share one snapshot, so each document is the document at some commit, if
// not always the one that triggered it.
func (e *docEngine) sqlCompose(ctx context.Context, p *docProjection, keys, docs [][]byte, bad []error) error {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(e.workers)
	for start := 0; start < len(keys); start += e.chunk {
		end := min(start+e.chunk, len(keys))
		g.Go(func() error {
			var q querier = e.pool
			if len(p.root.children) > 0 {
				tx, err := e.pool.BeginTx(gctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
				if err != nil {
					return fmt.Errorf("postgres: projection %q: %w", p.spec.Name, err)
				}
				defer tx.Rollback(context.WithoutCancel(gctx))
				q = tx
			}
			out, b, err := e.compose(gctx, q, p, keys[start:end])
			copy(docs[start:end], out)
			copy(bad[start:end], b)
			return err
		})
	}
	return g.Wait()
}

// visibleSQL reports whether 32-bit xid $1 (committed) is visible to a new
// snapshot: the xid is extended with the epoch of the snapshot's xmax.
const visibleSQL = `
	SELECT txid_visible_in_snapshot(
	         (txid_snapshot_xmax(s) >> 32 << 32) + $1::bigint
	           - CASE WHEN $1::bigint > (txid_snapshot_xmax(s) & 4294967295) THEN 4294967296 ELSE 0 END,
	         s)
	FROM txid_current_snapshot() AS s`

// waitVisible waits until transaction xid is visible to new snapshots.
func (e *docEngine) waitVisible(ctx context.Context, xid uint32) error {
	if xid == 0 {
		return nil
	}
	for wait := 100 * time.Microsecond; ; wait = min(2*wait, 10*time.Millisecond) {
		rows, err := e.pool.Query(ctx, visibleSQL, int64(xid))
		if err != nil {
			return fmt.Errorf("postgres: transaction visibility: %w", err)
		}
		var visible bool
		for rows.Next() {
			if err := rows.Scan(&visible); err != nil {
				rows.Close()
				return err
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("postgres: transaction visibility: %w", err)
		}
		if visible {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
}

// docEvent is a document's event: upsert with the document, or delete. A
// document that could not be encoded (docErr), whose key cannot be, or
// whose event is over the broker's limit becomes its error event, reported
// (counted and logged) here.
func (e *docEngine) docEvent(p *docProjection, key, doc []byte, docErr error, id string, lsn pglogrepl.LSN, commitTime time.Time) broker.Outgoing {
	ev, keyJSON, err := encodeDocEvent(p, key, doc, id, lsn, commitTime)
	reason := badValue
	switch {
	case err != nil:
		err = fmt.Errorf("key: %w", err)
	case docErr != nil:
		err = docErr
	default:
		if err = sizeError(ev, e.maxEvent); err == nil {
			return ev
		}
		reason = badTooLarge
	}
	bad := &badRowError{reason: reason, source: "projection " + p.spec.Name, key: string(key), lsn: lsn, err: err}
	e.report(bad)
	return errorEvent(p.errSubject, bad, keyJSON, id, commitTime)
}

// encodeDocEvent builds a document's event, and returns its key as JSON
// (nil when the key cannot be encoded: the error says why).
func encodeDocEvent(p *docProjection, key, doc []byte, id string, lsn pglogrepl.LSN, commitTime time.Time) (_ broker.Outgoing, keyJSON []byte, _ error) {
	b := make([]byte, 0, 128+len(doc))
	b = append(b, `{"id":"`...)
	b = append(b, id...)
	if doc == nil {
		b = append(b, `","op":"delete","key":`...)
	} else {
		b = append(b, `","op":"upsert","key":`...)
	}
	start := len(b)
	b, err := p.key.ctype.appendValue(b, key)
	if err != nil {
		return broker.Outgoing{}, nil, err
	}
	keyJSON = b[start:len(b):len(b)]
	b = append(b, `,"lsn":"`...)
	b = appendLSN(b, lsn)
	b = append(b, `","commit_time":"`...)
	b = commitTime.UTC().AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","doc":`...)
	if doc == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, doc...)
	}
	b = append(b, '}')
	var sb [128]byte
	subject := appendSubjectToken(append(append(sb[:0], p.subject...), '.'), key)
	return broker.Outgoing{Subject: string(subject), Data: b, ID: id}, keyJSON, nil
}

// appendLSN appends lsn as lsn.String() writes it ("%X/%X").
func appendLSN(b []byte, lsn pglogrepl.LSN) []byte {
	b = appendUpperHex(b, uint64(lsn>>32))
	b = append(b, '/')
	return appendUpperHex(b, uint64(uint32(lsn)))
}

// appendUpperHex appends v in hexadecimal, with upper-case digits.
func appendUpperHex(b []byte, v uint64) []byte {
	start := len(b)
	b = strconv.AppendUint(b, v, 16)
	for i := start; i < len(b); i++ {
		if b[i] >= 'a' {
			b[i] -= 'a' - 'A'
		}
	}
	return b
}

// tableEventKeys keeps, of the publication's tables, those whose table
// events were asked for (tables, as --tables names them): with projections,
// a table publishes table events only if --tables names it.
func tableEventKeys(keys map[string][]string, tables []string) map[string][]string {
	out := make(map[string][]string)
	for _, t := range tables {
		s, n := splitTable(t)
		if k, ok := keys[qualified(s, n)]; ok {
			out[qualified(s, n)] = k
		}
	}
	return out
}

// Defaults of the sql mode.
const (
	docChunk   = 128 // keys per query
	docWorkers = 8   // concurrent queries
)

// newDocEngine resolves the projections against the catalog and opens the
// pool their queries run on, with the session settings pgoutput writes
// values in (so a re-read value is the text a change carries).
func (in *Ingest) newDocEngine(ctx context.Context, conn *pgx.Conn, types *typeCache) (*docEngine, error) {
	cfg := &in.cfg
	projs, cat, err := resolveProjections(ctx, conn, types, cfg.Projections, cfg.Prefix, in.log)
	if err != nil {
		return nil, errFatal{err}
	}
	pcfg, err := pgxpool.ParseConfig(cfg.DSN)
	if err != nil {
		return nil, errFatal{fmt.Errorf("postgres: %w", err)}
	}
	pcfg.MaxConns = docWorkers
	maps.Copy(pcfg.ConnConfig.RuntimeParams, outputParams)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: projection pool: %w", err)
	}
	e := &docEngine{projs: projs, byTable: make(map[string][]*docNode), pool: pool, chunk: docChunk, workers: docWorkers, maxEvent: in.maxEvent, report: in.reportBad}
	for _, p := range projs {
		for _, n := range p.nodes {
			e.byTable[n.nameKey] = append(e.byTable[n.nameKey], n)
		}
	}
	if slices.ContainsFunc(projs, func(p *docProjection) bool { return p.spec.Mode == ModeMemory }) {
		e.mem = newMemState(projs, cat)
		in.mem.Store(e.mem)
		path := filepath.Join(cfg.StateDir, cfg.Slot+".db")
		if e.store, err = openMemStore(path, cfg.Projections); err != nil {
			pool.Close()
			return nil, errFatal{err}
		}
		lsn, err := e.store.load(e.mem)
		if err != nil {
			e.close()
			return nil, errFatal{err}
		}
		rows, bytes := e.mem.stats()
		in.log.Info("projection: memory state", zap.String("file", path), zap.Stringer("lsn", lsn), zap.Int64("rows", rows), zap.Int64("value_bytes", bytes))
	}
	return e, nil
}

// advance stores that the memory state is at lsn, with no transaction
// between its last one and lsn (an idle slot's WAL end, about to be
// confirmed).
func (e *docEngine) advance(lsn pglogrepl.LSN) error {
	if e == nil || e.store == nil {
		return nil
	}
	return e.store.advance(e.mem, lsn)
}

// memLSN is the LSN the memory state was restored at (0: it was not, and
// must be bootstrapped), and whether there is one (memory-mode projections).
func (e *docEngine) memLSN() (pglogrepl.LSN, bool) {
	if e == nil || e.mem == nil {
		return 0, false
	}
	return e.mem.lsn, true
}

func (e *docEngine) close() {
	if e.pool != nil {
		e.pool.Close()
	}
	if e.store != nil {
		_ = e.store.close()
	}
}

// commitMem records a transaction's state changes (memory mode) for
// persisting once its events are acknowledged.
func (e *docEngine) commitMem(d *docChanges, end pglogrepl.LSN) {
	if e.mem == nil {
		return
	}
	e.mem.lsn = end
	if len(d.delta.ops) > 0 {
		d.delta.end = end
		e.mem.deltas = append(e.mem.deltas, d.delta)
	}
}

// persist writes the memory state's changes up to acked; the reader
// confirms acked to PostgreSQL only after.
func (e *docEngine) persist(acked pglogrepl.LSN) error {
	if e == nil || e.store == nil {
		return nil
	}
	return e.store.persist(e.mem, acked)
}
