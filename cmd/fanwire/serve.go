package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fanwire/fanwire/gateway"
	"github.com/fanwire/fanwire/gateway/auth"
	"github.com/fanwire/fanwire/gateway/tlscert"
	"github.com/fanwire/fanwire/redact"
	"github.com/fanwire/fanwire/subject"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/sync/errgroup"
)

// wsFlags are the ws role's flags, shared by "ws" and "dev".
type wsFlags struct {
	brokerFlags
	consumer         string
	durableInactive  time.Duration
	maxDurables      int
	anonDurables     bool
	graphqlInit      time.Duration
	graphqlLimits    graphqlLimitFlags
	jwtSecretFile    string
	apiKeysFile      string
	jwtJWKSFile      string
	jwtIssuer        string
	jwtAudience      string
	jwtKeyGrace      time.Duration
	allowAnonymous   bool
	anonymousGrants  listFlag
	listen           string
	tlsCert          string
	tlsKey           string
	apiKey           string
	admin            adminFlags
	allowAnonPublish bool
	presence         presenceFlags
	reservedSubjects listFlag
	allowSystem      listFlag
	maxPublishBytes  int64
	console          bool
	allowedOrigins   listFlag
	maxConnections   int
	maxConnsPerIP    int
	connectLimits    connectLimitFlags
	maxMessageRate   int
	maxSubscriptions int
	maxSnapshot      int
	maxViewDocsConn  int
	maxViewDocs      int
	maxFilterCost    int
	filterEventCost  int
	filterCostRate   int
	filterCompiles   int
	mailboxMessages  int
	mailboxBytes     int
	readLimit        int64
	maxFrameBytes    int
	maxPace          time.Duration
	handshakeTimeout time.Duration
	maxHandshakes    int
	pingInterval     time.Duration
	pingTimeout      time.Duration
	shutdownTimeout  time.Duration
	logLevel         string
	logFormat        string
	debugListen      string
	metricsListen    string
	scrub            *redact.Scrubber // the command's: masks the API keys' values too, once read
	// banner is what dev adds to the start-up banner (its broker, store
	// and subject space); static before serveGateway.
	banner []string
}

