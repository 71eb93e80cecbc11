package cdc_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fanwire/fanwire/cdc/pgtest"
	"github.com/jackc/pgx/v5"
)

// BenchmarkBigTransactionRSS measures the memory of a `fanwire ingest`
// process (the built binary, its default flags: --memory-limit 64 MiB,
// --max-txn-memory 32 MiB) while it publishes ONE UPDATE of 2,000,000 rows
// into JetStream, served by a nats-server process of its own
// (/usr/sbin/nats-server -js, file store). It reports the process's VmHWM
// (high-water RSS, from /proc) when it is ready and once every change is
// in the stream, which is checked to hold exactly one message per row.
//
//   - streamed: PostgreSQL's default logical_decoding_work_mem (64MB); the
//     transaction outgrows it, so PostgreSQL 14+ streams it (protocol v2)
//     while it runs, and the ingest holds it per xid until its commit.
//   - whole: logical_decoding_work_mem = 2GB; PostgreSQL sends the
//     transaction after its commit, in one piece.
//
// The rows are written before the measured run without passing through
// the ingest: its slot is advanced past them while it is stopped.
// FANWIRE_BENCH_BIN runs another binary (another commit's, to compare);
// FANWIRE_BENCH_ROWS changes the row count. One op is one whole run:
//
//	go test -run '^$' -bench BenchmarkBigTransactionRSS -benchtime 1x -timeout 60m ./cdc
func BenchmarkBigTransactionRSS(b *testing.B) {
	rows := 2_000_000
	if s := os.Getenv("FANWIRE_BENCH_ROWS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			b.Fatalf("FANWIRE_BENCH_ROWS: %v", err)
		}
		rows = n
	}
	bin := benchBinary(b)
	for _, mode := range []struct {
		name     string
		settings map[string]string
	}{
		{"streamed", nil},
		{"whole", map[string]string{"logical_decoding_work_mem": "2GB"}},
	} {
		b.Run(mode.name, func(b *testing.B) {
			for range b.N {
				bigTxnRun(b, bin, rows, mode.settings)
			}
		})
	}
}

func bigTxnRun(b *testing.B, bin string, rows int, settings map[string]string) {
	pg := pgtest.Start(b, pgtest.Config{Settings: settings})
	natsURL := natsProcess(b)
	stateDir := b.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, pg.DSN("postgres"))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(context.Background())
	exec1 := func(sql string) {
		b.Helper()
		if _, err := conn.Exec(ctx, sql); err != nil {
			b.Fatalf("%s: %v", sql, err)
		}
	}

	// The slot and the publication (for all tables), with nothing to
	// bootstrap; then the rows, which the stopped ingest's slot skips.
	exec1("CREATE TABLE empty (id int PRIMARY KEY)")
	in := startIngest(b, bin, pg.DSN("postgres"), natsURL, stateDir)
	in.waitReady()
	in.stop()
	exec1("CREATE TABLE big (id int PRIMARY KEY, v text, n int)")
	exec1(fmt.Sprintf("INSERT INTO big SELECT g, 'row-' || g, 0 FROM generate_series(1, %d) g", rows))
	exec1("VACUUM ANALYZE big")
	exec1("SELECT pg_replication_slot_advance('fanwire', pg_current_wal_lsn())")

	in = startIngest(b, bin, pg.DSN("postgres"), natsURL, stateDir)
	defer in.stop()
	in.waitReady()
	readyHWM := in.status("VmHWM")
	start := time.Now()
	exec1("UPDATE big SET n = n + 1")
	committed := time.Since(start)
	// Polled every 100 ms: each poll costs the ingest a /metrics answer.
	poll := time.NewTicker(100 * time.Millisecond)
	defer poll.Stop()
	deadline := time.Now().Add(20 * time.Minute)
	for in.metric("fanwire_ingest_events_published_total") < float64(rows) {
		if time.Now().After(deadline) {
			b.Fatalf("%v events published after 20 minutes, want %d", in.metric("fanwire_ingest_events_published_total"), rows)
		}
		<-poll.C
	}
	took := time.Since(start)
	hwm := in.status("VmHWM")
	spilled := in.metric("fanwire_ingest_spilled_bytes_total")

	msgs := streamMsgs(b, natsURL)
	if msgs != uint64(rows) {
		b.Fatalf("the stream holds %d messages, want one per row: %d", msgs, rows)
	}
	var streamed int64
	if err := conn.QueryRow(ctx, "SELECT coalesce(sum(stream_txns), 0) FROM pg_stat_replication_slots").Scan(&streamed); err != nil {
		b.Fatal(err)
	}
	in.stop()
	if m, _ := filepath.Glob(filepath.Join(stateDir, "spill-*")); len(m) > 0 {
		b.Fatalf("spill files left: %v", m)
	}
	b.ReportMetric(readyHWM, "ready-VmHWM-MiB")
	b.ReportMetric(hwm, "VmHWM-MiB")
	b.ReportMetric(float64(rows)/took.Seconds(), "changes/s")
	b.ReportMetric(committed.Seconds(), "update-s")
	b.ReportMetric(took.Seconds(), "published-s")
	b.ReportMetric(spilled/(1<<20), "spilled-MiB")
	b.ReportMetric(float64(streamed), "streamed-txns")
	b.ReportMetric(float64(msgs), "stream-msgs")
}

