package pgjson

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/fanwire/fanwire/cdc/pgtest"
)

// valueColumns is a table with a column of each kind AppendValue treats
// differently, and of several kinds it passes on as strings.
const valueColumns = `
	i2 int2, i4 int4, i8 int8, o oid, f4 float4, f8 float8, n numeric, n2 numeric(12,2), b bool,
	j json, jb jsonb, t text, vc varchar(20), c char(6), nm name, u uuid, ip inet, cidr cidr,
	mac macaddr, iv interval, m money, x xml, e mood, d posint, ts timestamp, tstz timestamptz,
	dt date, tm time, ttz timetz, by bytea, rng int4range, tsv tsvector, pt point, comp pair,
	ai int4[], ai8 int8[], at text[], ab bytea[], atz timestamptz[], ajb jsonb[], an numeric[],
	abo bool[], af float8[], abox box[], ae mood[], ad date[]`

// valueCase is one value written with the SQL expression lit into column
// col, read back in text format after the statement set (if any), and
// the JSON AppendValue must make of it.
type valueCase struct {
	col, lit, set, want string
}

var valueCases = []valueCase{
	{col: "i2", lit: `-32768`, want: `-32768`},
	{col: "i2", lit: `32767`, want: `32767`},
	{col: "i4", lit: `0`, want: `0`},
	{col: "i4", lit: `-2147483648`, want: `-2147483648`},
	{col: "i8", lit: `-9223372036854775808`, want: `-9223372036854775808`},
	{col: "i8", lit: `9223372036854775807`, want: `9223372036854775807`},
	{col: "o", lit: `4294967295`, want: `4294967295`},

	{col: "f4", lit: `1.5`, want: `1.5`},
	{col: "f4", lit: `3.4028235e38`, want: `3.4028235e+38`},
	{col: "f4", lit: `'NaN'`, want: `"NaN"`},
	{col: "f4", lit: `'-Infinity'`, want: `"-Infinity"`},
	{col: "f8", lit: `0.1`, want: `0.1`},
	{col: "f8", lit: `1e300`, want: `1e+300`},
	{col: "f8", lit: `'-0'`, want: `-0`},
	{col: "f8", lit: `5e-324`, want: `5e-324`},
	{col: "f8", lit: `123456789012345678`, want: `1.2345678901234568e+17`},
	{col: "f8", lit: `'Infinity'`, want: `"Infinity"`},
	{col: "f8", lit: `'NaN'`, want: `"NaN"`},

	{col: "n", lit: `123456789012345678901234567890.123456789`, want: `"123456789012345678901234567890.123456789"`},
	{col: "n", lit: `-0.000001`, want: `"-0.000001"`},
	{col: "n", lit: `1e-5`, want: `"0.00001"`},
	{col: "n", lit: `1e20`, want: `"100000000000000000000"`},
	{col: "n", lit: `'NaN'`, want: `"NaN"`},
	{col: "n", lit: `'Infinity'`, want: `"Infinity"`},
	{col: "n", lit: `'-Infinity'`, want: `"-Infinity"`},
	{col: "n2", lit: `12.5`, want: `"12.50"`},

	{col: "b", lit: `true`, want: `true`},
	{col: "b", lit: `false`, want: `false`},

	{col: "j", lit: `'{"a": "\u00e9\ud83d\ude00", "b": [1, 2.5e3, null]}'`, want: `{"a": "\u00e9\ud83d\ude00", "b": [1, 2.5e3, null]}`},
	{col: "j", lit: `'{"k": "\u0000"}'`, want: `{"k": "\u0000"}`},
	{col: "j", lit: `E'[1,\n  2]'`, want: "[1,\n  2]"},
	{col: "j", lit: `'"just a string"'`, want: `"just a string"`},
	{col: "jb", lit: `'{"b": [1, 2.5e3, null], "a": "\u00e9\ud83d\ude00"}'`, want: `{"a": "é😀", "b": [1, 2500, null]}`},
	{col: "jb", lit: `'{"q": "say \"hi\"\n"}'`, want: `{"q": "say \"hi\"\n"}`},
	{col: "jb", lit: `'null'`, want: `null`},

	{col: "t", lit: `E'h\u00e9llo "w" \\ back\nline\ttab\x01end😀'`, want: `"héllo \"w\" \\ back\nline\ttab\u0001end😀"`},
	{col: "t", lit: `''`, want: `""`},
	{col: "vc", lit: `'abc'`, want: `"abc"`},
	{col: "c", lit: `'ab'`, want: `"ab    "`},
	{col: "nm", lit: `'pg_class'`, want: `"pg_class"`},
	{col: "u", lit: `'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11'`, want: `"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"`},
	{col: "ip", lit: `'192.168.0.1/24'`, want: `"192.168.0.1/24"`},
	{col: "ip", lit: `'::1'`, want: `"::1"`},
	{col: "cidr", lit: `'10.0.0.0/8'`, want: `"10.0.0.0/8"`},
	{col: "mac", lit: `'08-00-2B-01-02-03'`, want: `"08:00:2b:01:02:03"`},
	{col: "iv", lit: `'1 year 2 months 3 days 4 hours 5 minutes 6.5 seconds'`, want: `"1 year 2 mons 3 days 04:05:06.5"`},
	{col: "m", lit: `1234.5`, want: `"$1,234.50"`},
	{col: "x", lit: `'<a b="c">d</a>'`, want: `"<a b=\"c\">d</a>"`},
	{col: "e", lit: `'sad ish'`, want: `"sad ish"`},
	{col: "d", lit: `42`, want: `"42"`}, // a domain has its own OID: the ingest passes its base type instead (Type)
	{col: "rng", lit: `'[1,10)'`, want: `"[1,10)"`},
	{col: "tsv", lit: `'a fat cat'`, want: `"'a' 'cat' 'fat'"`},
	{col: "pt", lit: `'(1,2)'`, want: `"(1,2)"`},
	{col: "comp", lit: `ROW(1, 'a "q"')`, want: `"(1,\"a \"\"q\"\"\")"`},

	{col: "ts", lit: `'2024-05-01 12:34:56.789'`, want: `"2024-05-01T12:34:56.789"`},
	{col: "ts", lit: `'2024-05-01 00:00:00'`, want: `"2024-05-01T00:00:00"`},
	{col: "ts", lit: `'0044-03-15 12:00:00 BC'`, want: `"-000043-03-15T12:00:00"`},
	{col: "ts", lit: `'10000-01-01 00:00:00.000001'`, want: `"+010000-01-01T00:00:00.000001"`},
	{col: "ts", lit: `'infinity'`, want: `"infinity"`},
	{col: "ts", lit: `'-infinity'`, want: `"-infinity"`},
	{col: "tstz", lit: `'2024-05-01 12:34:56.789+02'`, want: `"2024-05-01T10:34:56.789+00:00"`},
	{col: "tstz", lit: `'2024-05-01 12:34:56.789+02'`, set: `SET TimeZone = 'Europe/Berlin'`, want: `"2024-05-01T12:34:56.789+02:00"`},
	{col: "tstz", lit: `'2024-05-01 12:34:56.789+02'`, set: `SET TimeZone = 'Asia/Kolkata'`, want: `"2024-05-01T16:04:56.789+05:30"`},
	{col: "tstz", lit: `'2024-05-01 12:34:56.789+02'`, set: `SET TimeZone = 'America/St_Johns'`, want: `"2024-05-01T08:04:56.789-02:30"`},
	{col: "tstz", lit: `'2024-01-01 00:00:00+00'`, set: `SET TimeZone = 'America/Los_Angeles'`, want: `"2023-12-31T16:00:00-08:00"`},
	// Liberia kept -0:44:30 until 1972: PostgreSQL writes the seconds,
	// RFC 3339 cannot, so the value comes out in UTC.
	{col: "tstz", lit: `'1970-01-01 00:00:00.5+00'`, set: `SET TimeZone = 'Africa/Monrovia'`, want: `"1970-01-01T00:00:00.5+00:00"`},
	{col: "tstz", lit: `'0044-03-15 12:00:00+00 BC'`, want: `"-000043-03-15T12:00:00+00:00"`},
	{col: "tstz", lit: `'294276-12-31 23:59:59.999999+00'`, want: `"+294276-12-31T23:59:59.999999+00:00"`},
	{col: "tstz", lit: `'infinity'`, want: `"infinity"`},
	{col: "tstz", lit: `'-infinity'`, want: `"-infinity"`},
	{col: "dt", lit: `'2024-05-01'`, want: `"2024-05-01"`},
	{col: "dt", lit: `'0001-01-01 BC'`, want: `"+000000-01-01"`},
	{col: "dt", lit: `'5874897-12-31'`, want: `"+5874897-12-31"`},
	{col: "dt", lit: `'infinity'`, want: `"infinity"`},
	{col: "tm", lit: `'12:34:56.789'`, want: `"12:34:56.789"`},
	{col: "tm", lit: `'24:00:00'`, want: `"24:00:00"`},
	{col: "ttz", lit: `'12:34:56+05:30'`, want: `"12:34:56+05:30"`},

	{col: "by", lit: `'\x00010203ff'`, want: `"AAECA/8="`},
	{col: "by", lit: `'\x'`, want: `""`},
	{col: "by", lit: `'\x61005c62ff'`, set: `SET bytea_output = escape`, want: `"YQBcYv8="`},
	// Over the encoder's 384-byte chunk, in both formats.
	{col: "by", lit: `decode(repeat('00ab', 500), 'hex')`, want: `"` + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0, 0xab}, 500)) + `"`},
	{col: "by", lit: `decode(repeat('5c61', 500) || '01', 'hex')`, set: `SET bytea_output = escape`, want: `"` + base64.StdEncoding.EncodeToString(append(bytes.Repeat([]byte(`\a`), 500), 1)) + `"`},

	{col: "ai", lit: `'{1,2,3}'`, want: `[1,2,3]`},
	{col: "ai", lit: `'{}'`, want: `[]`},
	{col: "ai", lit: `'{{1,2},{3,NULL}}'`, want: `[[1,2],[3,null]]`},
	{col: "ai", lit: `'[0:2]={1,2,3}'`, want: `[1,2,3]`},
	{col: "ai", lit: `'[0:1][-1:0]={{1,2},{3,4}}'`, want: `[[1,2],[3,4]]`},
	{col: "ai8", lit: `'{{{-9223372036854775808}},{{9223372036854775807}}}'`, want: `[[[-9223372036854775808]],[[9223372036854775807]]]`},
	{col: "at", lit: `ARRAY['a"b', 'c\d', 'e,f', '{g}', ' h ', 'NULL', NULL, '', 'ünï😀', 'x y', E'tab\there']`,
		want: `["a\"b","c\\d","e,f","{g}"," h ","NULL",null,"","ünï😀","x y","tab\there"]`},
	{col: "at", lit: `'{{a,b},{"c}",NULL}}'`, want: `[["a","b"],["c}",null]]`},
	{col: "ab", lit: `ARRAY['\x0001'::bytea, '\x', NULL]`, want: `["AAE=","",null]`},
	{col: "atz", lit: `ARRAY['2024-05-01 12:34:56.789+02'::timestamptz, 'infinity', '0044-03-15 12:00:00+00 BC']`,
		set: `SET TimeZone = 'Asia/Kolkata'`, want: `["2024-05-01T16:04:56.789+05:30","infinity","-000043-03-15T12:00:00+00:00"]`},
	{col: "ajb", lit: `ARRAY['{"a": [1, "x,y\"}"]}'::jsonb, 'null', NULL]`, want: `[{"a": [1, "x,y\"}"]},null,null]`},
	{col: "an", lit: `ARRAY[1.50, NULL, 'NaN', 123456789012345678901234567890]::numeric[]`, want: `["1.50",null,"NaN","123456789012345678901234567890"]`},
	{col: "abo", lit: `'{t,f,NULL}'`, want: `[true,false,null]`},
	{col: "af", lit: `ARRAY['NaN', '-Infinity', 1.5, 1e300]::float8[]`, want: `["NaN","-Infinity",1.5,1e+300]`},
	{col: "abox", lit: `ARRAY['((0,0),(1,1))'::box, '((2,2),(3,3))']`, want: `["(1,1),(0,0)","(3,3),(2,2)"]`},
	{col: "ad", lit: `ARRAY['2024-05-01'::date, '0044-03-15 BC', 'infinity']`, want: `["2024-05-01","-000043-03-15","infinity"]`},
	// An array of a user-defined type has an OID AppendValue cannot know (the
	// ingest looks up its element type and calls AppendArray: Type).
	{col: "ae", lit: `ARRAY['happy', 'sad ish']::mood[]`, want: `"{happy,\"sad ish\"}"`},
}

