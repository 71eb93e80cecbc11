package main

import (
	"context"
	"errors"
	"os/signal"
	"path/filepath"
	"slices"
	"syscall"

	"github.com/fanwire/fanwire/broker"
	"github.com/fanwire/fanwire/gateway"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"
)

func devCommand() *command {
	c := newCommand("dev", "Run everything in one process with an embedded NATS server: nothing else to install.")
	var f wsFlags
	f.register(c.fs, true)
	var dataDir string
	var natsPort int
	c.fs.StringVar(&dataDir, "data-dir", "./.fanwire", "directory for the embedded NATS server's JetStream store")
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
		// unless they were given.
		if ing.prefix != "db" && slices.Equal(f.reservedSubjects, gateway.DefaultReservedSubjects) {
			f.reservedSubjects = listFlag{ing.prefix + ".>"}
		}
		log, err := newLogger(f.logLevel, f.logFormat, c.scrub)
		if err != nil {
			return err
		}
		defer func() { _ = log.Sync() }()
		f.scrub = c.scrub
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
		defer stop()
		ns, err := broker.StartEmbedded(broker.EmbeddedConfig{Port: natsPort, JetStream: true, StoreDir: filepath.Join(dataDir, "nats")})
		if err != nil {
			return err
		}
		defer func() {
			ns.Shutdown()
			ns.WaitForShutdown()
		}()
		log.Info("embedded NATS started", zap.String("url", ns.ClientURL()), zap.String("store", filepath.Join(dataDir, "nats")))
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
