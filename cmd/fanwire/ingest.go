package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/fanwire/fanwire/cdc"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"
)

// ingestFlags are the ingest role's own flags (the broker's are shared).
type ingestFlags struct {
	pg            string
	slot          string
	publication   string
	prefix        string
	tables        listFlag
	rebootstrap   bool
	flushWindow   time.Duration
	maxBatch      int
	heartbeat     time.Duration
	leaderTimeout time.Duration
	configFile    string               // --config: the projections file
	stateDir      string               // --state-dir: the memory projections' state, spill files
	maxTxnMemory  int64                // --max-txn-memory
	projections   []cdc.ProjectionSpec // its projections, once loaded
	// heapLimit is the soft heap limit beyond the memory projections'
	// state (--memory-limit, kept by keepHeapLimit); 0: none (dev, tests).
	heapLimit int64
	// metricsApart: --metrics-listen serves /metrics, --listen does not.
	metricsApart bool
}

func (f *ingestFlags) register(fs *flag.FlagSet, dev bool) {
	what := "PostgreSQL to ingest, e.g. postgres://user:pass@127.0.0.1:5432/app (needs wal_level=logical and a role with REPLICATION)"
	if dev {
		what = "also run the ingest role in this process on this PostgreSQL, e.g. postgres://postgres@127.0.0.1:5432/app (needs wal_level=logical)"
	}
	fs.StringVar(&f.pg, "pg", "", what)
	fs.StringVar(&f.slot, "slot", "fanwire", "ingest: logical replication slot (created if missing)")
	fs.StringVar(&f.publication, "publication", "fanwire", "ingest: publication (created if missing: for --tables, or for all tables)")
	fs.StringVar(&f.prefix, "prefix", "db", "ingest: first subject token (letters, digits, _ and -): events go to <prefix>.<table>.<key>; ingests may share a prefix and a stream, each with its own tables")
	fs.Var(&f.tables, "tables", "ingest: tables to publish, comma-separated (table in public, or schema.table); default every table of the publication")
	fs.BoolVar(&f.rebootstrap, "rebootstrap", false, "ingest: drop the slot and publish every row again before tailing")
	fs.DurationVar(&f.flushWindow, "flush-window", 2*time.Millisecond, "ingest: how long the documents of projections coalesce across transactions, 0 for none (table events never wait: they publish at once, or with what arrived while the previous publish was in flight)")
	fs.IntVar(&f.maxBatch, "max-batch", 4096, "ingest: most events per publish")
	fs.DurationVar(&f.heartbeat, "heartbeat", 10*time.Second, "ingest: on an idle database, emit a logical message this often so the slot keeps advancing (negative: never)")
	fs.DurationVar(&f.leaderTimeout, "leader-timeout", 10*time.Second, "ingest: failover: a leader frozen this long (SIGSTOP, a paused VM) loses the slot's lock to a standby (PostgreSQL 14+: idle_session_timeout on the lock's session, pinged every quarter of this; negative: never)")
	stateDir := "ingest: where memory-mode projections keep their state, one file per slot (keep it on a persistent volume), and where transactions over --max-txn-memory spill"
	if dev {
		stateDir += "; in dev, <--data-dir>/ingest unless given"
	}
	fs.StringVar(&f.stateDir, "state-dir", ".fanwire/ingest", stateDir)
	fs.Int64Var(&f.maxTxnMemory, "max-txn-memory", 32<<20, "ingest: bytes of memory for the changes of open (uncommitted) transactions; past it the largest one spills to a temp file in --state-dir, read back at its commit (sized with --memory-limit for an RSS under 128 MiB)")
	fs.StringVar(&f.configFile, "config", "", "ingest: YAML file of projections: documents of a row with its child rows embedded (see docs/projections.md)")
}

// loadProjections reads --config, if given. Call it at start-up, before
// connecting to anything: a bad file is an error naming it, its line or
// each problem.
func (f *ingestFlags) loadProjections() error {
	if f.configFile == "" {
		return nil
	}
	specs, err := cdc.LoadProjections(f.configFile)
	if err != nil {
		return fmt.Errorf("--config: %w", err)
	}
	f.projections = specs
	return nil
}

func (f *ingestFlags) config(log *zap.Logger) cdc.Config {
	window := f.flushWindow
	if window == 0 {
		window = -1 // publish at once (the Config's zero means its default)
	}
	return cdc.Config{
		DSN: f.pg, Slot: f.slot, Publication: f.publication, Prefix: f.prefix, Tables: f.tables,
		Rebootstrap: f.rebootstrap, FlushWindow: window, MaxBatch: f.maxBatch, Heartbeat: f.heartbeat, LeaderTimeout: f.leaderTimeout,
		Projections: f.projections, StateDir: f.stateDir, MaxTxnMemory: f.maxTxnMemory, Logger: log.Named("ingest"),
	}
}