// TestAppendValue writes each case's value into a real table, reads it
// back in text format (the simple protocol; pgoutput sends the same output
// functions' text) with DateStyle ISO, and encodes it with the column's
// type OID from pg_attribute, as a Relation message carries it.
func TestAppendValue(t *testing.T) {
	srv := pgtest.Start(t, pgtest.Config{})
	srv.Exec("postgres",
		`CREATE TYPE mood AS ENUM ('happy', 'sad ish')`,
		`CREATE DOMAIN posint AS int4 CHECK (VALUE > 0)`,
		`CREATE TYPE pair AS (a int, b text)`,
		`CREATE TABLE v (id serial PRIMARY KEY, `+valueColumns+`)`)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn := connectText(ctx, t, srv)

	oids := map[string]uint32{}
	rows, err := conn.Query(ctx, `SELECT attname, atttypid FROM pg_attribute WHERE attrelid = 'v'::regclass AND attnum > 0`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		raw := rows.RawValues()
		oids[string(raw[0])] = parseOID(t, raw[1])
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}

	for _, c := range valueCases {
		t.Run(c.col, func(t *testing.T) {
			oid, ok := oids[c.col]
			if !ok {
				t.Fatalf("no column %q", c.col)
			}
			if c.set != "" {
				if _, err := conn.Exec(ctx, c.set); err != nil {
					t.Fatal(err)
				}
				defer func() {
					if _, err := conn.Exec(ctx, "RESET ALL"); err != nil {
						t.Fatal(err)
					}
				}()
			}
			text := queryText(ctx, t, conn, fmt.Sprintf("INSERT INTO v (%[1]s) VALUES (%[2]s) RETURNING %[1]s", c.col, c.lit))
			got, err := AppendValue([]byte("x"), oid, text)
			if err != nil {
				t.Fatalf("%s %q: %v", c.lit, text, err)
			}
			if string(got[1:]) != c.want || got[0] != 'x' {
				t.Errorf("%s: PostgreSQL wrote %q\n got %s\nwant %s", c.lit, text, got[1:], c.want)
			}
			if !json.Valid(got[1:]) {
				t.Errorf("%s: invalid JSON %s", c.lit, got[1:])
			}
		})
	}

	// An array of a user-defined type: the caller looks up its element
	// type and delimiter and calls AppendArray.
	t.Run("AppendArray", func(t *testing.T) {
		var elem uint32
		var delim byte
		rows, err := conn.Query(ctx, `SELECT typelem, typdelim FROM pg_type WHERE oid = '_mood'::regtype`)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			raw := rows.RawValues()
			elem, delim = parseOID(t, raw[0]), raw[1][0]
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		text := queryText(ctx, t, conn, `SELECT '{{happy,"sad ish"},{NULL,happy}}'::mood[]`)
		got, err := AppendArray(nil, elem, delim, text)
		if want := `[["happy","sad ish"],[null,"happy"]]`; err != nil || string(got) != want {
			t.Errorf("AppendArray(%d, %q, %q) = %s, %v; want %s", elem, delim, text, got, err, want)
		}
	})
}

