package cdc

import (
	"bytes"
	"context"
	"fmt"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/fanwire/fanwire/broker"
	"github.com/fanwire/fanwire/cdc/pgjson"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgtype"
)

// The memory mode's per-document hot path without PostgreSQL or a broker:
// the projection of BenchmarkProjectionUpdate (orders with their items and
// their customer) over pgtest.OrdersDataSet's rows, built in memory.
// BenchmarkMemDocuments/compose is what a 100,000-row UPDATE of orders
// costs once its changes are applied (events: every document composed and
// encoded as its event); /apply is applying those 100,000 changes to the
// state. Allocation counts do not depend on the machine's load.

const memBenchOrders = 100_000

// memBenchEngine is a docEngine with the memory state of the orders data
// set (orders orders, 3 items each, up to 10,000 customers), and the
// relation of orders as pgoutput describes it.
func memBenchEngine(tb testing.TB, orders int) (*docEngine, *table) {
	tb.Helper()
	col := func(oid uint32, typ string) catalogColumn {
		return catalogColumn{oid: oid, typ: typ, ctype: pgjson.Type{OID: oid}}
	}
	cat := map[string]*catalogTable{
		"public.customers": {
			cols:  map[string]catalogColumn{"id": col(pgtype.Int4OID, "integer"), "name": col(pgtype.TextOID, "text"), "email": col(pgtype.TextOID, "text")},
			order: []string{"id", "name", "email"}, pkey: []string{"id"}, replIdent: 'f',
		},
		"public.orders": {
			cols: map[string]catalogColumn{"id": col(pgtype.Int4OID, "integer"), "customer_id": col(pgtype.Int4OID, "integer"), "status": col(pgtype.TextOID, "text"),
				"total": col(pgtype.NumericOID, "numeric(12,2)"), "created_at": col(pgtype.TimestamptzOID, "timestamp with time zone")},
			order: []string{"id", "customer_id", "status", "total", "created_at"}, pkey: []string{"id"}, replIdent: 'd',
		},
		"public.order_items": {
			cols: map[string]catalogColumn{"id": col(pgtype.Int4OID, "integer"), "order_id": col(pgtype.Int4OID, "integer"), "sku": col(pgtype.TextOID, "text"),
				"qty": col(pgtype.Int4OID, "integer"), "price": col(pgtype.NumericOID, "numeric(10,2)")},
			order: []string{"id", "order_id", "sku", "qty", "price"}, pkey: []string{"id"}, replIdent: 'f',
		},
	}
	spec := &ProjectionSpec{
		Name: "orders", Table: "orders", Key: "id", Mode: ModeMemory,
		Embed: []EmbedSpec{
			{As: "items", Table: "order_items", On: map[string]string{"order_id": "id"}, Many: true, OrderBy: "id"},
			{As: "customer", Table: "customers", On: map[string]string{"id": "customer_id"}},
		},
	}
	p := &docProjection{spec: spec, subject: "fw.orders"}
	p.errSubject = errorSubject("fw", p.subject)
	root, errs := resolveNode(cat, "bench", spec.Table, nil, nil, p)
	errs = append(errs, resolveEmbeds(cat, "bench", root, spec.Embed, p)...)
	if len(errs) > 0 {
		tb.Fatal(errs)
	}
	p.root, p.key = root, mkCol("id", cat["public.orders"].cols["id"])
	e := &docEngine{projs: []*docProjection{p}, report: func(err *badRowError) { tb.Fatal(err) }}
	e.mem = newMemState(e.projs, cat)
	e.setComposers()
	put := func(name string, vals ...string) {
		t := e.mem.tables[name]
		row := make([][]byte, len(t.cols))
		for i, c := range t.cols {
			for j, n := range cat[name].order {
				if n == c.name {
					row[i] = []byte(vals[j])
				}
			}
		}
		t.insertVals(row)
	}
	for i := 1; i <= min(orders, 10_000); i++ {
		put("public.customers", strconv.Itoa(i), "Customer "+strconv.Itoa(i), "customer"+strconv.Itoa(i)+"@example.com")
	}
	created := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	for i := 1; i <= orders; i++ {
		put("public.orders", strconv.Itoa(i), strconv.Itoa(1+i%10_000), "new", fmt.Sprintf("%d.99", i%1000),
			created.Add(time.Duration(i)*time.Second).Format("2006-01-02 15:04:05+00"))
	}
	for i := 1; i <= 3*orders; i++ {
		put("public.order_items", strconv.Itoa(i), strconv.Itoa((i+2)/3), "SKU-"+strconv.Itoa(i%5000), strconv.Itoa(1+i%5), fmt.Sprintf("%d.50", i%200))
	}
	rel := &table{nameKey: "public.orders"}
	for _, n := range cat["public.orders"].order {
		rel.columns = append(rel.columns, newColumn(n, cat["public.orders"].cols[n].ctype))
	}
	return e, rel
}

// memBenchUpdates are the changes of UPDATE orders SET status = 'paid'
// on orders orders.
func memBenchUpdates(orders int) []change {
	created := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	out := make([]change, orders)
	for i := range out {
		id := i + 1
		vals := []string{strconv.Itoa(id), strconv.Itoa(1 + id%10_000), "paid", fmt.Sprintf("%d.99", id%1000), created.Add(time.Duration(id) * time.Second).Format("2006-01-02 15:04:05+00")}
		tuple := &pglogrepl.TupleData{}
		for _, v := range vals {
			tuple.Columns = append(tuple.Columns, &pglogrepl.TupleDataColumn{DataType: pglogrepl.TupleDataTypeText, Data: []byte(v)})
		}
		out[i] = change{kind: 'U', newRow: tuple}
	}
	return out
}

