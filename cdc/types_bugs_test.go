package cdc_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fanwire/fanwire/cdc"
	"github.com/fanwire/fanwire/cdc/pgtest"
)

// Failing tests of bugs found by TestColumnTypesAgree, each reduced to its
// smallest case.

// TestDomainEncodesAsItsBaseType: a domain's values are encoded as its
// base type's, on every path. The bootstrap's query reports a domain
// column with its base type (a number, an RFC 3339 time) while pgoutput's
// Relation messages and the catalog name the domain itself, whose values
// were strings: the same row changed JSON types between its bootstrap
// event and its first update, and a projection's documents disagreed with
// the table events. The memory mode, comparing a domain's values as
// bytes, also ordered keys and embeds 10 before 9.
func TestDomainEncodesAsItsBaseType(t *testing.T) {
	t.Parallel()
	bothModes(t, testDomainEncodesAsItsBaseType)
}

func testDomainEncodesAsItsBaseType(t *testing.T, mode string) {
	pg := pgtest.Start(t, pgtest.Config{})
	pg.Exec("postgres",
		"CREATE DOMAIN posint AS int4 CHECK (VALUE > 0)",
		"CREATE DOMAIN smallpos AS posint CHECK (VALUE < 1000)",
		"CREATE DOMAIN moment AS timestamptz",
		"CREATE TABLE d (id posint PRIMARY KEY, at moment)",
		"CREATE TABLE k (id int PRIMARY KEY, d_id posint, n smallpos)",
		"ALTER TABLE k REPLICA IDENTITY FULL",
		"INSERT INTO d VALUES (10, '2024-05-01 12:00:00+02'), (9, NULL)",
		"INSERT INTO k VALUES (1, 9, 10), (2, 9, 9)",
	)
	spec := []cdc.ProjectionSpec{{Name: "docs", Table: "d", Key: "id", Mode: mode, Embed: []cdc.EmbedSpec{
		{As: "ks", Table: "k", On: map[string]string{"d_id": "id"}, Many: true, OrderBy: "n", Columns: []string{"id", "n"}},
	}}}
	r := newRig(t, pg, func(c *cdc.Config) {
		c.Tables = []string{"d"}
		c.Projections = spec
		c.StateDir = t.TempDir()
	})
	evs := r.events(4)
	want := []struct{ subject, key, doc string }{
		{"db.d.9", `9`, `{"id":9,"at":null}`},
		{"db.d.10", `10`, `{"id":10,"at":"2024-05-01T10:00:00+00:00"}`},
		{"db.docs.9", `9`, `{"id":9,"at":null,"ks":[{"id":2,"n":9},{"id":1,"n":10}]}`},
		{"db.docs.10", `10`, `{"id":10,"at":"2024-05-01T10:00:00+00:00","ks":[]}`},
	}
	for i, w := range want {
		if evs[i].Subject != w.subject {
			t.Fatalf("bootstrap event %d on %s, want %s", i, evs[i].Subject, w.subject)
		}
		jsonEq(t, "bootstrap key of "+w.subject, evs[i].Key, w.key)
		jsonEq(t, "bootstrap doc of "+w.subject, evs[i].Doc, w.doc)
	}
	pg.Exec("postgres", "UPDATE d SET at = '2024-05-01 12:00:00+02' WHERE id = 9")
	evs = r.events(6)
	jsonEq(t, "tail key", evs[4].Key, `9`)
	jsonEq(t, "tail doc", evs[4].Doc, `{"id":9,"at":"2024-05-01T10:00:00+00:00"}`)
	jsonEq(t, "tail projection key", evs[5].Key, `9`)
	jsonEq(t, "tail projection doc", evs[5].Doc, `{"id":9,"at":"2024-05-01T10:00:00+00:00","ks":[{"id":2,"n":9},{"id":1,"n":10}]}`)
}

