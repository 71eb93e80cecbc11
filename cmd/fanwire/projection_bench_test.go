package main

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fanwire/fanwire/broker/brokertest"
	"github.com/fanwire/fanwire/cdc/pgtest"
)

// BenchmarkProjectionProcessRSS measures the memory of the ingest process
// alone (the built binary, with its default --memory-limit) serving the
// orders projection (items and customer embedded) on the ingest issue's
// data set: orders 100k, items 300k, customers 10k. It reports VmHWM after
// the bootstrap and after a 100,000-row UPDATE of orders, sampled from
// /proc until every document is published, for -projmode's mode; in memory
// mode also the state's rows and value bytes (from /metrics). The broker
// (embedded NATS with JetStream) runs in the benchmark's process.
func BenchmarkProjectionProcessRSS(b *testing.B) {
	mode := os.Getenv("FANWIRE_BENCH_PROJMODE")
	if mode == "" {
		mode = "sql"
	}
	bin := filepath.Join(b.TempDir(), "fanwire")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		b.Fatalf("go build: %v\n%s", err, out)
	}
	for range b.N {
		pg := pgtest.Start(b, pgtest.Config{})
		pg.Exec("postgres", pgtest.OrdersDataSet...)
		cfg := filepath.Join(b.TempDir(), "p.yaml")
		if err := os.WriteFile(cfg, []byte(`projections:
  - name: orders
    table: orders
    key: id
    mode: `+mode+`
    embed:
      - {as: items, table: order_items, on: {order_id: id}, many: true, order_by: id}
      - {as: customer, table: customers, on: {id: customer_id}}
`), 0o644); err != nil {
			b.Fatal(err)
		}
		ns := brokertest.NATS(b)
		port, err := freePort()
		if err != nil {
			b.Fatal(err)
		}
		cmd := exec.Command(bin, "ingest", "--pg", pg.DSN("postgres"), "--broker", "jetstream", "--nats-url", ns.ClientURL(),
			"--subjects", "db.>", "--stream", "CDC", "--storage", "memory", "--listen", fmt.Sprintf("127.0.0.1:%d", port),
			"--log-level", "warn", "--config", cfg, "--state-dir", b.TempDir())
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		metric := func(name string) float64 {
			resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", port))
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
		status := func(field string) float64 { return procStatus(b, cmd.Process.Pid, field) }
		wait := func(what string, cond func() bool) {
			deadline := time.Now().Add(5 * time.Minute)
			for !cond() {
				if time.Now().After(deadline) {
					_ = cmd.Process.Kill()
					b.Fatalf("timed out waiting for %s", what)
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
		wait("the bootstrap", func() bool { return metric("fanwire_ingest_events_published_total") >= 100_000 })
		bootHWM := status("VmHWM")
		rows, bytes := metric("fanwire_projection_memory_rows"), metric("fanwire_projection_memory_value_bytes")
		rssIdle := status("VmRSS")
		pg.Exec("postgres", "UPDATE orders SET status = 'paid'")
		start := time.Now()
		wait("the documents", func() bool { return metric("fanwire_ingest_events_published_total") >= 200_000 })
		took := time.Since(start)
		hwm := status("VmHWM")
		_ = cmd.Process.Signal(os.Interrupt)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		go func() { <-ctx.Done(); _ = cmd.Process.Kill() }()
		_ = cmd.Wait()
		cancel()
		b.ReportMetric(bootHWM, "boot-VmHWM-MiB")
		b.ReportMetric(rssIdle, "idle-RSS-MiB")
		b.ReportMetric(hwm, "VmHWM-MiB")
		b.ReportMetric(100_000/took.Seconds(), "update-docs/s")
		if rows > 0 {
			b.ReportMetric(rows, "mem-rows")
			b.ReportMetric(bytes/rows, "mem-value-B/row")
		}
	}
}
