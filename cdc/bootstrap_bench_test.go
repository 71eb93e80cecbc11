package cdc

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"hash"
	"hash/fnv"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fanwire/fanwire/cdc/pgjson"
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
			for k, v := range pgjson.OutputParams() {
				if _, err := tx.Exec(ctx, "SET LOCAL "+k+" = "+quoteString(v)); err != nil {
					b.Fatal(err)
				}
			}
			in := &Ingest{cfg: Config{BootstrapChunk: 10_000}, log: zap.NewNop()}
			q := "public." + name
			t, err := in.bootstrapTable(ctx, tx, pgjson.NewTypeCache(), q, "public", name, []string{"id"})
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
				enc := newBootEncoder("w", t, tx0)
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

// BenchmarkBootstrapID compares ways of making a bootstrapped row's id
// from the table and its values (an orders row): the id as it was (SHA-256
// through hash.Hash, its sum, hex and the "b-" each allocated), and what
// the bootstrap may do instead with its scratch buffers reused from row to
// row: SHA-256 of the row's bytes in hexadecimal (bootstrapHash and
// appendBootstrapID: the same ids) or in base64url, and FNV-1a 128 and 64
// (stdlib, not cryptographic). cpu-ns/op is the process's CPU time per id.
// Measured (medians of 8, load average 12-15 on 2 cores), in cpu-ns/op:
// 451 as it was, 227 SHA-256 hex, 204 base64url, 217 FNV-1a 128, 154
// FNV-1a 64; the bootstrap keeps SHA-256 in hex (docs/ingest.md).
func BenchmarkBootstrapID(b *testing.B) {
	raw := [][]byte{[]byte("12345"), []byte("2346"), []byte("new"), []byte("345.99"), []byte("2026-11-30 15:25:45+00")}
	const table = "public.orders"
	var in, out []byte
	var l [5]byte
	fnvHash := func(h hash.Hash) {
		h.Reset()
		h.Write([]byte(table))
		for _, v := range raw {
			if v == nil {
				h.Write(l[:1])
				continue
			}
			l[0] = 1
			binary.BigEndian.PutUint32(l[1:], uint32(len(v)))
			h.Write(l[:])
			h.Write(v)
		}
	}
	b.Run("sha256-hex-alloc", func(b *testing.B) {
		b.ReportAllocs()
		defer reportCPU(b, cpuTime(b))
		for b.Loop() {
			_ = oldBootstrapID(table, raw)
		}
	})
	b.Run("sha256-hex", func(b *testing.B) {
		b.ReportAllocs()
		defer reportCPU(b, cpuTime(b))
		for b.Loop() {
			var sum [sha256.Size]byte
			in, sum = bootstrapHash(in[:0], table, raw)
			out = appendBootstrapID(out[:0], "w", &sum)
		}
	})
	b.Run("sha256-base64url", func(b *testing.B) {
		b.ReportAllocs()
		defer reportCPU(b, cpuTime(b))
		for b.Loop() {
			var sum [sha256.Size]byte
			in, sum = bootstrapHash(in[:0], table, raw)
			out = base64.RawURLEncoding.AppendEncode(append(out[:0], "b-"...), sum[:12])
		}
	})
	for _, f := range []struct {
		name string
		h    hash.Hash
	}{{"fnv128a-hex", fnv.New128a()}, {"fnv64a-hex", fnv.New64a()}} {
		b.Run(f.name, func(b *testing.B) {
			b.ReportAllocs()
			defer reportCPU(b, cpuTime(b))
			for b.Loop() {
				fnvHash(f.h)
				in = f.h.Sum(in[:0])
				out = hex.AppendEncode(append(out[:0], "b-"...), in)
			}
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

// reportCPU reports the process's CPU time per op since start
// (cpu-ns/op).
func reportCPU(b *testing.B, start time.Duration) {
	b.ReportMetric(float64((cpuTime(b)-start).Nanoseconds())/float64(b.N), "cpu-ns/op")
}
