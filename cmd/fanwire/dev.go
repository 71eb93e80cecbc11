package main

import (
	"context"
	"errors"
	"fmt"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/fanwire/fanwire/broker"
	"github.com/fanwire/fanwire/gateway"
	"github.com/fanwire/fanwire/redact"
	"github.com/fanwire/fanwire/subject"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"
)

// dev runs the ws role, and with --pg the ingest, on a NATS server embedded
// in the process, by default on JetStream: a stream in --data-dir keeps the
// events, so the console can subscribe from the first, resume and open
// views, and the history outlives a restart.
//
// The stream's subjects must be named. nats-server 2.15 refuses a stream
// over ">" that acknowledges publishes ("capturing all subjects requires
// no-ack", 10052) and one over "*.>" (it overlaps $JS.API). Without acks
// fanwire has neither cursors nor deduplication, and measured on the
// embedded server such a stream also stores the JetStream API requests,
// its advisories, every _INBOX reply and the presence bus
// ($FANWIRE.bus.>); worse, it stores each message a consumer delivers
// again, so one live consumer turned 3 published events into 109,943 in a
// second. A NATS pattern cannot say "every subject but the system ones",
// so dev names the spaces people use with it: the ingest's <prefix>.>,
// and devAppSpaces. The measurement: docs/operations.md, "A stream over >".

// devAppSpaces are the subjects dev's stream keeps beside the ingest's:
// app.>, the space the docs suggest for an application's own events, and
// the README's and the console's examples (demo.* events, presence in
// room.*).
var devAppSpaces = []string{"app.>", "demo.>", "room.>"}

// devSubjects is dev's default subject space on JetStream for an ingest
// publishing under prefix.
func devSubjects(prefix string) []string {
	own := prefix + ".>"
	return append([]string{own}, slices.DeleteFunc(slices.Clone(devAppSpaces), func(s string) bool { return s == own })...)
}

// withIngestSpace is a subject space given with --subjects, completed
// with the ingest's <prefix>.> when no pattern covers it: the events of
// an ingest in the same process must reach the gateway. A pattern that
// covers part of it is an error: the stream's patterns may not overlap.
func withIngestSpace(given []string, prefix string) ([]string, error) {
	own := prefix + ".>"
	for _, p := range given {
		if err := subject.ValidatePattern(p); err != nil {
			return nil, fmt.Errorf("--subjects: %w", err)
		}
	}
	for _, p := range given {
		if subject.Contains(p, own) {
			return given, nil
		}
	}
	for _, p := range given {
		if subject.Overlap(p, own) {
			return nil, fmt.Errorf("--subjects: %q covers part of the ingest's %s (--prefix %s): give a pattern that covers all of it, e.g. %s, or another --prefix", p, own, prefix, own)
		}
	}
	return append(slices.Clone(given), own), nil
}

func devCommand() *command {
	c := newCommand("dev", "Run everything in one process with an embedded NATS server (JetStream, stored in --data-dir): nothing else to install.")
	var f wsFlags
	f.register(c.fs, true)
	var dataDir string
	var natsPort int
	c.fs.StringVar(&dataDir, "data-dir", "./.fanwire", "directory of dev's data, kept across restarts: the embedded NATS server's JetStream store (nats/: the stream's events with --broker jetstream) and, unless --state-dir is given, the ingest's state (ingest/); one dev at a time may use it")
	c.fs.IntVar(&natsPort, "nats-port", 0, "port of the embedded NATS server on 127.0.0.1 (0: a free port)")
	var ing ingestFlags
	ing.register(c.fs, true)
	c.brokerSecrets()
	c.markSecret(secretValue, "api-key", "admin-key")
	c.markSecret(secretURL, "pg")
	c.run = func([]string) error {
		if ing.configFile != "" && ing.pg == "" {
			return errors.New("--config needs --pg: projections are made by the ingest role")
		}
		if err := ing.loadProjections(); err != nil {
			return err
		}
		// One process: the reserved subjects follow the ingest's prefix
		// unless they were given, and so does the subject space.
		if ing.prefix != "db" && slices.Equal(f.reservedSubjects, gateway.DefaultReservedSubjects) {
			f.reservedSubjects = listFlag{ing.prefix + ".>"}
		}
		switch {
		case c.isGiven("subjects") && ing.pg != "":
			s, err := withIngestSpace(f.subjects, ing.prefix)
			if err != nil {
				return err
			}
			f.subjects = s
		case c.isGiven("subjects"):
		case f.brokerKind == "jetstream":
			f.subjects = devSubjects(ing.prefix)
		default:
			f.subjects = listFlag{">"} // Core NATS and Redis keep no subject list
		}
		if !c.isGiven("state-dir") {
			ing.stateDir = filepath.Join(dataDir, "ingest")
		}
		log, err := newLogger(f.logLevel, f.logFormat, c.scrub)
		if err != nil {
			return err
		}
		defer func() { _ = log.Sync() }()
		f.scrub = c.scrub
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
		defer stop()
		unlock, err := lockDataDir(dataDir)
		if err != nil {
			return err
		}
		defer unlock()
		store, err := filepath.Abs(filepath.Join(dataDir, "nats"))
		if err != nil {
			return fmt.Errorf("--data-dir: %w", err)
		}
		ns, err := broker.StartEmbedded(broker.EmbeddedConfig{Port: natsPort, JetStream: true, StoreDir: store})
		if err != nil {
			return err
		}
		defer func() {
			ns.Shutdown()
			ns.WaitForShutdown()
		}()
		log.Info("embedded NATS started", zap.String("url", ns.ClientURL()), zap.String("store", store),
			zap.String("broker", f.brokerKind), zap.Strings("subjects", f.subjects))
		if f.brokerKind == "jetstream" && ing.pg != "" && !ing.rebootstrap {
			// A new stream holds no row: a slot left by an earlier run (on
			// another store, or Core NATS) would go on from where it was,
			// and views would miss every row that does not change.
			exists, err := streamExists(ctx, ns, f.stream)
			if err != nil {
				return err
			}
			if !exists {
				ing.rebootstrap = true
				log.Info("the stream is new: the ingest publishes every row (--rebootstrap, if its slot exists)", zap.String("stream", f.stream))
			}
		}
		f.banner = devBanner(&f, &ing, ns, store)
		if ing.pg == "" {
			return serveGateway(ctx, log, &f, ns)
		}
		// The ingest role beside the ws role, on the same embedded broker.
		g, gctx := errgroup.WithContext(ctx)
		g.Go(func() error { return serveGateway(gctx, log, &f, ns) })
		g.Go(func() error { return runIngest(gctx, log, &ing, &f.brokerFlags, ns, nil, "") })
		return g.Wait()
	}
	return c
}