func (f *wsFlags) register(fs *flag.FlagSet, dev bool) {
	fs.StringVar(&f.listen, "listen", "127.0.0.1:8080", "HTTP address: /ws, /graphql, /api/publish, /healthz, /readyz, /metrics unless --metrics-listen (and / for the console)")
	fs.StringVar(&f.metricsListen, "metrics-listen", "", metricsListenUsage)
	fs.StringVar(&f.tlsCert, "tls-cert", "", "PEM certificate (chain) file: with --tls-key, --listen serves HTTPS and wss:// itself (no proxy needed); both files are loaded again when they change")
	fs.StringVar(&f.tlsKey, "tls-key", "", "PEM private key file of --tls-cert")
	subjects := ">"
	if dev {
		subjects = strings.Join(devSubjects("db"), ",")
	}
	f.brokerFlags.register(fs, dev, subjects)
	fs.StringVar(&f.consumer, "consumer", "shared", "jetstream: shared (one live consumer per node feeds every subscription) or per-connection (every subscription gets its own consumer on the server)")
	fs.DurationVar(&f.durableInactive, "durable-inactive", 24*time.Hour, "jetstream: the server deletes a durable subscription consumer nobody has been bound to for this long")
	fs.IntVar(&f.maxDurables, "max-durables", 32, "jetstream: durable subscription consumers one token sub keeps on the broker (counted there, across nodes); a new one past it is refused with too_many_durables; negative: no cap")
	fs.BoolVar(&f.anonDurables, "anonymous-durables", dev, "let connections without a token keep durable subscriptions, in one namespace they all share (any of them can bind or delete the others'); without it only a token's sub has durables")
	fs.DurationVar(&f.graphqlInit, "graphql-init-timeout", 3*time.Second, "a GraphQL WebSocket connection that sends no connection_init within this is closed with 4408")
	f.graphqlLimits.register(fs)
	fs.StringVar(&f.jwtSecretFile, "jwt-secret-file", "", "file holding the HS256 secret (32+ bytes) that signs connection tokens; with a key configured every connection needs a valid token (Authorization: Bearer, ?token=, or GraphQL connection_init's token) unless --allow-anonymous")
	fs.StringVar(&f.jwtJWKSFile, "jwt-jwks-file", "", "JSON Web Key Set file with the RS256/ES256 public keys that sign connection tokens")
	fs.StringVar(&f.jwtIssuer, "jwt-issuer", "", "when set, a token's iss must equal it")
	fs.StringVar(&f.jwtAudience, "jwt-audience", "", "when set, a token's aud must contain it")
	fs.DurationVar(&f.jwtKeyGrace, "jwt-key-grace", auth.DefaultKeyGrace, "--jwt-secret-file and --jwt-jwks-file are loaded again when they change (looked at every 2 s at most): a key they no longer hold still verifies tokens this long (0: it stops at once)")
	fs.BoolVar(&f.allowAnonymous, "allow-anonymous", dev, "admit connections without a token, with --anonymous-grants; without a JWT key, ws refuses to start unless this is set (every connection would be anonymous)")
	fs.Var(&f.anonymousGrants, "anonymous-grants", "subject patterns anonymous connections may subscribe to, comma-separated (default: none with a JWT key, every subject without one)")
	fs.StringVar(&f.apiKeysFile, "api-keys-file", "", "file of POST /api/publish keys, one per line: name key [patterns,comma-separated] (none: publish anywhere); # starts a comment")
	fs.StringVar(&f.apiKey, "api-key", "", "a POST /api/publish key: requests need Authorization: Bearer <key>, and may publish anywhere but --reserved-subjects")
	f.admin.register(fs)
	fs.BoolVar(&f.allowAnonPublish, "allow-anonymous-publish", dev, "let publishers without a credential publish anywhere but --reserved-subjects: POST /api/publish without Authorization, and connections without a token; without it, --api-key, --api-keys-file or a JWT key, POST /api/publish answers 403 (publishing is off)")
	f.reservedSubjects = listFlag(gateway.DefaultReservedSubjects)
	fs.Var(&f.reservedSubjects, "reserved-subjects", "subject patterns no publish through the gateway may write to, comma-separated (the ingest's events), unless a key's or token's publish pattern that matches the subject lies inside one of them; empty: none")
	fs.Var(&f.allowSystem, "allow-system-subjects", "system subject patterns to open, comma-separated, e.g. $KV.config.>: subjects whose first token starts with $ or is _INBOX (the NATS server's APIs, advisories and request replies) are closed to publishing and subscribing; even opened, only a publish pattern or a subscription that writes the first token out reaches them, never > or *.>")
	f.presence.register(fs, dev)
	fs.Int64Var(&f.maxPublishBytes, "max-publish-bytes", 1<<20, "largest POST /api/publish body, and largest data of a client publish (WebSocket message, GraphQL mutation): over it, too_large")
	fs.BoolVar(&f.console, "console", dev, "serve the live console page at /")
	fs.Var(&f.allowedOrigins, "allowed-origins", "browser origins allowed to connect besides same-origin, comma-separated host patterns (e.g. app.example.com,*.example.com)")
	fs.IntVar(&f.maxConnections, "max-connections", 100_000, "connections over this get 503 with Retry-After; /readyz is not ready from 90% of it")
	fs.IntVar(&f.maxConnsPerIP, "max-connections-per-ip", 0, "connections from one client address (IPv6: one --ip-limit-ipv6-prefix, a /64) over this get 429 with Retry-After (0: no cap; behind a load balancer every client has its address unless --trusted-proxies names it)")
	f.connectLimits.register(fs)
	fs.IntVar(&f.maxSubscriptions, "max-subscriptions", 256, "subscriptions per connection; past it a subscribe gets too_many_subscriptions")
	fs.IntVar(&f.maxSnapshot, "max-snapshot", 100_000, "most documents a live view holds: a from:\"latest\" snapshot, or a filtered subscription's documents; past it the subscription ends with view_too_large")
	fs.IntVar(&f.maxViewDocsConn, "max-view-documents-per-connection", 200_000, "most documents one connection's views hold together (about 180 bytes each); past it the view that would add one ends with view_too_large")
	fs.IntVar(&f.maxViewDocs, "max-view-documents", 5_000_000, "most documents all views on the node hold together (about 180 bytes each); past it the view that would add one ends with view_too_large")
	fs.IntVar(&f.maxFilterCost, "max-filter-cost", 10_000, "CEL cost units one evaluation of a where or a grant's row filter may spend (about one per field, comparison or list element; a regex by its input times its program); past it the event does not pass")
	fs.IntVar(&f.filterEventCost, "max-filter-cost-per-event", 20_000, "cost units one connection's filters together may spend on one event in the dispatcher; the subscription whose filter passes it ends with filter_too_costly, as do the connection's others that would evaluate one for that event: it bounds how long one client can hold up every other's delivery")
	fs.IntVar(&f.filterCostRate, "filter-cost-rate", 1_000_000, "cost units per second one connection's filters may spend (bursts of a second's worth): past it, its live views end with filter_too_costly and new filtered subscribes are refused until it has paid; its snapshots and replays wait")
	fs.IntVar(&f.filterCompiles, "filter-compile-rate", 32, "new filter texts one connection may have compiled per second (bursts of --max-subscriptions); past it a subscribe is refused with rate_limited; texts the node holds cost nothing")
	fs.IntVar(&f.maxMessageRate, "max-message-rate", 100, "client messages (WebSocket pings included) per second per connection (burst twice that); over it a message is dropped with rate_limited, a ping gets no pong (GraphQL: close 1008); negative: no limit")
	fs.IntVar(&f.mailboxMessages, "mailbox-messages", 4096, "per-connection queue bound in messages; over it: close 4008 (slow consumer)")
	fs.IntVar(&f.mailboxBytes, "mailbox-bytes", 4<<20, "per-connection queue bound in bytes; over it: close 4008 (slow consumer); at least --max-publish-bytes (or the broker's message limit when smaller). A publish whose event is bigger is refused (too_large), and such an event from the broker is delivered to no one (fanwire_events_dropped_total{reason=\"too_large\"})")
	fs.Int64Var(&f.readLimit, "read-limit", 64<<10, "largest client frame in bytes; over it: close 1009")
	fs.IntVar(&f.maxFrameBytes, "max-frame-bytes", 64<<10, "the writer coalesces queued messages into frames up to this size")
	fs.DurationVar(&f.maxPace, "max-pace", 50*time.Millisecond, "when most clients' mailboxes are over half full (node saturated), the dispatcher waits up to this long per batch for them to drain instead of disconnecting them; negative: never wait")
	fs.IntVar(&f.maxHandshakes, "max-handshakes", 4096, "most connections waiting for their first request (a WebSocket not upgraded yet); over it a new connection is closed at once, so a flood of silent connections costs at most this many")
	fs.DurationVar(&f.handshakeTimeout, "handshake-timeout", 10*time.Second, "a connection must send its request headers (for /ws: the WebSocket upgrade) within this of connecting, or it is closed without an answer; a request body (POST /api/publish, /graphql) gets as long again")
	fs.DurationVar(&f.pingInterval, "ping-interval", 30*time.Second, "server WebSocket ping period")
	fs.DurationVar(&f.pingTimeout, "ping-timeout", 10*time.Second, "a ping unanswered this long closes the connection")
	fs.DurationVar(&f.shutdownTimeout, "shutdown-timeout", 10*time.Second, "on SIGTERM/SIGINT: time to drain and close connections with 1001 before cutting them")
	fs.StringVar(&f.debugListen, "debug-listen", "", "when set, serve Go's /debug/pprof on this address (keep it private)")
	fs.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	def := "json"
	if dev {
		def = "console"
	}
	fs.StringVar(&f.logFormat, "log-format", def, "json or console")
}

