package cdc_test

// Benchmarks of the ingest role against its targets (docs/benchmarks.md,
// "Ingest (PostgreSQL → broker)"). Each op is one whole run on a fresh
// PostgreSQL cluster and a fresh embedded JetStream (file store): run them
// with -benchtime 1x -count N.

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"github.com/prometheus/client_golang/prometheus"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/fanwire/fanwire/broker"
	"github.com/fanwire/fanwire/cdc"
	"github.com/fanwire/fanwire/cdc/pgtest"
	"github.com/fanwire/fanwire/gateway"
	"github.com/fanwire/fanwire/gateway/gatewaytest"
	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
)

// tailProfile, when set, receives a CPU profile of the timed part of the
// tail benchmarks only (the ingest catching up), not of their set-up and
// bootstrap, which -cpuprofile would include.
var tailProfile = flag.String("tailprofile", "", "write a CPU profile of the tail benchmarks' timed catch-up to this file")

// benchRig is a cluster and a JetStream broker; ingests come and go.
type benchRig struct {
	tb  testing.TB
	pg  *pgtest.Server
	b   *broker.JetStream
	url string
}

func newBenchRig(tb testing.TB) *benchRig {
	tb.Helper()
	pg := pgtest.Start(tb, pgtest.Config{})
	b, url := jetStream(tb)
	return &benchRig{tb: tb, pg: pg, b: b, url: url}
}

// ingest starts an ingest and returns it with a stop function; it does not
// wait for it to be ready.
func (r *benchRig) ingest(window time.Duration) (*cdc.Ingest, func()) {
	r.tb.Helper()
	in, err := cdc.New(cdc.Config{DSN: r.pg.DSN("postgres"), Broker: r.b, Logger: zap.NewNop(), FlushWindow: window, Retry: 100 * time.Millisecond})
	if err != nil {
		r.tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- in.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				r.tb.Errorf("ingest: %v", err)
			}
		})
	}
	r.tb.Cleanup(stop)
	return in, stop
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(tb testing.TB, what string, d time.Duration, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("%s: not after %v", what, d)
		}
		time.Sleep(time.Millisecond)
	}
}

func (r *benchRig) lsn() string {
	r.tb.Helper()
	conn, err := pgx.Connect(context.Background(), r.pg.DSN("postgres"))
	if err != nil {
		r.tb.Fatal(err)
	}
	defer conn.Close(context.Background())
	var lsn string
	if err := conn.QueryRow(context.Background(), "SELECT pg_current_wal_lsn()::text").Scan(&lsn); err != nil {
		r.tb.Fatal(err)
	}
	return lsn
}

// recvlogical decodes the reference slot up to endpos with pg_recvlogical
// (pgoutput's binary output to /dev/null: the decode ceiling) and returns
// how long it took.
func (r *benchRig) recvlogical(endpos string) time.Duration {
	r.tb.Helper()
	bin, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pg_recvlogical")
	if len(bin) == 0 {
		r.tb.Fatal("pg_recvlogical not found under /usr/lib/postgresql/*/bin")
	}
	slices.Sort(bin)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin[len(bin)-1], "-d", r.pg.DSN("postgres"), "--slot", "bench_ref", "--start",
		"-o", "proto_version=1", "-o", "publication_names=fanwire", "-f", "/dev/null", "--endpos", endpos, "--no-loop")
	start := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		r.tb.Fatalf("pg_recvlogical: %v\n%s", err, out)
	}
	return time.Since(start)
}

// bootstrapTables creates the bootstrap data set.
func bootstrapTables(pg *pgtest.Server, orders, items, customers int) {
	pg.Exec("postgres",
		"CREATE TABLE customers (id int PRIMARY KEY, name text, email text)",
		"CREATE TABLE orders (id int PRIMARY KEY, customer_id int, status text, total numeric(12,2), created_at timestamptz)",
		"CREATE TABLE order_items (id int PRIMARY KEY, order_id int, sku text, qty int, price numeric(10,2))",
		fmt.Sprintf("INSERT INTO customers SELECT i, 'Customer '||i, 'customer'||i||'@example.com' FROM generate_series(1, %d) i", customers),
		fmt.Sprintf("INSERT INTO orders SELECT i, 1 + i %% %d, 'new', (i %% 1000) + 0.99, '2026-11-30 12:00:00+00'::timestamptz + i * interval '1 second' FROM generate_series(1, %d) i", max(customers, 1), orders),
		fmt.Sprintf("INSERT INTO order_items SELECT i, 1 + i %% %d, 'SKU-'||(i %% 5000), 1 + i %% 5, (i %% 200) + 0.5 FROM generate_series(1, %d) i", max(orders, 1), items),
		"VACUUM ANALYZE",
	)
}

