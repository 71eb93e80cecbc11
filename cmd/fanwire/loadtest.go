package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/fanwire/fanwire/loadtest"
)

func loadtestCommand() *command {
	c := newCommand("loadtest", "Measure a gateway: N clients, M events, every delivery verified (no gap, no duplicate).")
	c.usage = `Either --spawn (start "fanwire dev" as a child process and measure it) or --url and --nats
(an existing gateway and the NATS it consumes; add --pid to sample its CPU and RSS).
--url is the native endpoint even with --proto graphql: the GraphQL endpoint is derived
from it (or given with --graphql-url), and a --resume run's primer check speaks native.
Exits 1 on any gap, duplicate, missing or unexpected delivery; with --churn also when a churning
client's stream has a gap or a repeat, a churn session fails, or the gateway's goroutines, heap
in use, connections or subscriptions do not come back to their baseline (the gateway's /metrics
must carry the Go collector, as "fanwire ws" and "fanwire dev" do); with --storm also when a
client does not come back on node B and catch up.`
	var (
		cfg        loadtest.Config
		spawn      bool
		spawnRole  string
		spawnFlags string
		spawnBin   string
		consumer   string
		pid        int
		asJSON     bool
		idle       time.Duration
		behind     int
		latest     int
		rounds     int
		brokerKind string
		cpuProfile string
		storm      bool
	)
	fs := c.fs
	fs.IntVar(&cfg.Clients, "clients", loadtest.DefaultClients, "WebSocket clients, each subscribed to the hot subject")
	fs.IntVar(&cfg.Events, "events", 0, fmt.Sprintf("events to publish (0: %d; with --churn it is derived: --rate × (--churn-baseline + --churn + --churn-settle), and may not be given)", loadtest.DefaultEvents))
	fs.IntVar(&cfg.Size, "size", loadtest.DefaultSize, "bytes per event (its JSON data)")
	fs.IntVar(&cfg.Rate, "rate", 0, fmt.Sprintf("events per second; 0 = burst, as fast as possible (with --churn: %d/s)", loadtest.DefaultChurnRate))
	fs.StringVar(&cfg.URL, "url", "", "gateway WebSocket URL, e.g. ws://127.0.0.1:8080/ws")
	fs.StringVar(&cfg.Proto, "proto", loadtest.ProtoNative, "what the clients speak: native (the gateway's protocol at --url) or graphql (a GraphQL events subscription over graphql-transport-ws at --graphql-url, one event per WebSocket message); deliveries are verified the same way")
	fs.StringVar(&cfg.GraphQLURL, "graphql-url", "", "with --proto graphql: the gateway's GraphQL WebSocket URL (default: --url with its final /ws replaced by /graphql, e.g. ws://127.0.0.1:8080/graphql; with --spawn, the spawned gateway's)")
	fs.StringVar(&cfg.PublishVia, "publish-via", loadtest.PublishViaBroker, "who publishes: broker (one publisher, --events events straight into the broker) or ws/http (every client also publishes --events numbered events of its own through the gateway: native publish messages on its connection, or one POST /api/publish each; every client must get all clients × --events, each publisher's in order; reports publishes accepted/s). With --spawn, ws also starts the gateway with --max-message-rate -1, and --spawn-role ws with --allow-anonymous-publish; an existing gateway must allow both")
	fs.IntVar(&cfg.PublishBatch, "publish-batch", 0, "with --publish-via broker: post the events to the gateway's POST /api/publish, this many per request (a JSON array), instead of publishing them into NATS; with --rate each request goes out when its last event is due, its events stamped then. With --spawn --spawn-role ws the gateway gets --allow-anonymous-publish; an existing gateway must allow it")
	fs.StringVar(&cfg.NATSURL, "nats", "", "NATS URL the gateway consumes; events are published there")
	fs.StringVar(&cfg.Subject, "subject", "", "subject to publish on (default loadtest.<run id>.hot)")
	fs.DurationVar(&cfg.Timeout, "timeout", loadtest.DefaultTimeout, "give up after this long without delivery progress")
	fs.IntVar(&cfg.RcvBuf, "client-rcvbuf", 4<<20, "SO_RCVBUF of each client socket in bytes (0: kernel autotuning, which on loopback stalls 200-800 ms at zero windows)")
	fs.IntVar(&cfg.SourceAddrs, "source-addrs", 0, "spread the clients over this many loopback source addresses, 127.0.0.2 on (0: the kernel's choice); one address reaches one server from about 28,000 ports, so 50,000 clients need 2 (--url must be 127.0.0.1)")
	fs.BoolVar(&cfg.OwnPattern, "own-pattern", false, "subscribe each client to a pattern of its own too (<subject>.own.<client>.>, nothing published on it), beside the shared subject, so the gateway's index holds one pattern per client")
	fs.StringVar(&brokerKind, "broker", "nats", "the gateway's broker: nats, jetstream (events are published to NATS either way) or redis (pipelined XADD to --redis); with --spawn the gateway is started on it")
	fs.StringVar(&cfg.RedisURL, "redis", "redis://127.0.0.1:6379", "with --broker redis: the Redis server")
	fs.StringVar(&cfg.Stream, "stream", "fanwire-loadtest", "with --broker redis: the stream key")
	fs.BoolVar(&spawn, "spawn", false, "start a gateway (see --spawn-role) on free ports as a child process and measure it")
	fs.StringVar(&spawnRole, "spawn-role", "dev", "with --spawn: dev (gateway and embedded NATS in one measured process) or ws (the measured process is \"fanwire ws\"; NATS runs embedded in the loadtest process)")
	fs.StringVar(&consumer, "consumer", "shared", "with --spawn --broker jetstream: the spawned gateway's consumer mode, shared or per-connection (a subscription consumer each)")
	fs.StringVar(&spawnBin, "spawn-binary", "", "with --spawn: the fanwire binary to start (default: this one), e.g. an earlier commit's build to compare with, alternating runs; this binary still drives the load")
	fs.StringVar(&spawnFlags, "spawn-flags", "", "extra flags for the spawned gateway, space-separated (e.g. \"--mailbox-messages 8192\")")
	fs.IntVar(&pid, "pid", 0, "sample this existing gateway process's CPU and RSS from /proc")
	fs.BoolVar(&asJSON, "json", false, "print one JSON object instead of the table")
	fs.Float64Var(&cfg.ResumeShare, "resume", 0, "share of the clients (0-1) that, while events flow, drop their connection without a close handshake at random points, reconnect at once and resume from the cursor of their last event; they too must get every event exactly once, in order (needs --broker jetstream or redis)")
	fs.IntVar(&cfg.ResumeDrops, "resume-drops", 1, "with --resume: how many times each resuming client drops")
	fs.Uint64Var(&cfg.ResumeSeed, "resume-seed", 0, "with --resume: seed choosing the resuming clients and their drop points (0: a random one, printed with the result; give it to repeat a run)")
	fs.IntVar(&behind, "resume-behind", 0, "instead of the fan-out test: a client leaves, this many events are published, and it resumes from its cursor; reports the catch-up rate (needs --broker jetstream on the gateway)")
	fs.IntVar(&latest, "latest", 0, "instead of the fan-out test: publish this many documents, each once on a subject of its own, then read them into one new client at a time, alternately from \"latest\" (a snapshot; with --where eq or range, filtered by a where every document passes) and from the cursor before them (a replay of the same events), after one warm-up replay that is not counted; each read must get every document once, in order, then synced; reports documents/s from subscribe to synced and the gateway's CPU per document (needs --broker jetstream or redis; past 100,000 documents raise the gateway's --max-snapshot with --spawn-flags)")
	fs.IntVar(&rounds, "latest-rounds", 3, "with --latest: how many reads of each kind, alternating (snapshot first, then replay first, ...)")
	fs.StringVar(&cpuProfile, "cpuprofile", "", "fan-out test: write a CPU profile of this (the loadtest) process, from the first publish to the end of delivery, to this file (go tool pprof)")
	fs.BoolVar(&storm, "storm", false, "reconnect storm (with --spawn --spawn-role ws and --broker jetstream or redis): spawn two \"fanwire ws\" nodes on one broker, connect --clients to node A, publish at --rate, SIGTERM node A after --storm-after events; every client, closed with 1001, comes back on node B with fanwire.js's backoff (full jitter from 500 ms, doubling, at most 30 s; 503 and 429 retried) and resumes from its last event's cursor, and must get every event once, in order; reports node A's drain, the time until all are back and caught up, dials and refusals, and node B's CPU and peak RSS (the gateway figures are node B's)")
	fs.IntVar(&cfg.StormAfter, "storm-after", 0, "with --storm: events published before node A gets SIGTERM (0: a quarter of --events)")
	fs.Uint64Var(&cfg.StormSeed, "storm-seed", 0, "with --storm: seed of the clients' backoff jitter (0: a random one, printed with the result)")
	fs.DurationVar(&cfg.Churn, "churn", 0, "churn soak: besides --clients (connected throughout, verified as usual), --churn-clients clients connect, subscribe, receive for up to half a second and leave (clean closes, TCP drops, resubscriptions on one connection, drops before subscribing), over and over, for this long (0: off); events flow at --rate throughout, and the gateway's goroutines and heap (from --metrics-url) must come back to their baseline")
	fs.IntVar(&cfg.ChurnClients, "churn-clients", loadtest.DefaultChurnClients, "with --churn: concurrent churning clients")
	fs.DurationVar(&cfg.ChurnBaseline, "churn-baseline", loadtest.DefaultChurnBaseline, "with --churn: how long events flow to --clients alone before churn starts; the baseline is read over its second half")
	fs.DurationVar(&cfg.ChurnSettle, "churn-settle", loadtest.DefaultChurnSettle, "with --churn: how long events keep flowing once the churners have left; the after figures are read over its last part, as long as the baseline's window (at least --churn-baseline)")
	fs.Uint64Var(&cfg.ChurnSeed, "churn-seed", 0, "with --churn: seed drawing the sessions' kinds and lengths (0: a random one, printed with the result)")
	fs.StringVar(&cfg.MetricsURL, "metrics-url", "", "with --churn: the gateway's Prometheus endpoint, which must carry the Go collector's go_goroutines and go_memstats_heap_inuse_bytes (default: --url's host, path /metrics; with --spawn, the spawned gateway's)")
	fs.StringVar(&cfg.Where, "where", "", "views: the events are rows of a table (subject <subject>.<customer>.<row>, data {\"seq\",\"ts\",\"doc\":{\"customer_id\":k,\"total\":k.5},...}), customer k = event number mod --clients, and client i a view of customer i's rows, so each event goes to one client (--events at least --clients): eq (where \"doc.customer_id == i\", which the gateway indexes), range (where \"doc.total >= i && doc.total < i+1\", scanned) or subject (no where: client i subscribes to <subject>.i.*, the same deliveries routed by subject); each client must get exactly its events, in order, and no leave. With --idle the documents are published once after the first reading and a second reading gives the memory per held document")
	fs.IntVar(&cfg.WhereDocs, "where-docs", loadtest.DefaultWhereDocs, "with --where: documents (rows, each a subject) per client; the events cycle over --clients × this many")
	fs.DurationVar(&idle, "idle", 0, "instead of the fan-out test: connect --clients subscribed clients, wait this long, and report the gateway's RSS per idle connection; with --where, then publish every client's --where-docs documents once, wait this long again, and report the RSS (and heap in use, from the gateway's /metrics) per held document")
	c.markSecret(secretNATSURL, "nats")
	c.markSecret(secretURL, "redis")
	c.run = func([]string) error {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
		defer stop()
		if cfg.Proto != loadtest.ProtoNative && cfg.Proto != loadtest.ProtoGraphQL {
			return fmt.Errorf("--proto %q: want native or graphql", cfg.Proto)
		}
		extra := strings.Fields(spawnFlags)
		switch brokerKind {
		case "nats":
			// Said, not assumed: "fanwire dev" defaults to JetStream.
			extra = append([]string{"--broker", "nats"}, extra...)
		case "jetstream":
			cfg.Broker = "jetstream"
			extra = append([]string{"--broker", "jetstream", "--subjects", "loadtest.>", "--consumer", consumer}, extra...)
		case "redis":
			cfg.Broker = "redis"
			extra = append([]string{"--broker", "redis", "--redis-url", cfg.RedisURL, "--stream", cfg.Stream}, extra...)
		default:
			return fmt.Errorf("--broker %q: want nats, jetstream or redis", brokerKind)
		}
		if consumer != "shared" && (brokerKind != "jetstream" || !spawn) {
			return fmt.Errorf("--consumer %s applies to a gateway this run spawns on JetStream (--spawn --broker jetstream); an existing gateway runs the mode it was started with", consumer)
		}
		switch cfg.PublishVia {
		case loadtest.PublishViaBroker:
			if cfg.PublishBatch > 0 && spawnRole == "ws" {
				extra = append([]string{"--allow-anonymous-publish"}, extra...)
			}
		case loadtest.PublishViaWS, loadtest.PublishViaHTTP:
			// Flags the clients' publishing needs come first, so
			// --spawn-flags can override them.
			if cfg.PublishVia == loadtest.PublishViaWS {
				extra = append([]string{"--max-message-rate", "-1"}, extra...)
			}
			if spawnRole == "ws" {
				extra = append([]string{"--allow-anonymous-publish"}, extra...) // "fanwire dev" has it on
			}
		default:
			return fmt.Errorf("--publish-via %q: want broker, ws or http", cfg.PublishVia)
		}
		if storm {
			if !spawn || spawnRole != "ws" || cfg.Broker == "" {
				return errors.New("--storm spawns its two nodes: give --spawn --spawn-role ws and --broker jetstream or redis")
			}
			if behind > 0 || idle > 0 || latest > 0 || cfg.ResumeShare != 0 || cfg.Churn != 0 {
				return errors.New("--storm is a test of its own: drop --resume, --resume-behind, --idle, --latest and --churn")
			}
		} else if cfg.StormAfter != 0 || cfg.StormSeed != 0 {
			return errors.New("--storm-after and --storm-seed apply to --storm")
		}
		if spawn {
			if cfg.URL != "" || cfg.GraphQLURL != "" || cfg.NATSURL != "" || cfg.MetricsURL != "" || pid != 0 {
				return errors.New("--spawn starts its own gateway: drop --url, --graphql-url, --nats, --metrics-url and --pid")
			}
		}
		if storm {
			a, b, err := spawnStormPair(ctx, spawnBin, extra)
			if err != nil {
				return err
			}
			defer b.stop()
			defer a.stop() // first: b owns the NATS server
			cfg.URL, cfg.StormURL, cfg.NATSURL, pid = a.wsURL, b.wsURL, b.natsURL, b.cmd.Process.Pid
			cfg.StormStop = a.terminate
		} else if spawn {
			child, err := spawnGateway(ctx, spawnBin, spawnRole, extra)
			if err != nil {
				return err
			}
			defer child.stop()
			cfg.URL, cfg.NATSURL, pid = child.wsURL, child.natsURL, child.cmd.Process.Pid
		} else if spawnBin != "" {
			return errors.New("--spawn-binary applies to a gateway this run spawns (--spawn)")
		} else if cfg.URL == "" || cfg.NATSURL == "" {
			return errors.New("give --spawn, or both --url and --nats")
		}
		cfg.Proc = loadtest.ProcSampler{PID: pid}
		if cfg.ResumeShare != 0 && (behind > 0 || idle > 0) {
			return errors.New("--resume applies to the fan-out test: drop --resume-behind or --idle")
		}
		if cfg.Churn != 0 && (behind > 0 || idle > 0 || cfg.ResumeShare != 0) {
			return errors.New("--churn is a test of its own: drop --resume, --resume-behind or --idle")
		}
		if latest > 0 {
			if behind > 0 || idle > 0 || cfg.ResumeShare != 0 || cfg.Churn != 0 {
				return errors.New("--latest is a test of its own: drop --resume, --resume-behind, --idle and --churn")
			}
			res, err := loadtest.Latest(ctx, cfg, latest, rounds)
			if err != nil {
				return err
			}
			return report(res, res.OK, asJSON)
		}
		if behind > 0 {
			res, err := loadtest.Resume(ctx, cfg, behind)
			if err != nil {
				return err
			}
			return report(res, res.OK, asJSON)
		}
		if idle > 0 {
			res, err := loadtest.Idle(ctx, cfg, idle)
			if err != nil {
				return err
			}
			return report(res, true, asJSON)
		}
		if !asJSON {
			cfg.Progress = os.Stderr
		}
		if cpuProfile != "" {
			f, err := os.Create(cpuProfile)
			if err != nil {
				return err
			}
			defer f.Close()
			cfg.CPUProfile = f
		}
		res, err := loadtest.Run(ctx, cfg)
		if err != nil {
			return err
		}
		if asJSON {
			if err := res.WriteJSON(os.Stdout); err != nil {
				return err
			}
		} else {
			res.WriteTable(os.Stdout)
		}
		if !res.OK() {
			return exitCode(1)
		}
		return nil
	}
	return c
}

// report prints a test's result on stdout, as JSON or as its table, and
// fails the run (exit code 1) when it is not ok.
func report(res interface{ WriteTable(io.Writer) }, ok, asJSON bool) error {
	if asJSON {
		if err := json.NewEncoder(os.Stdout).Encode(res); err != nil {
			return err
		}
	} else {
		res.WriteTable(os.Stdout)
	}
	if !ok {
		return exitCode(1)
	}
	return nil
}
