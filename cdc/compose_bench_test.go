package cdc

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fanwire/fanwire/cdc/pgjson"
	"github.com/fanwire/fanwire/cdc/pgtest"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"
)

// BenchmarkComposeQueries compares the sql mode's two ways of re-reading
// documents, on the ingest issue's data set (orders 100k, items 300k,
// customers 10k), docChunk keys per query, 8 queries at a time: one query per
// relation level (what the engine does: values come back as text and are
// encoded like change values), and one composed query per chunk
// (json_build_object and json_agg: PostgreSQL's JSON, whose values differ
// from the events' — numeric as numbers, timestamps in its own format —
// and would need re-encoding on top of the figure here).
func BenchmarkComposeQueries(b *testing.B) {
	pg := pgtest.Start(b, pgtest.Config{})
	pg.Exec("postgres", pgtest.OrdersDataSet...)
	ctx := context.Background()
	pcfg, err := pgxpool.ParseConfig(pg.DSN("postgres"))
	if err != nil {
		b.Fatal(err)
	}
	pcfg.MaxConns = docWorkers
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	specs := []ProjectionSpec{{Name: "orders", Table: "orders", Key: "id", Embed: []EmbedSpec{
		{As: "items", Table: "order_items", On: map[string]string{"order_id": "id"}, Many: true, OrderBy: "id"},
		{As: "customer", Table: "customers", On: map[string]string{"id": "customer_id"}},
	}}}
	projs, _, err := resolveProjections(ctx, pool, pgjson.NewTypeCache(), specs, "db", zap.NewNop())
	if err != nil {
		b.Fatal(err)
	}
	e := &sqlComposer{pool: pool, chunk: docChunk, workers: docWorkers}
	const n = 100_000
	keys := make([][]byte, n)
	for i := range keys {
		keys[i] = []byte(strconv.Itoa(i + 1))
	}
	composed := `SELECT o.id::text, json_build_object('id', o.id, 'status', o.status, 'total', o.total, 'customer_id', o.customer_id, 'created_at', o.created_at,
		'items', coalesce((SELECT json_agg(json_build_object('id', i.id, 'order_id', i.order_id, 'sku', i.sku, 'qty', i.qty, 'price', i.price) ORDER BY i.id) FROM order_items i WHERE i.order_id = o.id), '[]'),
		'customer', (SELECT json_build_object('id', c.id, 'name', c.name, 'email', c.email) FROM customers c WHERE c.id = o.customer_id))::text
		FROM orders o WHERE o.id = ANY($1::text[]::int4[])`
	b.Run("per-level", func(b *testing.B) {
		docs := make([][]byte, n)
		b.ReportAllocs()
		cpu := startCPU(b)
		for b.Loop() {
			if err := e.sqlCompose(ctx, projs[0], keys, docs, make([]error, len(keys))); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "docs/s")
		cpu.report(b, n*b.N)
	})
	b.Run("composed", func(b *testing.B) {
		b.ReportAllocs()
		cpu := startCPU(b)
		for b.Loop() {
			g, gctx := errgroup.WithContext(ctx)
			g.SetLimit(docWorkers)
			for start := 0; start < n; start += docChunk {
				part := make([]string, 0, docChunk)
				for _, k := range keys[start:min(start+docChunk, n)] {
					part = append(part, string(k))
				}
				g.Go(func() error {
					rows, err := pool.Query(gctx, composed, part)
					if err != nil {
						return err
					}
					defer rows.Close()
					for rows.Next() {
						_ = rows.RawValues()
					}
					return rows.Err()
				})
			}
			if err := g.Wait(); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "docs/s")
		cpu.report(b, n*b.N)
	})
}

// benchCPU is the CPU time of this process and of each PostgreSQL
// process it started (their backends: the queries' side) at a start.
type benchCPU struct {
	self time.Duration
	pg   map[int]int64 // pid → clock ticks
}

func startCPU(tb testing.TB) benchCPU {
	tb.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return benchCPU{self: time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), pg: postgresCPU()}
}

// report reports the CPU per document of both since the start.
func (c benchCPU) report(b *testing.B, docs int) {
	now := startCPU(b)
	var ticks int64 // of the processes still there (one that ended took its ticks with it)
	for pid, t := range now.pg {
		ticks += t - c.pg[pid]
	}
	b.ReportMetric(float64((now.self-c.self).Nanoseconds())/1e3/float64(docs), "self-cpu-µs/doc")
	b.ReportMetric(float64(ticks)*1e4/float64(docs), "pg-cpu-µs/doc") // 100 ticks a second
}

// postgresCPU is the CPU time in clock ticks of each process named
// postgres that this process started, and of their children.
func postgresCPU() map[int]int64 {
	type proc struct {
		ppid  int
		ticks int64
		comm  string
	}
	procs := make(map[int]proc)
	paths, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, path := range paths {
		b, err := os.ReadFile(path)
		if err != nil {
			continue // gone
		}
		lp, rp := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
		if lp < 0 || rp < lp {
			continue
		}
		pid, _ := strconv.Atoi(strings.TrimSpace(string(b[:lp])))
		f := strings.Fields(string(b[rp+1:]))
		if len(f) < 13 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		ut, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		procs[pid] = proc{ppid: ppid, ticks: ut + st, comm: string(b[lp+1 : rp])}
	}
	me := os.Getpid()
	out := make(map[int]int64)
	for pid, p := range procs {
		if p.comm == "postgres" && (p.ppid == me || procs[p.ppid].ppid == me && procs[p.ppid].comm == "postgres") {
			out[pid] = p.ticks
		}
	}
	return out
}