// BenchmarkBootstrap: a new slot's bootstrap of orders (100k), order_items
// (300k) and customers (10k) into JetStream, from Run to Ready (the last
// row acknowledged by the broker).
func BenchmarkBootstrap(b *testing.B) {
	const rows = 100_000 + 300_000 + 10_000
	b.ReportAllocs()
	var total time.Duration
	for range b.N {
		b.StopTimer()
		r := newBenchRig(b)
		bootstrapTables(r.pg, 100_000, 300_000, 10_000)
		b.StartTimer()
		start := time.Now()
		in, stop := r.ingest(2 * time.Millisecond)
		waitFor(b, "bootstrap", 5*time.Minute, in.Ready)
		total += time.Since(start)
		b.StopTimer()
		if got := in.Published(); got != rows {
			b.Fatalf("published %d events, want %d", got, rows)
		}
		stop()
	}
	b.ReportMetric(float64(rows*b.N)/total.Seconds(), "rows/s")
}

// tailRun times the ingest and pg_recvlogical decoding the same backlog
// of WAL: write runs with no ingest attached (the ingest's slot and the
// reference slot both hold the WAL), then a new ingest catches up from its
// slot until it has published n events, then pg_recvlogical reads the same
// WAL from the reference slot. Both include connecting.
func tailRun(b *testing.B, window time.Duration, n int, setup func(*benchRig), write func(*benchRig)) (ingest, ref time.Duration) {
	b.StopTimer()
	r := newBenchRig(b)
	setup(r)
	in, stop := r.ingest(window)
	waitFor(b, "bootstrap", 5*time.Minute, in.Ready)
	stop()
	r.pg.Exec("postgres", "SELECT pg_create_logical_replication_slot('bench_ref', 'pgoutput')")
	write(r)
	endpos := r.lsn()
	if *tailProfile != "" {
		f, err := os.Create(*tailProfile)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			b.Fatal(err)
		}
	}
	b.StartTimer()
	start := time.Now()
	in, stop = r.ingest(window)
	waitFor(b, "tail", 5*time.Minute, func() bool { return in.Published() >= uint64(n) })
	ingest = time.Since(start)
	b.StopTimer()
	if *tailProfile != "" {
		pprof.StopCPUProfile()
	}
	stop()
	if got := in.Published(); got != uint64(n) {
		b.Fatalf("published %d events, want %d", got, n)
	}
	ref = r.recvlogical(endpos)
	return ingest, ref
}

func reportTail(b *testing.B, n int, ingest, ref time.Duration) {
	in := float64(n*b.N) / ingest.Seconds()
	rf := float64(n*b.N) / ref.Seconds()
	b.ReportMetric(in, "changes/s")
	b.ReportMetric(rf, "ref-changes/s")
	b.ReportMetric(100*in/rf, "%-of-ref")
}

var windows = []time.Duration{time.Microsecond, 2 * time.Millisecond, 10 * time.Millisecond}

// BenchmarkTailUpdate: one UPDATE of 100,000 rows in one transaction.
func BenchmarkTailUpdate(b *testing.B) {
	const n = 100_000
	for _, w := range windows {
		b.Run("window="+w.String(), func(b *testing.B) {
			b.ReportAllocs()
			var ingest, ref time.Duration
			for range b.N {
				i, r := tailRun(b, w, n,
					func(r *benchRig) { bootstrapTables(r.pg, n, 0, 0) },
					func(r *benchRig) { r.pg.Exec("postgres", "UPDATE orders SET status = 'paid', total = total + 1") })
				ingest, ref = ingest+i, ref+r
			}
			reportTail(b, n, ingest, ref)
		})
	}
}

// BenchmarkTailSmallTxns: 40,000 single-row INSERT transactions from 4
// concurrent writers.
func BenchmarkTailSmallTxns(b *testing.B) {
	const n, writers = 40_000, 4
	b.ReportAllocs()
	var ingest, ref time.Duration
	for range b.N {
		i, r := tailRun(b, 2*time.Millisecond, n,
			func(r *benchRig) { bootstrapTables(r.pg, 0, 0, 0) },
			func(r *benchRig) { insertConcurrently(b, r.pg.DSN("postgres"), writers, n) })
		ingest, ref = ingest+i, ref+r
	}
	reportTail(b, n, ingest, ref)
}

func insertConcurrently(tb testing.TB, dsn string, writers, n int) {
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			conn, err := pgx.Connect(ctx, dsn)
			if err != nil {
				errs <- err
				return
			}
			defer conn.Close(ctx)
			for i := w; i < n; i += writers {
				if _, err := conn.Exec(ctx, "INSERT INTO orders VALUES ($1, $2, 'new', 9.99, now())", i+1, i%1000); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		tb.Fatal(err)
	}
}

