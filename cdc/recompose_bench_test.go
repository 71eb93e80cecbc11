package cdc_test

// Benchmarks of projections in sql mode: documents of an order with its
// items and its customer, recomposed from PostgreSQL. Each op is one whole
// run on a fresh PostgreSQL cluster and a fresh embedded JetStream (file
// store), like the ingest benchmarks of bench_test.go: run them with
// -benchtime 1x -count N.

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fanwire/fanwire/cdc"
	"github.com/fanwire/fanwire/cdc/pgtest"
	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
)

// projProfile, when set, receives a CPU profile of the timed part of
// BenchmarkProjectionUpdate and BenchmarkProjectionChildDeletes only (not
// their set-up and bootstrap, which -cpuprofile would include).
var projProfile = flag.String("projprofile", "", "write a CPU profile of the projection benchmarks' timed part to this file")

// benchOrders is the number of orders (documents) in pgtest.OrdersDataSet.
const benchOrders = 100_000

// projectionDataSet creates pgtest.OrdersDataSet.
func projectionDataSet(r *benchRig) {
	r.pg.Exec("postgres", pgtest.OrdersDataSet...)
}

var projMode = flag.String("projmode", cdc.ModeSQL, "the projection benchmarks' mode: sql or memory")

// benchProjection: orders with their items (by id) and their customer, in
// -projmode.
func benchProjection() []cdc.ProjectionSpec {
	return []cdc.ProjectionSpec{{
		Name: "orders", Table: "orders", Key: "id", Mode: *projMode,
		Embed: []cdc.EmbedSpec{
			{As: "items", Table: "order_items", On: map[string]string{"order_id": "id"}, Many: true, OrderBy: "id"},
			{As: "customer", Table: "customers", On: map[string]string{"id": "customer_id"}},
		},
	}}
}

// projIngest starts an ingest of benchProjection() (documents only: no
// table events) and returns it with a stop function; it does not wait
// for it to be ready.
func (r *benchRig) projIngest() (*cdc.Ingest, func()) {
	r.tb.Helper()
	in, err := cdc.New(cdc.Config{DSN: r.pg.DSN("postgres"), Broker: r.b, Logger: zap.NewNop(), Retry: 100 * time.Millisecond, Projections: benchProjection(), StateDir: r.tb.TempDir()})
	if err != nil {
		r.tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- in.Run(ctx) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			r.tb.Errorf("ingest: %v", err)
		}
	}
	r.tb.Cleanup(stop)
	return in, stop
}

// procStatus returns a field of /proc/self/status in MiB (VmHWM, VmRSS).
func procStatus(tb testing.TB, field string) float64 {
	tb.Helper()
	return statusField(tb, "/proc/self/status", field)
}

// statusField is a field of a /proc/<pid>/status file in MiB.
func statusField(tb testing.TB, path, field string) float64 {
	tb.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	for line := range bytes.Lines(b) {
		if v, ok := bytes.CutPrefix(line, []byte(field+":")); ok {
			kb, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(string(v)), " kB"))
			if err != nil {
				tb.Fatalf("%s %s: %q", path, field, v)
			}
			return float64(kb) / 1024
		}
	}
	tb.Fatalf("%s has no %s", path, field)
	return 0
}

// resetHWM resets the process's RSS high-water mark (VmHWM) to its current
// RSS (Linux ≥ 4.0), so that a VmHWM read later is the peak of what came
// after.
func resetHWM(tb testing.TB) {
	tb.Helper()
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		tb.Fatalf("reset VmHWM: %v", err)
	}
}

// cpuTimes is the CPU time (user + system) of this process, and of the
// PostgreSQL processes it started (postmasters and their children), those
// of walsenders (decoding) apart from the rest (backends running queries,
// auxiliary processes), from /proc. Processes that exit in between are
// not counted.
func cpuTimes(tb testing.TB) (self, walsenders, others time.Duration) {
	tb.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	var ws, rest int64
	for pid, ticks := range cdc.PostgresCPU() {
		title, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)) // "postgres: walsender …"
		if bytes.Contains(title, []byte("walsender")) {
			ws += ticks
		} else {
			rest += ticks
		}
	}
	tick := time.Second / 100 // USER_HZ
	return self, time.Duration(ws) * tick, time.Duration(rest) * tick
}

// projResult is what one op of projRun measured.
type projResult struct {
	took          time.Duration // commit → the last document acknowledged
	first         time.Duration // commit → the first document acknowledged
	selfCPU       time.Duration
	walCPU, pgCPU time.Duration // walsenders, other PostgreSQL processes
	rssStart, hwm float64
	memRows       int64 // memory mode: rows held, and their values' bytes
	memBytes      int64
}