// debugMux is Go's /debug/pprof without /debug/pprof/cmdline: the command
// line holds whatever credentials were given as flags (--api-key, a
// password in --nats-url), and a profile endpoint is no place for them.
func debugMux() *http.ServeMux {
	m := http.NewServeMux()
	m.HandleFunc("/debug/pprof/", pprof.Index)
	m.HandleFunc("/debug/pprof/profile", pprof.Profile)
	m.HandleFunc("/debug/pprof/trace", pprof.Trace)
	m.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	m.HandleFunc("/debug/pprof/cmdline", func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "not served: the command line may hold credentials (flags such as --api-key or a password in --nats-url)", http.StatusNotFound)
	})
	return m
}

// startDebug serves Go's /debug/pprof on addr ("": not at all) until stop,
// which waits for the server's goroutine.
func startDebug(addr string) (stop func(), err error) {
	if addr == "" {
		return func() {}, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("debug listen: %w", err)
	}
	ds := &http.Server{Handler: debugMux(), ReadHeaderTimeout: 10 * time.Second}
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = ds.Serve(ln) // ErrServerClosed after stop
	}()
	return func() {
		_ = ds.Close()
		<-served
	}, nil
}

// newLogger builds the role's logger. Every line goes through scrub,
// which masks the credentials of the command's flags (a client library's
// error may quote the URL it was given).
func newLogger(level, format string, scrub *redact.Scrubber) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	var cfg zap.Config
	var enc zapcore.Encoder
	switch format {
	case "json":
		cfg = zap.NewProductionConfig()
		enc = zapcore.NewJSONEncoder(cfg.EncoderConfig)
	case "console":
		cfg = zap.NewDevelopmentConfig()
		enc = zapcore.NewConsoleEncoder(cfg.EncoderConfig)
	default:
		return nil, fmt.Errorf("--log-format: %q is not json or console", format)
	}
	out := zapcore.Lock(zapcore.AddSync(scrub.Writer(os.Stderr)))
	opts := []zap.Option{zap.AddCaller(), zap.ErrorOutput(out)}
	if format == "json" {
		opts = append(opts, zap.AddStacktrace(zap.ErrorLevel))
	}
	return zap.New(zapcore.NewCore(enc, out, zap.NewAtomicLevelAt(lvl)), opts...), nil
}

