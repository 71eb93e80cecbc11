package cdc

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/fanwire/fanwire/broker"
	"github.com/fanwire/fanwire/cdc/pgjson"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgtype"
)

// TestBootEncoderMatchesTheProjection: a bootstrapped row's event, built
// in the bootstrap's reused buffers, is byte for byte the event the
// table's projection makes of the row's insert (rowEvent), with the id
// bootstrapID gives; so are the error events of rows that cannot be
// published (a NULL or malformed key, a malformed value, an event over the
// broker's limit). Keys escape in their subject token, composite and
// single; payloads span several of the encoder's blocks, and events that
// came earlier are not overwritten by later ones.
func TestBootEncoderMatchesTheProjection(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	texts := []string{"", "a", "a.b", "a,b", "%", "é *>", "x y"}
	for _, composite := range []bool{false, true} {
		for _, limit := range []int{0, 300} {
			tb := encoderTestTable(t, composite, limit)
			tx0 := &txn{commitLSN: 0x16B3748, commitTime: time.Date(2026, 12, 1, 19, 0, 0, 123456000, time.FixedZone("x", 3600))}
			e := newBootEncoder("w", tb, tx0)
			var got, want []broker.Outgoing
			var gotErrs, wantErrs []bool
			for i := range 3000 {
				raw := encoderTestRow(rng, texts, i)
				switch rng.IntN(20) {
				case 0:
					raw[0] = nil // a NULL key
				case 1:
					raw[1] = []byte("x") // a malformed integer
				case 2:
					raw[2] = []byte("1.5") // a malformed key when composite
				case 3:
					raw[3] = nil
				case 4:
					raw[0] = []byte{} // the empty key
				}
				var err error
				if got, err = e.add(got, raw); err != nil {
					if _, ok := asBadRow(err); !ok {
						t.Fatal(err)
					}
				}
				gotErrs = append(gotErrs, err != nil)

				id := bootstrapID("w", tb.nameKey, raw)
				c := &change{kind: 'I', newRow: &pglogrepl.TupleData{Columns: textColumns(raw)}}
				if want, err = tb.proj.project(want, tx0, tb, c, id); err != nil {
					if _, ok := asBadRow(err); !ok {
						t.Fatal(err)
					}
				}
				wantErrs = append(wantErrs, err != nil)
			}
			checkEncoded(t, fmt.Sprintf("composite %v, limit %d", composite, limit), got, want, gotErrs, wantErrs)
		}
	}
}

// TestBootstrapIDUnchanged: the bootstrap's ids are the writer's name and
// the ids it made before it reused its buffers.
func TestBootstrapIDUnchanged(t *testing.T) {
	t.Parallel()
	rows := [][][]byte{
		nil,
		{nil},
		{{}},
		{[]byte("1"), nil, []byte("")},
		{[]byte("12345"), []byte("2346"), []byte("new"), []byte("345.99"), []byte("2026-11-30 15:25:45+00")},
		{bytes.Repeat([]byte("x"), 100_000)},
	}
	var in, out []byte
	for _, table := range []string{"public.orders", "projection orders", ""} {
		for _, raw := range rows {
			want := "w:" + oldBootstrapID(table, raw)
			if got := bootstrapID("w", table, raw); got != want {
				t.Errorf("bootstrapID(%q, %q) = %s, want %s", table, raw, got, want)
			}
			var sum [sha256.Size]byte
			in, sum = bootstrapHash(in[:0], table, raw)
			if out = appendBootstrapID(out[:0], "w", &sum); string(out) != want {
				t.Errorf("appendBootstrapID(%q, %q) = %s, want %s", table, raw, out, want)
			}
		}
	}
}

// TestAppendSubjectToken: the append form escapes as subjectToken does
// (%XX, capital hex digits; the empty token "%").
func TestAppendSubjectToken(t *testing.T) {
	t.Parallel()
	for c := range 256 {
		s := string([]byte{byte(c)})
		want := s
		if !tokenByte(byte(c)) {
			want = fmt.Sprintf("%%%02X", c)
		}
		if got := string(appendSubjectToken([]byte("x."), s)); got != "x."+want {
			t.Errorf("appendSubjectToken(%q) = %q, want %q", s, got, "x."+want)
		}
		if got := subjectToken(s); got != want {
			t.Errorf("subjectToken(%q) = %q, want %q", s, got, want)
		}
	}
	for s, want := range map[string]string{"": "%", "a-b.c,d%": "a-b%2Ec%2Cd%25", "Ab_9": "Ab_9", "é": "%C3%A9"} {
		if got := string(appendSubjectToken(nil, []byte(s))); got != want {
			t.Errorf("appendSubjectToken(%q) = %q, want %q", s, got, want)
		}
		if got := subjectToken(s); got != want {
			t.Errorf("subjectToken(%q) = %q, want %q", s, got, want)
		}
	}
}

