package gateway

import (
	"errors"
	"fmt"
	"net/netip"
	"time"
	"unicode/utf8"

	"github.com/fanwire/fanwire/broker"
	"github.com/fanwire/fanwire/gateway/auth"
	"github.com/fanwire/fanwire/gateway/internal/admission"
	"github.com/fanwire/fanwire/subject"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// Config configures a Server. Zero values take the defaults below.
type Config struct {
	Broker   broker.Broker // required
	Subjects []string      // the node's subject space (default [">"]); subscriptions outside it are refused
	Logger   *zap.Logger
	Registry *prometheus.Registry // metrics are registered here and served at /metrics (default: a new one)
	// MetricsApart leaves /metrics out of Handler (it answers 404): the
	// metrics are served on a listener of their own (fanwire's
	// --metrics-listen), off the address clients reach.
	MetricsApart bool

	MaxConnections int // over it the upgrade gets 503 + Retry-After (default 100,000); /readyz is not ready from 90% of it
	// MaxConnectionsPerIP caps one client address's connections; over it
	// the upgrade gets 429 + Retry-After (default 0: no cap). Behind a load
	// balancer every client has its address: cap there, or trust its
	// header in a proxy of your own.
	MaxConnectionsPerIP int
	// IPLimitIPv6Prefix is the prefix length by which MaxConnectionsPerIP
	// counts IPv6 clients: a host is given a whole /64 and picks its source
	// addresses in it (default 64; 128: each address). IPv4 clients, and
	// IPv4-mapped IPv6 ones, count by their address.
	IPLimitIPv6Prefix int
	// TrustedProxies are the peers (load balancers, reverse proxies of
	// yours) whose X-Forwarded-For names the client: from one of them, the
	// client is the first address of that header, read from the right, that
	// is not a trusted proxy. From any other peer the header
	// is ignored. The client address is what MaxConnectionsPerIP counts
	// (IPv6 by IPLimitIPv6Prefix) and what logs show. Parse flags with
	// ParseTrustedProxies.
	TrustedProxies []netip.Prefix
	// MaxConnectRate admits at most this many upgrades per second on the
	// node (GraphQL and native together), in bursts of up to ConnectBurst;
	// a request past it waits in a FIFO queue of ConnectQueue for at most
	// ConnectQueueWait, and is refused with 503 connect_rate when the
	// queue is full or its turn would come later (package internal/admission). Default
	// 1,000; negative: no limit (and no queue).
	MaxConnectRate int
	// ConnectBurst is how many upgrades may be admitted at once after a
	// quiet period (default MaxConnectRate: one second's worth).
	ConnectBurst int
	// ConnectQueue caps the upgrade requests waiting for admission (default
	// 1,024; negative: none wait, a request without a free token is
	// refused). Each holds its connection, a goroutine and net/http's
	// buffers while it waits: see docs/operations.md, "Limits".
	ConnectQueue int
	// ConnectQueueWait is the longest an upgrade request waits for
	// admission (default 5s).
	ConnectQueueWait time.Duration
	MaxSubscriptions int // per connection (default 256)
	// MaxSnapshot bounds a view: the documents a from:"latest" snapshot
	// sends, and those a filtered subscription holds (a fanout.View). Past it
	// the subscription ends with view_too_large (default 100,000).
	MaxSnapshot int
	// MaxViewDocumentsPerConnection bounds the documents one connection's
	// views hold together, and MaxViewDocuments those of every view on the
	// node (each costs about 180 bytes: docs/benchmarks.md, "Live views"); past either a
	// subscription ends with view_too_large naming the bound (defaults
	// 200,000 and 5,000,000).
	MaxViewDocumentsPerConnection int
	MaxViewDocuments              int
	// MaxFilterCost caps one evaluation of a filter (a where or a grant's),
	// in CEL's cost units (about one per field access, comparison or
	// list element visited); over it the event does not pass (default
	// 10,000).
	MaxFilterCost int
	// MaxFilterCostPerEvent caps what one connection's filters together
	// may spend on one event in the dispatcher, in the same units: the
	// subscription whose filter passes it ends with filter_too_costly, as
	// does each of the connection's others that would evaluate a filter for
	// that event (fanout.View). It bounds how long one connection can hold up
	// every other's delivery (default 20,000).
	MaxFilterCostPerEvent int
	// FilterCostRate caps the cost units per second one connection's
	// filters spend, in bursts of a second's worth: in the dispatcher a
	// view that would evaluate past it ends with filter_too_costly, and
	// filtered subscribes are refused until it has paid; snapshots,
	// replays and feeds wait instead (default 1,000,000: about 0.1 s of
	// CPU a second; docs/benchmarks.md, "Hostile filters").
	FilterCostRate int
	// FilterCompileRate caps the filter texts one connection has compiled
	// per second (a text the node holds costs nothing), in bursts of
	// MaxSubscriptions; over it a subscribe is refused with rate_limited
	// (default 32).
	FilterCompileRate int
	MailboxMessages   int           // per-connection queue bound in messages (default 4096)
	MailboxBytes      int           // per-connection queue bound in bytes (default 4 MiB); at least the largest publish (MaxPublishBytes, or the broker's limit when smaller); a bigger event is delivered to no one
	ReadLimit         int64         // largest client frame; over it: close 1009 (default 64 KiB)
	MaxFrameBytes     int           // the writer starts a new frame past this size (default 64 KiB)
	MaxPace           time.Duration // longest dispatcher wait per batch when most clients are behind (default 50ms; negative: never wait)
	PingInterval      time.Duration // server ping period (default 30s)
	PingTimeout       time.Duration // a ping not answered in this time closes the connection (default 10s)
	CloseTimeout      time.Duration // how long a close (1001, 4008, 1008) may take before the socket is cut (default 5s)
	MaxClientErrors   int           // protocol errors per ErrorWindow before close 1008 (default 100)
	MaxMessageRate    int           // client messages (WebSocket pings included) per second per connection, burst twice that; over it a message is dropped with rate_limited, a ping gets no pong (GraphQL: close 1008) (default 100; negative: no limit)
	ErrorWindow       time.Duration // default 10s
	// HandshakeTimeout bounds the time from a TCP accept to the end of its
	// first request's headers (for /ws, to the WebSocket upgrade); later
	// requests on a keep-alive connection get as long for their headers.
	// A connection over it is closed without an answer. A request body
	// (POST /api/publish, POST /graphql) gets as long again after its
	// headers (see HTTPServer; default 10s).
	HandshakeTimeout time.Duration
	// MaxHandshakes caps the connections accepted whose first request has
	// not been handled yet (a WebSocket not upgraded yet). Over it a new
	// TCP connection is closed at once, counted as
	// rejected{reason="max_handshakes"}: a flood of connections that never
	// send a request costs at most this many goroutines, not rate ×
	// HandshakeTimeout (default 4096; well-behaved clients are past their
	// handshake in milliseconds).
	MaxHandshakes int

	APIKey          string   // when set, POST /api/publish needs "Authorization: Bearer <key>" (shorthand for one APIKeys entry, "default", publishing anywhere)
	APIKeys         []APIKey // when set, POST /api/publish needs one of these keys, and publishes only where it may
	MaxPublishBytes int64    // largest publish request body, and largest data of one client publish (WebSocket, GraphQL) (default 1 MiB)
	// PublishTokens says that Authenticate verifies tokens whose "publish"
	// claim grants publishing (JWTAuth.Grant): POST /api/publish and the
	// GraphQL publish mutation over HTTP then accept a token as their
	// bearer credential. Connections publish with their own grants
	// whatever it says.
	PublishTokens bool
	// AllowAnonymousPublish lets publishers without a credential publish
	// anywhere outside ReservedSubjects: POST /api/publish without an
	// Authorization header, and connections admitted without a token.
	// Publishing is closed by default: without it, APIKeys or
	// PublishTokens, POST /api/publish answers 403 publish_disabled.
	AllowAnonymousPublish bool

	// Presence (package internal/presence). A token tracks where its presence claim
	// matches; AllowAnonymousPresence lets connections without a token
	// (and gateways without authentication) track where they may
	// subscribe.
	AllowAnonymousPresence bool
	MaxPresenceState       int           // a member's state, compacted JSON bytes (default 1,024)
	MaxPresenceTracks      int           // subjects one connection tracks at once (default 16)
	MaxPresenceMembers     int           // members a node's replica holds, every node's: over it a new member is refused (default 1,000,000)
	PresenceRate           int           // track and untrack messages per second per connection, burst twice that (default 5; negative: no limit)
	PresenceListLimit      int           // over this many members a subject's changes are coalesced per PresenceInterval (default 100)
	PresenceInterval       time.Duration // the coalescing interval of big subjects (default 1s)
	PresenceHeartbeat      time.Duration // how often a node tells the others it lives (default 2s)
	PresenceTimeout        time.Duration // a node silent this long is dead: its members leave (default 10s)
	// ReservedSubjects are the patterns no publish through the gateway may
	// write to (nil: DefaultReservedSubjects; empty, not nil: none), unless
	// the credential names them explicitly: one of its publish patterns
	// matches the subject and lies wholly inside a reserved pattern (see
	// publishauth.go). They keep clients from forging the ingest's events.
	ReservedSubjects []string
	// AllowSystemSubjects opens system subjects (first token starting with
	// '$', or _INBOX: the NATS server's APIs and request replies), closed
	// by default to publishing and subscribing: patterns whose first token
	// is a system one, written out (e.g. "$KV.config.>"). Even then only a
	// publish pattern or a subscription that names that token reaches
	// them; > and *.> never do (system.go).
	AllowSystemSubjects []string

	// AdminKey, when set, serves the inspector (admin.go): GET
	// /admin/connections and POST /admin/connections/close, each request
	// with "Authorization: Bearer <AdminKey>". Empty: /admin/ is not
	// served (404). At least MinAdminKeyLen characters.
	AdminKey string
	// AdminApart leaves the inspector out of Handler (/admin/ answers 404
	// there, as without AdminKey): AdminHandler serves it, with the
	// console's Inspector page, on a listener of its own (fanwire's
	// --admin-listen), which may be bound to a private interface. Needs
	// AdminKey.
	AdminApart bool

	AllowedOrigins []string // browser origins allowed besides same-origin (host patterns, e.g. "*.example.com")
	Console        bool     // serve the live console page at /

	// Consumer is ConsumerShared (default) or ConsumerPerConnection, which
	// needs a broker with per-subscription consumers (JetStream).
	Consumer string
	// DurableInactive is how long the broker keeps a durable subscription
	// consumer nobody is bound to (default 24h).
	DurableInactive time.Duration
	// MaxDurables caps the durable consumers one principal keeps on the
	// broker (a token's sub; connections without a token share one): a
	// new one past it is refused with too_many_durables, counted on the
	// broker so the cap holds across nodes (default 32; negative: no cap).
	MaxDurables int
	// AnonymousDurables lets connections without a token keep durable
	// subscriptions, all in one namespace they share (any of them can bind,
	// move or delete the others'). Without it only a token's sub has
	// durables. On a gateway without Authenticate every connection is
	// without a token.
	AnonymousDurables bool

	// GraphQLInitTimeout is how long a GraphQL connection may take to send
	// connection_init; then it is closed with 4408 (default 3s, as the
	// graphql-ws server's).
	GraphQLInitTimeout time.Duration
	// GraphQLMaxBodyBytes caps a POST /graphql body; over it: 413 with a
	// GraphQL error, code too_large (default 1 MiB).
	GraphQLMaxBodyBytes int64
	// Query limits of a GraphQL operation (HTTP and WebSocket), checked
	// before gqlgen validates it; over one: a GraphQL error, code
	// query_limit (graphql_limits.go). Negative: no limit. The defaults
	// are well above what the full introspection query of graphql-js
	// (every option on, as GraphiQL sends it) takes: 2,075 bytes, 184
	// tokens, depth 15, no aliases, complexity 230.
	GraphQLMaxQueryBytes int // query text in bytes (default 32 KiB)
	GraphQLMaxTokens     int // lexical tokens (default 4,000)
	GraphQLMaxDepth      int // nesting of fields, fragments expanded (default 24)
	GraphQLMaxAliases    int // aliased fields as written (default 100)
	// GraphQLMaxComplexity bounds the fields selected, fragments expanded,
	// plus one per pair of fields sharing a response name in one
	// selection set: the pairs validation compares (default 2,000).
	GraphQLMaxComplexity int
	// Authenticate, when set, admits or refuses every connection: GraphQL
	// from its connection_init payload and upgrade request (refused: 4403),
	// native from its upgrade request (refused: 401 before the upgrade).
	Authenticate auth.Authenticator

	// filterClock is the filter budgets' clock (nil: time.Now); tests set
	// another with SetFilterClock.
	filterClock func() time.Time
}

func (c *Config) setDefaults() {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	defDur := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	if len(c.Subjects) == 0 {
		c.Subjects = []string{">"}
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	if c.Registry == nil {
		c.Registry = prometheus.NewRegistry()
	}
	def(&c.MaxConnections, 100_000)
	def(&c.IPLimitIPv6Prefix, 64)
	def(&c.MaxConnectRate, DefaultMaxConnectRate)
	if c.MaxConnectRate < 0 {
		c.MaxConnectRate = 0 // no limit
	}
	def(&c.ConnectBurst, c.MaxConnectRate)
	def(&c.ConnectQueue, 1024)
	if c.ConnectQueue < 0 {
		c.ConnectQueue = 0
	}
	defDur(&c.ConnectQueueWait, 5*time.Second)
	def(&c.MaxSubscriptions, 256)
	def(&c.MaxSnapshot, 100_000)
	def(&c.MaxViewDocumentsPerConnection, 200_000)
	def(&c.MaxViewDocuments, 5_000_000)
	def(&c.MaxFilterCost, 10_000)
	def(&c.MaxFilterCostPerEvent, 2*c.MaxFilterCost)
	def(&c.FilterCostRate, 1_000_000)
	def(&c.FilterCompileRate, 32)
	def(&c.MailboxMessages, 4096)
	def(&c.MailboxBytes, 4<<20)
	if c.ReadLimit == 0 {
		c.ReadLimit = 64 << 10
	}
	def(&c.MaxFrameBytes, 64<<10)
	defDur(&c.MaxPace, 50*time.Millisecond)
	defDur(&c.HandshakeTimeout, 10*time.Second)
	def(&c.MaxHandshakes, 4096)
	defDur(&c.PingInterval, 30*time.Second)
	defDur(&c.PingTimeout, 10*time.Second)
	defDur(&c.CloseTimeout, 5*time.Second)
	def(&c.MaxClientErrors, 100)
	def(&c.MaxMessageRate, 100)
	defDur(&c.ErrorWindow, 10*time.Second)
	if c.Consumer == "" {
		c.Consumer = ConsumerShared
	}
	defDur(&c.DurableInactive, 24*time.Hour)
	def(&c.MaxDurables, 32)
	defDur(&c.GraphQLInitTimeout, 3*time.Second)
	if c.GraphQLMaxBodyBytes == 0 {
		c.GraphQLMaxBodyBytes = 1 << 20
	}
	def(&c.GraphQLMaxQueryBytes, 32<<10)
	def(&c.GraphQLMaxTokens, 4000)
	def(&c.GraphQLMaxDepth, 24)
	def(&c.GraphQLMaxAliases, 100)
	def(&c.GraphQLMaxComplexity, 2000)
	if c.APIKey != "" {
		c.APIKeys = append([]APIKey{{Name: "default", Key: c.APIKey}}, c.APIKeys...)
	}
	if c.MaxPublishBytes == 0 {
		c.MaxPublishBytes = 1 << 20
	}
	if c.ReservedSubjects == nil {
		c.ReservedSubjects = DefaultReservedSubjects
	}
	def(&c.MaxPresenceState, 1024)
	def(&c.MaxPresenceTracks, 16)
	def(&c.MaxPresenceMembers, 1_000_000)
	def(&c.PresenceRate, 5)
	if c.PresenceRate < 0 {
		c.PresenceRate = 0 // no limit
	}
	def(&c.PresenceListLimit, 100)
	defDur(&c.PresenceInterval, time.Second)
	defDur(&c.PresenceHeartbeat, 2*time.Second)
	defDur(&c.PresenceTimeout, 10*time.Second)
}

// DefaultMaxConnectRate is Config.MaxConnectRate's default, upgrades per
// second: see docs/operations.md ("Limits") for why this figure.
const DefaultMaxConnectRate = 1000

// DefaultReservedSubjects is the ingest's subject space under its default
// prefix ("db"): database changes, projections and their error events.
var DefaultReservedSubjects = []string{"db.>"}

func (c *Config) validate() error {
	var errs []error
	if c.Broker == nil {
		errs = append(errs, errors.New("Broker is required"))
	}
	if c.PresenceTimeout < 2*c.PresenceHeartbeat {
		errs = append(errs, fmt.Errorf("PresenceTimeout (%s) must be at least twice PresenceHeartbeat (%s): a node would be declared dead between two heart-beats", c.PresenceTimeout, c.PresenceHeartbeat))
	}
	for _, s := range c.Subjects {
		if err := subject.ValidatePattern(s); err != nil {
			errs = append(errs, fmt.Errorf("Subjects: %w", err))
		}
	}
	for i, a := range c.Subjects {
		for _, b := range c.Subjects[i+1:] {
			if subject.Overlap(a, b) {
				errs = append(errs, fmt.Errorf("Subjects: %q and %q overlap: an event would arrive twice", a, b))
			}
		}
	}
	switch c.Consumer {
	case ConsumerShared:
	case ConsumerPerConnection:
		if _, ok := c.Broker.(broker.Consumers); c.Broker != nil && !ok {
			errs = append(errs, errors.New("Consumer per-connection needs a broker with per-subscription consumers (JetStream)"))
		}
	default:
		errs = append(errs, fmt.Errorf("Consumer %q: want %s or %s", c.Consumer, ConsumerShared, ConsumerPerConnection))
	}
	pos := func(name string, v int64) {
		if v < 0 {
			errs = append(errs, fmt.Errorf("%s must not be negative (got %d)", name, v))
		}
	}
	pos("MaxConnections", int64(c.MaxConnections))
	if c.IPLimitIPv6Prefix < 1 || c.IPLimitIPv6Prefix > 128 {
		errs = append(errs, fmt.Errorf("IPLimitIPv6Prefix must be 1 to 128 (got %d)", c.IPLimitIPv6Prefix))
	}
	pos("ConnectBurst", int64(c.ConnectBurst))
	pos("ConnectQueueWait", int64(c.ConnectQueueWait))
	for i, p := range c.TrustedProxies {
		if !p.IsValid() {
			errs = append(errs, fmt.Errorf("TrustedProxies[%d]: not a valid prefix", i))
		}
	}
	pos("MaxSubscriptions", int64(c.MaxSubscriptions))
	pos("MaxSnapshot", int64(c.MaxSnapshot))
	pos("MaxViewDocumentsPerConnection", int64(c.MaxViewDocumentsPerConnection))
	pos("MaxViewDocuments", int64(c.MaxViewDocuments))
	pos("MaxFilterCost", int64(c.MaxFilterCost))
	pos("MaxFilterCostPerEvent", int64(c.MaxFilterCostPerEvent))
	pos("FilterCostRate", int64(c.FilterCostRate))
	pos("FilterCompileRate", int64(c.FilterCompileRate))
	pos("MailboxMessages", int64(c.MailboxMessages))
	pos("MailboxBytes", int64(c.MailboxBytes))
	pos("ReadLimit", c.ReadLimit)
	pos("MaxFrameBytes", int64(c.MaxFrameBytes))
	pos("HandshakeTimeout", int64(c.HandshakeTimeout))
	pos("MaxHandshakes", int64(c.MaxHandshakes))
	pos("PingInterval", int64(c.PingInterval))
	pos("PingTimeout", int64(c.PingTimeout))
	pos("CloseTimeout", int64(c.CloseTimeout))
	pos("MaxClientErrors", int64(c.MaxClientErrors))
	pos("MaxPublishBytes", c.MaxPublishBytes)
	if max, what := c.maxPublishable(); c.MailboxBytes > 0 && int64(c.MailboxBytes) < max {
		errs = append(errs, fmt.Errorf("MailboxBytes (--mailbox-bytes) of %d is under the %d bytes a publish may carry (%s): no subscriber could receive such an event; raise --mailbox-bytes or lower --max-publish-bytes", c.MailboxBytes, max, what))
	}
	for i, k := range c.APIKeys {
		if k.Key == "" {
			errs = append(errs, fmt.Errorf("APIKeys[%d] (%q): empty key", i, k.Name))
		}
		for _, p := range k.Publish {
			if err := subject.ValidatePattern(p); err != nil {
				errs = append(errs, fmt.Errorf("APIKeys[%d] (%q): %w", i, k.Name, err))
			}
		}
	}
	for _, p := range c.ReservedSubjects {
		if err := subject.ValidatePattern(p); err != nil {
			errs = append(errs, fmt.Errorf("ReservedSubjects: %w", err))
		}
	}
	errs = append(errs, validateAllowSystem(c.AllowSystemSubjects)...)
	if n := utf8.RuneCountInString(c.AdminKey); c.AdminKey != "" && n < MinAdminKeyLen {
		errs = append(errs, fmt.Errorf("AdminKey has %d characters, want at least %d", n, MinAdminKeyLen))
	}
	if c.AdminApart && c.AdminKey == "" {
		errs = append(errs, errors.New("AdminApart needs AdminKey: there is no inspector to serve apart"))
	}
	if c.PublishTokens && c.Authenticate == nil {
		errs = append(errs, errors.New("PublishTokens needs Authenticate (a token verifier such as JWTAuth.Grant)"))
	}
	pos("GraphQLInitTimeout", int64(c.GraphQLInitTimeout))
	pos("GraphQLMaxBodyBytes", c.GraphQLMaxBodyBytes)
	return errors.Join(errs...)
}

// maxPublishable is the largest data a publish through the gateway may
// carry, MaxPublishBytes or the broker's message limit when smaller, and
// which of them it is.
func (c *Config) maxPublishable() (int64, string) {
	max, what := c.MaxPublishBytes, "MaxPublishBytes, --max-publish-bytes"
	if l, ok := c.Broker.(broker.Limited); ok && l.MaxMessage() > 0 && int64(l.MaxMessage()) < max {
		max, what = int64(l.MaxMessage()), "the broker's message limit, under --max-publish-bytes"
	}
	return max, what
}

// ParseTrustedProxies parses addresses and CIDR prefixes ("10.0.0.0/8",
// "192.0.2.7", "2001:db8::/32") for Config.TrustedProxies.
func ParseTrustedProxies(list []string) ([]netip.Prefix, error) {
	return admission.ParseTrustedProxies(list)
}