func wsCommand() *command {
	c := newCommand("ws", "Run the ws role: fan events from a NATS broker out to WebSocket clients.")
	var f wsFlags
	f.register(c.fs, false)
	c.brokerSecrets()
	c.markSecret(secretValue, "api-key", "admin-key")
	c.run = func([]string) error {
		log, err := newLogger(f.logLevel, f.logFormat, c.scrub)
		if err != nil {
			return err
		}
		defer func() { _ = log.Sync() }()
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
		defer stop()
		f.scrub = c.scrub
		return serveGateway(ctx, log, &f, nil)
	}
	return c
}

// serveGateway runs the ws role until ctx is done, then shuts down
// gracefully: stop accepting, drain and close every connection with 1001,
// stop consuming, close the broker.
func serveGateway(ctx context.Context, log *zap.Logger, f *wsFlags, ns *server.Server) error {
	// Credentials first: a missing key file or a gateway that would admit
	// anyone by accident fails before anything connects.
	authenticate, keyMetrics, err := f.authenticatorFor(log.Named("auth"))
	if err != nil {
		return err
	}
	apiKeys, err := loadAPIKeys(f.apiKeysFile)
	if err != nil {
		return err
	}
	adminKey, err := f.admin.load()
	if err != nil {
		return err
	}
	if f.scrub != nil {
		for _, k := range apiKeys {
			f.scrub.Add(k.Key)
		}
		f.scrub.Add(adminKey)
	}
	certs, err := f.listenerCerts(log)
	if err != nil {
		return err
	}
	limits, err := f.connectLimits.config()
	if err != nil {
		return err
	}
	reserved := []string(f.reservedSubjects)
	if reserved == nil {
		reserved = []string{} // --reserved-subjects "": none (nil would be the default)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if certs != nil {
		reg.MustRegister(certs.Collector())
	}
	reg.MustRegister(keyMetrics...)

	// The broker reports drops to the server, which exists only after the
	// broker does.
	var srvRef atomic.Pointer[gateway.Server]
	b, err := f.dial(ctx, log, ns, "fanwire-ws", func(reason string, n int) {
		if s := srvRef.Load(); s != nil {
			s.CountDropped(reason, n)
		}
	})
	if err != nil {
		return err
	}
	defer b.Close()

	f.maxConnections, f.maxHandshakes = fitFileLimit(log, f.maxConnections, f.maxHandshakes)
	srv, err := gateway.New(gateway.Config{
		Broker:                        b,
		Subjects:                      f.subjects,
		Logger:                        log,
		Registry:                      reg,
		MaxConnections:                f.maxConnections,
		MaxConnectionsPerIP:           f.maxConnsPerIP,
		TrustedProxies:                limits.TrustedProxies,
		IPLimitIPv6Prefix:             limits.IPLimitIPv6Prefix,
		MaxConnectRate:                limits.MaxConnectRate,
		ConnectBurst:                  limits.ConnectBurst,
		ConnectQueue:                  limits.ConnectQueue,
		ConnectQueueWait:              limits.ConnectQueueWait,
		MaxMessageRate:                f.maxMessageRate,
		MaxSubscriptions:              f.maxSubscriptions,
		MaxSnapshot:                   f.maxSnapshot,
		MaxViewDocumentsPerConnection: f.maxViewDocsConn,
		MaxViewDocuments:              f.maxViewDocs,
		MaxFilterCost:                 f.maxFilterCost,
		MaxFilterCostPerEvent:         f.filterEventCost,
		FilterCostRate:                f.filterCostRate,
		FilterCompileRate:             f.filterCompiles,
		MailboxMessages:               f.mailboxMessages,
		MailboxBytes:                  f.mailboxBytes,
		ReadLimit:                     f.readLimit,
		MaxFrameBytes:                 f.maxFrameBytes,
		MaxPace:                       f.maxPace,
		HandshakeTimeout:              f.handshakeTimeout,
		MaxHandshakes:                 f.maxHandshakes,
		PingInterval:                  f.pingInterval,
		PingTimeout:                   f.pingTimeout,
		APIKey:                        f.apiKey,
		AdminKey:                      adminKey,
		AdminApart:                    f.admin.listen != "",
		MaxPublishBytes:               f.maxPublishBytes,
		AllowedOrigins:                f.allowedOrigins,
		Console:                       f.console,
		Consumer:                      f.consumer,
		DurableInactive:               f.durableInactive,
		MaxDurables:                   f.maxDurables,
		AnonymousDurables:             f.anonDurables,

		GraphQLInitTimeout:   f.graphqlInit,
		GraphQLMaxBodyBytes:  f.graphqlLimits.maxBodyBytes,
		GraphQLMaxQueryBytes: f.graphqlLimits.maxQueryBytes,
		GraphQLMaxTokens:     f.graphqlLimits.maxTokens,
		GraphQLMaxDepth:      f.graphqlLimits.maxDepth,
		GraphQLMaxAliases:    f.graphqlLimits.maxAliases,
		GraphQLMaxComplexity: f.graphqlLimits.maxComplexity,
		Authenticate:         authenticate,
		APIKeys:              apiKeys,

		PublishTokens:          f.jwtSecretFile != "" || f.jwtJWKSFile != "",
		AllowAnonymousPublish:  f.allowAnonPublish,
		AllowAnonymousPresence: f.presence.allowAnonymous,
		MaxPresenceState:       f.presence.maxState,
		MaxPresenceTracks:      f.presence.maxTracks,
		MaxPresenceMembers:     f.presence.maxMembers,
		PresenceRate:           f.presence.rate,
		PresenceListLimit:      f.presence.listLimit,
		PresenceInterval:       f.presence.interval,
		PresenceHeartbeat:      f.presence.heartbeat,
		PresenceTimeout:        f.presence.timeout,
		ReservedSubjects:       reserved,
		AllowSystemSubjects:    f.allowSystem,
		MetricsApart:           f.metricsListen != "",
	})
	if err != nil {
		return err
	}
	srvRef.Store(srv)
	// The side listeners first: a failure to listen returns before the
	// client listener's goroutines start.
	stopDebug, err := startDebug(f.debugListen)
	if err != nil {
		return err
	}
	defer stopDebug()
	stopMetrics, err := startMetrics(f.metricsListen, reg, log)
	if err != nil {
		return err
	}
	defer stopMetrics()
	stopAdmin, err := startAdmin(f.admin.listen, srv, log)
	if err != nil {
		return err
	}
	defer func() { _ = stopAdmin(context.Background()) }() // a no-op after the shutdown below
	ln, err := net.Listen("tcp", f.listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	httpScheme, wsScheme := "http", "ws"
	if certs != nil {
		ln = tls.NewListener(ln, certs.TLSConfig())
		httpScheme, wsScheme = "https", "wss"
	}
	hs := srv.HTTPServer()
	runCtx, stopRun := context.WithCancel(context.Background())
	defer stopRun()
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		if err := hs.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("http: %w", err)
		}
		return nil
	})
	g.Go(func() error { return srv.Run(runCtx) })

	addr := ln.Addr().String()
	metricsURL := httpScheme + "://" + addr + "/metrics"
	if f.metricsListen != "" {
		metricsURL = "apart, --metrics-listen"
	}
	log.Info("fanwire ws role ready",
		zap.String("websocket", wsScheme+"://"+addr+"/ws"),
		zap.String("graphql", httpScheme+"://"+addr+"/graphql"),
		zap.String("publish", httpScheme+"://"+addr+"/api/publish"),
		zap.String("metrics", metricsURL))
	logPublishing(log, srv, f, len(apiKeys), reserved)
	if adminKey != "" && f.admin.listen == "" {
		log.Info("the inspector is on (--admin-key): /admin/connections lists and closes this node's connections; keep /admin behind your network",
			zap.String("inspector", httpScheme+"://"+addr+"/admin/connections"))
	}
	if f.console {
		var b strings.Builder
		fmt.Fprintf(&b, "\n  fanwire is up: open %s://%s/ in a browser for the console\n", httpScheme, addr)
		for _, l := range f.banner {
			fmt.Fprintf(&b, "  %s\n", l)
		}
		fmt.Fprintf(&b, "  websocket: %[2]s://%[3]s/ws   graphql: %[2]s://%[3]s/graphql\n  publish: curl -d '{\"subject\":\"demo.hello\",\"data\":{\"hi\":1}}' %[1]s://%[3]s/api/publish\n", httpScheme, wsScheme, addr)
		if f.allowAnonPublish {
			fmt.Fprintf(&b, "  anonymous publishing is on (--allow-anonymous-publish): anyone who reaches this address may publish, except on %s\n", strings.Join(reserved, ","))
		}
		fmt.Fprintln(&b)
		fmt.Fprint(os.Stderr, f.scrub.String(b.String())) // the banner may name a URL with a password
	}

	<-gctx.Done()
	log.Info("shutting down: draining connections", zap.Duration("timeout", f.shutdownTimeout))
	sctx, scancel := context.WithTimeout(context.Background(), f.shutdownTimeout)
	defer scancel()
	var errs []error
	adminStopped := make(chan error, 1) // the admin listener stops beside the client one, not after its last request
	go func() { adminStopped <- stopAdmin(sctx) }()
	if err := hs.Shutdown(sctx); err != nil {
		errs = append(errs, fmt.Errorf("http shutdown: %w", err))
	}
	if err := <-adminStopped; err != nil {
		errs = append(errs, err)
	}
	if err := srv.Shutdown(sctx); err != nil {
		errs = append(errs, err)
	}
	stopRun()
	if err := g.Wait(); err != nil {
		errs = append(errs, err)
	}
	log.Info("stopped")
	return errors.Join(errs...)
}