// devBanner is what dev adds to the start-up banner: what it runs, where
// its data lives and which subjects it serves.
func devBanner(f *wsFlags, ing *ingestFlags, ns *server.Server, store string) []string {
	subjects := strings.Join(f.subjects, ",")
	var lines []string
	switch f.brokerKind {
	case "jetstream":
		kept := "kept " + retention(f.retentionAge, f.retentionBytes) + ", across restarts"
		if f.storage == "memory" {
			kept = "in memory: lost when dev stops"
		}
		lines = append(lines,
			fmt.Sprintf("broker: JetStream, stream %s on the embedded NATS server %s", f.stream, ns.ClientURL()),
			fmt.Sprintf("store: %s (events %s)", store, kept),
			fmt.Sprintf("subjects: %s (the stream keeps these: publish, subscribe and track there; --subjects to change)", subjects))
	case "nats":
		lines = append(lines,
			fmt.Sprintf("broker: Core NATS on the embedded NATS server %s: live only, no history, no cursors (--broker jetstream keeps them)", ns.ClientURL()),
			fmt.Sprintf("store: %s (the server's; Core NATS keeps no events)", store),
			"subjects: "+subjects)
	case "redis":
		lines = append(lines,
			fmt.Sprintf("broker: Redis Streams, stream %s on %s", f.stream, redact.URL(f.redisURL)),
			"subjects: "+subjects)
	}
	if ing.pg != "" {
		lines = append(lines, fmt.Sprintf("ingest: %s, events on %s.<table>.<key>", redact.URL(ing.pg), ing.prefix))
	}
	return lines
}

// retention says how long a stream keeps events: "24h or 1 GiB".
func retention(age time.Duration, bytes int64) string {
	var parts []string
	if age > 0 {
		s := age.String()
		if age%time.Hour == 0 {
			s = fmt.Sprintf("%dh", age/time.Hour)
		}
		parts = append(parts, s)
	}
	if bytes > 0 {
		s := fmt.Sprintf("%d bytes", bytes)
		if bytes%(1<<20) == 0 {
			s = fmt.Sprintf("%d MiB", bytes>>20)
		}
		if bytes%(1<<30) == 0 {
			s = fmt.Sprintf("%d GiB", bytes>>30)
		}
		parts = append(parts, s)
	}
	if len(parts) == 0 {
		return "with no limit"
	}
	return strings.Join(parts, " or ")
}

// streamExists reports whether the embedded server ns holds stream name.
func streamExists(ctx context.Context, ns *server.Server, name string) (bool, error) {
	nc, err := nats.Connect("", nats.InProcessServer(ns), nats.Name("fanwire-dev"))
	if err != nil {
		return false, fmt.Errorf("embedded nats: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return false, fmt.Errorf("embedded nats: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	switch _, err := js.Stream(ctx, name); {
	case err == nil:
		return true, nil
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return false, nil
	default:
		return false, fmt.Errorf("jetstream: look up stream %q: %w", name, err)
	}
}
