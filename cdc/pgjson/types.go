package pgjson

import (
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
)

// Type is how a column's values are encoded: AppendValue's mapping of
// the type they are underneath. A domain is encoded as its base type (a
// domain over a domain, as the base at the bottom), so that a column keeps
// its JSON whichever path reads it: pgoutput's Relation messages and the
// catalog name the domain, a query's row description its base type. An
// array of a user-defined type (an enum, a domain, a composite type), which
// AppendValue cannot know, is a JSON array of its elements, each encoded
// as its element type (a domain's as its base type).
//
// A TypeCache's Get returns a column type's Type; Type{OID: oid} takes oid
// as is (AppendValue's encoding of it), as for a built-in type.
type Type struct {
	OID   uint32 // the column's type, or a domain's base type
	elem  uint32 // an array of a user-defined type: its element type, or that domain's base type; else 0
	delim byte   // with elem: the element type's delimiter (pg_type.typdelim)
}

// Append appends the JSON encoding of one value of type c, given in
// PostgreSQL's text output format, to dst, as AppendValue does.
func (c Type) Append(dst, text []byte) ([]byte, error) {
	if c.elem != 0 {
		return AppendArray(dst, c.elem, c.delim, text)
	}
	return AppendValue(dst, c.OID, text)
}

// firstUserOID is PostgreSQL's FirstGenbkiObjectId: no type below it is a
// domain, and AppendValue knows every array type below it. Types at or
// above it (user-defined, and those initdb creates with SQL, such as
// information_schema's domains) are looked up in the catalog.
const firstUserOID = 10000

// TypeCache resolves type OIDs to their Type from the catalog, once
// each: a type's base type never changes (a dropped type's OID is not
// reused soon), so entries stay valid across reconnects. It has no lock:
// one goroutine at a time owns it (Lookup and Get).
type TypeCache struct {
	m map[uint32]Type // owned by the cache's goroutine
}

// NewTypeCache returns an empty cache.
func NewTypeCache() *TypeCache { return &TypeCache{m: make(map[uint32]Type)} }

// Querier runs a query: a pgx pool, connection or transaction.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// baseTypeSQL follows each of $1's OIDs through domains to the type at the
// bottom and, when that is an array (in the array category, variable
// length, with an element type: what CREATE TYPE makes for every type's
// array), returns its element type and the element type's delimiter.
const baseTypeSQL = `
	WITH RECURSIVE d(start, oid, depth) AS (
		SELECT o, o, 0 FROM unnest($1::oid[]) AS o
		UNION ALL
		SELECT d.start, t.typbasetype, d.depth + 1 FROM d JOIN pg_type t ON t.oid = d.oid WHERE t.typtype = 'd'
	)
	SELECT DISTINCT ON (d.start) d.start, d.oid,
	       CASE WHEN t.typcategory = 'A' AND t.typlen = -1 AND t.typelem <> 0 THEN t.typelem ELSE 0::oid END,
	       coalesce(e.typdelim::text, ',')
	FROM d
	LEFT JOIN pg_type t ON t.oid = d.oid
	LEFT JOIN pg_type e ON e.oid = t.typelem
	ORDER BY d.start, d.depth DESC`

// Lookup resolves the OIDs the cache does not know yet with q. A type the
// catalog no longer has (dropped since the change was written) keeps its
// OID: its values are strings. Types below 10000 (built-in; none is a
// domain) are never looked up.
func (c *TypeCache) Lookup(ctx context.Context, q Querier, oids []uint32) error {
	var todo []uint32
	for _, o := range oids {
		if _, ok := c.m[o]; !ok && o >= firstUserOID && !slices.Contains(todo, o) {
			todo = append(todo, o)
		}
	}
	if len(todo) == 0 {
		return nil
	}
	rows, err := q.Query(ctx, baseTypeSQL, todo)
	if err != nil {
		return fmt.Errorf("postgres: read the catalog's types: %w", err)
	}
	defer rows.Close()
	found := make(map[uint32]Type, len(todo))
	var elems []uint32
	for rows.Next() {
		var start, base, elem uint32
		var delim string
		if err := rows.Scan(&start, &base, &elem, &delim); err != nil {
			return fmt.Errorf("postgres: read the catalog's types: %w", err)
		}
		t := Type{OID: base}
		// A built-in array is AppendValue's; a built-in type with an
		// element type that is no array (int2vector, oidvector) a string.
		if elem != 0 && base >= firstUserOID && len(delim) == 1 {
			t.elem, t.delim = elem, delim[0]
			elems = append(elems, elem)
		}
		found[start] = t
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("postgres: read the catalog's types: %w", err)
	}
	rows.Close()
	// The elements' own base types (an array of a domain). An element is
	// no array, but may be a domain over one: then it is AppendValue's
	// array, or a string.
	if err := c.Lookup(ctx, q, elems); err != nil {
		return err
	}
	for o, t := range found {
		if t.elem != 0 {
			t.elem = c.Get(t.elem).OID
			found[o] = t
		}
	}
	for _, o := range todo {
		t, ok := found[o]
		if !ok {
			t = Type{OID: o}
		}
		c.m[o] = t
	}
	return nil
}

// Get returns the Type of oid, as looked up (an OID not looked up is
// taken as is).
func (c *TypeCache) Get(oid uint32) Type {
	if t, ok := c.m[oid]; ok {
		return t
	}
	return Type{OID: oid}
}