// listenerCerts loads --tls-cert and --tls-key (nil when neither is
// given): the listener serves HTTPS and wss:// with them, loaded again
// when the files change.
func (f *wsFlags) listenerCerts(log *zap.Logger) (*tlscert.Files, error) {
	if f.tlsCert == "" && f.tlsKey == "" {
		return nil, nil
	}
	if f.tlsCert == "" || f.tlsKey == "" {
		return nil, errors.New("--tls-cert and --tls-key go together: give both (HTTPS and wss:// on --listen) or neither")
	}
	certs, err := tlscert.New(f.tlsCert, f.tlsKey, 0, log.Named("tls"))
	if err != nil {
		return nil, fmt.Errorf("--tls-cert, --tls-key: %w", err)
	}
	return certs, nil
}

// logPublishing says at start whether and how publishing is open: off
// (POST /api/publish answers 403), or which credentials publish.
func logPublishing(log *zap.Logger, srv *gateway.Server, f *wsFlags, keys int, reserved []string) {
	if !srv.PublishEnabled() {
		log.Info("publishing is off: POST /api/publish answers 403; give --api-key, --api-keys-file, a JWT key whose tokens carry a publish claim, or --allow-anonymous-publish")
		return
	}
	if f.apiKey != "" {
		keys++
	}
	log.Info("publishing is on",
		zap.Int("api_keys", keys),
		zap.Bool("token_publish_grants", f.jwtSecretFile != "" || f.jwtJWKSFile != ""),
		zap.Bool("anonymous", f.allowAnonPublish),
		zap.Strings("reserved_subjects", reserved))
	if f.allowAnonPublish {
		log.Warn("anonymous publishing is on (--allow-anonymous-publish): anyone who reaches this gateway may publish outside --reserved-subjects")
	}
}