// TestArraysOfUserDefinedTypes: an array of an enum, of a domain or of a
// composite type is a JSON array, as an array of a built-in type is, with
// each element encoded as its type (a domain's as its base type). It was
// the array's text, one string ("{happy,\"sad ish\"}"), on every path:
// pgjson.AppendValue knows the built-in array types only.
func TestArraysOfUserDefinedTypes(t *testing.T) {
	t.Parallel()
	pg := pgtest.Start(t, pgtest.Config{})
	pg.Exec("postgres",
		`CREATE TYPE mood AS ENUM ('happy', 'sad ish', 'a,b{c}', 'NULL')`,
		"CREATE DOMAIN posint AS int4 CHECK (VALUE > 0)",
		"CREATE TYPE pair AS (a int, b text)",
		"CREATE TABLE a (id int PRIMARY KEY, moods mood[], ns posint[], ps pair[])",
		`INSERT INTO a VALUES (1, '{{happy,"sad ish"},{NULL,"a,b{c}"}}', '{1,NULL,3}', ARRAY[ROW(1, 'x "y"')::pair, NULL])`,
	)
	spec := func(mode string) cdc.ProjectionSpec {
		return cdc.ProjectionSpec{Name: "a" + mode, Table: "a", Key: "id", Mode: mode}
	}
	r := newRig(t, pg, func(c *cdc.Config) {
		c.Tables = []string{"a"}
		c.Projections = []cdc.ProjectionSpec{spec(cdc.ModeSQL), spec(cdc.ModeMemory)}
		c.StateDir = t.TempDir()
	})
	want := `{"id":1,"moods":[["happy","sad ish"],[null,"a,b{c}"]],"ns":[1,null,3],"ps":["(1,\"x \"\"y\"\"\")",null]}`
	for _, e := range r.events(3) {
		jsonEq(t, "bootstrap "+e.Subject, e.Doc, want)
	}
	pg.Exec("postgres", `UPDATE a SET moods = '{NULL,happy}' WHERE id = 1`)
	want = `{"id":1,"moods":[null,"happy"],"ns":[1,null,3],"ps":["(1,\"x \"\"y\"\"\")",null]}`
	for _, e := range r.events(6)[3:] {
		jsonEq(t, "tail "+e.Subject, e.Doc, want)
	}
}

// TestBootstrapLeavesOutGeneratedColumns: a table event has the columns
// pgoutput sends, at the bootstrap as on the tail. pgoutput does not send
// generated columns; the bootstrap's SELECT * did, so a row's bootstrap
// event had a field that its updates then lacked (neither null nor named
// unchanged).
func TestBootstrapLeavesOutGeneratedColumns(t *testing.T) {
	t.Parallel()
	pg := pgtest.Start(t, pgtest.Config{})
	pg.Exec("postgres",
		"CREATE TABLE g (id int PRIMARY KEY, x int, twice int GENERATED ALWAYS AS (x * 2) STORED, note text)",
		"INSERT INTO g (id, x, note) VALUES (1, 1, 'a')",
	)
	r := newRig(t, pg, nil)
	jsonEq(t, "bootstrap doc", r.events(1)[0].Doc, `{"id":1,"x":1,"note":"a"}`)
	pg.Exec("postgres", "UPDATE g SET x = 2")
	jsonEq(t, "tail doc", r.events(2)[1].Doc, `{"id":1,"x":2,"note":"a"}`)
}