// connectText connects with the settings the replication connection uses,
// reading every value in text format.
func connectText(ctx context.Context, t *testing.T, srv *pgtest.Server) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(srv.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	cfg.RuntimeParams["DateStyle"] = "ISO"
	cfg.RuntimeParams["TimeZone"] = "UTC"
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// queryText returns the one value sql returns, as text.
func queryText(ctx context.Context, t *testing.T, conn *pgx.Conn, sql string) []byte {
	t.Helper()
	rows, err := conn.Query(ctx, sql)
	if err != nil {
		t.Fatal(err)
	}
	var text []byte
	for rows.Next() {
		text = bytes.Clone(rows.RawValues()[0])
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	if text == nil {
		t.Fatalf("%s: no value", sql)
	}
	return text
}

func parseOID(t *testing.T, b []byte) uint32 {
	t.Helper()
	var v uint32
	if _, err := fmt.Sscan(string(b), &v); err != nil {
		t.Fatalf("oid %q: %v", b, err)
	}
	return v
}

// TestArrayTypes checks the table of built-in array types against the
// server's pg_type, both ways, and each element type's delimiter.
func TestArrayTypes(t *testing.T) {
	srv := pgtest.Start(t, pgtest.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn := connectText(ctx, t, srv)
	rows, err := conn.Query(ctx, `SELECT typarray, oid, typname, typdelim FROM pg_type WHERE typarray <> 0 AND oid < 10000`)
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for rows.Next() {
		raw := rows.RawValues()
		arr, elem, name, delim := parseOID(t, raw[0]), parseOID(t, raw[1]), string(raw[2]), raw[3][0]
		seen++
		if got, ok := arrayElem[arr]; !ok || got != elem {
			t.Errorf("%s[] (%d): element %d, %v in the table; pg_type says %d", name, arr, got, ok, elem)
		}
		if want := byte(','); elem == pgtype.BoxOID {
			want = ';'
			if delim != want {
				t.Errorf("%s: delimiter %q, pg_type says %q", name, want, delim)
			}
		} else if delim != want {
			t.Errorf("%s: delimiter %q, pg_type says %q", name, want, delim)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if seen != len(arrayElem) {
		t.Errorf("pg_type has %d built-in array types, the table %d", seen, len(arrayElem))
	}
}

// TestAppendValueMalformed: text no output function writes is an error
// naming the kind, never a panic or invalid JSON.
func TestAppendValueMalformed(t *testing.T) {
	for _, c := range []struct {
		oid  uint32
		text string
	}{
		{pgtype.BoolOID, "true"},
		{pgtype.BoolOID, ""},
		{pgtype.Int4OID, ""},
		{pgtype.Int4OID, "12a"},
		{pgtype.Int4OID, "01"},
		{pgtype.Int8OID, "-"},
		{pgtype.Int8OID, "+1"},
		{pgtype.Float8OID, "1."},
		{pgtype.Float8OID, ".5"},
		{pgtype.Float8OID, "1e"},
		{pgtype.Float8OID, "inf"},
		{pgtype.NumericOID, "1e5"},
		{pgtype.NumericOID, "1."},
		{pgtype.NumericOID, "-"},
		{pgtype.NumericOID, `1"`},
		{pgtype.JSONBOID, `{"a":`},
		{pgtype.JSONOID, ``},
		{pgtype.ByteaOID, `\x0`},
		{pgtype.ByteaOID, `\xgg`},
		{pgtype.ByteaOID, `a\q`},
		{pgtype.ByteaOID, `a\400`},
		{pgtype.ByteaOID, `a\`},
		{pgtype.TimestamptzOID, "2024-05-01 12:34:56"},
		{pgtype.TimestamptzOID, "2024-05-01 12:34:56+2"},
		{pgtype.TimestamptzOID, "2024-05-01 12:34:56+02:3"},
		{pgtype.TimestamptzOID, "2024-05-01T12:34:56+02"},
		{pgtype.TimestamptzOID, "Wed May 01 12:34:56.789 2024 CEST"}, // DateStyle Postgres
		{pgtype.TimestampOID, "2024-05-01 12:34:56+02"},
		{pgtype.TimestampOID, "2024-05-01 12:34:56."},
		{pgtype.TimestampOID, "24-05-01 12:34:56"},
		{pgtype.DateOID, "05/01/2024"}, // DateStyle SQL
		{pgtype.DateOID, "2024-05-01 "},
		{pgtype.Int4ArrayOID, "{1,2"},
		{pgtype.Int4ArrayOID, "{1,,2}"},
		{pgtype.Int4ArrayOID, "{1,2}x"},
		{pgtype.Int4ArrayOID, "1,2"},
		{pgtype.Int4ArrayOID, "{a}"},
		{pgtype.Int4ArrayOID, "[1:2]{1,2}"},
		{pgtype.Int4ArrayOID, "[1]={1}"},
		{pgtype.Int4ArrayOID, "{{{{{{{1}}}}}}}"},
		{pgtype.TextArrayOID, `{"a}`},
		{pgtype.TextArrayOID, `{a"b}`},
		{pgtype.TextArrayOID, `{"a\"}`},
	} {
		_, err := AppendValue(nil, c.oid, []byte(c.text))
		if !errors.Is(err, ErrMalformedValue) {
			t.Errorf("AppendValue(%d, %q): error %v, want ErrMalformedValue", c.oid, c.text, err)
		}
	}
}

// TestAppendValueReplacesInvalidUTF8: a json value's strings with invalid
// UTF-8 (a SQL_ASCII database stores any bytes) are valid JSON, each
// invalid byte U+FFFD.
func TestAppendValueReplacesInvalidUTF8(t *testing.T) {
	got, err := AppendValue(nil, pgtype.JSONOID, []byte("[\"a\xffb\"]"))
	if want := "[\"a\ufffdb\"]"; err != nil || string(got) != want {
		t.Errorf("json with invalid UTF-8 = %q, %v; want %q", got, err, want)
	}
}

// row is a typical change: int8, text, timestamptz, numeric, bool, jsonb.
var row = []struct {
	oid  uint32
	text []byte
}{
	{pgtype.Int8OID, []byte("1234567890123")},
	{pgtype.TextOID, []byte(`Order #1234 for "Ada" shipped`)},
	{pgtype.TimestamptzOID, []byte("2024-05-01 12:34:56.789123+00")},
	{pgtype.NumericOID, []byte("1299.95")},
	{pgtype.BoolOID, []byte("t")},
	{pgtype.JSONBOID, []byte(`{"sku": "A-17", "qty": 3, "tags": ["gift", "express"]}`)},
}

func appendBenchRow(dst []byte) ([]byte, error) {
	dst = append(dst, '[')
	for i, c := range row {
		if i > 0 {
			dst = append(dst, ',')
		}
		var err error
		if dst, err = AppendValue(dst, c.oid, c.text); err != nil {
			return dst, err
		}
	}
	return append(dst, ']'), nil
}

// TestAppendValueAllocs: encoding into a buffer with room allocates
// nothing, escaped array elements included.
func TestAppendValueAllocs(t *testing.T) {
	buf := make([]byte, 0, 4096)
	arr := []byte(`{"a\"b","c\\d",NULL,"{}"}`)
	allocs := testing.AllocsPerRun(1000, func() { // 1000: a stray allocation of another goroutine rounds away
		dst, err := appendBenchRow(buf[:0])
		if err == nil {
			dst, err = AppendValue(dst, pgtype.TextArrayOID, arr)
		}
		if err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("%v allocations per row, want 0", allocs)
	}
}

func BenchmarkAppendValue(b *testing.B) {
	buf := make([]byte, 0, 4096)
	n := 0
	for _, c := range row {
		n += len(c.text)
	}
	b.SetBytes(int64(n))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := appendBenchRow(buf[:0]); err != nil {
			b.Fatal(err)
		}
	}
}

// FuzzAppendValue: whatever the text, AppendValue does not panic, keeps
// what dst held, and on success appends valid JSON.
func FuzzAppendValue(f *testing.F) {
	oids := []uint32{
		pgtype.BoolOID, pgtype.Int8OID, pgtype.Float8OID, pgtype.NumericOID, pgtype.JSONOID,
		pgtype.JSONBOID, pgtype.TextOID, pgtype.ByteaOID, pgtype.TimestamptzOID, pgtype.TimestampOID,
		pgtype.DateOID, pgtype.Int4ArrayOID, pgtype.TextArrayOID, pgtype.ByteaArrayOID,
		pgtype.JSONBArrayOID, pgtype.TimestamptzArrayOID, pgtype.BoxArrayOID, pgtype.NumericArrayOID,
		99999, // a user-defined type
	}
	for _, c := range valueCases {
		f.Add(uint8(0), []byte(strings.Trim(c.lit, "'")))
	}
	for i, s := range []string{
		"t", "-9223372036854775808", "1e+300", "NaN", "12.50", `{"a": [1, "x"]}`, "h\xffé",
		`\x00ff`, `a\000\\b`, "2024-05-01 12:34:56.789+05:30", "1970-01-01 00:00:00.5-00:44:30",
		"0044-03-15 12:00:00 BC", "2024-05-01", `[0:1]={{1,2},{3,NULL}}`, `{"a\"b","c\\d",NULL,"",x}`,
		`{"\\x0001",NULL}`, `{"{\"a\": 1}",null}`, `{2024-05-01 00:00:00+00,infinity}`,
		`{(1,1),(0,0);(3,3),(2,2)}`, `{1.50,NaN}`, `(1,"a")`,
	} {
		f.Add(uint8(i), []byte(s))
	}
	f.Fuzz(func(t *testing.T, which uint8, text []byte) {
		oid := oids[int(which)%len(oids)]
		got, err := AppendValue([]byte("[0,"), oid, text)
		if err != nil {
			return
		}
		if !bytes.HasPrefix(got, []byte("[0,")) {
			t.Fatalf("AppendValue(%d, %q) overwrote dst: %q", oid, text, got)
		}
		if !json.Valid(append(got, ']')) {
			t.Fatalf("AppendValue(%d, %q) = %q: invalid JSON", oid, text, got[3:])
		}
	})
}