// projRun is one op of the update and delete benchmarks: a fresh cluster
// with the data set and a bootstrapped ingest (not timed), then write,
// timed from its commit until the ingest has published want(r) more
// events. It measures the CPU used by this process and by PostgreSQL
// meanwhile, and the process's RSS before and its peak during that time.
func projRun(b *testing.B, want func(*benchRig) uint64, write string) projResult {
	b.StopTimer()
	r := newBenchRig(b)
	projectionDataSet(r)
	in, stop := r.projIngest()
	waitFor(b, "bootstrap", 5*time.Minute, in.Ready)
	defer stop()
	if got := in.Published(); got != benchOrders {
		b.Fatalf("bootstrap published %d documents, want %d", got, benchOrders)
	}
	n := want(r)
	base := in.Published()
	conn, err := pgx.Connect(context.Background(), r.pg.DSN("postgres"))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(context.Background())
	if *projProfile != "" {
		f, err := os.Create(*projProfile)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			b.Fatal(err)
		}
	}
	var res projResult
	runtime.GC()
	res.memRows, res.memBytes = in.MemoryState()
	resetHWM(b)
	res.rssStart = procStatus(b, "VmRSS")
	self0, wal0, pg0 := cpuTimes(b)
	if _, err := conn.Exec(context.Background(), write); err != nil {
		b.Fatal(err)
	}
	b.StartTimer()
	start := time.Now()
	waitFor(b, "documents", 5*time.Minute, func() bool {
		p := in.Published()
		if res.first == 0 && p > base {
			res.first = time.Since(start)
		}
		return p >= base+n
	})
	res.took = time.Since(start)
	b.StopTimer()
	self1, wal1, pg1 := cpuTimes(b)
	res.hwm = procStatus(b, "VmHWM")
	res.selfCPU, res.walCPU, res.pgCPU = self1-self0, wal1-wal0, pg1-pg0
	if *projProfile != "" {
		pprof.StopCPUProfile()
	}
	time.Sleep(200 * time.Millisecond) // any event too many
	if got := in.Published() - base; got != n {
		b.Fatalf("published %d documents, want %d", got, n)
	}
	return res
}

func reportProj(b *testing.B, docs int, res []projResult) {
	var took, first, self, wal, pg time.Duration
	var rss, hwm float64
	for _, r := range res {
		took, first, self, wal, pg = took+r.took, first+r.first, self+r.selfCPU, wal+r.walCPU, pg+r.pgCPU
		rss, hwm = max(rss, r.rssStart), max(hwm, r.hwm)
	}
	ops := float64(len(res))
	b.ReportMetric(float64(docs*len(res))/took.Seconds(), "docs/s")
	b.ReportMetric(first.Seconds()*1000/ops, "first-doc-ms")
	b.ReportMetric(self.Seconds()/ops, "go-cpu-s/op")
	b.ReportMetric(wal.Seconds()/ops, "pg-walsender-cpu-s/op")
	b.ReportMetric(pg.Seconds()/ops, "pg-backends-cpu-s/op")
	b.ReportMetric(rss, "rss-start-MiB")
	b.ReportMetric(hwm, "VmHWM-MiB")
	if last := res[len(res)-1]; last.memRows > 0 {
		b.ReportMetric(float64(last.memRows), "mem-rows")
		b.ReportMetric(float64(last.memBytes)/float64(last.memRows), "mem-value-B/row")
	}
}

// BenchmarkProjectionUpdate: one UPDATE of the status of all 100,000
// orders, from its commit until the 100,000th document is acknowledged by
// the broker. VmHWM is the process's RSS peak in that time (reset at its
// start); the process holds the in-process NATS server too.
func BenchmarkProjectionUpdate(b *testing.B) {
	b.ReportAllocs()
	var res []projResult
	for range b.N {
		res = append(res, projRun(b, func(*benchRig) uint64 { return benchOrders }, "UPDATE orders SET status = 'paid'"))
	}
	reportProj(b, benchOrders, res)
}

// BenchmarkProjectionChildDeletes: 10,000 items deleted in one statement,
// from its commit until the documents of their orders (3,334: coalesced,
// one per order) are acknowledged. changes/s is the 10,000 deletes over
// that time.
func BenchmarkProjectionChildDeletes(b *testing.B) {
	const deletes = 10_000
	b.ReportAllocs()
	var res []projResult
	var docs uint64
	for range b.N {
		res = append(res, projRun(b, func(r *benchRig) uint64 {
			if err := pgQuery(r.pg, fmt.Sprintf("SELECT count(DISTINCT order_id) FROM order_items WHERE id <= %d", deletes), &docs); err != nil {
				b.Fatal(err)
			}
			return docs
		}, fmt.Sprintf("DELETE FROM order_items WHERE id <= %d", deletes)))
	}
	reportProj(b, int(docs), res)
	var took time.Duration
	for _, r := range res {
		took += r.took
	}
	b.ReportMetric(float64(deletes*len(res))/took.Seconds(), "changes/s")
}

// BenchmarkProjectionBootstrap: a new slot's bootstrap of the 100,000
// documents, from Run to Ready (the last document acknowledged).
func BenchmarkProjectionBootstrap(b *testing.B) {
	b.ReportAllocs()
	var took time.Duration
	for range b.N {
		b.StopTimer()
		r := newBenchRig(b)
		projectionDataSet(r)
		b.StartTimer()
		start := time.Now()
		in, stop := r.projIngest()
		waitFor(b, "bootstrap", 5*time.Minute, in.Ready)
		took += time.Since(start)
		b.StopTimer()
		if got := in.Published(); got != benchOrders {
			b.Fatalf("published %d documents, want %d", got, benchOrders)
		}
		stop()
	}
	b.ReportMetric(float64(benchOrders*b.N)/took.Seconds(), "docs/s")
}
