package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime/debug"
	"testing"
	"time"

	"github.com/fanwire/fanwire/broker/brokertest"
	"github.com/fanwire/fanwire/cdc/pgtest"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// TestHeapLimitIsBeyondTheMemoryState: with memory-mode projections, the
// soft heap limit (--memory-limit) is kept beyond the rows the state holds,
// so a state larger than the limit does not keep the GC running.
func TestHeapLimitIsBeyondTheMemoryState(t *testing.T) {
	pg := pgtest.Start(t, pgtest.Config{})
	const rows = 20_000
	pg.Exec("postgres",
		"CREATE TABLE orders (id int PRIMARY KEY, note text NOT NULL)",
		"INSERT INTO orders SELECT g, repeat('x', 100) FROM generate_series(1, 20000) g",
	)
	cfgFile := filepath.Join(t.TempDir(), "projections.yaml")
	if err := os.WriteFile(cfgFile, []byte("projections:\n  - name: orders\n    table: orders\n    key: id\n    mode: memory\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ns := brokertest.NATS(t)
	f, bf := parseIngestFlags(t, "--pg", pg.DSN("postgres"), "--state-dir", t.TempDir(), "--config", cfgFile,
		"--broker", "nats", "--nats-url", ns.ClientURL())
	if err := f.loadProjections(); err != nil {
		t.Fatal(err)
	}
	const base = 8 << 20
	f.heapLimit = base
	before := debug.SetMemoryLimit(-1)
	defer debug.SetMemoryLimit(before)
	debug.SetMemoryLimit(base)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	defer runIngestInTest(t, ctx, f, bf)()
	// 20,000 rows of over 100 B of values: the state alone is past 2 MiB
	// of values and 3.8 MiB of rows.
	want := int64(base + rows*100 + rows*memStateRowHeap)
	for {
		limit := debug.SetMemoryLimit(-1)
		if limit >= want {
			if limit > want+rows*64 {
				t.Fatalf("heap limit %d: want about %d (base %d + the state's values and rows)", limit, want, base)
			}
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("heap limit %d after the bootstrap of %d rows: want at least %d", limit, rows, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// parseIngestFlags parses the ingest command's flags from args.
func parseIngestFlags(t *testing.T, args ...string) (*ingestFlags, *brokerFlags) {
	t.Helper()
	c := newCommand("ingest", "")
	var f ingestFlags
	var bf brokerFlags
	f.register(c.fs, false)
	bf.register(c.fs, false, "db.>")
	if err := c.parse(args); err != nil {
		t.Fatal(err)
	}
	return &f, &bf
}

// runIngestInTest runs the ingest role in this process until the returned
// stop is called, which waits for it and fails the test on its error.
func runIngestInTest(t *testing.T, ctx context.Context, f *ingestFlags, bf *brokerFlags) (stop func()) {
	ictx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- runIngest(ictx, zap.NewNop(), f, bf, nil, prometheus.NewRegistry(), "") }()
	return func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("ingest: %v", err)
		}
	}
}
