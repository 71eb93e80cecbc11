package cdc_test

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/fanwire/fanwire/cdc"
	"github.com/fanwire/fanwire/cdc/pgtest"
	"github.com/jackc/pglogrepl"
)

// typesSeed repeats a run of TestColumnTypesAgree (the test logs the seed
// it drew). FANWIRE_TYPES_SEED does the same.
var typesSeed = flag.Uint64("types-seed", 0, "seed of TestColumnTypesAgree (0: random)")

// typeCase is a value written as the SQL literal lit, and the JSON the
// ingest must make of it (docs/ingest.md's table of types).
type typeCase struct{ lit, want string }

// typeKind is a column type of the generated schema: its hand-written
// representative values, and optionally a generator of random ones whose
// JSON is computed here.
type typeKind struct {
	name  string // column name stem
	typ   string // the column's SQL type
	cases []typeCase
	gen   func(*rand.Rand) typeCase
	// external: the column is stored out of line (STORAGE EXTERNAL), and
	// gen draws values big enough for it to be: an update that leaves
	// them alone does not send them (unchanged TOAST).
	external bool
}

// typesDDL creates the user-defined types the kinds use.
var typesDDL = []string{
	`CREATE TYPE mood AS ENUM ('happy', 'sad ish', 'it''s "odd"', 'a,b{c}', 'NULL', 'ünï')`,
	`CREATE DOMAIN posint AS int4 CHECK (VALUE > 0)`,
	`CREATE DOMAIN smallpos AS posint CHECK (VALUE < 1000)`,
	`CREATE DOMAIN doc AS jsonb`,
	`CREATE DOMAIN moment AS timestamptz`,
	`CREATE DOMAIN intlist AS int4[]`,
	`CREATE TYPE pair AS (a int, b text)`,
	`CREATE TYPE floatrange AS RANGE (subtype = float8)`,
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// oddPieces make up random text: quotes, backslashes, array and JSON
// syntax, control characters, unicode, the word NULL.
var oddPieces = []string{"", "a", "Zoë", "O'Brien", `back\slash`, `"q"`, "😀", "日本", "\n", "\t", "\x01", ",", "{", "}", "[1]", "NULL", " ", "x y", `\x41`, "\u2028", "<&>"}

func randText(rng *rand.Rand, pieces int) string {
	var b strings.Builder
	for range rng.IntN(pieces + 1) {
		b.WriteString(oddPieces[rng.IntN(len(oddPieces))])
	}
	return b.String()
}

// randBig is 2,500 to 5,000 random characters, with some odd ones.
func randBig(rng *rand.Rand) string {
	const b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
	n := 2500 + rng.IntN(2500)
	var b strings.Builder
	for b.Len() < n {
		if rng.IntN(50) == 0 {
			b.WriteString(oddPieces[rng.IntN(len(oddPieces))])
			continue
		}
		b.WriteByte(b64[rng.IntN(len(b64))])
	}
	return b.String()
}

func sqlLit(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// sqlArray writes a one- or two-dimensional array literal of elements
// (nil: NULL) with type typ, and its JSON with elem's mapping.
func sqlArray(rows [][]*string, typ string, quote func(string) string, elem func(string) string) typeCase {
	if len(rows) == 0 || len(rows[0]) == 0 {
		return typeCase{"'{}'::" + typ, "[]"}
	}
	one := func(r []*string) (string, string) {
		var l, w []string
		for _, e := range r {
			if e == nil {
				l, w = append(l, "NULL"), append(w, "null")
				continue
			}
			l, w = append(l, quote(*e)), append(w, elem(*e))
		}
		return "ARRAY[" + strings.Join(l, ", ") + "]", "[" + strings.Join(w, ",") + "]"
	}
	if len(rows) == 1 {
		l, w := one(rows[0])
		return typeCase{l + "::" + typ, w}
	}
	var ls, ws []string
	for _, r := range rows {
		l, w := one(r)
		ls, ws = append(ls, l), append(ws, w)
	}
	return typeCase{"ARRAY[" + strings.Join(ls, ", ") + "]::" + typ, "[" + strings.Join(ws, ",") + "]"}
}

// randArray draws a 0-, 1- or 2-dimensional shape with some NULLs.
func randArray(rng *rand.Rand, elem func() string) [][]*string {
	dims, n := 1+rng.IntN(2), rng.IntN(4)
	if rng.IntN(8) == 0 {
		return nil
	}
	if n == 0 {
		n = 1
	}
	out := make([][]*string, 1)
	if dims == 2 {
		out = make([][]*string, 1+rng.IntN(3))
	}
	for i := range out {
		for range n {
			if rng.IntN(5) == 0 {
				out[i] = append(out[i], nil)
				continue
			}
			s := elem()
			out[i] = append(out[i], &s)
		}
	}
	return out
}

func randDigits(rng *rand.Rand, n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte('0' + rng.IntN(10))
	}
	if n > 1 && b[0] == '0' {
		b[0] = byte('1' + rng.IntN(9))
	}
	return string(b)
}

// typeKinds are the column types: every family pgjson.AppendValue maps
// differently, and the strings it passes on. The cases are the documented
// mapping; a change to it is a change to docs/ingest.md.
var typeKinds = []typeKind{
	{name: "bool", typ: "bool", cases: []typeCase{{"true", "true"}, {"false", "false"}}},
	{name: "i2", typ: "int2", cases: []typeCase{{"-32768", "-32768"}, {"32767", "32767"}, {"0", "0"}}},
	{name: "i4", typ: "int4", cases: []typeCase{{"-2147483648", "-2147483648"}, {"2147483647", "2147483647"}},
		gen: func(rng *rand.Rand) typeCase {
			v := strconv.Itoa(int(rng.Int32()) - rng.IntN(1<<30))
			return typeCase{v, v}
		}},
	{name: "i8", typ: "int8", cases: []typeCase{{"-9223372036854775808", "-9223372036854775808"}, {"9223372036854775807", "9223372036854775807"}, {"9007199254740993", "9007199254740993"}},
		gen: func(rng *rand.Rand) typeCase {
			v := strconv.FormatInt(rng.Int64()-rng.Int64N(1<<62), 10)
			return typeCase{v, v}
		}},
	{name: "num", typ: "numeric", cases: []typeCase{
		{"'NaN'", `"NaN"`}, {"'Infinity'", `"Infinity"`}, {"'-Infinity'", `"-Infinity"`},
		{"12345678901234567890.123456789", `"12345678901234567890.123456789"`},
		{"-0.000001", `"-0.000001"`}, {"1e-5", `"0.00001"`}, {"1e20", `"100000000000000000000"`}, {"12.50", `"12.50"`}, {"0", `"0"`}},
		gen: func(rng *rand.Rand) typeCase {
			v := randDigits(rng, 1+rng.IntN(25))
			if rng.IntN(2) == 0 {
				v += "." + randDigits(rng, 1+rng.IntN(12))
			}
			if rng.IntN(3) == 0 && strings.Trim(v, "0.") != "" {
				v = "-" + v
			}
			return typeCase{v, `"` + v + `"`}
		}},
	{name: "num2", typ: "numeric(12,2)", cases: []typeCase{{"12.5", `"12.50"`}, {"-0.004", `"0.00"`}, {"9999999999.994", `"9999999999.99"`}}},
	{name: "f4", typ: "float4", cases: []typeCase{{"1.5", "1.5"}, {"3.4028235e38", "3.4028235e+38"}, {"'NaN'", `"NaN"`}, {"'Infinity'", `"Infinity"`}, {"'-Infinity'", `"-Infinity"`}, {"'-0'", "-0"}, {"0.1", "0.1"}}},
	{name: "f8", typ: "float8", cases: []typeCase{{"0.1", "0.1"}, {"1e300", "1e+300"}, {"'-0'", "-0"}, {"5e-324", "5e-324"}, {"123456789012345678", "1.2345678901234568e+17"},
		{"'Infinity'", `"Infinity"`}, {"'-Infinity'", `"-Infinity"`}, {"'NaN'", `"NaN"`}, {"1e-7", "1e-07"}}},
	{name: "txt", typ: "text", cases: []typeCase{{"''", `""`}, {`E'h\u00e9llo "w" \\ back\nline\ttab\x01end😀'`, `"héllo \"w\" \\ back\nline\ttab\u0001end😀"`}, {"'NULL'", `"NULL"`}},
		gen: func(rng *rand.Rand) typeCase { s := randText(rng, 6); return typeCase{sqlLit(s), jsonString(s)} }},
	{name: "bigtxt", typ: "text", external: true, cases: []typeCase{{"'small'", `"small"`}},
		gen: func(rng *rand.Rand) typeCase { s := randBig(rng); return typeCase{sqlLit(s), jsonString(s)} }},
	{name: "bigby", typ: "bytea", external: true, cases: []typeCase{{`'\x0102'`, `"AQI="`}},
		gen: func(rng *rand.Rand) typeCase {
			b := make([]byte, 2500+rng.IntN(2500))
			for i := range b {
				b[i] = byte(rng.IntN(256))
			}
			return typeCase{`'\x` + hex.EncodeToString(b) + `'`, `"` + base64.StdEncoding.EncodeToString(b) + `"`}
		}},
	{name: "bigjsb", typ: "jsonb", external: true, cases: []typeCase{{`'{"k": 1}'`, `{"k": 1}`}},
		gen: func(rng *rand.Rand) typeCase {
			m := map[string]string{}
			for i := range 10 {
				m[fmt.Sprintf("k%d", i)] = string([]rune(randBig(rng))[:300])
			}
			b, _ := json.Marshal(m)
			return typeCase{sqlLit(string(b)), string(b)}
		}},
	{name: "bigat", typ: "text[]", external: true, cases: []typeCase{{`'{a,NULL}'`, `["a",null]`}},
		gen: func(rng *rand.Rand) typeCase {
			var rows [][]*string
			rows = append(rows, nil)
			for range 10 {
				s := string([]rune(randBig(rng))[:300])
				rows[0] = append(rows[0], &s)
			}
			return sqlArray(rows, "text[]", sqlLit, jsonString)
		}},
	{name: "vc", typ: "varchar(40)", cases: []typeCase{{"'abc'", `"abc"`}, {"''", `""`}},
		gen: func(rng *rand.Rand) typeCase {
			s := randText(rng, 4)
			for utf8.RuneCountInString(s) > 40 {
				s = string([]rune(s)[:40])
			}
			return typeCase{sqlLit(s), jsonString(s)}
		}},
	{name: "ch", typ: "char(5)", cases: []typeCase{{"'ab'", `"ab   "`}, {"''", `"     "`}, {"'ü,{}'", `"ü,{} "`}, {"'abcde'", `"abcde"`}}},
	{name: "uuid", typ: "uuid", cases: []typeCase{{"'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11'", `"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"`}},
		gen: func(rng *rand.Rand) typeCase {
			var b [16]byte
			for i := range b {
				b[i] = byte(rng.IntN(256))
			}
			h := hex.EncodeToString(b[:])
			u := h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
			return typeCase{sqlLit(strings.ToUpper(u)), `"` + u + `"`}
		}},
	{name: "by", typ: "bytea", cases: []typeCase{{`'\x'`, `""`}, {`'\x00010203ff'`, `"AAECA/8="`}},
		gen: func(rng *rand.Rand) typeCase {
			b := make([]byte, rng.IntN(20))
			for i := range b {
				b[i] = byte(rng.IntN(256))
			}
			return typeCase{`'\x` + hex.EncodeToString(b) + `'`, `"` + base64.StdEncoding.EncodeToString(b) + `"`}
		}},
	{name: "js", typ: "json", cases: []typeCase{
		{`'{"b": 1, "a": [1, 2.5e3, null], "b": "dup"}'`, `{"b": 1, "a": [1, 2.5e3, null], "b": "dup"}`},
		{`'"just a string"'`, `"just a string"`}, {`E'[1,\n  2]'`, "[1,\n  2]"}, {`'12345678901234567890123'`, `12345678901234567890123`},
		{`'{"k": "\u00e9\ud83d\ude00 \\ \""}'`, `{"k": "\u00e9\ud83d\ude00 \\ \""}`}}},
	{name: "jsb", typ: "jsonb", cases: []typeCase{
		{`'{"b": [1, 2.5e3, null], "a": "\u00e9\ud83d\ude00"}'`, `{"a": "é😀", "b": [1, 2500, null]}`},
		{`'{"q": "say \"hi\"\n", "e": {}}'`, `{"e": {}, "q": "say \"hi\"\n"}`}, {`'[]'`, `[]`}, {`'1.50'`, `1.50`}, {`'false'`, `false`}}},
	{name: "dt", typ: "date", cases: []typeCase{{"'2024-05-01'", `"2024-05-01"`}, {"'0044-03-15 BC'", `"-000043-03-15"`}, {"'0001-01-01 BC'", `"+000000-01-01"`},
		{"'5874897-12-31'", `"+5874897-12-31"`}, {"'infinity'", `"infinity"`}, {"'-infinity'", `"-infinity"`}}},
	{name: "tm", typ: "time", cases: []typeCase{{"'12:34:56.789'", `"12:34:56.789"`}, {"'24:00:00'", `"24:00:00"`}, {"'00:00:00'", `"00:00:00"`}}},
	{name: "ttz", typ: "timetz", cases: []typeCase{{"'12:34:56+05:30'", `"12:34:56+05:30"`}, {"'00:00:00.000001-00:30:15'", `"00:00:00.000001-00:30:15"`}}},
	{name: "ts", typ: "timestamp", cases: []typeCase{{"'2024-05-01 12:34:56.789'", `"2024-05-01T12:34:56.789"`}, {"'0044-03-15 12:00:00 BC'", `"-000043-03-15T12:00:00"`},
		{"'10000-01-01 00:00:00.000001'", `"+010000-01-01T00:00:00.000001"`}, {"'infinity'", `"infinity"`}, {"'-infinity'", `"-infinity"`}}},
	{name: "tstz", typ: "timestamptz", cases: []typeCase{{"'2024-05-01 12:34:56.789+02'", `"2024-05-01T10:34:56.789+00:00"`},
		{"'0044-03-15 12:00:00+00 BC'", `"-000043-03-15T12:00:00+00:00"`}, {"'294276-12-31 23:59:59.999999+00'", `"+294276-12-31T23:59:59.999999+00:00"`},
		{"'infinity'", `"infinity"`}, {"'-infinity'", `"-infinity"`}}},
	{name: "iv", typ: "interval", cases: []typeCase{{"'1 year 2 months 3 days 4 hours 5 minutes 6.5 seconds'", `"1 year 2 mons 3 days 04:05:06.5"`},
		{"'-1 day 2 hours'", `"-1 days +02:00:00"`}, {"'0'", `"00:00:00"`}}},
	{name: "inet", typ: "inet", cases: []typeCase{{"'192.168.0.1/24'", `"192.168.0.1/24"`}, {"'10.0.0.1'", `"10.0.0.1"`}, {"'::1'", `"::1"`}}},
	{name: "cidr", typ: "cidr", cases: []typeCase{{"'10.0.0.0/8'", `"10.0.0.0/8"`}, {"'2001:db8::/32'", `"2001:db8::/32"`}}},
	{name: "mac", typ: "macaddr", cases: []typeCase{{"'08-00-2B-01-02-03'", `"08:00:2b:01:02:03"`}}},
	{name: "money", typ: "money", cases: []typeCase{{"1234.5", `"$1,234.50"`}, {"-1", `"-$1.00"`}}},
	{name: "mood", typ: "mood", cases: []typeCase{{"'happy'", `"happy"`}, {"'sad ish'", `"sad ish"`}, {`'it''s "odd"'`, `"it's \"odd\""`}, {"'NULL'", `"NULL"`}}},
	{name: "comp", typ: "pair", cases: []typeCase{{`ROW(1, 'a "q"')`, `"(1,\"a \"\"q\"\"\")"`}, {`ROW(NULL, '')`, `"(,\"\")"`}}},
	{name: "oid", typ: "oid", cases: []typeCase{{"4294967295", "4294967295"}, {"0", "0"}}},
	{name: "nm", typ: "name", cases: []typeCase{{"'pg_class'", `"pg_class"`}, {`'a "b"'`, `"a \"b\""`}}},
	{name: "xml", typ: "xml", cases: []typeCase{{`'<a b="c">d &amp; e</a>'`, `"<a b=\"c\">d &amp; e</a>"`}}},
	{name: "tsv", typ: "tsvector", cases: []typeCase{{"'a fat cat'", `"'a' 'cat' 'fat'"`}}},
	{name: "bit", typ: "bit(4)", cases: []typeCase{{"B'1010'", `"1010"`}}},
	{name: "vbit", typ: "varbit", cases: []typeCase{{"B'1'", `"1"`}, {"B''", `""`}}},
	{name: "lsn", typ: "pg_lsn", cases: []typeCase{{"'16/B374D848'", `"16/B374D848"`}}},
	{name: "rng", typ: "int4range", cases: []typeCase{{"'[1,10)'", `"[1,10)"`}, {"'empty'", `"empty"`}, {"'(,5]'", `"(,6)"`}}},
	{name: "frng", typ: "floatrange", cases: []typeCase{{"'[1.5,2.5)'", `"[1.5,2.5)"`}, {"'(,)'", `"(,)"`}}},
	{name: "pt", typ: "point", cases: []typeCase{{"'(1,2)'", `"(1,2)"`}}},
	// Domains encode as their base type.
	{name: "pos", typ: "posint", cases: []typeCase{{"42", "42"}, {"2147483647", "2147483647"}}},
	{name: "spos", typ: "smallpos", cases: []typeCase{{"7", "7"}}},
	{name: "doc", typ: "doc", cases: []typeCase{{`'{"b": 1, "a": [true]}'`, `{"a": [true], "b": 1}`}, {`'"s"'`, `"s"`}}},
	{name: "mom", typ: "moment", cases: []typeCase{{"'2024-05-01 12:34:56.789+02'", `"2024-05-01T10:34:56.789+00:00"`}, {"'-infinity'", `"-infinity"`}}},
	{name: "ilist", typ: "intlist", cases: []typeCase{{"'{{1,2},{3,NULL}}'", "[[1,2],[3,null]]"}, {"'{}'", "[]"}}},
	// Arrays: of built-in types, of an enum, of a domain.
	{name: "ai", typ: "int4[]", cases: []typeCase{{"'{1,2,3}'", "[1,2,3]"}, {"'{}'", "[]"}, {"'{{1,2},{3,NULL}}'", "[[1,2],[3,null]]"},
		{"'[0:2]={1,2,3}'", "[1,2,3]"}, {"'{{{-1}},{{2}}}'", "[[[-1]],[[2]]]"}},
		gen: func(rng *rand.Rand) typeCase {
			return sqlArray(randArray(rng, func() string { return strconv.Itoa(rng.IntN(2000) - 1000) }), "int4[]", func(s string) string { return s }, func(s string) string { return s })
		}},
	{name: "at", typ: "text[]", cases: []typeCase{
		{`ARRAY['a"b', 'c\d', 'e,f', '{g}', ' h ', 'NULL', NULL, '', 'ünï😀', 'x y', E'tab\there']`, `["a\"b","c\\d","e,f","{g}"," h ","NULL",null,"","ünï😀","x y","tab\there"]`},
		{`'{{a,b},{"c}",NULL}}'`, `[["a","b"],["c}",null]]`}},
		gen: func(rng *rand.Rand) typeCase {
			return sqlArray(randArray(rng, func() string { return randText(rng, 3) }), "text[]", sqlLit, jsonString)
		}},
	{name: "ach", typ: "char(3)[]", cases: []typeCase{{`ARRAY['a', '', 'x,y', NULL]`, `["a  ","   ","x,y",null]`}}},
	{name: "an", typ: "numeric[]", cases: []typeCase{{`ARRAY[1.50, NULL, 'NaN', 12345678901234567890.123456789]::numeric[]`, `["1.50",null,"NaN","12345678901234567890.123456789"]`}}},
	{name: "af", typ: "float8[]", cases: []typeCase{{`ARRAY['NaN', '-Infinity', 'Infinity', 1.5, 1e300, NULL]::float8[]`, `["NaN","-Infinity","Infinity",1.5,1e+300,null]`}}},
	{name: "ab", typ: "bool[]", cases: []typeCase{{`'{{t,f},{NULL,true}}'`, `[[true,false],[null,true]]`}}},
	{name: "ad", typ: "date[]", cases: []typeCase{{`ARRAY['2024-05-01'::date, '0044-03-15 BC', 'infinity', NULL]`, `["2024-05-01","-000043-03-15","infinity",null]`}}},
	{name: "atz", typ: "timestamptz[]", cases: []typeCase{{`ARRAY['2024-05-01 12:34:56.789+02'::timestamptz, '-infinity', NULL]`, `["2024-05-01T10:34:56.789+00:00","-infinity",null]`}}},
	{name: "ajb", typ: "jsonb[]", cases: []typeCase{{`ARRAY['{"a": [1, "x,y\"}"]}'::jsonb, 'null', NULL]`, `[{"a": [1, "x,y\"}"]},null,null]`}}},
	{name: "aby", typ: "bytea[]", cases: []typeCase{{`ARRAY['\x0001'::bytea, '\x', NULL]`, `["AAE=","",null]`}}},
	{name: "au", typ: "uuid[]", cases: []typeCase{{`'{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11,NULL}'`, `["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",null]`}}},
	{name: "amood", typ: "mood[]", cases: []typeCase{{`ARRAY['happy', 'sad ish', NULL, 'NULL', 'a,b{c}', 'it''s "odd"']::mood[]`, `["happy","sad ish",null,"NULL","a,b{c}","it's \"odd\""]`},
		{`'{{happy,ünï},{NULL,happy}}'`, `[["happy","ünï"],[null,"happy"]]`}, {`'{}'`, `[]`}}},
	{name: "afrng", typ: "floatrange[]", cases: []typeCase{{`ARRAY['[1.5,2.5)', 'empty', NULL]::floatrange[]`, `["[1.5,2.5)","empty",null]`}}},
	{name: "acomp", typ: "pair[]", cases: []typeCase{{`ARRAY[ROW(1, 'a,b'), NULL]::pair[]`, `["(1,\"a,b\")",null]`}}},
	{name: "abox", typ: "box[]", cases: []typeCase{{`ARRAY['((0,0),(1,1))'::box, '((2,2),(3,3))']`, `["(1,1),(0,0)","(3,3),(2,2)"]`}}},
	{name: "aiv", typ: "interval[]", cases: []typeCase{{`ARRAY['1 day', NULL, '-1 day 2 hours']::interval[]`, `["1 day",null,"-1 days +02:00:00"]`}}},
	{name: "amoney", typ: "money[]", cases: []typeCase{{`ARRAY[1234.5, -1]::money[]`, `["$1,234.50","-$1.00"]`}}},
	{name: "apos", typ: "posint[]", cases: []typeCase{{`'{1,NULL,2147483647}'`, `[1,null,2147483647]`}, {`'{{1},{2}}'`, `[[1],[2]]`}}},
	{name: "amom", typ: "moment[]", cases: []typeCase{{`ARRAY['2024-05-01 12:34:56.789+02', 'infinity']::moment[]`, `["2024-05-01T10:34:56.789+00:00","infinity"]`}}},
}

// keyKind is a type of the parent's primary key (the projections' key)
// and the child's column joining it: val gives the key of row id as a
// literal, as PostgreSQL's text output (the subject token's source) and as
// JSON.
type keyKind struct {
	typ string
	val func(id int) (lit, text, want string)
}

// keyJoins write a child's join value differently from the parent's key,
// but equal to it, for the key types that can (numeric 1.5 for a key 1.50).
var keyJoins = map[string]func(id int) (lit, want string){
	"numeric": func(id int) (string, string) { s := fmt.Sprintf("%d.5", id); return s, `"` + s + `"` },
}

func same(s string) (string, string, string) { return s, s, s }

var keyKinds = []keyKind{
	{"int4", func(id int) (string, string, string) { return same(strconv.Itoa(id)) }},
	{"int8", func(id int) (string, string, string) { return same(strconv.Itoa(9007199254740993 + 2*id)) }},
	{"posint", func(id int) (string, string, string) { return same(strconv.Itoa(id)) }},
	{"numeric", func(id int) (string, string, string) { s := fmt.Sprintf("%d.50", id); return s, s, `"` + s + `"` }},
	{"text", func(id int) (string, string, string) {
		s := fmt.Sprintf("k%d.a b*>/ü\"'\\,%%", id)
		return sqlLit(s), s, jsonString(s)
	}},
	{"char(8)", func(id int) (string, string, string) {
		s := fmt.Sprintf("c%-7d", id)
		return sqlLit(strings.TrimSpace(s)), s, jsonString(s)
	}},
	{"uuid", func(id int) (string, string, string) {
		u := fmt.Sprintf("0000000a-0000-4000-8000-%012d", id)
		return sqlLit(strings.ToUpper(u)), u, `"` + u + `"`
	}},
	{"date", func(id int) (string, string, string) {
		md := time.Date(2023, 12, 31, 0, 0, 0, 0, time.UTC).AddDate(0, 0, id).Format("01-02")
		if id%2 == 1 {
			return sqlLit("0044-" + md + " BC"), "0044-" + md + " BC", `"-000043-` + md + `"`
		}
		return sqlLit("2024-" + md), "2024-" + md, `"2024-` + md + `"`
	}},
	{"timestamptz", func(id int) (string, string, string) {
		at := time.Date(2024, 5, 1, 10, 0, 0, 5e8, time.UTC).Add(time.Duration(id) * time.Minute)
		return sqlLit(at.In(time.FixedZone("", 2*3600)).Format("2006-01-02 15:04:05.0-07")), at.Format("2006-01-02 15:04:05.0") + "+00", `"` + at.Format("2006-01-02T15:04:05.0") + `+00:00"`
	}},
	{"bytea", func(id int) (string, string, string) {
		b := []byte{0, 0xff, byte(id)}
		return `'\x` + hex.EncodeToString(b) + `'`, `\x` + hex.EncodeToString(b), `"` + base64.StdEncoding.EncodeToString(b) + `"`
	}},
	{"inet", func(id int) (string, string, string) {
		s := fmt.Sprintf("10.0.%d.1", id)
		return sqlLit(s), s, `"` + s + `"`
	}},
}

// token is a key's subject token: the ingest keeps ASCII letters, digits,
// '_' and '-', and writes every other byte %XX.
func token(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' {
			b.WriteByte(c)
			continue
		}
		fmt.Fprintf(&b, "%%%02X", c)
	}
	return b.String()
}

