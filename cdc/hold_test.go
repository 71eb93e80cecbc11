package cdc

import (
	"bytes"
	"context"
	"path/filepath"
	"reflect"
	"testing"

	"go.uber.org/zap"

	"github.com/fanwire/fanwire/cdc/pgjson"
)

// TestHoldingASmallTransactionAllocatesNothing: a transaction under
// MaxTxnMemory costs its changes' slice, its messages' arena block and
// nothing of the spill machinery: no allocation per change, no file.
func TestHoldingASmallTransactionAllocatesNothing(t *testing.T) {
	cfg := Config{StateDir: t.TempDir()}
	cfg.setDefaults()
	r := &reader{in: &Ingest{cfg: cfg, log: zap.NewNop()}, streamed: make(map[uint32]*txn), rels: newRelations("db", nil, 0, pgjson.NewTypeCache(), nil)}
	msg := pgUpdate(1, "42", "a value")
	block := make([]byte, 0, arenaBlock) // the arena's, reused from run to run (release lets it go)
	r.cur = &txn{xid: 7, changes: changeList{first: make([]heldChange, 0, 64)}}
	allocs := testing.AllocsPerRun(100, func() {
		r.cur.changes.first = r.cur.changes.first[:0]
		r.cur.arena.block = block[:0]
		for range 64 {
			if err := r.handle(context.Background(), msg); err != nil {
				t.Fatal(err)
			}
		}
		r.release(r.cur)
	})
	if allocs != 0 {
		t.Errorf("%v allocations per 64 changes held", allocs)
	}
	if r.cur.spill != nil || r.held != 0 || r.cur.changes.len() != 64 {
		t.Errorf("spilled %v, held %d bytes after release, %d changes", r.cur.spill != nil, r.held, r.cur.changes.len())
	}
	if m, _ := filepath.Glob(filepath.Join(cfg.StateDir, "*")); len(m) > 0 {
		t.Errorf("files in the state dir: %v", m)
	}
}

// TestHeldChangeIsACopy: a held change keeps its message's bytes after the
// receive buffer it came in is written over, and is decoded at its commit
// as it was received.
func TestHeldChangeIsACopy(t *testing.T) {
	t.Parallel()
	cfg := Config{StateDir: t.TempDir()}
	cfg.setDefaults()
	r := &reader{in: &Ingest{cfg: cfg, log: zap.NewNop()}, streamed: make(map[uint32]*txn), rels: newRelations("db", nil, 0, pgjson.NewTypeCache(), nil)}
	r.cur = &txn{xid: 7}
	buf := pgUpdate(1, "42", "a value")
	want := bytes.Clone(buf)
	if err := r.handle(context.Background(), buf); err != nil {
		t.Fatal(err)
	}
	for i := range buf {
		buf[i] = 0xff
	}
	h := r.cur.changes.at(0)
	if !bytes.Equal(h.msg, want) {
		t.Fatalf("held %q, want %q", h.msg, want)
	}
	c, err := r.decodeHeld(h)
	if err != nil {
		t.Fatal(err)
	}
	if c.kind != 'U' || c.rel != 1 || len(c.newRow.Columns) != 2 || string(c.newRow.Columns[1].Data) != "a value" {
		t.Fatalf("decoded %+v", c)
	}
}