// oldBootstrapID is bootstrapID as it was before the bootstrap reused its
// buffers: its ids must not change.
func oldBootstrapID(table string, raw [][]byte) string {
	h := sha256.New()
	h.Write([]byte(table))
	var l [5]byte
	for _, v := range raw {
		if v == nil {
			l[0] = 0 // NULL differs from the empty string
			h.Write(l[:1])
			continue
		}
		l[0] = 1
		binary.BigEndian.PutUint32(l[1:], uint32(len(v)))
		h.Write(l[:])
		h.Write(v)
	}
	return "b-" + hex.EncodeToString(h.Sum(nil)[:12])
}

// encoderTestTable is the table of the encoder tests: a text, an int4, an
// int8, a text and a timestamptz column; its key is k1, or (k2, k1) when
// composite; limit is the broker's largest event (0: none).
func encoderTestTable(t *testing.T, composite bool, limit int) *table {
	t.Helper()
	tb := &table{nameKey: "s.t"}
	tb.columns = []column{
		newColumn("k1", pgjson.Type{OID: pgtype.TextOID}),
		newColumn("n", pgjson.Type{OID: pgtype.Int4OID}),
		newColumn("k2", pgjson.Type{OID: pgtype.Int8OID}),
		newColumn("note", pgjson.Type{OID: pgtype.TextOID}),
		newColumn("at", pgjson.Type{OID: pgtype.TimestamptzOID}),
	}
	key := []string{"k1"}
	if composite {
		key = []string{"k2", "k1"}
	}
	if err := tb.publish("db", "s", "t.x", key, limit); err != nil {
		t.Fatal(err)
	}
	return tb
}

// encoderTestRow is row i of encoderTestTable, as text values: a key made
// of one of texts (each to escape in a subject) and i, and notes that need
// escaping in JSON, some of them large.
func encoderTestRow(rng *rand.Rand, texts []string, i int) [][]byte {
	return [][]byte{
		[]byte(texts[rng.IntN(len(texts))] + fmt.Sprint(i)),
		[]byte(fmt.Sprint(rng.IntN(100))),
		[]byte(fmt.Sprint(i)),
		bytes.Repeat([]byte("ab\"\\\n"), rng.IntN(60)),
		[]byte("2026-11-30 12:00:00.5+00"),
	}
}

// textColumns is raw as a tuple's text columns, nil values as NULLs.
func textColumns(raw [][]byte) []*pglogrepl.TupleDataColumn {
	cols := make([]*pglogrepl.TupleDataColumn, len(raw))
	for j, v := range raw {
		cols[j] = &pglogrepl.TupleDataColumn{DataType: pglogrepl.TupleDataTypeText, Data: v}
		if v == nil {
			cols[j].DataType = pglogrepl.TupleDataTypeNull
		}
	}
	return cols
}

// checkEncoded fails the test unless the encoder's events (got, and
// whether each was an error event) are byte for byte the reference's
// (want), and both kinds of event occur; what names the case.
func checkEncoded(t *testing.T, what string, got, want []broker.Outgoing, gotErrs, wantErrs []bool) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d events, want %d", what, len(got), len(want))
	}
	bad := 0
	for i := range want {
		if got[i].ID != want[i].ID || got[i].Subject != want[i].Subject || !bytes.Equal(got[i].Data, want[i].Data) || gotErrs[i] != wantErrs[i] {
			t.Fatalf("%s: event %d:\n got %s %s %s (error %v)\nwant %s %s %s (error %v)", what, i,
				got[i].ID, got[i].Subject, got[i].Data, gotErrs[i], want[i].ID, want[i].Subject, want[i].Data, wantErrs[i])
		}
		if wantErrs[i] {
			bad++
		}
	}
	if bad == 0 || bad == len(want) {
		t.Fatalf("%s: %d error events of %d: the test does not cover both", what, bad, len(want))
	}
}
