package cdc

import (
	"context"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fanwire/fanwire/cdc/pgtest"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
)

// BenchmarkBootstrapRows measures the ingest's own work per bootstrapped
// row: fetching a table's rows from PostgreSQL chunk by chunk, as the
// bootstrap does (bootstrapChunk, in the exported snapshot's session
// settings), to finished events, which are dropped: the broker is left
// out. One op is a whole pass over the table (orders 100k rows, order_items
// 300k, of the projection benchmarks' data set); allocs/row and B/row
// count every allocation of the pass (pgx's reading of the rows included),
// ns/row is the pass's wall-clock time (PostgreSQL's share included), and
// cpu-ns/row this process's CPU time (PostgreSQL's left out; less skewed
// than wall-clock time by other work on the machine).
func BenchmarkBootstrapRows(b *testing.B) {
	pg := pgtest.Start(b, pgtest.Config{})
	pg.Exec("postgres", pgtest.OrdersDataSet...)
	ctx := context.Background()
	for _, name := range []string{"orders", "order_items"} {
		b.Run(name, func(b *testing.B) {
			conn, err := pgx.Connect(ctx, pg.DSN("postgres"))
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close(ctx)
			tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
			if err != nil {
				b.Fatal(err)
			}
			defer tx.Rollback(ctx)
			for k, v := range outputParams {
				if _, err := tx.Exec(ctx, "SET LOCAL "+k+" = "+quoteString(v)); err != nil {
					b.Fatal(err)
				}
			}
			in := &Ingest{cfg: Config{BootstrapChunk: 10_000}, log: zap.NewNop()}
			q := "public." + name
			t, err := in.bootstrapTable(ctx, tx, newTypeCache(), q, "public", name, []string{"id"})
			if err != nil {
				b.Fatal(err)
			}
			sel := make([]string, len(t.columns))
			for i, c := range t.columns {
				sel[i] = pgx.Identifier{c.name}.Sanitize()
			}
			decl := "DECLARE bench NO SCROLL CURSOR FOR SELECT " + strings.Join(sel, ", ") + " FROM " + pgx.Identifier{"public", name}.Sanitize() + " ORDER BY id"
			// A commit time with nanoseconds, as time.Now gives.
			tx0 := &txn{commitLSN: pglogrepl.LSN(0x1_6B37_48A0), commitTime: time.Date(2026, 12, 1, 19, 37, 3, 123456789, time.UTC)}
			b.ReportAllocs()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			rows, events := 0, 0
			cpu0 := cpuTime(b)
			for b.Loop() {
				if _, err := tx.Exec(ctx, decl); err != nil {
					b.Fatal(err)
				}
				n := 0
				enc := newBootEncoder(t, tx0)
				for {
					evs, err := in.bootstrapChunk(ctx, tx, "bench", enc, &n)
					if err != nil {
						b.Fatal(err)
					}
					if len(evs) == 0 {
						break
					}
					events += len(evs) // the publish that drops
				}
				if _, err := tx.Exec(ctx, "CLOSE bench"); err != nil {
					b.Fatal(err)
				}
				rows += n
			}
			cpu := cpuTime(b) - cpu0
			runtime.ReadMemStats(&after)
			if events != rows {
				b.Fatalf("%d events of %d rows", events, rows)
			}
			b.ReportMetric(float64(after.Mallocs-before.Mallocs)/float64(rows), "allocs/row")
			b.ReportMetric(float64(after.TotalAlloc-before.TotalAlloc)/float64(rows), "B/row")
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(rows), "ns/row")
			b.ReportMetric(float64(cpu.Nanoseconds())/float64(rows), "cpu-ns/row")
		})
	}
}

// cpuTime is the CPU time (user and system) this process has used.
func cpuTime(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
