package cdc

import (
	"context"
	"fmt"
	"slices"
)

// colType is how a column's values are encoded: AppendValue's mapping of
// the type they are underneath. A domain is encoded as its base type (a
// domain over a domain, as the base at the bottom), so that a column keeps
// its JSON whichever path reads it: pgoutput's Relation messages and the
// catalog name the domain, a query's row description its base type. An
// array of a user-defined type (an enum, a domain, a composite type), which
// AppendValue cannot know, is a JSON array of its elements, each encoded
// as its element type (a domain's as its base type).
type colType struct {
	oid   uint32 // the column's type, or a domain's base type
	elem  uint32 // an array of a user-defined type: its element type, or that domain's base type; else 0
	delim byte   // with elem: the element type's delimiter (pg_type.typdelim)
}

func (c colType) appendValue(dst, text []byte) ([]byte, error) {
	if c.elem != 0 {
		return AppendArray(dst, c.elem, c.delim, text)
	}
	return AppendValue(dst, c.oid, text)
}

// firstUserOID is PostgreSQL's FirstGenbkiObjectId: no type below it is a
// domain, and AppendValue knows every array type below it. Types at or
// above it (user-defined, and those initdb creates with SQL, such as
// information_schema's domains) are looked up in the catalog.
const firstUserOID = 10000

// typeCache resolves type OIDs to their colType from the catalog, once
// each: a type's base type never changes (a dropped type's OID is not
// reused soon), so entries stay valid across reconnects. It is owned by
// the goroutine that runs the ingest's connections (the start-up and the
// bootstrap, then the reader); it has no lock.
type typeCache struct {
	m map[uint32]colType
}

func newTypeCache() *typeCache { return &typeCache{m: make(map[uint32]colType)} }

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

// lookup resolves the OIDs the cache does not know yet with q. A type the
// catalog no longer has (dropped since the change was written) keeps its
// OID: its values are strings.
func (c *typeCache) lookup(ctx context.Context, q querier, oids []uint32) error {
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
	found := make(map[uint32]colType, len(todo))
	var elems []uint32
	for rows.Next() {
		var start, base, elem uint32
		var delim string
		if err := rows.Scan(&start, &base, &elem, &delim); err != nil {
			return fmt.Errorf("postgres: read the catalog's types: %w", err)
		}
		t := colType{oid: base}
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
	if err := c.lookup(ctx, q, elems); err != nil {
		return err
	}
	for o, t := range found {
		if t.elem != 0 {
			t.elem = c.get(t.elem).oid
			found[o] = t
		}
	}
	for _, o := range todo {
		t, ok := found[o]
		if !ok {
			t = colType{oid: o}
		}
		c.m[o] = t
	}
	return nil
}

// get returns the colType of oid, as looked up (an OID not looked up is
// taken as is).
func (c *typeCache) get(oid uint32) colType {
	if t, ok := c.m[oid]; ok {
		return t
	}
	return colType{oid: oid}
}