func BenchmarkMemDocuments(b *testing.B) {
	e, rel := memBenchEngine(b, memBenchOrders)
	changes := memBenchUpdates(memBenchOrders)
	tx := &txn{xid: 1, commitLSN: 0x1000, commitTime: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)}
	id := docEventIDs("w", tx.commitLSN, tx.commitLSN) // as the reader names documents
	var published int
	flush := func(evs []broker.Outgoing) ([]broker.Outgoing, error) {
		if len(evs) < 4096 {
			return evs, nil
		}
		published += len(evs)
		return nil, nil
	}
	b.Run("apply", func(b *testing.B) {
		m := startAllocs(b)
		for b.Loop() {
			d := newDocChanges()
			for i := range changes {
				if err := e.observe(d, rel, &changes[i]); err != nil {
					b.Fatal(err)
				}
			}
			if n := len(d.keys[e.projs[0]]); n != memBenchOrders {
				b.Fatalf("%d documents affected, want %d", n, memBenchOrders)
			}
		}
		reportPerDoc(b, m)
	})
	d := newDocChanges()
	for i := range changes {
		if err := e.observe(d, rel, &changes[i]); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("compose", func(b *testing.B) {
		m := startAllocs(b)
		for b.Loop() {
			published = 0
			evs, err := e.events(context.Background(), nil, d, tx, id, flush)
			if err != nil {
				b.Fatal(err)
			}
			if published += len(evs); published != memBenchOrders {
				b.Fatalf("%d events, want %d", published, memBenchOrders)
			}
		}
		reportPerDoc(b, m)
	})
}

// BenchmarkMemStateHeap: the Go heap the memory state of the data set
// (410,000 rows) takes beyond its values' bytes, per row (HeapAlloc after
// a GC, around building it), and how many objects the GC finds in it.
func BenchmarkMemStateHeap(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		var m0, m1 runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&m0)
		e, _ := memBenchEngine(b, memBenchOrders)
		runtime.GC()
		runtime.ReadMemStats(&m1)
		rows, values := e.mem.stats()
		b.ReportMetric(float64(int64(m1.HeapAlloc-m0.HeapAlloc)-values)/float64(rows), "heap-beyond-values-B/row")
		b.ReportMetric(float64(values)/float64(rows), "value-B/row")
		b.ReportMetric(float64(m1.HeapObjects-m0.HeapObjects), "heap-objects")
		runtime.KeepAlive(e)
	}
}

// startAllocs returns the count of heap allocations so far.
func startAllocs(b *testing.B) uint64 {
	b.ReportAllocs()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.Mallocs
}

// reportPerDoc reports documents per second, and allocations and bytes
// per document, of a benchmark whose op handles memBenchOrders documents
// (mallocs: startAllocs before its loop).
func reportPerDoc(b *testing.B, mallocs uint64) {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	docs := float64(memBenchOrders * b.N)
	b.ReportMetric(docs/b.Elapsed().Seconds(), "docs/s")
	b.ReportMetric(float64(m.Mallocs-mallocs)/docs, "allocs/doc")
}

// An update applied in place is persisted as what it is: a state loaded
// from the store holds the updated rows and composes the same documents.
func TestMemUpdatePersists(t *testing.T) {
	t.Parallel()
	e, rel := memBenchEngine(t, 50)
	store, err := openMemStore(t.TempDir()+"/state.db", []ProjectionSpec{*e.projs[0].spec})
	if err != nil {
		t.Fatal(err)
	}
	defer store.close()
	if err := store.writeAll(e.mem, 1); err != nil {
		t.Fatal(err)
	}
	d := newDocChanges()
	for i, c := range memBenchUpdates(50) {
		if i%2 == 0 {
			if err := e.observe(d, rel, &c); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n := len(d.keys[e.projs[0]]); n != 25 {
		t.Fatalf("%d documents affected, want 25", n)
	}
	e.commitMem(d, 2)
	if err := store.persist(e.mem, 2); err != nil {
		t.Fatal(err)
	}
	e2, _ := memBenchEngine(t, 0)
	if _, err := store.load(e2.mem); err != nil {
		t.Fatal(err)
	}
	for name, tab := range e.mem.tables {
		t2 := e2.mem.tables[name]
		got, want := memRowsByKey(t2), memRowsByKey(tab)
		if len(got) != len(want) {
			t.Fatalf("%s: %d rows loaded, want %d", name, len(got), len(want))
		}
		for k, row := range want {
			if got[k] != row {
				t.Fatalf("%s %q: loaded %q, want %q", name, k, got[k], row)
			}
		}
	}
	for id := 1; id <= 50; id++ {
		k := []byte(strconv.Itoa(id))
		want, err1 := e.mem.memCompose(e.projs[0], k)
		got, err2 := e2.mem.memCompose(e2.projs[0], k)
		if err1 != nil || err2 != nil || string(got) != string(want) {
			t.Fatalf("order %d: loaded %s (%v), want %s (%v)", id, got, err2, want, err1)
		}
		if paid := bytes.Contains(want, []byte(`"status":"paid"`)); paid != (id%2 == 1) {
			t.Fatalf("order %d: %s", id, want)
		}
	}
}

// memRowsByKey is every row of t by its key.
func memRowsByKey(t *memTable) map[string]string {
	m := make(map[string]string, t.n)
	for id := uint32(1); id < uint32(len(t.slots)); id++ {
		if row, ok := t.rowAt(id); ok {
			m[string(t.appendKey(nil, row))] = string(row)
		}
	}
	return m
}