// BenchmarkBootstrapRSS measures the same process's VmHWM over the
// bootstrap of a table of 1,000,000 rows (FANWIRE_BENCH_ROWS), fetched
// from PostgreSQL faster than a nats-server process acknowledges them:
// what the reader has handed the publisher and the broker has not
// acknowledged is what grows. The stream must then hold one message per
// row.
//
//	go test -run '^$' -bench BenchmarkBootstrapRSS -benchtime 1x -timeout 60m ./cdc
func BenchmarkBootstrapRSS(b *testing.B) {
	rows := 1_000_000
	if s := os.Getenv("FANWIRE_BENCH_ROWS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			b.Fatalf("FANWIRE_BENCH_ROWS: %v", err)
		}
		rows = n
	}
	bin := benchBinary(b)
	for range b.N {
		pg := pgtest.Start(b, pgtest.Config{})
		natsURL := natsProcess(b)
		pg.Exec("postgres", "CREATE TABLE big (id int PRIMARY KEY, v text, n int)")
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		conn, err := pgx.Connect(ctx, pg.DSN("postgres"))
		if err != nil {
			b.Fatal(err)
		}
		if _, err := conn.Exec(ctx, fmt.Sprintf("INSERT INTO big SELECT g, 'row-' || g, 0 FROM generate_series(1, %d) g", rows)); err != nil {
			b.Fatal(err)
		}
		conn.Close(ctx)
		cancel()
		start := time.Now()
		in := startIngest(b, bin, pg.DSN("postgres"), natsURL, b.TempDir())
		waitFor(b, "the bootstrap", 20*time.Minute, func() bool { return in.metric("fanwire_ingest_ready") == 1 })
		took := time.Since(start)
		hwm := in.status("VmHWM")
		in.stop()
		if msgs := streamMsgs(b, natsURL); msgs != uint64(rows) {
			b.Fatalf("the stream holds %d messages, want one per row: %d", msgs, rows)
		}
		b.ReportMetric(hwm, "VmHWM-MiB")
		b.ReportMetric(float64(rows)/took.Seconds(), "rows/s")
	}
}

// benchBinary is FANWIRE_BENCH_BIN, or fanwire built from this tree.
func benchBinary(b *testing.B) string {
	if bin := os.Getenv("FANWIRE_BENCH_BIN"); bin != "" {
		return bin
	}
	bin := filepath.Join(b.TempDir(), "fanwire")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/fanwire/fanwire/cmd/fanwire").CombinedOutput(); err != nil {
		b.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// streamMsgs is the number of messages in the stream CDC.
func streamMsgs(tb testing.TB, natsURL string) uint64 { return streamMsgsNamed(tb, natsURL, "CDC") }

// natsProcess starts /usr/sbin/nats-server with JetStream on a free port
// and a store in a temp dir, and returns its URL once it answers.
func natsProcess(tb testing.TB) string {
	tb.Helper()
	return natsServerProcess(tb, "/usr/sbin/nats-server")
}

func freeTCPPort(tb testing.TB) int {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// ingestProcess is a running `fanwire ingest`.
type ingestProcess struct {
	tb     testing.TB
	cmd    *exec.Cmd
	port   int
	exited chan struct{}
}

func startIngest(tb testing.TB, bin, dsn, natsURL, stateDir string) *ingestProcess {
	tb.Helper()
	port := freeTCPPort(tb)
	return startProcess(tb, bin, port, "ingest", "--pg", dsn, "--broker", "jetstream", "--nats-url", natsURL,
		"--stream", "CDC", "--subjects", "db.>", "--storage", "file", "--retention-bytes", strconv.Itoa(8<<30),
		"--listen", fmt.Sprintf("127.0.0.1:%d", port), "--log-level", "warn", "--state-dir", stateDir)
}

// stop interrupts the process and waits for it (killing it after 30s).
func (p *ingestProcess) stop() {
	select {
	case <-p.exited:
		return
	default:
	}
	_ = p.cmd.Process.Signal(os.Interrupt)
	select {
	case <-p.exited:
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

func (p *ingestProcess) waitReady() {
	p.tb.Helper()
	waitFor(p.tb, "fanwire ingest ready", 2*time.Minute, func() bool {
		select {
		case <-p.exited:
			p.tb.Fatal("fanwire ingest exited")
		default:
		}
		return p.metric("fanwire_ingest_ready") == 1
	})
}

// metric is the value of one of the process's metrics (-1: unknown).
func (p *ingestProcess) metric(name string) float64 {
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", p.port))
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 2 && f[0] == name {
			v, _ := strconv.ParseFloat(f[1], 64)
			return v
		}
	}
	return -1
}

// status is a field of /proc/<pid>/status in MiB (VmHWM, VmRSS).
func (p *ingestProcess) status(field string) float64 {
	p.tb.Helper()
	return statusField(p.tb, fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid), field)
}
