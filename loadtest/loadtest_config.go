package loadtest

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"math"
	"net"
	"net/url"
	"strings"
	"sync/atomic"
	"time"
)

// Defaults filled in by Run for zero-valued Config fields.
const (
	DefaultClients = 200
	DefaultEvents  = 20000
	DefaultSize    = 256
	DefaultTimeout = 15 * time.Second

	// Churn runs (Config.Churn).
	DefaultChurnClients  = 50
	DefaultChurnRate     = 500 // events/s when Rate is not given
	DefaultChurnBaseline = 5 * time.Second
	DefaultChurnSettle   = 15 * time.Second
)

// maxBitmapBytes bounds the per-client "seen" bitmaps (Clients × Events bits),
// which are what make the gap/duplicate/missing counts exact.
const maxBitmapBytes = 1 << 30

// Config describes one load-test run. The zero value of every field except
// URL and NATSURL selects a default.
type Config struct {
	URL      string        // gateway native endpoint, e.g. ws://127.0.0.1:8080/ws (required, whatever Proto)
	NATSURL  string        // NATS server the gateway consumes, e.g. nats://127.0.0.1:4222 (required unless Broker is redis)
	Broker   string        // the gateway's broker: "nats" (default) or "jetstream" (events are published to NATS either way) or "redis"
	RedisURL string        // Broker redis: server URL
	Stream   string        // Broker redis: the stream key the gateway reads (default "fanwire")
	Clients  int           // concurrent WebSocket clients; default 200
	Events   int           // events published; default 20000
	Size     int           // bytes per event payload (the JSON in "data"); default 256
	Rate     int           // events/s; 0 publishes as fast as possible (burst)
	Subject  string        // default "loadtest.<random run id>.hot", so concurrent runs don't mix
	Timeout  time.Duration // give up after this long without delivery progress; also bounds each dial and the NATS connect; default 15s
	Progress io.Writer     // one progress line per second; nil for none
	Proc     ProcSampler   // samples the gateway's CPU and peak RSS; zero value samples nothing
	// Proto is what the clients speak: ProtoNative ("native", the default)
	// at URL, or ProtoGraphQL ("graphql"), a GraphQL events subscription
	// over graphql-transport-ws at GraphQLURL, one event per WebSocket
	// message. Deliveries are verified the same way. Checks a run makes
	// before its clients connect (a resume run's primer) use URL, so it
	// is required either way.
	Proto string
	// GraphQLURL is the GraphQL WebSocket endpoint for Proto graphql;
	// default URL with its path's final "/ws" replaced by "/graphql"
	// (ws://127.0.0.1:8080/ws → ws://127.0.0.1:8080/graphql).
	GraphQLURL string
	// RcvBuf sets each client socket's SO_RCVBUF in bytes; 0 leaves the
	// kernel's autotuning. On loopback (MTU 64 KiB) autotuned buffers run
	// into zero-window stalls of 200–800 ms (TCP's persist timer backing
	// off) whenever clients fall behind a burst; real clients over a real
	// network don't see those, so the benchmarks use 4 MiB (see
	// docs/benchmarks.md).
	RcvBuf int
	// SourceAddrs spreads the clients' connections over this many
	// loopback source addresses, 127.0.0.2 on, in turn (0: the kernel's
	// choice). One address to one server has about 28,000 ephemeral
	// ports; 50,000 clients need two. URL must be a loopback address.
	SourceAddrs int
	// OwnPattern subscribes each client, beside the run's subject (id
	// s1), to a pattern of its own too (id s2): <subject>.own.<client>.>,
	// on which nothing is published. The gateway's index then holds a
	// pattern per client, as it does when every user follows their own
	// things.
	OwnPattern bool
	nextSource *atomic.Uint32 // the next source address (SourceAddrs)

	// ResumeShare is the share of clients (0–1: round(share × Clients), at
	// least 1 when above 0) that, while events flow, drop their connection
	// without a close handshake, redial at once and resume from the cursor
	// of the last event they received. Verification does not change: they
	// too must receive every event exactly once and in order. It needs a
	// durable broker (Broker jetstream or redis).
	ResumeShare float64
	// ResumeDrops is how many times each resuming client drops, each after
	// a distinct random number of received events; default 1.
	ResumeDrops int
	// ResumeSeed picks the resuming clients and their drop points, so a
	// failing run can be repeated; 0 draws one (Result.Resume reports it).
	ResumeSeed uint64

	// Churn, when above 0, makes the run a churn soak (see churn.go):
	// besides the Clients, which stay connected and are verified as
	// usual, ChurnClients clients connect, subscribe, receive for a short
	// random time and leave, over and over, for this long. Events flow at
	// Rate for ChurnBaseline + Churn + ChurnSettle, and the gateway's
	// goroutines and heap (read from MetricsURL) must come back to their
	// baseline afterwards. Events is derived from that schedule and must
	// be left 0; Rate defaults to DefaultChurnRate.
	Churn time.Duration
	// ChurnClients is how many clients churn concurrently; default 50.
	ChurnClients int
	// ChurnBaseline is how long events flow to the Clients alone before
	// churn starts; the gateway's baseline is read over its last part.
	// Default 5s.
	ChurnBaseline time.Duration
	// ChurnSettle is how long events keep flowing after the churners have
	// gone; the gateway's "after" figures are read over its last part, as
	// long as ChurnBaseline's. Default 15s; at least ChurnBaseline.
	ChurnSettle time.Duration
	// ChurnSeed draws the churners' session kinds and lengths; 0 draws
	// one (Result.Churn reports it).
	ChurnSeed uint64
	// MetricsURL is the gateway's Prometheus endpoint for a churn run;
	// default URL's host with path /metrics (the gateway serves both on
	// one listener).
	MetricsURL string

	// StormURL, when set, makes the run a reconnect storm (storm.go): the
	// clients connect to URL (node A) and, once StormAfter events are
	// published, StormStop stops node A gracefully; every client, closed
	// with 1001, reconnects to StormURL (node B, on the same durable
	// broker) under fanwire.js's backoff (backoff.go), 503 and 429
	// included, and resumes from the cursor of the last event it
	// processed. Verification does not change: every event once, in
	// order, for every client. Proc then samples node B, the survivor.
	// Needs Broker jetstream or redis and native clients; not with
	// ResumeShare, Churn, PublishVia or Where.
	StormURL string
	// StormAfter is how many events are published before node A is
	// stopped; default Events/4. Under 1 ≤ StormAfter < Events.
	StormAfter int
	// StormStop stops node A as SIGTERM does (drain, close every
	// connection with 1001) and returns once it has exited; the time it
	// takes is node A's drain time. Required with StormURL.
	StormStop func(ctx context.Context) error
	// StormSeed draws the clients' backoff jitter; 0 draws one
	// (Result.Storm reports it).
	StormSeed uint64

	// PublishVia is who publishes the events: PublishViaBroker ("broker",
	// the default) is one publisher writing Events events straight into
	// the broker; PublishViaWS ("ws") and PublishViaHTTP ("http") make
	// every client a publisher too, through the gateway: each publishes
	// its own Events numbered events, one after another, as native
	// "publish" messages on its connection (ws) or as one POST
	// /api/publish each on a keep-alive connection of its own (http, at
	// HTTPURL). Every client then expects Clients × Events events, each
	// publisher's in order. The gateway must let the clients publish
	// (--allow-anonymous-publish) and, for ws, not rate-limit them
	// (--max-message-rate). Not with Rate, ResumeShare or Churn; ws needs
	// Proto native.
	PublishVia string
	// HTTPURL is the gateway's publish endpoint for PublishVia http and
	// PublishBatch; default URL's host with path /api/publish.
	HTTPURL string
	// PublishBatch, when above 0 (with PublishVia broker), makes the one
	// publisher post its events to the gateway's POST /api/publish at
	// HTTPURL, PublishBatch events per request (a JSON array), instead of
	// writing them into the broker. With Rate each request goes out whole
	// when its last event is due, its events stamped then (see httpSink).
	PublishBatch int

	// Where, when set, makes the clients views of a table's rows (see
	// views_config.go): WhereEq ("eq") and WhereRange ("range") give each
	// client a filter (a where) that passes only its own customer's rows,
	// WhereSubject ("subject") routes the same rows by subject, unfiltered.
	// Every event then goes to exactly one client, and Events must be at
	// least Clients. Native clients only; not with PublishVia, ResumeShare
	// or Churn.
	Where string
	// WhereDocs is how many documents (rows, each a subject) each
	// client's view holds: events cycle over Clients × WhereDocs
	// documents. Default 1.
	WhereDocs int

	// CPUProfile, when set, receives a CPU profile (pprof format) of this
	// process over the measured window of Run: from the first publish to
	// the end of delivery, the window LoadtestCPUSeconds covers.
	CPUProfile io.Writer
}

