package loadtest

import (
	"context"
	"errors"
	"io/fs"
	"math"
	"net"
	"slices"
	"strings"
	"testing"
	"time"
)

// The end-to-end test (Run against a real gateway) lands with the gateway.
// These cover what Run does before and around it, with real servers only.

func TestRunInvalidConfig(t *testing.T) {
	valid := Config{URL: "ws://127.0.0.1:1/ws", NATSURL: "nats://127.0.0.1:1"}
	tests := []struct {
		name  string
		mod   func(*Config)
		field string
	}{
		{"no URL", func(c *Config) { c.URL = "" }, "URL"},
		{"no NATSURL", func(c *Config) { c.NATSURL = "" }, "NATSURL"},
		{"bad scheme", func(c *Config) { c.URL = "tcp://x/ws" }, "URL"},
		{"negative clients", func(c *Config) { c.Clients = -1 }, "Clients"},
		{"negative events", func(c *Config) { c.Events = -1 }, "Events"},
		{"negative size", func(c *Config) { c.Size = -1 }, "Size"},
		{"negative rate", func(c *Config) { c.Rate = -1 }, "Rate"},
		{"negative timeout", func(c *Config) { c.Timeout = -time.Second }, "Timeout"},
		{"wildcard subject", func(c *Config) { c.Subject = "loadtest.*.hot" }, "Subject"},
		{"empty token", func(c *Config) { c.Subject = "loadtest..hot" }, "Subject"},
		{"huge bitmaps", func(c *Config) { c.Clients, c.Events = 100_000, 1_000_000 }, "Clients×Events"},
		{"negative pid", func(c *Config) { c.Proc.PID = -1 }, "Proc.PID"},
		{"unknown broker", func(c *Config) { c.Broker = "kafka" }, "Broker"},
		{"resume on core nats", func(c *Config) { c.ResumeShare = 0.5 }, "ResumeShare needs a durable broker"},
		{"resume share over 1", func(c *Config) { c.Broker, c.ResumeShare = "jetstream", 1.5 }, "ResumeShare"},
		{"resume share NaN", func(c *Config) { c.Broker, c.ResumeShare = "jetstream", math.NaN() }, "ResumeShare"},
		{"negative resume share", func(c *Config) { c.Broker, c.ResumeShare = "jetstream", -0.1 }, "ResumeShare"},
		{"negative drops", func(c *Config) { c.Broker, c.ResumeShare, c.ResumeDrops = "jetstream", 0.5, -1 }, "ResumeDrops"},
		{"more drops than events", func(c *Config) { c.Broker, c.ResumeShare, c.Events, c.ResumeDrops = "jetstream", 0.5, 10, 11 }, "ResumeDrops"},
		{"unknown proto", func(c *Config) { c.Proto = "grpc" }, "Proto"},
		{"graphql URL not derivable", func(c *Config) { c.Proto, c.URL = "graphql", "ws://127.0.0.1:1/socket" }, "GraphQLURL"},
		{"graphql URL bad scheme", func(c *Config) { c.Proto, c.GraphQLURL = "graphql", "tcp://x/graphql" }, "GraphQLURL"},
		{"unknown publish-via", func(c *Config) { c.PublishVia = "grpc" }, "PublishVia"},
		{"publish via ws with graphql", func(c *Config) { c.PublishVia, c.Proto = PublishViaWS, "graphql" }, "PublishVia ws needs Proto native"},
		{"publish via ws paced", func(c *Config) { c.PublishVia, c.Rate = PublishViaWS, 100 }, "Rate"},
		{"publish via http with churn", func(c *Config) { c.PublishVia, c.Churn = PublishViaHTTP, time.Second }, "Churn"},
		{"publish URL not derivable", func(c *Config) { c.PublishVia, c.URL = PublishViaHTTP, "ws://127.0.0.1:1/socket" }, "HTTPURL"},
		{"unknown where", func(c *Config) { c.Where = "gt" }, "Where"},
		{"where with graphql", func(c *Config) { c.Where, c.Proto = WhereEq, ProtoGraphQL }, "Where needs Proto native"},
		{"where with churn", func(c *Config) { c.Where, c.Churn = WhereEq, time.Second }, "Where is a test of its own"},
		{"where with client publishes", func(c *Config) { c.Where, c.PublishVia = WhereRange, PublishViaWS }, "Where is a test of its own"},
		{"where with fewer events than clients", func(c *Config) { c.Where, c.Clients, c.Events = WhereEq, 10, 9 }, "Events 9 with Where is fewer than Clients 10"},
		{"negative where docs", func(c *Config) { c.Where, c.WhereDocs = WhereEq, -1 }, "WhereDocs"},
		{"storm on core nats", func(c *Config) { c.StormURL, c.StormStop = "ws://127.0.0.1:2/ws", stopNothing }, "StormURL needs a durable broker"},
		{"storm without a stop", func(c *Config) { c.Broker, c.StormURL = "jetstream", "ws://127.0.0.1:2/ws" }, "StormStop"},
		{"storm to the same node", func(c *Config) { c.Broker, c.StormURL, c.StormStop = "jetstream", c.URL, stopNothing }, "node B must be another node"},
		{"storm after the last event", func(c *Config) {
			c.Broker, c.StormURL, c.StormStop, c.Events, c.StormAfter = "jetstream", "ws://127.0.0.1:2/ws", stopNothing, 10, 10
		}, "StormAfter 10"},
		{"storm with resumes", func(c *Config) {
			c.Broker, c.StormURL, c.StormStop, c.ResumeShare = "jetstream", "ws://127.0.0.1:2/ws", stopNothing, 0.5
		}, "StormURL is a test of its own"},
		{"storm with graphql", func(c *Config) {
			c.Broker, c.StormURL, c.StormStop, c.Proto = "jetstream", "ws://127.0.0.1:2/ws", stopNothing, ProtoGraphQL
		}, "StormURL needs native clients"},
		{"storm fields without a storm", func(c *Config) { c.StormAfter = 5 }, "StormAfter and StormStop need StormURL"},
		{"huge bitmaps of client publishes", func(c *Config) { c.PublishVia, c.Clients, c.Events = PublishViaWS, 10_000, 1_000_000 }, "Clients×Events"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := valid
			tt.mod(&cfg)
			res, err := Run(t.Context(), cfg)
			if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tt.field) || res != nil {
				t.Fatalf("Run = %v, %v; want ErrInvalidConfig naming %s", res, err, tt.field)
			}
		})
	}
}

