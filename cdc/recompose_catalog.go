package cdc

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/fanwire/fanwire/cdc/pgjson"
	"github.com/fanwire/fanwire/jsonstr"
)

// Resolving projections: each ProjectionSpec is checked against the live
// catalog (loadCatalog) and becomes a docProjection, the tree of relations
// (docNode) that both modes track changes on and compose documents from.

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
	ident    string      // quoted
	typ      string      // format_type, for casts of text arrays
	ctype    pgjson.Type // how its values are encoded
	jsonName []byte      // "name":
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
	composer   composer // its mode's (docEngine.setComposers)
}

// querier runs queries: a pool, a connection or a transaction.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// catalogColumn is what the catalog says of a column.
type catalogColumn struct {
	oid       uint32      // pg_attribute.atttypid
	typ       string      // format_type
	ctype     pgjson.Type // how its values are encoded
	generated bool        // a generated column: pgoutput does not send it
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
func loadCatalog(ctx context.Context, q querier, types *pgjson.TypeCache, tables []string) (map[string]*catalogTable, error) {
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
	if err := types.Lookup(ctx, q, oids); err != nil {
		return nil, err
	}
	for _, ct := range out {
		if ct == nil {
			continue
		}
		for name, c := range ct.cols {
			c.ctype = types.Get(c.oid)
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
func resolveProjections(ctx context.Context, q querier, types *pgjson.TypeCache, specs []ProjectionSpec, prefix string, log *zap.Logger) ([]*docProjection, map[string]*catalogTable, error) {
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
	return docCol{name: name, ident: pgx.Identifier{name}.Sanitize(), typ: c.typ, ctype: c.ctype, jsonName: append(jsonstr.AppendBytes(nil, []byte(name)), ':')}
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
		n.as = append(jsonstr.AppendBytes(nil, []byte(es.As)), ':')
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