func ingestCommand() *command {
	c := newCommand("ingest", "Run the ingest role: publish committed PostgreSQL changes (logical replication) as events. Several may run for one slot: one leads, the others wait as standbys and take over when it dies.")
	var f ingestFlags
	var b brokerFlags
	var listen, logLevel, logFormat, debugListen, metricsListen string
	var memoryLimit int64
	f.register(c.fs, false)
	b.register(c.fs, false, "db.>")
	c.brokerSecrets()
	c.markSecret(secretURL, "pg")
	c.fs.StringVar(&listen, "listen", "127.0.0.1:8081", "HTTP address: /healthz, /readyz, /metrics unless --metrics-listen")
	c.fs.StringVar(&metricsListen, "metrics-listen", "", metricsListenUsage)
	c.fs.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	c.fs.StringVar(&logFormat, "log-format", "json", "json or console")
	c.fs.StringVar(&debugListen, "debug-listen", "", "when set, serve Go's /debug/pprof on this address (keep it private)")
	c.fs.Int64Var(&memoryLimit, "memory-limit", 64<<20, "soft limit in bytes for the Go heap beyond what memory-mode projections hold: the GC works harder near it instead of letting a big transaction double the heap (0: none; GOMEMLIMIT, when set, wins)")
	c.run = func([]string) error {
		if f.pg == "" {
			return errors.New("--pg is required: the PostgreSQL to ingest, e.g. postgres://user@127.0.0.1:5432/app")
		}
		if err := f.loadProjections(); err != nil {
			return err
		}
		log, err := newLogger(logLevel, logFormat, c.scrub)
		if err != nil {
			return err
		}
		defer func() { _ = log.Sync() }()
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
		defer stop()
		if memoryLimit > 0 && os.Getenv("GOMEMLIMIT") == "" {
			// The Go runtime caps the GC's CPU near the limit, so a live
			// heap over it costs CPU, not a stall (docs/benchmarks.md: the
			// tail's high-water mark 121 -> 81 MiB at 64 MiB).
			debug.SetMemoryLimit(memoryLimit)
			f.heapLimit = memoryLimit
		}
		reg := prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		stopDebug, err := startDebug(debugListen)
		if err != nil {
			return err
		}
		defer stopDebug()
		f.metricsApart = metricsListen != ""
		stopMetrics, err := startMetrics(metricsListen, reg, log)
		if err != nil {
			return err
		}
		defer stopMetrics()
		return runIngest(ctx, log, &f, &b, nil, reg, listen)
	}
	return c
}

// runIngest runs the ingest role until ctx is done; with listen it also
// serves /healthz, /readyz and /metrics there.
func runIngest(ctx context.Context, log *zap.Logger, f *ingestFlags, bf *brokerFlags, ns *server.Server, reg *prometheus.Registry, listen string) error {
	b, err := bf.dial(ctx, log, ns, "fanwire-ingest", func(string, int) {})
	if err != nil {
		return err
	}
	defer b.Close()
	cfg := f.config(log)
	cfg.Broker = b
	in, err := cdc.New(cfg)
	if err != nil {
		return err
	}
	if reg != nil {
		reg.MustRegister(in.Collector())
	}
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return in.Run(gctx) })
	if f.heapLimit > 0 && len(f.projections) > 0 {
		g.Go(func() error { keepHeapLimit(gctx, in, f.heapLimit); return nil })
	}
	if listen != "" {
		mux := http.NewServeMux()
		mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, `{"status":"ok"}`) })
		mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
			if in.Standby() {
				w.WriteHeader(http.StatusServiceUnavailable)
				fmt.Fprintln(w, `{"status":"standby"}`)
				return
			}
			if !in.Ready() || !b.Ready() {
				w.WriteHeader(http.StatusServiceUnavailable)
				fmt.Fprintln(w, `{"status":"not ready"}`)
				return
			}
			fmt.Fprintln(w, `{"status":"ready"}`)
		})
		if !f.metricsApart {
			mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
		}
		ln, err := net.Listen("tcp", listen)
		if err != nil {
			return fmt.Errorf("listen: %w", err)
		}
		hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		g.Go(func() error {
			if err := hs.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("http: %w", err)
			}
			return nil
		})
		g.Go(func() error {
			<-gctx.Done()
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			return hs.Shutdown(sctx)
		})
		if !f.metricsApart {
			log.Info("fanwire ingest role", zap.String("metrics", "http://"+ln.Addr().String()+"/metrics"))
		} else {
			log.Info("fanwire ingest role", zap.String("health", "http://"+ln.Addr().String()+"/healthz"))
		}
	}
	return g.Wait()
}

// keepHeapLimit keeps the soft heap limit at base beyond the memory-mode
// projections' state, once a second, until ctx is done. The state is live
// by design: a limit under it would keep the GC running without pause
// (BenchmarkDeployed's memory-mode projections ran at half speed under a
// 64 MiB limit with a 130 MiB state), while base still bounds what a big
// transaction or a burst of documents adds.
func keepHeapLimit(ctx context.Context, in *cdc.Ingest, base int64) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	set := base
	for {
		rows, values := in.MemoryState()
		if limit := base + values + rows*memStateRowHeap; limit != set {
			debug.SetMemoryLimit(limit)
			set = limit
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// memStateRowHeap is the Go heap a memory-mode row takes beyond its
// values' bytes, rounded up: its map entries, indexes and slice headers
// (161 B measured on the standard data set, docs/benchmarks.md).
const memStateRowHeap = 192