func TestConfigDefaults(t *testing.T) {
	var a, b Config
	if err := a.setDefaults(); err != nil {
		t.Fatal(err)
	}
	if err := b.setDefaults(); err != nil {
		t.Fatal(err)
	}
	if a.Clients != 200 || a.Events != 20000 || a.Size != 256 || a.Timeout != 15*time.Second || a.Rate != 0 {
		t.Errorf("defaults = %+v", a)
	}
	if !strings.HasPrefix(a.Subject, "loadtest.") || !strings.HasSuffix(a.Subject, ".hot") || a.Subject == b.Subject {
		t.Errorf("default subjects %q and %q: want distinct loadtest.<id>.hot", a.Subject, b.Subject)
	}
	a.URL, a.NATSURL = "ws://x/ws", "nats://x"
	if err := a.validate(); err != nil {
		t.Errorf("default subject rejected: %v", err)
	}
	if a.ResumeDrops != 0 || a.ResumeSeed != 0 {
		t.Errorf("resume defaults without ResumeShare: drops %d seed %d, want none", a.ResumeDrops, a.ResumeSeed)
	}
	if a.Proto != ProtoNative || a.GraphQLURL != "" {
		t.Errorf("proto defaults: %q %q, want native and no GraphQL URL", a.Proto, a.GraphQLURL)
	}
	for _, tt := range []struct{ url, gql, want string }{
		{"ws://127.0.0.1:8080/ws", "", "ws://127.0.0.1:8080/graphql"},
		{"wss://h/prefix/ws?x=1", "", "wss://h/prefix/graphql?x=1"},
		{"ws://h:1", "", "ws://h:1/graphql"},
		{"ws://h:1/ws", "ws://other/gql", "ws://other/gql"},
	} {
		g := Config{URL: tt.url, Proto: ProtoGraphQL, GraphQLURL: tt.gql}
		if err := g.setDefaults(); err != nil {
			t.Fatal(err)
		}
		if g.GraphQLURL != tt.want {
			t.Errorf("URL %s, GraphQLURL %q: GraphQLURL = %q, want %q", tt.url, tt.gql, g.GraphQLURL, tt.want)
		}
	}
	r := Config{ResumeShare: 0.2}
	if err := r.setDefaults(); err != nil {
		t.Fatal(err)
	}
	if r.ResumeDrops != 1 || r.ResumeSeed == 0 {
		t.Errorf("resume defaults: drops %d seed %d, want 1 and a drawn seed", r.ResumeDrops, r.ResumeSeed)
	}
	s := Config{ResumeShare: 0.2, ResumeDrops: 4, ResumeSeed: 99}
	if err := s.setDefaults(); err != nil {
		t.Fatal(err)
	}
	if s.ResumeDrops != 4 || s.ResumeSeed != 99 {
		t.Errorf("resume settings overwritten: drops %d seed %d, want 4 and 99", s.ResumeDrops, s.ResumeSeed)
	}
}