// TestMemoryProjectionRefusesGeneratedColumns: a memory-mode projection
// cannot keep a generated column, which pgoutput does not send: the ingest
// says so at start, naming the column. It started, bootstrapped (the
// bootstrap reads with SQL), then failed on the first change of the table
// and reconnected forever ("column twice is not replicated").
func TestMemoryProjectionRefusesGeneratedColumns(t *testing.T) {
	t.Parallel()
	pg := pgtest.Start(t, pgtest.Config{})
	pg.Exec("postgres",
		"CREATE TABLE g (id int PRIMARY KEY, x int, twice int GENERATED ALWAYS AS (x * 2) STORED)",
		"INSERT INTO g (id, x) VALUES (1, 1)",
	)
	b, _ := jetStream(t)
	in, err := cdc.New(cdc.Config{DSN: pg.DSN("postgres"), Broker: b, StateDir: t.TempDir(), Retry: 100 * time.Millisecond,
		Projections: []cdc.ProjectionSpec{{Name: "g", Table: "g", Key: "id", Mode: cdc.ModeMemory}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- in.Run(ctx) }()
	waitFor(t, "the ingest to start or fail", 10*time.Second, func() bool { return in.Ready() || len(done) > 0 })
	pg.Exec("postgres", "UPDATE g SET x = 2")
	if err := <-done; err == nil || !strings.Contains(err.Error(), "public.g.twice is a generated column") {
		t.Fatalf("Run: %v; want an error naming the generated column", err)
	}
	// Without it, the projection runs.
	ok := []cdc.ProjectionSpec{{Name: "g", Table: "g", Key: "id", Mode: cdc.ModeMemory, Columns: []string{"id", "x"}}}
	r := newRig(t, pg, func(c *cdc.Config) { c.Projections = ok; c.StateDir = t.TempDir() })
	jsonEq(t, "bootstrap doc", r.events(1)[0].Doc, `{"id":1,"x":2}`)
	pg.Exec("postgres", "UPDATE g SET x = 3")
	jsonEq(t, "tail doc", r.events(2)[1].Doc, `{"id":1,"x":3}`)
}

// TestProjectionOrderByTiesByPrimaryKey: rows of a many list with equal
// order_by values come in primary key order, in both modes. They came in
// the order of the heap (sql) or of the state's index (memory): the order
// of their inserts, which the two modes could see differently after an
// update, and which a document's readers cannot tell from its data.
func TestProjectionOrderByTiesByPrimaryKey(t *testing.T) {
	t.Parallel()
	bothModes(t, testProjectionOrderByTiesByPrimaryKey)
}

func testProjectionOrderByTiesByPrimaryKey(t *testing.T, mode string) {
	pg := pgtest.Start(t, pgtest.Config{})
	pg.Exec("postgres",
		"CREATE TABLE p (id int PRIMARY KEY)",
		"CREATE TABLE c (id int PRIMARY KEY, p_id int, rank int)",
		"ALTER TABLE c REPLICA IDENTITY FULL",
		"INSERT INTO p VALUES (1)",
		"INSERT INTO c VALUES (3, 1, 5), (1, 1, 5), (4, 1, 1), (2, 1, 5)",
	)
	spec := []cdc.ProjectionSpec{{Name: "p", Table: "p", Key: "id", Mode: mode, Embed: []cdc.EmbedSpec{
		{As: "cs", Table: "c", On: map[string]string{"p_id": "id"}, Many: true, OrderBy: "rank", Columns: []string{"id"}},
	}}}
	r := newRig(t, pg, func(c *cdc.Config) { c.Projections = spec; c.StateDir = t.TempDir() })
	jsonEq(t, "bootstrap doc", r.events(1)[0].Doc, `{"id":1,"cs":[{"id":4},{"id":1},{"id":2},{"id":3}]}`)
	pg.Exec("postgres", "UPDATE c SET rank = 5 WHERE id = 4")
	jsonEq(t, "tail doc", r.events(2)[1].Doc, `{"id":1,"cs":[{"id":1},{"id":2},{"id":3},{"id":4}]}`)
}

// TestProjectionOrdersNumbersAndTimesAsPostgreSQL: a many list ordered by a
// float, a numeric, a date or a timestamp is in PostgreSQL's order in both
// modes: -Infinity first, NaN after Infinity; BC dates before AD ones,
// years past 9999 after 9999, -infinity first and infinity last. The
// memory mode compared the specials and every date as bytes ("0001-01-01
// BC" before "0044-03-15 BC", "10000-01-01" before "2024-05-01").
func TestProjectionOrdersNumbersAndTimesAsPostgreSQL(t *testing.T) {
	t.Parallel()
	bothModes(t, testProjectionOrdersNumbersAndTimesAsPostgreSQL)
}

func testProjectionOrdersNumbersAndTimesAsPostgreSQL(t *testing.T, mode string) {
	pg := pgtest.Start(t, pgtest.Config{})
	pg.Exec("postgres",
		"CREATE TABLE p (id int PRIMARY KEY)",
		"CREATE TABLE c (id int PRIMARY KEY, p_id int, f float8, n numeric, d date, ts timestamptz)",
		"ALTER TABLE c REPLICA IDENTITY FULL",
		"INSERT INTO p VALUES (1)",
		`INSERT INTO c VALUES
			(1, 1, 'NaN', 'NaN', 'infinity', 'infinity'),
			(2, 1, 'Infinity', 'Infinity', '2024-05-01', '2024-05-01 12:00:00.5+00'),
			(3, 1, '-Infinity', '-Infinity', '10000-01-01', '2024-05-01 12:00:00+00'),
			(4, 1, 1.5, 10.5, '-infinity', '0044-03-15 12:00:00+00 BC'),
			(5, 1, -2, -2, '0044-03-15 BC', '-infinity'),
			(6, 1, 1e300, 9.75, '0001-01-01 BC', '10000-01-01 00:00:00+00')`,
	)
	by := func(col string) cdc.EmbedSpec {
		return cdc.EmbedSpec{As: col, Table: "c", On: map[string]string{"p_id": "id"}, Many: true, OrderBy: col, Columns: []string{"id"}}
	}
	spec := []cdc.ProjectionSpec{{Name: "p", Table: "p", Key: "id", Mode: mode, Embed: []cdc.EmbedSpec{by("f"), by("n"), by("d"), by("ts")}}}
	r := newRig(t, pg, func(c *cdc.Config) { c.Projections = spec; c.StateDir = t.TempDir() })
	ids := func(l ...int) string {
		var s []string
		for _, id := range l {
			s = append(s, fmt.Sprintf(`{"id":%d}`, id))
		}
		return "[" + strings.Join(s, ",") + "]"
	}
	jsonEq(t, "bootstrap doc", r.events(1)[0].Doc, `{"id":1,"f":`+ids(3, 5, 4, 6, 2, 1)+`,"n":`+ids(3, 5, 6, 4, 2, 1)+
		`,"d":`+ids(4, 5, 6, 2, 3, 1)+`,"ts":`+ids(5, 4, 3, 2, 6, 1)+`}`)
}

// TestDomainOverAVectorIsAString: a domain over int2vector or oidvector
// (built-in types with an element type that print as "1 2", not as an
// array) is a string, as its base type is; the catalog lookup must not
// take it for an array (which would report its values malformed and stop
// the ingest).
func TestDomainOverAVectorIsAString(t *testing.T) {
	t.Parallel()
	pg := pgtest.Start(t, pgtest.Config{})
	pg.Exec("postgres",
		"CREATE DOMAIN cols AS int2vector",
		"CREATE TABLE v (id int PRIMARY KEY, c cols)",
		"INSERT INTO v VALUES (1, '1 2')",
	)
	r := newRig(t, pg, nil)
	jsonEq(t, "bootstrap doc", r.events(1)[0].Doc, `{"id":1,"c":"1 2"}`)
	pg.Exec("postgres", "INSERT INTO v VALUES (2, '3')")
	jsonEq(t, "tail doc", r.events(2)[1].Doc, `{"id":2,"c":"3"}`)
}

// TestProjectionJoinsEqualValues: a child row belongs to the parent row
// whose join columns equal its own, as PostgreSQL compares them, in both
// modes: a numeric 1.5 joins a numeric(8,2) key 1.50, a char(8) 'ab' a
// char(4) 'ab'. Both modes matched the values' text ("1.5" against "1.50",
// "ab      " against "ab  "): the children were never embedded, and a
// child's change to a document found by its key text was lost.
func TestProjectionJoinsEqualValues(t *testing.T) {
	t.Parallel()
	bothModes(t, testProjectionJoinsEqualValues)
}

func testProjectionJoinsEqualValues(t *testing.T, mode string) {
	pg := pgtest.Start(t, pgtest.Config{})
	pg.Exec("postgres",
		"CREATE TABLE p (k numeric(8,2) PRIMARY KEY, code char(4))",
		"CREATE TABLE c (id int PRIMARY KEY, p_k numeric)",
		"CREATE TABLE d (id int PRIMARY KEY, code char(8))",
		"ALTER TABLE c REPLICA IDENTITY FULL",
		"ALTER TABLE d REPLICA IDENTITY FULL",
		"INSERT INTO p VALUES (1.5, 'ab')",
		"INSERT INTO c VALUES (1, 1.5)",
		"INSERT INTO d VALUES (1, 'ab')",
	)
	spec := []cdc.ProjectionSpec{{Name: "p", Table: "p", Key: "k", Mode: mode, Embed: []cdc.EmbedSpec{
		{As: "cs", Table: "c", On: map[string]string{"p_k": "k"}, Many: true},
		{As: "ds", Table: "d", On: map[string]string{"code": "code"}, Many: true, Columns: []string{"id"}},
	}}}
	r := newRig(t, pg, func(c *cdc.Config) { c.Projections = spec; c.StateDir = t.TempDir() })
	ev := r.events(1)[0]
	if ev.Subject != "db.p.1%2E50" {
		t.Fatalf("bootstrap event on %s, want db.p.1%%2E50", ev.Subject)
	}
	jsonEq(t, "bootstrap doc", ev.Doc, `{"k":"1.50","code":"ab  ","cs":[{"id":1,"p_k":"1.5"}],"ds":[{"id":1}]}`)
	pg.Exec("postgres", "INSERT INTO c VALUES (2, 1.500)")
	ev = r.events(2)[1]
	if ev.Subject != "db.p.1%2E50" {
		t.Fatalf("event of the new child on %s, want db.p.1%%2E50", ev.Subject)
	}
	jsonEq(t, "doc after the new child", ev.Doc, `{"k":"1.50","code":"ab  ","cs":[{"id":1,"p_k":"1.5"},{"id":2,"p_k":"1.500"}],"ds":[{"id":1}]}`)
	pg.Exec("postgres", "INSERT INTO d VALUES (2, 'ab ')")
	ev = r.events(3)[2]
	jsonEq(t, "doc after the new d", ev.Doc, `{"k":"1.50","code":"ab  ","cs":[{"id":1,"p_k":"1.5"},{"id":2,"p_k":"1.500"}],"ds":[{"id":1},{"id":2}]}`)
}