// typeCol is one column of the generated schema.
type typeCol struct {
	name string
	kind *typeKind
	deck []typeCase // hand-written cases not drawn yet
}

// draw picks a value for c: its hand-written cases first, in a random
// order, then NULL, a generated value or a case again.
func (c *typeCol) draw(rng *rand.Rand, fresh bool) typeCase {
	if fresh && len(c.deck) > 0 {
		v := c.deck[len(c.deck)-1]
		c.deck = c.deck[:len(c.deck)-1]
		return v
	}
	switch {
	case rng.IntN(6) == 0:
		return typeCase{"NULL", "null"}
	case c.kind.gen != nil && (c.kind.external || rng.IntN(2) == 0):
		return c.kind.gen(rng)
	}
	return c.kind.cases[rng.IntN(len(c.kind.cases))]
}

// typeRow is one row's values at one version (the touch column).
type typeRow map[string]typeCase

// TestColumnTypesAgree generates a schema of every column type, a parent
// table (its key of a random type too) and a child table with the same
// typed columns, and publishes both as table events and as two projections
// of the parent with its children embedded, one per mode. Rows are written
// before the ingest starts (the bootstrap reads them), after (the tail
// decodes them; big values left unchanged are not sent), and while it is
// stopped (the memory state comes back from its file): every value must
// come out as the same JSON through the bootstrap's and the tail's table
// events, the old row of an update, both projections' parent columns and
// embedded child columns, at bootstrap and on the tail; that JSON is the
// documented mapping of the type (typeKinds); every event's key and
// subject are the key's; and both modes end with the same documents.
func TestColumnTypesAgree(t *testing.T) {
	t.Parallel()
	seed := *typesSeed
	if s := os.Getenv("FANWIRE_TYPES_SEED"); seed == 0 && s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("FANWIRE_TYPES_SEED=%q: %v", s, err)
		}
	}
	if seed == 0 {
		seed = rand.Uint64()
	}
	t.Logf("seed %d (repeat with -types-seed %d or FANWIRE_TYPES_SEED=%d)", seed, seed, seed)
	rng := rand.New(rand.NewPCG(seed, seed^0x5bd1e995))

	// The schema: every kind once, some twice, in a random order.
	var cols []*typeCol
	for i := range typeKinds {
		k := &typeKinds[i]
		for n := range 1 + rng.IntN(3)/2 {
			c := &typeCol{name: fmt.Sprintf("%s_%d", k.name, n), kind: k}
			if n == 0 {
				c.deck = slices.Clone(k.cases)
				rng.Shuffle(len(c.deck), func(i, j int) { c.deck[i], c.deck[j] = c.deck[j], c.deck[i] })
			}
			cols = append(cols, c)
		}
	}
	rng.Shuffle(len(cols), func(i, j int) { cols[i], cols[j] = cols[j], cols[i] })
	var defs []string
	for _, c := range cols {
		defs = append(defs, c.name+" "+c.kind.typ)
	}
	typed := strings.Join(defs, ", ")
	key := keyKinds[rng.IntN(len(keyKinds))]
	t.Logf("key: %s; columns: %s", key.typ, typed)

	pg := pgtest.Start(t, pgtest.Config{})
	pg.Exec("postgres", typesDDL...)
	ddl := []string{
		"CREATE TABLE parent (k " + key.typ + " PRIMARY KEY, id int NOT NULL UNIQUE, touch int NOT NULL, " + typed + ")",
		"CREATE TABLE child (id int PRIMARY KEY, parent_k " + key.typ + " NOT NULL, touch int NOT NULL, " + typed + ")",
		"CREATE INDEX ON child (parent_k)",
		"ALTER TABLE child REPLICA IDENTITY FULL",
	}
	for _, c := range cols {
		if c.kind.external {
			ddl = append(ddl, "ALTER TABLE parent ALTER COLUMN "+c.name+" SET STORAGE EXTERNAL", "ALTER TABLE child ALTER COLUMN "+c.name+" SET STORAGE EXTERNAL")
		}
	}
	pg.Exec("postgres", ddl...)

	// want[table][id][touch] is what the row holds at that version.
	want := map[string]map[int]map[int]typeRow{"parent": {}, "child": {}}
	parentOf := map[int]int{}
	var parents []int
	write := func(table string, id, touch int, fresh bool) string {
		row := typeRow{}
		var names, lits []string
		for _, c := range cols {
			v := c.draw(rng, fresh)
			row[c.name] = v
			names, lits = append(names, c.name), append(lits, v.lit)
		}
		if want[table][id] == nil {
			want[table][id] = map[int]typeRow{}
		}
		want[table][id][touch] = row
		if table == "parent" {
			lit, _, w := key.val(id)
			row["k"] = typeCase{lit, w}
		} else if touch > 0 {
			row["parent_k"] = want[table][id][0]["parent_k"]
		}
		if touch > 0 { // an update
			sets := make([]string, len(names))
			for i := range names {
				sets[i] = names[i] + " = " + lits[i]
			}
			return fmt.Sprintf("UPDATE %s SET touch = %d, %s WHERE id = %d", table, touch, strings.Join(sets, ", "), id)
		}
		if table == "parent" {
			parents = append(parents, id)
			return fmt.Sprintf("INSERT INTO parent (k, id, touch, %s) VALUES (%s, %d, 0, %s)", strings.Join(names, ", "), row["k"].lit, id, strings.Join(lits, ", "))
		}
		p := parents[rng.IntN(len(parents))]
		parentOf[id] = p
		pl, _, pw := key.val(p)
		if j := keyJoins[key.typ]; j != nil && rng.IntN(2) == 0 {
			pl, pw = j(p)
		}
		row["parent_k"] = typeCase{pl, pw}
		return fmt.Sprintf("INSERT INTO child (id, parent_k, touch, %s) VALUES (%d, %s, 0, %s)", strings.Join(names, ", "), id, pl, strings.Join(lits, ", "))
	}
	// The bootstrap's rows.
	var stmts []string
	for id := 1; id <= 6; id++ {
		stmts = append(stmts, write("parent", id, 0, true))
	}
	for id := 1; id <= 12; id++ {
		stmts = append(stmts, write("child", id, 0, true))
	}
	pg.Exec("postgres", stmts...)
	booted := map[string]int{"parent": 6, "child": 12}

	// The children are ordered by a typed column whose type both modes
	// order as PostgreSQL does (docs/projections.md), ties by their key.
	var orderable []string
	for _, c := range cols {
		if slices.Contains([]string{"bool", "i2", "i4", "i8", "num", "num2", "f4", "f8", "txt", "vc", "ch", "uuid", "by", "dt", "ts", "tstz", "pos", "spos", "mom"}, c.kind.name) {
			orderable = append(orderable, c.name)
		}
	}
	orderBy := orderable[rng.IntN(len(orderable))]
	t.Logf("children ordered by %s", orderBy)
	embed := func(mode string) cdc.ProjectionSpec {
		return cdc.ProjectionSpec{Name: "p" + mode, Table: "parent", Key: "k", Mode: mode, Embed: []cdc.EmbedSpec{
			{As: "kids", Table: "child", On: map[string]string{"parent_k": "k"}, Many: true, OrderBy: orderBy},
		}}
	}
	stateDir := t.TempDir()
	config := func(c *cdc.Config) {
		c.Tables = []string{"parent", "child"}
		c.Projections = []cdc.ProjectionSpec{embed(cdc.ModeSQL), embed(cdc.ModeMemory)}
		c.StateDir = stateDir
	}
	r := newRig(t, pg, config)
	// confirmed waits until the ingest has published everything committed.
	confirmed := func() {
		t.Helper()
		var lsnText string
		if err := pgQuery(pg, "SELECT pg_current_wal_lsn()::text", &lsnText); err != nil {
			t.Fatal(err)
		}
		end, err := pglogrepl.ParseLSN(lsnText)
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the ingest confirming "+end.String(), 30*time.Second, func() bool { return r.in.Confirmed() >= end })
	}

	// The tail: every row again with its values unchanged (touch 1), then
	// some rows with new values (touch 2), then new rows.
	for _, table := range []string{"parent", "child"} {
		for _, vs := range want[table] {
			vs[1] = vs[0]
		}
		stmts = append(stmts[:0], "UPDATE "+table+" SET touch = 1")
		pg.Exec("postgres", stmts...)
	}
	stmts = stmts[:0]
	for _, table := range []string{"parent", "child"} {
		for id := 1; id <= booted[table]; id++ {
			if rng.IntN(2) == 0 {
				stmts = append(stmts, write(table, id, 2, true))
			}
		}
	}
	for id := 101; id <= 103; id++ {
		stmts = append(stmts, write("parent", id, 0, true))
	}
	for id := 101; id <= 108; id++ {
		stmts = append(stmts, write("child", id, 0, true))
	}
	pg.Exec("postgres", stmts...)
	confirmed()
	// A restart: the memory state comes back from its file, and the tail
	// goes on from the slot, with new values (touch 3) and new rows.
	r.stop()
	before := len(allEvents(t, r.b))
	stmts = stmts[:0]
	for _, table := range []string{"parent", "child"} {
		for _, id := range slices.Sorted(mapKeys(want[table])) {
			if rng.IntN(3) == 0 {
				stmts = append(stmts, write(table, id, 3, true))
			}
		}
	}
	for id := 201; id <= 202; id++ {
		stmts = append(stmts, write("parent", id, 0, true))
	}
	for id := 201; id <= 204; id++ {
		stmts = append(stmts, write("child", id, 0, true))
	}
	pg.Exec("postgres", stmts...)
	r.start(config)
	confirmed()

	// Every value seen, by row, version and column, with the path it came
	// through.
	type seen struct {
		path string
		raw  json.RawMessage
	}
	type cell struct {
		table       string
		id, version int // the version: 0 and 1 hold the same values
		col         string
	}
	values := map[cell][]seen{}
	paths := map[string]map[string]bool{} // "table id version" → paths
	// The columns compared: the typed ones and the key (the parent's) or
	// the join column (the child's).
	keyCol := func(name string) *typeCol { return &typeCol{name: name, kind: &typeKind{name: name, typ: key.typ}} }
	colsOf := map[string][]*typeCol{"parent": append([]*typeCol{keyCol("k")}, cols...), "child": append([]*typeCol{keyCol("parent_k")}, cols...)}
	unsent := 0 // values an event left out as unchanged TOAST
	record := func(table, path string, raw json.RawMessage, unchanged []string) {
		t.Helper()
		var doc map[string]json.RawMessage
		if err := json.Unmarshal(raw, &doc); err != nil {
			t.Fatalf("%s: %v: %s", path, err, raw)
		}
		var id, touch int
		if err := json.Unmarshal(doc["id"], &id); err != nil {
			t.Fatalf("%s: id %s: %v", path, doc["id"], err)
		}
		if err := json.Unmarshal(doc["touch"], &touch); err != nil {
			t.Fatalf("%s: touch %s: %v", path, doc["touch"], err)
		}
		k := fmt.Sprintf("%s %d %d", table, id, touch)
		if paths[k] == nil {
			paths[k] = map[string]bool{}
		}
		paths[k][path] = true
		version := touch
		if version == 1 {
			version = 0
		}
		for _, c := range colsOf[table] {
			v, ok := doc[c.name]
			if !ok && slices.Contains(unchanged, c.name) {
				unsent++
				continue
			}
			if !ok {
				t.Errorf("%s: %s %d has no column %s: %s", path, table, id, c.name, raw)
				continue
			}
			values[cell{table, id, version, c.name}] = append(values[cell{table, id, version, c.name}], seen{fmt.Sprintf("%s (touch %d)", path, touch), v})
		}
	}
	evs := allEvents(t, r.b)
	for _, e := range evs[before:] {
		if strings.Contains(e.ID, ":b-") {
			t.Fatalf("the restarted ingest bootstrapped again (%s %s): the memory state was not restored", e.Subject, e.ID)
		}
	}
	lastDoc := map[string]map[string]json.RawMessage{"psql": {}, "pmemory": {}} // projection → subject token → its last document
	for _, e := range evs {
		phase := "tail"
		if strings.Contains(e.ID, ":b-") {
			phase = "bootstrap"
		}
		parts := strings.Split(e.Subject, ".")
		// The event's key and subject: the parent's key, the child's id.
		var ids struct{ ID int }
		if err := json.Unmarshal(e.Doc, &ids); err != nil {
			t.Fatalf("%s: %v: %s", e.Subject, err, e.Doc)
		}
		_, ktext, kwant := key.val(ids.ID)
		if parts[1] == "child" {
			ktext, kwant = strconv.Itoa(ids.ID), strconv.Itoa(ids.ID)
		}
		if !sameJSON(e.Key, []byte(kwant)) || parts[2] != token(ktext) {
			t.Errorf("%s %s (row %d): key %s on subject %s, want %s on %s", parts[1], e.Op, ids.ID, e.Key, e.Subject, kwant, token(ktext))
		}
		switch parts[1] {
		case "parent", "child":
			record(parts[1], parts[1]+" table event, "+phase, e.Doc, e.Unchanged)
			if parts[1] == "child" && e.Op == "update" {
				record("child", "child table event, old row", e.Old, nil)
			}
		case "psql", "pmemory":
			lastDoc[parts[1]][parts[2]] = e.Doc
			mode := strings.TrimPrefix(parts[1], "p")
			var doc struct {
				Kids []json.RawMessage `json:"kids"`
			}
			if err := json.Unmarshal(e.Doc, &doc); err != nil {
				t.Fatalf("%s: %v", e.Doc, err)
			}
			record("parent", mode+" projection parent, "+phase, e.Doc, nil)
			for _, k := range doc.Kids {
				record("child", mode+" projection embed, "+phase, k, nil)
			}
		default:
			t.Fatalf("an event on %s", e.Subject)
		}
	}

	// Each value is its documented JSON, and the same bytes on every path.
	typeOf := map[string]*typeCol{}
	for _, cs := range colsOf {
		for _, c := range cs {
			typeOf[c.name] = c
		}
	}
	reported := map[string]bool{} // one report per column, path and literal
	bad := 0
	for c, ss := range values {
		wv := want[c.table][c.id][c.version][c.col]
		col := typeOf[c.col]
		for _, s := range ss {
			if sameJSON(s.raw, []byte(wv.want)) && bytes.Equal(s.raw, ss[0].raw) {
				continue
			}
			bad++
			path := s.path[:strings.Index(s.path, " (")]
			if k := c.col + "\x00" + path + "\x00" + wv.lit; !reported[k] {
				reported[k] = true
				t.Errorf("%s (%s) = %s via %s, want %s (literal %s; %s %d; first seen as %s via %s)",
					c.col, col.kind.typ, s.raw, s.path, wv.want, wv.lit, c.table, c.id, ss[0].raw, ss[0].path)
			}
		}
	}
	// Every row reached every path: the bootstrap's rows at the bootstrap
	// and on the tail, every row's last version through each path.
	need := func(table string, id, touch int, ps ...string) {
		t.Helper()
		got := paths[fmt.Sprintf("%s %d %d", table, id, touch)]
		for _, p := range ps {
			if !got[p] {
				t.Errorf("%s %d (touch %d) never came through %s (it did through %v)", table, id, touch, p, slices.Sorted(mapKeys(got)))
			}
		}
	}
	for table, rows := range want {
		for id, vs := range rows {
			last := slices.Max(slices.Collect(mapKeys(vs)))
			if id <= booted[table] {
				if table == "parent" {
					need(table, id, 0, "parent table event, bootstrap", "sql projection parent, bootstrap", "memory projection parent, bootstrap")
				} else {
					need(table, id, 0, "child table event, bootstrap", "sql projection embed, bootstrap", "memory projection embed, bootstrap")
				}
				need(table, id, 1, table+" table event, tail")
			}
			if table == "parent" {
				need(table, id, last, "parent table event, tail", "sql projection parent, tail", "memory projection parent, tail")
			} else {
				need(table, id, last, "child table event, tail", "sql projection embed, tail", "memory projection embed, tail")
			}
		}
	}
	t.Logf("%d columns, %d events, %d values compared, %d differ; %d left out as unchanged TOAST", len(cols), len(evs), func() (n int) {
		for _, ss := range values {
			n += len(ss)
		}
		return n
	}(), bad, unsent)
	// Both modes end with the same documents, children in the same order.
	for k, d := range lastDoc["psql"] {
		if m := lastDoc["pmemory"][k]; !bytes.Equal(d, m) {
			t.Errorf("parent %s: the last documents differ (ordered by %s)\nsql:    %s\nmemory: %s", k, orderBy, d, m)
		}
	}
	if len(lastDoc["psql"]) != len(lastDoc["pmemory"]) {
		t.Errorf("documents: %d in sql mode, %d in memory mode", len(lastDoc["psql"]), len(lastDoc["pmemory"]))
	}
	if unsent == 0 {
		t.Error("no event left out an unchanged TOAST value: the big values did not test that path")
	}
}

func mapKeys[K comparable, V any](m map[K]V) func(func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// sameJSON compares two JSON texts as values, numbers by their text (no
// float64 rounding) and strings by their characters (not their escapes).
func sameJSON(a, b []byte) bool {
	norm := func(x []byte) (string, bool) {
		d := json.NewDecoder(bytes.NewReader(x))
		d.UseNumber()
		var v any
		if err := d.Decode(&v); err != nil {
			return "", false
		}
		out, err := json.Marshal(v)
		return string(out), err == nil
	}
	x, ok1 := norm(a)
	y, ok2 := norm(b)
	return ok1 && ok2 && x == y
}