// BenchmarkLatency: commit → WebSocket client, at 1,000 single-row
// transactions/s for latencySeconds, through an ingest, JetStream and an
// in-process gateway. The latency is the client's receive time minus the
// event's commit_time (PostgreSQL's commit timestamp, same clock).
func BenchmarkLatency(b *testing.B) {
	const rate, seconds = 1000, 10
	for _, w := range windows {
		b.Run("window="+w.String(), func(b *testing.B) {
			var lat []time.Duration
			var nodeLag lagShares
			for range b.N {
				b.StopTimer()
				r := newBenchRig(b)
				r.pg.Exec("postgres", "CREATE TABLE lat (id int PRIMARY KEY, n int)")
				in, _ := r.ingest(w)
				waitFor(b, "ready", time.Minute, in.Ready)
				reg := prometheus.NewRegistry()
				gw := gatewaytest.Start(b, gateway.Config{Broker: r.b, Subjects: []string{"db.>"}, Registry: reg})
				b.StartTimer()
				lat = append(lat, latencyRun(b, r, gw.WSURL(), rate, seconds)...)
				b.StopTimer()
				nodeLag.add(b, reg)
				gw.Close()
			}
			slices.Sort(lat)
			q := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Microseconds()) / 1000 }
			b.ReportMetric(q(0.50), "p50-ms")
			b.ReportMetric(q(0.95), "p95-ms")
			b.ReportMetric(q(0.99), "p99-ms")
			b.ReportMetric(float64(lat[len(lat)-1].Microseconds())/1000, "max-ms")
			nodeLag.report(b)
		})
	}
}

// lagShares sums the gateway's fanwire_commit_to_dispatch_seconds over
// runs: what an operator's dashboard shows of the same traffic.
type lagShares struct {
	count, le5ms, le25ms uint64
	sum                  float64
}

func (l *lagShares) add(b *testing.B, reg *prometheus.Registry) {
	mfs, err := reg.Gather()
	if err != nil {
		b.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "fanwire_commit_to_dispatch_seconds" {
			continue
		}
		h := mf.GetMetric()[0].GetHistogram()
		l.count += h.GetSampleCount()
		l.sum += h.GetSampleSum()
		for _, bk := range h.GetBucket() {
			switch bk.GetUpperBound() {
			case 0.005:
				l.le5ms += bk.GetCumulativeCount()
			case 0.025:
				l.le25ms += bk.GetCumulativeCount()
			}
		}
	}
}

// report adds the node's own view: the mean commit → dispatch and the
// shares of events dispatched within 5 and 25 ms of their commit.
func (l *lagShares) report(b *testing.B) {
	if l.count == 0 {
		b.Fatal("the gateway observed no commit → dispatch lag")
	}
	b.ReportMetric(l.sum/float64(l.count)*1000, "node-lag-mean-ms")
	b.ReportMetric(float64(l.le5ms)/float64(l.count), "node-lag-le5ms")
	b.ReportMetric(float64(l.le25ms)/float64(l.count), "node-lag-le25ms")
}

func latencyRun(b *testing.B, r *benchRig, wsURL string, rate, seconds int) []time.Duration {
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(seconds+30)*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, wsURL, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer c.CloseNow()
	c.SetReadLimit(1 << 20)
	if _, _, err := c.Read(ctx); err != nil { // ready
		b.Fatal(err)
	}
	if err := c.Write(ctx, websocket.MessageText, []byte(`{"type":"subscribe","id":"l","subject":"db.lat.>"}`)); err != nil {
		b.Fatal(err)
	}
	if _, _, err := c.Read(ctx); err != nil { // subscribed
		b.Fatal(err)
	}
	n := rate * seconds
	errc := make(chan error, 1)
	go func() {
		conn, err := pgx.Connect(ctx, r.pg.DSN("postgres"))
		if err != nil {
			errc <- err
			return
		}
		defer conn.Close(context.Background())
		next := time.Now()
		for i := range n {
			if d := time.Until(next); d > 0 {
				time.Sleep(d)
			}
			next = next.Add(time.Second / time.Duration(rate))
			if _, err := conn.Exec(ctx, "INSERT INTO lat VALUES ($1, 0)", i+1); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	lat := make([]time.Duration, 0, n)
	var m struct {
		Type string `json:"type"`
		Data struct {
			CommitTime time.Time `json:"commit_time"`
		} `json:"data"`
	}
	for len(lat) < n {
		_, data, err := c.Read(ctx)
		if err != nil {
			b.Fatalf("after %d events: %v", len(lat), err)
		}
		now := time.Now()
		// A frame may carry several events, one per line.
		for line := range bytes.SplitSeq(data, []byte{'\n'}) {
			if len(line) == 0 {
				continue
			}
			if err := json.Unmarshal(line, &m); err != nil {
				b.Fatalf("%v: %s", err, line)
			}
			if m.Type == "event" {
				lat = append(lat, now.Sub(m.Data.CommitTime))
			}
		}
	}
	if err := <-errc; err != nil {
		b.Fatal(err)
	}
	return lat
}
