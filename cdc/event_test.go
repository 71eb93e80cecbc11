package cdc

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/fanwire/fanwire/broker"
	"github.com/jackc/pglogrepl"
)

// TestEventEncoderMatchesRowEvent: a committed transaction's table events,
// built by the reader's eventEncoder, are byte for byte what rowEvent
// makes of each change, with the ids tableEventID gives (with and without
// a flush window); so are the error events of changes that cannot be
// published (a missing or malformed key, a malformed value, an event over
// the broker's limit). Inserts, updates and deletes, with no old row, the
// key ('K') or the whole old row ('O'), and unchanged TOAST values; keys
// escape in their subject token, composite and single; payloads span
// several of the encoder's blocks, and earlier events are not overwritten
// by later ones.
func TestEventEncoderMatchesRowEvent(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(3, 4))
	texts := []string{"", "a", "a.b", "a,b", "%", "é *>", "x y"}
	enc := eventEncoder{writer: "w"}
	for _, composite := range []bool{false, true} {
		for _, limit := range []int{0, 300} {
			for _, window := range []pglogrepl.LSN{0, 0x16B3700} {
				tb := encoderTestTable(t, composite, limit)
				commit := time.Date(2026, 12, 1, 19, 0, 0, 123456000, time.FixedZone("x", 3600))
				const lsn = 0x16B3748
				slow := &txn{commitLSN: lsn, commitTime: commit}
				fast := &txn{commitLSN: lsn, commitTime: commit, enc: &enc}
				enc.begin(lsn, commit, window)
				row := func(i int) *pglogrepl.TupleData {
					raw := encoderTestRow(rng, texts, i)
					switch rng.IntN(30) {
					case 0:
						raw[1] = []byte("x") // a malformed integer
					case 1:
						raw[2] = []byte("1.5") // a malformed key when composite
					case 2:
						raw[0] = []byte{} // the empty key
					}
					cols := textColumns(raw)
					switch rng.IntN(20) {
					case 0:
						cols[0].DataType, cols[0].Data = pglogrepl.TupleDataTypeNull, nil // a NULL key
					case 1:
						cols[3].DataType, cols[3].Data = pglogrepl.TupleDataTypeToast, nil // unchanged TOAST
					case 2:
						cols[3].DataType, cols[3].Data = pglogrepl.TupleDataTypeNull, nil
					}
					return &pglogrepl.TupleData{Columns: cols}
				}
				var got, want []broker.Outgoing
				var gotErrs, wantErrs []bool
				for i := range 3000 {
					c := &change{kind: "IUD"[rng.IntN(3)], newRow: row(i)}
					if c.kind != 'I' {
						switch rng.IntN(3) {
						case 1:
							c.oldKind, c.oldRow = 'K', row(i)
							for j := range c.oldRow.Columns {
								if j != 0 && j != 2 {
									c.oldRow.Columns[j] = &pglogrepl.TupleDataColumn{DataType: pglogrepl.TupleDataTypeNull}
								}
							}
						case 2:
							c.oldKind, c.oldRow = 'O', row(i)
						}
					}
					if c.kind == 'D' {
						c.newRow = nil
						if c.oldRow == nil {
							c.oldKind, c.oldRow = 'K', row(i)
						}
					}
					var err error
					if got, err = (tableProjection{}).project(got, fast, tb, c, enc.tableID(i)); err != nil {
						if _, ok := asBadRow(err); !ok {
							t.Fatal(err)
						}
					}
					gotErrs = append(gotErrs, err != nil)
					if want, err = (tableProjection{}).project(want, slow, tb, c, tableEventID("w", lsn, i, window)); err != nil {
						if _, ok := asBadRow(err); !ok {
							t.Fatal(err)
						}
					}
					wantErrs = append(wantErrs, err != nil)
				}
				checkEncoded(t, fmt.Sprintf("composite %v, limit %d, window %v", composite, limit, window), got, want, gotErrs, wantErrs)
			}
		}
	}
}