// loadAPIKeys reads an --api-keys-file: one key per line, "name key
// [pattern,pattern]"; blank lines and # comments are skipped. Errors name
// the line, never the key.
func loadAPIKeys(path string) ([]gateway.APIKey, error) {
	if path == "" {
		return nil, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--api-keys-file: %w", err)
	}
	var keys []gateway.APIKey
	for i, line := range strings.Split(string(b), "\n") {
		if j := strings.IndexByte(line, '#'); j >= 0 {
			line = line[:j]
		}
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if len(f) < 2 || len(f) > 3 {
			return nil, fmt.Errorf("--api-keys-file %s line %d: want \"name key [patterns]\"", path, i+1)
		}
		k := gateway.APIKey{Name: f[0], Key: f[1]}
		if len(f) == 3 {
			k.Publish = strings.Split(f[2], ",")
		}
		keys = append(keys, k)
	}
	return keys, nil
}

// authenticator is the connections' authentication. With a JWT key every
// connection needs a valid token, unless --allow-anonymous admits those
// without one (with --anonymous-grants). Without a key, connections are
// anonymous, which must be asked for with --allow-anonymous (on in dev):
// they may subscribe to --anonymous-grants, or without those to every
// subject the gateway serves.
func (f *wsFlags) authenticator() (auth.Authenticator, error) {
	auth, _, err := f.authenticatorFor(zap.NewNop())
	return auth, err
}