func TestPlanDrops(t *testing.T) {
	cfg := Config{Clients: 20, Events: 50, ResumeShare: 0.25, ResumeDrops: 50, ResumeSeed: 7}
	plan := planDrops(&cfg)
	if len(plan) != 20 {
		t.Fatalf("plan for %d clients, want 20", len(plan))
	}
	resuming := 0
	for i, points := range plan {
		if points == nil {
			continue
		}
		resuming++
		// 50 distinct drop points in [0, 50) are all of them, in order.
		for k, p := range points {
			if p != int64(k) {
				t.Fatalf("client %d: drop points %v, want 0..49", i, points)
			}
		}
	}
	if resuming != 5 {
		t.Errorf("%d resuming clients, want round(0.25 × 20) = 5", resuming)
	}

	cfg.ResumeDrops = 3
	a, b := planDrops(&cfg), planDrops(&cfg)
	cfg.ResumeSeed = 8
	c := planDrops(&cfg)
	same := func(x, y [][]int64) bool {
		for i := range x {
			if !slices.Equal(x[i], y[i]) {
				return false
			}
		}
		return true
	}
	if !same(a, b) {
		t.Errorf("one seed, two plans:\n%v\n%v", a, b)
	}
	if same(a, c) {
		t.Errorf("seeds 7 and 8 planned the same drops: %v", a)
	}
	for _, points := range a {
		if points != nil && (len(points) != 3 || !slices.IsSorted(points) || points[0] < 0 || points[2] >= 50 ||
			points[0] == points[1] || points[1] == points[2]) {
			t.Errorf("drop points %v: want 3 distinct, ascending, in [0, 50)", points)
		}
	}

	for _, tt := range []struct {
		share   float64
		clients int
		want    int
	}{{0, 20, 0}, {0.01, 20, 1}, {0.5, 20, 10}, {0.7, 10, 7}, {1, 3, 3}} {
		c := Config{Clients: tt.clients, ResumeShare: tt.share}
		if got := c.resumingClients(); got != tt.want {
			t.Errorf("share %v of %d clients: %d resume, want %d", tt.share, tt.clients, got, tt.want)
		}
	}
}

// closedPort returns a local address nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

func TestRunNATSUnreachable(t *testing.T) {
	_, err := Run(t.Context(), Config{URL: "ws://" + closedPort(t) + "/ws", NATSURL: "nats://" + closedPort(t), Timeout: 5 * time.Second})
	if err == nil || !strings.Contains(err.Error(), "connect nats") {
		t.Fatalf("err = %v, want a NATS connect error", err)
	}
}

func TestRunGatewayUnreachable(t *testing.T) {
	start := time.Now()
	_, err := Run(t.Context(), Config{URL: "ws://" + closedPort(t) + "/ws", NATSURL: startNATS(t), Clients: 120, Timeout: 5 * time.Second})
	if err == nil || !strings.Contains(err.Error(), "connect clients") || !strings.Contains(err.Error(), "dial") {
		t.Fatalf("err = %v, want a dial error", err)
	}
	if took := time.Since(start); took > 4*time.Second {
		t.Errorf("a refused dial took %v to fail the run", took)
	}
}

func TestRunSizeOverMaxPayload(t *testing.T) {
	_, err := Run(t.Context(), Config{URL: "ws://" + closedPort(t) + "/ws", NATSURL: startNATS(t), Size: 2 << 20})
	if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "max_payload") {
		t.Fatalf("err = %v, want ErrInvalidConfig about max_payload", err)
	}
}

func TestRunNoSuchGatewayProcess(t *testing.T) {
	_, err := Run(t.Context(), Config{URL: "ws://" + closedPort(t) + "/ws", NATSURL: startNATS(t), Proc: ProcSampler{PID: 1 << 30}})
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("err = %v, want fs.ErrNotExist from sampling a missing pid", err)
	}
}

func TestRunCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err := Run(ctx, Config{URL: "ws://" + closedPort(t) + "/ws", NATSURL: startNATS(t)})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}

// stopNothing is a StormStop for configurations that never get to run.
func stopNothing(context.Context) error { return nil }