// TestParseChangeMatchesPglogrepl: changeDecoder makes of Insert, Update and
// Delete messages (and its check finds in them), streamed or not, the changes pglogrepl's ParseV2 makes
// (every column kind, empty and NULL values, old keys and rows), and
// refuses what pglogrepl cannot parse: every truncation of them, and
// unknown tuple types.
func TestParseChangeMatchesPglogrepl(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(5, 6))
	tupleBytes := func() []byte {
		n := rng.IntN(6)
		b := binary.BigEndian.AppendUint16(nil, uint16(n))
		for range n {
			switch k := "tnubx"[rng.IntN(5)]; k {
			case 't', 'b':
				v := bytes.Repeat([]byte("v"), rng.IntN(4))
				b = binary.BigEndian.AppendUint32(append(b, k), uint32(len(v)))
				b = append(b, v...)
			default:
				b = append(b, k)
			}
		}
		return b
	}
	viaPglogrepl := func(data []byte, inStream bool) (change, uint32, error) {
		m, err := decode(data, inStream)
		if err != nil {
			return change{}, 0, err
		}
		switch m := m.(type) {
		case *pglogrepl.InsertMessageV2:
			return change{kind: 'I', rel: m.RelationID, newRow: m.Tuple}, m.Xid, nil
		case *pglogrepl.UpdateMessageV2:
			return change{kind: 'U', rel: m.RelationID, newRow: m.NewTuple, oldRow: m.OldTuple, oldKind: m.OldTupleType}, m.Xid, nil
		case *pglogrepl.DeleteMessageV2:
			return change{kind: 'D', rel: m.RelationID, oldRow: m.OldTuple, oldKind: m.OldTupleType}, m.Xid, nil
		}
		return change{}, 0, fmt.Errorf("%T", m)
	}
	var dec changeDecoder // reused, as the reader reuses its own
	for i := range 5000 {
		inStream := i%2 == 1
		kind := "IUD"[rng.IntN(3)]
		b := []byte{kind}
		if inStream {
			b = binary.BigEndian.AppendUint32(b, rng.Uint32())
		}
		b = binary.BigEndian.AppendUint32(b, rng.Uint32())
		switch kind {
		case 'I':
			b = append(append(b, "NNNX"[rng.IntN(4)]), tupleBytes()...)
		case 'U':
			switch rng.IntN(4) {
			case 0:
				b = append(append(b, 'K'), tupleBytes()...)
			case 1:
				b = append(append(b, 'O'), tupleBytes()...)
			case 2:
				b = append(b, 'Z')
			}
			b = append(append(b, 'N'), tupleBytes()...)
		case 'D':
			b = append(append(b, "KOZ"[rng.IntN(3)]), tupleBytes()...)
		}
		for _, n := range []int{len(b), rng.IntN(len(b) + 1)} {
			msg := b[:n]
			if n == 0 {
				continue
			}
			var got change
			rel, checkXid, checkErr := dec.check(msg, inStream)
			c, gotXid, gotErr := dec.decode(msg, inStream)
			if gotErr == nil {
				got = *c
			}
			if (checkErr != nil) != (gotErr != nil) || gotErr == nil && (rel != got.rel || checkXid != gotXid) {
				t.Fatalf("%q (stream %v): check gave relation %d, xid %d, error %v; decode %+v, xid %d, error %v", msg, inStream, rel, checkXid, checkErr, got, gotXid, gotErr)
			}
			want, wantXid, wantErr := viaPglogrepl(msg, inStream)
			if (gotErr != nil) != (wantErr != nil) {
				t.Fatalf("%q (stream %v): error %v, pglogrepl's %v", msg, inStream, gotErr, wantErr)
			}
			if gotErr == nil && (gotXid != wantXid || !reflect.DeepEqual(got, want)) {
				t.Fatalf("%q (stream %v):\n got %+v xid %d\nwant %+v xid %d", msg, inStream, got, gotXid, want, wantXid)
			}
		}
	}
}

// TestAppendLSN: appendLSN formats as pglogrepl's LSN.String does.
func TestAppendLSN(t *testing.T) {
	t.Parallel()
	for _, lsn := range []pglogrepl.LSN{0, 1, 0xF, 0x10, 0x1_6B37_48A0, 0xFFFFFFFF, 0x1_0000_0000, 0xABCDEF01_23456789, ^pglogrepl.LSN(0)} {
		if got, want := string(appendLSN([]byte("x"), lsn)), "x"+lsn.String(); got != want {
			t.Errorf("appendLSN(%d) = %q, want %q", uint64(lsn), got, want)
		}
	}
}