// authenticatorFor is authenticator, logging the key files' reloads to
// log, with the collectors of their metrics.
func (f *wsFlags) authenticatorFor(log *zap.Logger) (auth.Authenticator, []prometheus.Collector, error) {
	for _, p := range f.anonymousGrants {
		if err := subject.ValidatePattern(p); err != nil {
			return nil, nil, fmt.Errorf("--anonymous-grants: %w", err)
		}
	}
	if f.jwtSecretFile != "" || f.jwtJWKSFile != "" {
		grace := f.jwtKeyGrace
		if grace <= 0 {
			grace = -1 // none (the Config's zero means its default)
		}
		auth, err := auth.NewJWTAuth(auth.JWTConfig{
			SecretFile: f.jwtSecretFile, JWKSFile: f.jwtJWKSFile, Issuer: f.jwtIssuer, Audience: f.jwtAudience,
			AllowAnonymous: f.allowAnonymous, AnonymousGrants: f.anonymousGrants,
			KeyGrace: grace, Logger: log,
		})
		if err != nil {
			return nil, nil, err
		}
		return auth.Grant, auth.Collectors(), nil
	}
	if f.jwtIssuer != "" || f.jwtAudience != "" {
		return nil, nil, errors.New("--jwt-issuer and --jwt-audience need a key: --jwt-secret-file or --jwt-jwks-file")
	}
	if !f.allowAnonymous {
		return nil, nil, errors.New("no authentication configured: give --jwt-secret-file or --jwt-jwks-file so that connections need a token, or --allow-anonymous to admit every connection without one (fanwire dev does)")
	}
	if len(f.anonymousGrants) == 0 {
		return nil, nil, nil // every subject of --subjects
	}

	grants := &auth.Grants{Subscribe: f.anonymousGrants, Subject: "anonymous", Anonymous: true}
	return func(context.Context, *http.Request, json.RawMessage) (*auth.Grants, error) { return grants, nil }, nil, nil
}