// TestSpillFileRoundTrip: changes read back from a spill file equal those
// written, in order, but a rolled-back subtransaction's; the file is
// removed.
func TestSpillFileRoundTrip(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	// Two definitions of one table (a DDL between its changes), and
	// another table: each change comes back with its own.
	t1, t1b, t2 := &table{nameKey: "public.a", gen: 1}, &table{nameKey: "public.a", gen: 3}, &table{nameKey: "public.b", gen: 2}
	defs := map[uint64]*table{1: t1, 2: t2, 3: t1b}
	toastUpdate := []byte{'U', 0, 0, 0x40, 0, 'O', 0, 3, 't', 0, 0, 0, 1, '2', 't', 0, 0, 0, 3, 'o', 'l', 'd', 'n', 'N', 0, 3, 't', 0, 0, 0, 1, '2', 'u', 't', 0, 0, 0, 0}
	del := []byte{'D', 0, 0, 0x40, 1, 'K', 0, 2, 't', 0, 0, 0, 1, '3', 'n'}
	in := []heldChange{
		{msg: pgInsert(16384, "1", "x"), tbl: t1},
		{msg: pgStreamInsert(11, 16384, "2", "y"), xid: 11, stream: true, tbl: t1},
		{msg: toastUpdate, xid: 10, tbl: t1},
		{msg: del, xid: 10, tbl: t2},
		{truncs: []*table{t1, t2, t1b}, xid: 12},
		{truncs: []*table{}, xid: 12}, // of no table (pgoutput sends none such; it reads back all the same)
		{msg: pgStreamInsert(11, 16384, "rolled back"), xid: 11, stream: true, tbl: t1b},
		{msg: pgUpdate(16384, "4"), xid: 10, tbl: t1b},
		{msg: pgInsert(16390, "no relation"), xid: 10},
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
	var out []heldChange
	if err := f.replay(func(gen uint64) *table { return defs[gen] }, func(h *heldChange) error {
		c := *h
		c.msg = bytes.Clone(h.msg) // the record's buffer is reused
		out = append(out, c)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	want := []heldChange{in[0], in[2], in[3], in[4], in[5], in[7], in[8]}
	want[4].truncs = nil // read back: none
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
	t.Parallel()
	var l changeList
	var want []uint32
	check := func(step string) {
		t.Helper()
		if l.len() != len(want) {
			t.Fatalf("%s: len %d, want %d", step, l.len(), len(want))
		}
		var got []uint32
		_ = l.each(func(c *heldChange) error { got = append(got, c.xid); return nil })
		for i := range want {
			if l.at(i).xid != want[i] {
				t.Fatalf("%s: at(%d) = %d, want %d", step, i, l.at(i).xid, want[i])
			}
		}
		if !reflect.DeepEqual(got, want) && len(want) > 0 {
			t.Fatalf("%s: each gave %v, want %v", step, got, want)
		}
	}
	add := func(from, to int) {
		for i := from; i < to; i++ {
			l.add(heldChange{xid: uint32(i)})
			want = append(want, uint32(i))
		}
	}
	filter := func(drop uint32) {
		l.filter(func(c *heldChange) bool { return c.xid%3 != drop })
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
	if err := l.consume(func(c *heldChange) error {
		if c.xid != want[n] {
			t.Fatalf("consume: change %d is %d, want %d", n, c.xid, want[n])
		}
		n++
		return nil
	}); err != nil || n != len(want) || l.len() != 0 {
		t.Fatalf("consume: %v, %d changes of %d, %d left", err, n, len(want), l.len())
	}
}

// TestAbortedSubtransactionStaysCounted: the messages of a streamed
// transaction's rolled-back subtransaction stay in its arena until it ends,
// so they stay counted against MaxTxnMemory; past it, the transaction
// spills, which frees them, and what it writes is only the changes kept.
func TestAbortedSubtransactionStaysCounted(t *testing.T) {
	t.Parallel()
	cfg := Config{StateDir: t.TempDir()}
	cfg.setDefaults()
	r := &reader{in: &Ingest{cfg: cfg, log: zap.NewNop()}, streamed: make(map[uint32]*txn), rels: newRelations("db", nil, 0, pgjson.NewTypeCache(), nil)}
	msg := pgUpdate(1, "42", "a value")
	r.inStream, r.streamXid = true, 9
	for i := range 100 {
		if err := r.add(heldChange{msg: msg, xid: uint32(10 + i%2)}); err != nil {
			t.Fatal(err)
		}
	}
	tx := r.streamed[9]
	held := r.held
	if held == 0 || tx.mem != held {
		t.Fatalf("held %d bytes, the transaction %d", held, tx.mem)
	}
	r.abortSub(tx, 11)
	if tx.changes.len() != 50 {
		t.Fatalf("%d changes after the rollback, want 50", tx.changes.len())
	}
	if r.held != held || tx.mem != held {
		t.Fatalf("held %d, the transaction %d after the rollback, want %d: its messages are still in the arena", r.held, tx.mem, held)
	}
	// Past the bound, the transaction spills: its memory is free, and the
	// spill file holds the 50 changes kept.
	r.in.cfg.MaxTxnMemory = held
	if err := r.add(heldChange{msg: msg, xid: 10}); err != nil {
		t.Fatal(err)
	}
	if tx.spill == nil || r.held != 0 || tx.mem != 0 {
		t.Fatalf("spilled %v, held %d, the transaction %d", tx.spill != nil, r.held, tx.mem)
	}
	r.close()
}