// setDefaults fills zero-valued fields. It is the only place defaults live.
func (c *Config) setDefaults() error {
	if c.Clients == 0 {
		c.Clients = DefaultClients
	}
	if c.Churn > 0 {
		c.setChurnDefaults()
	}
	if c.Events == 0 {
		c.Events = DefaultEvents
	}
	if c.Size == 0 {
		c.Size = DefaultSize
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.Subject == "" {
		var id [6]byte
		if _, err := rand.Read(id[:]); err != nil {
			return fmt.Errorf("run id: %w", err)
		}
		c.Subject = "loadtest." + hex.EncodeToString(id[:]) + ".hot"
	}
	if c.Proto == "" {
		c.Proto = ProtoNative
	}
	if c.nextSource == nil {
		c.nextSource = new(atomic.Uint32)
	}
	if c.PublishVia == "" {
		c.PublishVia = PublishViaBroker
	}
	if (c.PublishVia == PublishViaHTTP || c.PublishBatch > 0) && c.HTTPURL == "" && c.URL != "" {
		c.HTTPURL, _ = publishURL(c.URL) // validate reports a URL it cannot derive from
	}
	if c.Proto == ProtoGraphQL && c.GraphQLURL == "" && c.URL != "" {
		c.GraphQLURL, _ = graphQLURL(c.URL) // validate reports a URL it cannot derive from
	}
	if c.viewRun() && c.WhereDocs == 0 {
		c.WhereDocs = DefaultWhereDocs
	}
	if c.storm() {
		c.setStormDefaults()
	}
	if c.ResumeShare > 0 {
		if c.ResumeDrops == 0 {
			c.ResumeDrops = 1
		}
		if c.ResumeSeed == 0 {
			c.ResumeSeed = randomSeed()
		}
	}
	return nil
}

// randomSeed draws a seed for a run's random choices (never 0: 0 asks
// for one). crypto/rand.Read never fails (Go 1.24+).
func randomSeed() uint64 {
	for {
		var b [8]byte
		_, _ = rand.Read(b[:])
		if s := binary.LittleEndian.Uint64(b[:]); s != 0 {
			return s
		}
	}
}

// brokerName is Broker with its default spelled out, for messages.
func (c *Config) brokerName() string {
	if c.Broker == "" {
		return "nats"
	}
	return c.Broker
}

// resumingClients is how many clients drop and resume: round(ResumeShare ×
// Clients), at least one when ResumeShare is above 0.
func (c *Config) resumingClients() int {
	if c.ResumeShare <= 0 || c.Clients == 0 {
		return 0
	}
	return min(c.Clients, max(1, int(math.Round(c.ResumeShare*float64(c.Clients)))))
}

// validate checks a Config after setDefaults.
func (c *Config) validate() error {
	switch {
	case c.URL == "":
		return fmt.Errorf("%w: URL is required", ErrInvalidConfig)
	case c.Proto != ProtoNative && c.Proto != ProtoGraphQL:
		return fmt.Errorf("%w: Proto %q: want native or graphql", ErrInvalidConfig, c.Proto)
	case c.Broker != "" && c.Broker != "nats" && c.Broker != "jetstream" && c.Broker != "redis":
		return fmt.Errorf("%w: Broker %q: want nats, jetstream or redis", ErrInvalidConfig, c.Broker)
	case c.Broker == "redis" && c.RedisURL == "":
		return fmt.Errorf("%w: RedisURL is required with Broker redis", ErrInvalidConfig)
	case c.Broker != "redis" && c.NATSURL == "":
		return fmt.Errorf("%w: NATSURL is required", ErrInvalidConfig)
	case c.Clients < 0:
		return fmt.Errorf("%w: Clients %d is negative", ErrInvalidConfig, c.Clients)
	case c.Events < 0:
		return fmt.Errorf("%w: Events %d is negative", ErrInvalidConfig, c.Events)
	case c.Size < 0:
		return fmt.Errorf("%w: Size %d is negative", ErrInvalidConfig, c.Size)
	case c.Rate < 0:
		return fmt.Errorf("%w: Rate %d is negative", ErrInvalidConfig, c.Rate)
	case c.RcvBuf < 0:
		return fmt.Errorf("%w: RcvBuf %d is negative", ErrInvalidConfig, c.RcvBuf)
	case c.SourceAddrs < 0 || c.SourceAddrs > 250*250:
		return fmt.Errorf("%w: SourceAddrs %d: want 0 to %d", ErrInvalidConfig, c.SourceAddrs, 250*250)
	case c.OwnPattern && (c.Proto != ProtoNative || c.viewRun()):
		return fmt.Errorf("%w: OwnPattern needs native clients of the plain fan-out (no Proto graphql, no Where)", ErrInvalidConfig)
	case c.Timeout < 0:
		return fmt.Errorf("%w: Timeout %v is negative", ErrInvalidConfig, c.Timeout)
	case c.Proc.PID < 0:
		return fmt.Errorf("%w: Proc.PID %d is negative", ErrInvalidConfig, c.Proc.PID)
	case !(c.ResumeShare >= 0 && c.ResumeShare <= 1): // NaN fails both
		return fmt.Errorf("%w: ResumeShare %v: want a share between 0 and 1", ErrInvalidConfig, c.ResumeShare)
	case c.ResumeShare > 0 && c.Broker != "jetstream" && c.Broker != "redis":
		return fmt.Errorf("%w: ResumeShare needs a durable broker (Broker jetstream or redis), not %q: Core NATS keeps no history to resume from",
			ErrInvalidConfig, c.brokerName())
	case c.ResumeDrops < 0:
		return fmt.Errorf("%w: ResumeDrops %d is negative", ErrInvalidConfig, c.ResumeDrops)
	case c.ResumeShare > 0 && c.ResumeDrops > c.Events:
		// Each drop comes after a distinct number of received events.
		return fmt.Errorf("%w: ResumeDrops %d is more than Events %d", ErrInvalidConfig, c.ResumeDrops, c.Events)
	case c.expectedTotal()/8 > maxBitmapBytes:
		return fmt.Errorf("%w: Clients×Events %d×%d needs over 1 GiB of verification bitmaps",
			ErrInvalidConfig, c.Clients, c.perClient())
	}
	if err := c.validateWhere(); err != nil {
		return err
	}
	if err := c.validatePublishVia(); err != nil {
		return err
	}
	if err := c.validateChurn(); err != nil {
		return err
	}
	if err := c.validateStorm(); err != nil {
		return err
	}
	if err := checkWSURL("URL", c.URL); err != nil {
		return err
	}
	if c.SourceAddrs > 0 {
		if u, _ := url.Parse(c.URL); u != nil {
			if ip := net.ParseIP(u.Hostname()); ip == nil || ip.To4() == nil || !ip.IsLoopback() {
				return fmt.Errorf("%w: SourceAddrs needs an IPv4 loopback URL (127.0.0.1), not %q: the source addresses are loopback ones", ErrInvalidConfig, c.URL)
			}
		}
	}
	if c.Proto == ProtoGraphQL {
		if c.GraphQLURL == "" {
			_, err := graphQLURL(c.URL)
			return fmt.Errorf("%w: no GraphQLURL from URL %q: %w", ErrInvalidConfig, c.URL, err)
		}
		if err := checkWSURL("GraphQLURL", c.GraphQLURL); err != nil {
			return err
		}
	}
	// A publish subject is concrete: no wildcards, no empty tokens, no whitespace.
	for _, tok := range strings.Split(c.Subject, ".") {
		if tok == "" || tok == "*" || tok == ">" || strings.ContainsAny(tok, " \t\r\n*>") {
			return fmt.Errorf("%w: Subject %q is not a concrete NATS subject", ErrInvalidConfig, c.Subject)
		}
	}
	return nil
}

// checkWSURL checks that the URL named name is a WebSocket one.
func checkWSURL(name, s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Errorf("%w: %s %q: %w", ErrInvalidConfig, name, s, err)
	}
	switch u.Scheme {
	case "ws", "wss", "http", "https":
	default:
		return fmt.Errorf("%w: %s %q: scheme must be ws or wss", ErrInvalidConfig, name, s)
	}
	return nil
}
