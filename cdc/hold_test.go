package cdc

import (
	"github.com/fanwire/fanwire/cdc/pgjson"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/jackc/pglogrepl"
	"go.uber.org/zap"
)

func tuple(cols ...*pglogrepl.TupleDataColumn) *pglogrepl.TupleData {
	return &pglogrepl.TupleData{ColumnNum: uint16(len(cols)), Columns: cols}
}

func text(s string) *pglogrepl.TupleDataColumn {
	return &pglogrepl.TupleDataColumn{DataType: pglogrepl.TupleDataTypeText, Length: uint32(len(s)), Data: []byte(s)}
}

// TestHoldingASmallTransactionAllocatesNothing: a transaction under
// MaxTxnMemory costs its changes' slice and nothing of the spill
// machinery: no allocation per change, no file.
func TestHoldingASmallTransactionAllocatesNothing(t *testing.T) {
	cfg := Config{StateDir: t.TempDir()}
	cfg.setDefaults()
	r := &reader{in: &Ingest{cfg: cfg, log: zap.NewNop()}, streamed: make(map[uint32]*txn), rels: newRelations("db", nil, 0, pgjson.NewTypeCache(), nil)}
	row := tuple(text("42"), text("a value"), &pglogrepl.TupleDataColumn{DataType: pglogrepl.TupleDataTypeNull})
	r.cur = &txn{xid: 7, changes: changeList{first: make([]change, 0, 64)}}
	allocs := testing.AllocsPerRun(100, func() {
		r.cur.changes.first = r.cur.changes.first[:0]
		for range 64 {
			if err := r.add(7, change{kind: 'U', rel: 1, newRow: row, oldRow: row, oldKind: 'O'}); err != nil {
				t.Fatal(err)
			}
		}
		r.release(r.cur)
	})
	if allocs != 0 {
		t.Errorf("%v allocations per 64 changes held", allocs)
	}
	if r.cur.spill != nil || r.held != 0 {
		t.Errorf("spilled %v, held %d bytes after release", r.cur.spill != nil, r.held)
	}
	if m, _ := filepath.Glob(filepath.Join(cfg.StateDir, "*")); len(m) > 0 {
		t.Errorf("files in the state dir: %v", m)
	}
}

// TestSpillFileRoundTrip: changes read back from a spill file equal those
// written, in order, but a rolled-back subtransaction's; the file is
// removed.
func TestSpillFileRoundTrip(t *testing.T) {
	dir := t.TempDir()
	toast := &pglogrepl.TupleDataColumn{DataType: pglogrepl.TupleDataTypeToast}
	null := &pglogrepl.TupleDataColumn{DataType: pglogrepl.TupleDataTypeNull}
	empty := &pglogrepl.TupleDataColumn{DataType: pglogrepl.TupleDataTypeText, Data: []byte{}}
	// Two definitions of one table (a DDL between its changes), and
	// another table: each change comes back with its own.
	t1, t1b, t2 := &table{nameKey: "public.a", gen: 1}, &table{nameKey: "public.a", gen: 3}, &table{nameKey: "public.b", gen: 2}
	defs := map[uint64]*table{1: t1, 2: t2, 3: t1b}
	in := []change{
		{kind: 'I', xid: 10, rel: 16384, tbl: t1, newRow: tuple(text("1"), text("x"), null)},
		{kind: 'U', xid: 11, rel: 16384, tbl: t1, newRow: tuple(text("2"), toast, empty), oldRow: tuple(text("2"), text("old"), null), oldKind: 'O'},
		{kind: 'D', xid: 10, rel: 16385, tbl: t2, oldRow: tuple(text("3"), null), oldKind: 'K'},
		{kind: 'T', xid: 12, truncs: []*table{t1, t2, t1b}},
		{kind: 'I', xid: 11, rel: 16384, tbl: t1b, newRow: tuple(text("rolled back"))},
		{kind: 'U', xid: 10, rel: 16384, tbl: t1b, newRow: tuple()},
	}
	f, err := newSpillFile(dir, "fanwire", 10)
	if err != nil {
		t.Fatal(err)
	}
	for i := range in {
		if _, err := f.write(&in[i]); err != nil {
			t.Fatal(err)
		}
	}
	f.abort(11)
	var out []change
	if err := f.replay(func(gen uint64) *table { return defs[gen] }, func(c *change) error { out = append(out, *c); return nil }); err != nil {
		t.Fatal(err)
	}
	want := []change{in[0], in[2], in[3], in[5]}
	if len(out) != len(want) {
		t.Fatalf("read back %d changes, want %d", len(out), len(want))
	}
	for i := range want {
		if !reflect.DeepEqual(out[i], want[i]) {
			t.Errorf("change %d: read back %+v, want %+v", i, out[i], want[i])
		}
	}
	if err := f.remove(); err != nil {
		t.Fatal(err)
	}
	if m, _ := filepath.Glob(filepath.Join(dir, "*")); len(m) > 0 {
		t.Errorf("files left: %v", m)
	}
}

// TestChangeListKeepsOrder: a changeList past several chunks gives its
// changes back in order, filters them in place (across chunks, down to
// fewer than one), keeps growing after, and lets them all go once consumed.
func TestChangeListKeepsOrder(t *testing.T) {
	var l changeList
	var want []uint32
	check := func(step string) {
		t.Helper()
		if l.len() != len(want) {
			t.Fatalf("%s: len %d, want %d", step, l.len(), len(want))
		}
		var got []uint32
		_ = l.each(func(c *change) error { got = append(got, c.rel); return nil })
		for i := range want {
			if l.at(i).rel != want[i] {
				t.Fatalf("%s: at(%d) = %d, want %d", step, i, l.at(i).rel, want[i])
			}
		}
		if !reflect.DeepEqual(got, want) && len(want) > 0 {
			t.Fatalf("%s: each gave %v, want %v", step, got, want)
		}
	}
	add := func(from, to int) {
		for i := from; i < to; i++ {
			l.add(change{rel: uint32(i), xid: uint32(i % 3)})
			want = append(want, uint32(i))
		}
	}
	filter := func(drop uint32) {
		l.filter(func(c *change) bool { return c.xid != drop })
		kept := want[:0]
		for _, v := range want {
			if v%3 != drop {
				kept = append(kept, v)
			}
		}
		want = kept
	}
	add(0, 5*changeChunk+7)
	check("added")
	filter(1)
	check("filtered")
	add(5*changeChunk+7, 6*changeChunk)
	check("added after a filter")
	filter(0)
	filter(2)
	check("all filtered")
	add(0, 3*changeChunk)
	check("added to an empty list")
	n := 0
	if err := l.consume(func(c *change) error {
		if c.rel != want[n] {
			t.Fatalf("consume: change %d is %d, want %d", n, c.rel, want[n])
		}
		n++
		return nil
	}); err != nil || n != len(want) || l.len() != 0 {
		t.Fatalf("consume: %v, %d changes of %d, %d left", err, n, len(want), l.len())
	}
}
