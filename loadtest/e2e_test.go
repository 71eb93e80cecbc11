package loadtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/fanwire/fanwire/broker"
	"github.com/fanwire/fanwire/broker/brokertest"
	"github.com/fanwire/fanwire/gateway"
	"github.com/fanwire/fanwire/gateway/gatewaytest"
)

// TestRunAgainstGateway runs the load generator against a real gateway (in
// this process) on a real embedded NATS server: every client must get every
// event exactly once and in order, and the gateway's figures are sampled.
func TestRunAgainstGateway(t *testing.T) {
	natsURL, b := startNATSBroker(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	wsURL := startGateway(t, b, nil)

	var progress strings.Builder
	res, err := Run(ctx, Config{
		URL:      wsURL,
		NATSURL:  natsURL,
		Clients:  20,
		Events:   2000,
		Size:     200,
		RcvBuf:   1 << 20,
		Proc:     ProcSampler{PID: os.Getpid()}, // the gateway runs in this process
		Progress: &progress,
	})
	if err != nil {
		t.Fatal(err)
	}
	if !res.OK() || res.Delivered != 20*2000 {
		var out strings.Builder
		res.WriteTable(&out)
		t.Fatalf("run not clean:\n%s", out.String())
	}
	if !res.GatewaySampled || res.GatewayRSSHighWaterBytes <= 0 || res.LatencyMax <= 0 {
		t.Errorf("figures missing: sampled %v rss %d max latency %v", res.GatewaySampled, res.GatewayRSSHighWaterBytes, res.LatencyMax)
	}
	if !strings.Contains(progress.String(), "delivered") {
		t.Errorf("no progress line: %q", progress.String())
	}
}

// TestRunGraphQLAgainstGateway runs the load generator's GraphQL clients
// (graphql-transport-ws at /graphql) against a real gateway on Core NATS
// and on JetStream: every client must get every event exactly once and in
// order, as native clients do. On JetStream a third of the clients also
// drop and resume by subscribing again from their last event's cursor.
func TestRunGraphQLAgainstGateway(t *testing.T) {
	for _, tc := range []struct {
		kind   string
		resume float64
	}{{"nats", 0}, {"jetstream", 0}, {"jetstream", 0.3}} {
		t.Run(fmt.Sprintf("%s/resume=%v", tc.kind, tc.resume), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cfg := Config{Proto: ProtoGraphQL, Clients: 20, Events: 2000, Size: 200, RcvBuf: 1 << 20,
				Proc: ProcSampler{PID: os.Getpid()}, ResumeShare: tc.resume, ResumeDrops: 2}
			b, subjects := testBroker(ctx, t, &cfg, tc.kind)
			cfg.URL = startGateway(t, b, subjects)

			res, err := Run(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			var table strings.Builder
			res.WriteTable(&table)
			if !res.OK() || res.Delivered != 20*2000 || res.Gaps != 0 || res.Duplicates != 0 || res.Disconnects != 0 {
				t.Fatalf("run not clean:\n%s", table.String())
			}
			if res.LatencyMax <= 0 {
				t.Errorf("no latency measured:\n%s", table.String())
			}
			if tc.resume > 0 {
				if rs := res.Resume; rs == nil || rs.Clients != 6 || rs.Reconnects != 12 {
					t.Fatalf("resume figures: %+v\n%s", rs, table.String())
				}
			}
		})
	}
}

// TestRunGraphQLRejected checks that a GraphQL subscription the gateway
// refuses fails the run before anything is published, naming its code.
func TestRunGraphQLRejected(t *testing.T) {
	natsURL, b := startNATSBroker(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	wsURL := gatewaytest.Start(t, gateway.Config{Broker: b, Subjects: []string{"other.>"}}).WSURL()
	_, err := Run(ctx, Config{URL: wsURL, NATSURL: natsURL, Proto: ProtoGraphQL, Clients: 3, Events: 10, Timeout: 5 * time.Second})
	if !errors.Is(err, ErrRejected) {
		t.Fatalf("err = %v, want ErrRejected", err)
	}
	t.Log(err)
}

// TestResumeAgainstGateway measures a catch-up against a real gateway on a
// real JetStream stream: every missed event arrives once, in order.
func TestResumeAgainstGateway(t *testing.T) {
	natsURL := startNATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := broker.DialJetStream(ctx, broker.JetStreamConfig{
		NATSConfig: broker.NATSConfig{URL: natsURL, Subjects: []string{"loadtest.>"}}, Storage: "memory"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() }) // after the gateway's cleanup: cleanups run last-in first-out
	wsURL := startGateway(t, b, []string{"loadtest.>"})
	for _, proto := range []string{ProtoNative, ProtoGraphQL} {
		res, err := Resume(ctx, Config{URL: wsURL, NATSURL: natsURL, Size: 200, Proto: proto}, 5000)
		if err != nil {
			t.Fatalf("%s: %v", proto, err)
		}
		if !res.OK || res.Received != 5000 || res.EventsPerSec <= 0 {
			t.Fatalf("%s: resume: %+v", proto, res)
		}
	}
}

// TestRunWithResumingClients runs the load generator with half of its
// clients dropping their connections three times each while events flow,
// against a real gateway on each durable broker. A resumed client is
// verified like any other: every event exactly once and in order. In a
// burst most resumes replay history once publishing is over; at a rate
// (1.5 s of events) they hand over to a live feed that is still moving.
func TestRunWithResumingClients(t *testing.T) {
	if testing.Short() {
		t.Skip("-short (make test-quick) leaves out the slow tests: make test runs them")
	}
	for _, tc := range []struct {
		kind string
		rate int
	}{{"jetstream", 0}, {"jetstream", 2000}, {"redis", 0}, {"redis", 2000}} {
		kind := tc.kind
		t.Run(fmt.Sprintf("%s/rate=%d", kind, tc.rate), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cfg := Config{Clients: 20, Events: 3000, Size: 200, Rate: tc.rate, RcvBuf: 1 << 20, ResumeShare: 0.5, ResumeDrops: 3}
			b, subjects := testBroker(ctx, t, &cfg, kind)
			cfg.URL = startGateway(t, b, subjects)

			res, err := Run(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			var table strings.Builder
			res.WriteTable(&table)
			if !res.OK() || res.Delivered != 20*3000 || res.Disconnects != 0 {
				t.Fatalf("run not clean:\n%s", table.String())
			}
			// A clean run reached every drop point: each lies before the
			// client's last event.
			rs := res.Resume
			if rs == nil || rs.Clients != 10 || rs.Reconnects != 30 || rs.ReconnectTime <= 0 || rs.CatchUpTime < rs.ReconnectTime/30 {
				t.Fatalf("resume figures: %+v\n%s", rs, table.String())
			}
			if !strings.Contains(table.String(), fmt.Sprintf("seed %d", rs.Seed)) {
				t.Errorf("the table does not name the seed %d:\n%s", rs.Seed, table.String())
			}
		})
	}
}

// TestRunResumeNeedsHistory checks that a run with resuming clients fails
// before connecting them when the gateway cannot resume: when no stream
// stores the subject, and when one does but the gateway runs on Core NATS.
func TestRunResumeNeedsHistory(t *testing.T) {
	natsURL, b := startNATSBroker(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	wsURL := startGateway(t, b, nil)
	cfg := Config{URL: wsURL, NATSURL: natsURL, Broker: "jetstream", Clients: 5, Events: 10, ResumeShare: 0.5, Timeout: 5 * time.Second}

	_, err := Run(ctx, cfg)
	if !errors.Is(err, ErrNotDurable) {
		t.Fatalf("no stream: err = %v, want ErrNotDurable", err)
	}

	js, err := broker.DialJetStream(ctx, broker.JetStreamConfig{
		NATSConfig: broker.NATSConfig{URL: natsURL, Subjects: []string{"loadtest.>"}}, Storage: "memory"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = js.Close() })
	_, err = Run(ctx, cfg)
	if !errors.Is(err, ErrRejected) || !strings.Contains(err.Error(), "bad_cursor") {
		t.Fatalf("Core NATS gateway: err = %v, want its bad_cursor reply", err)
	}
}

// startGateway runs a real gateway on b in this process until the test ends
// and returns its WebSocket URL once it is consuming.
// testBroker starts a broker of kind ("nats", "jetstream" or "redis") for
// a load test, points cfg at it, and dials it for the gateway: the broker,
// closed after the gateway (cleanups run last-in first-out), and the
// subjects the gateway serves.
func testBroker(ctx context.Context, t *testing.T, cfg *Config, kind string) (broker.Broker, []string) {
	t.Helper()
	var b broker.Broker
	var err error
	var subjects []string
	switch kind {
	case "nats":
		cfg.NATSURL = startNATS(t)
		b, err = broker.DialNATS(ctx, broker.NATSConfig{URL: cfg.NATSURL})
	case "jetstream":
		cfg.Broker, cfg.NATSURL = "jetstream", startNATS(t)
		subjects = []string{"loadtest.>"}
		b, err = broker.DialJetStream(ctx, broker.JetStreamConfig{
			NATSConfig: broker.NATSConfig{URL: cfg.NATSURL, Subjects: subjects}, Storage: "memory"})
	case "redis":
		cfg.Broker, cfg.RedisURL, cfg.Stream = "redis", "redis://"+brokertest.Redis(t), "{loadtest}"
		b, err = broker.DialRedis(ctx, broker.RedisConfig{URL: cfg.RedisURL, Stream: cfg.Stream})
	default:
		t.Fatalf("no broker %q", kind)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b, subjects
}

func startGateway(t *testing.T, b broker.Broker, subjects []string) string {
	t.Helper()
	return gatewaytest.Start(t, gateway.Config{Broker: b, Subjects: subjects}).WSURL()
}

// TestRunClientsPublishAgainstGateway runs the clients as publishers too
// (PublishVia ws and http) against a real gateway that lets them: every
// client must get every client's events, each publisher's in order, and
// every publish must be accepted. A gateway that does not let them
// publish fails the run: over HTTP with ErrPublishRefused, over the
// connection with the gateway's error replies (forbidden, or rate_limited
// past --max-message-rate's burst) counted, and the events missing.
func TestRunClientsPublishAgainstGateway(t *testing.T) {
	if testing.Short() {
		t.Skip("-short (make test-quick) leaves out the slow tests: make test runs them")
	}
	const clients, events = 8, 40
	for _, via := range []string{PublishViaWS, PublishViaHTTP} {
		t.Run(via, func(t *testing.T) {
			natsURL, b := startNATSBroker(t)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			wsURL := gatewaytest.Start(t, gateway.Config{Broker: b, AllowAnonymousPublish: true, MaxMessageRate: -1}).WSURL()
			res, err := Run(ctx, Config{URL: wsURL, NATSURL: natsURL, PublishVia: via, Clients: clients, Events: events, Size: 100,
				Proc: ProcSampler{PID: os.Getpid()}})
			if err != nil {
				t.Fatal(err)
			}
			var table strings.Builder
			res.WriteTable(&table)
			if !res.OK() || res.Expected != clients*clients*events || res.Delivered != res.Expected || res.Disconnects != 0 {
				t.Fatalf("run not clean:\n%s", table.String())
			}
			if res.PublishesAccepted != clients*events || res.PublishesPerSec <= 0 || !strings.Contains(table.String(), "publishes accepted") {
				t.Fatalf("publish figures: accepted %d, %v/s\n%s", res.PublishesAccepted, res.PublishesPerSec, table.String())
			}
		})
	}
	for _, tc := range []struct {
		name string
		via  string
		gw   gateway.Config
		want string // in the first server error (ws)
	}{
		{"http/anonymous publish off", PublishViaHTTP, gateway.Config{}, ""},
		{"ws/anonymous publish off", PublishViaWS, gateway.Config{}, "forbidden"},
		{"ws/rate limited", PublishViaWS, gateway.Config{AllowAnonymousPublish: true, MaxMessageRate: 10}, "rate_limited"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			natsURL, b := startNATSBroker(t)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			tc.gw.Broker = b
			wsURL := gatewaytest.Start(t, tc.gw).WSURL()
			res, err := Run(ctx, Config{URL: wsURL, NATSURL: natsURL, PublishVia: tc.via, Clients: 2, Events: 40, Timeout: time.Second})
			if tc.via == PublishViaHTTP {
				if !errors.Is(err, ErrPublishRefused) {
					t.Fatalf("err = %v, want ErrPublishRefused", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if res.OK() || res.ServerErrors == 0 || res.Missing == 0 || !strings.Contains(res.FirstServerError, tc.want) {
				var table strings.Builder
				res.WriteTable(&table)
				t.Fatalf("want a failed run with %s errors:\n%s", tc.want, table.String())
			}
		})
	}
}

// TestRunViewsAgainstGateway runs view clients (each a filtered or a
// subject-routed view of its own customer's rows) against a real gateway:
// every event must reach exactly its customer's client, in order, once,
// and no document may leave a view.
func TestRunViewsAgainstGateway(t *testing.T) {
	for _, where := range []string{WhereEq, WhereRange, WhereSubject} {
		t.Run(where, func(t *testing.T) {
			natsURL, b := startNATSBroker(t)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			wsURL := startGateway(t, b, nil)
			res, err := Run(ctx, Config{URL: wsURL, NATSURL: natsURL, Clients: 20, Events: 2000, Size: 200, RcvBuf: 1 << 20,
				Where: where, WhereDocs: 3, Proc: ProcSampler{PID: os.Getpid()}})
			if err != nil {
				t.Fatal(err)
			}
			var table strings.Builder
			res.WriteTable(&table)
			if !res.OK() || res.Expected != 2000 || res.Delivered != 2000 || res.Disconnects != 0 {
				t.Fatalf("run not clean:\n%s", table.String())
			}
			if !strings.Contains(table.String(), "where "+where+", 3 document(s) per client") {
				t.Errorf("view figures missing:\n%s", table.String())
			}
		})
	}
}

// TestIdleViewsAgainstGateway measures idle views against a real gateway
// that pings every 20 ms: the idle clients must answer (an unanswered
// ping closes a connection, which fails the measurement), and after the
// first reading every client gets exactly its documents, then the second
// reading is taken. Figures are the process's (the gateway runs in it),
// so only their presence is checked.
func TestIdleViewsAgainstGateway(t *testing.T) {
	for _, where := range []string{"", WhereEq, WhereSubject} {
		t.Run("where="+where, func(t *testing.T) {
			natsURL, b := startNATSBroker(t)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			wsURL := gatewaytest.Start(t, gateway.Config{Broker: b, PingInterval: 20 * time.Millisecond, PingTimeout: 2 * time.Second}).WSURL()
			res, err := Idle(ctx, Config{URL: wsURL, NATSURL: natsURL, Clients: 30, Where: where, WhereDocs: 4,
				Proc: ProcSampler{PID: os.Getpid()}}, 300*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			var table strings.Builder
			res.WriteTable(&table)
			if res.IdleBytes <= 0 || res.Clients != 30 {
				t.Fatalf("no idle reading:\n%s", table.String())
			}
			switch {
			case where == "" && (res.HeldDocs != 0 || strings.Contains(table.String(), "per document")):
				t.Errorf("plain idle run reports documents:\n%s", table.String())
			case where != "" && (res.HeldDocs != 120 || res.HeldBytes <= 0 || !strings.Contains(table.String(), "120 documents held")):
				t.Errorf("view idle run: want 120 documents held and a second reading:\n%s", table.String())
			}
		})
	}
}

// TestLatestAgainstGateway reads documents into one client from "latest"
// and by replay, alternately, against a real gateway on each durable
// broker: every read gets every document once, in order, then synced.
func TestLatestAgainstGateway(t *testing.T) {
	if testing.Short() {
		t.Skip("-short (make test-quick) leaves out the slow tests: make test runs them")
	}
	for _, tc := range []struct{ kind, where string }{{"jetstream", ""}, {"jetstream", WhereEq}, {"redis", ""}, {"redis", WhereRange}} {
		t.Run(tc.kind+"/where="+tc.where, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cfg := Config{Size: 200, Where: tc.where, Proc: ProcSampler{PID: os.Getpid()}}
			b, subjects := testBroker(ctx, t, &cfg, tc.kind)
			cfg.URL = startGateway(t, b, subjects)
			res, err := Latest(ctx, cfg, 500, 2)
			if err != nil {
				t.Fatal(err)
			}
			var table strings.Builder
			res.WriteTable(&table)
			if !res.OK || len(res.Reads) != 5 || res.Reads[0].Kind != readWarmUp || res.Reads[1].Kind != readSnapshot || res.Reads[3].Kind != readReplay {
				t.Fatalf("want 5 clean reads: a warm-up, snapshot first, then replay first:\n%s", table.String())
			}
			for _, rd := range res.Reads {
				if rd.Received != 500 || rd.DocsPerSec <= 0 {
					t.Errorf("%s read %d documents at %v/s:\n%s", rd.Kind, rd.Received, rd.DocsPerSec, table.String())
				}
			}
		})
	}
}

// TestLatestNeedsSnapshots checks that a gateway on Core NATS, which
// cannot serve "latest", fails the measurement with its error.
func TestLatestNeedsSnapshots(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := Config{Size: 200, Timeout: 5 * time.Second}
	testBroker(ctx, t, &cfg, "jetstream")                                // a stream stores the documents…
	nb, err := broker.DialNATS(ctx, broker.NATSConfig{URL: cfg.NATSURL}) // …but the gateway reads Core NATS
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nb.Close() })
	cfg.URL = startGateway(t, nb, nil)
	_, err = Latest(ctx, cfg, 10, 1)
	if !errors.Is(err, ErrRejected) || !strings.Contains(err.Error(), "bad_cursor") {
		t.Fatalf("err = %v, want the gateway's bad_cursor", err)
	}
}
