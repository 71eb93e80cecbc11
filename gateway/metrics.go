package gateway

import (
	"github.com/fanwire/fanwire/gateway/internal/fanout"
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the ws role's Prometheus metrics. They are created per Server
// and registered on the registry given in Config, so tests and several
// servers in one process don't collide. Hot paths update them once per batch
// or per frame, never per delivery.
type Metrics struct {
	Connections         prometheus.Gauge
	ReadersParked       prometheus.Gauge
	ConnectionsAccepted prometheus.Counter
	ConnectionsRejected *prometheus.CounterVec // reason: max_connections, max_connections_per_ip, connect_rate, shutting_down, bad_upgrade, bad_subprotocol, unauthorized, handshake_timeout, max_handshakes
	ConnectQueue        prometheus.Gauge       // upgrade requests waiting for admission (MaxConnectRate)
	ConnectWait         prometheus.Histogram   // admitted upgrades' wait for admission
	Disconnects         *prometheus.CounterVec // reason: client, slow_consumer, policy, shutdown, ping_timeout, write_error, read_limit, token_expired, invalid_utf8, admin (closed through the inspector); GraphQL: init_timeout (4408), unauthorized (4403), protocol_error (4400, 4401, 4409, 4429)
	Subscriptions       prometheus.Gauge
	SlowConsumers       prometheus.Counter     // mailbox overflows found (each connection is then closed with 4008)
	ClientErrors        *prometheus.CounterVec // code: the protocol error code

	EventsReceived  prometheus.Counter
	EventsInvalid   prometheus.Counter
	EventsDropped   *prometheus.CounterVec // reason: broker_slow_consumer (Core NATS), removed_before_read (JetStream: retention removed events before this node read them), too_large (over MailboxBytes: delivered to no one; counted again by each replay or per-connection consumer that meets it), system_subject (a $… or _INBOX subject no AllowSystemSubjects pattern opens, see system.go)
	Deliveries      prometheus.Counter
	Frames          prometheus.Counter
	BytesSent       prometheus.Counter
	DispatchLatency prometheus.Histogram
	CommitLag       prometheus.Histogram // an ingest event's commit → its dispatch (commitlag.go)
	DispatchPaced   prometheus.Counter
	WriterHandoffs  prometheus.Counter // a shared flusher handed a connection to a writer goroutine of its own (conn_flush.go)

	PublishRequests *prometheus.CounterVec // result: ok, unauthorized, broker_error, or a refusal's code (bad_request, bad_subject, forbidden, forbidden_origin, too_large, body_timeout)
	PublishedEvents prometheus.Counter

	GraphQLRefused *prometheus.CounterVec // limit: body, bytes, tokens, depth, aliases, complexity, publishes (graphql_limits.go)

	FilterEvaluations prometheus.Counter // live views: distinct filters evaluated by the dispatcher (once per event per filter)
	FilterErrors      prometheus.Counter // of those, evaluations that were errors: rejections a filter may not mean
	FilterCost        prometheus.Counter // cost units those evaluations spent (package filter prices them)
	FilterCompiles    prometheus.Counter // distinct filter texts compiled (filter.Cache misses)

	AdminRefused prometheus.Counter // inspector requests refused for a missing or wrong admin key (admin.go)
}

// dispatch is the hub's share of m.
func (m *Metrics) dispatch() *fanout.DispatchMetrics {
	return &fanout.DispatchMetrics{
		Deliveries: m.Deliveries, DispatchLatency: m.DispatchLatency, DispatchPaced: m.DispatchPaced,
		FilterEvaluations: m.FilterEvaluations, FilterErrors: m.FilterErrors, FilterCost: m.FilterCost,
	}
}

func newMetrics(reg prometheus.Registerer, brokerUp func() bool) *Metrics {
	m := &Metrics{
		Connections:         prometheus.NewGauge(prometheus.GaugeOpts{Name: "fanwire_connections", Help: "Open WebSocket connections."}),
		ReadersParked:       prometheus.NewGauge(prometheus.GaugeOpts{Name: "fanwire_connections_parked", Help: "Open connections whose reader is parked: their client has sent nothing since its last message was handled, and they hold no goroutine until it does (plain TCP; TLS connections keep theirs)."}),
		ConnectionsAccepted: prometheus.NewCounter(prometheus.CounterOpts{Name: "fanwire_connections_accepted_total", Help: "WebSocket connections accepted."}),
		ConnectionsRejected: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fanwire_connections_rejected_total", Help: "Upgrade requests refused, by reason."}, []string{"reason"}),
		ConnectQueue:        prometheus.NewGauge(prometheus.GaugeOpts{Name: "fanwire_connect_queue", Help: "Upgrade requests waiting for admission under --max-connect-rate (at most --connect-queue)."}),
		ConnectWait:         prometheus.NewHistogram(prometheus.HistogramOpts{Name: "fanwire_connect_wait_seconds", Help: "How long admitted upgrade requests waited for admission under --max-connect-rate (0 when a token was free).", Buckets: []float64{0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30}}),
		Disconnects:         prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fanwire_disconnects_total", Help: "Connections ended, by reason (slow_consumer counts 4008 closes)."}, []string{"reason"}),
		SlowConsumers:       prometheus.NewCounter(prometheus.CounterOpts{Name: "fanwire_slow_consumers_total", Help: "Connections whose mailbox overflowed; each is closed with 4008 (counted in fanwire_disconnects_total once the close completes)."}),
		Subscriptions:       prometheus.NewGauge(prometheus.GaugeOpts{Name: "fanwire_subscriptions", Help: "Active client subscriptions."}),
		ClientErrors:        prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fanwire_client_errors_total", Help: "Protocol errors sent to clients, by code."}, []string{"code"}),

		EventsReceived:  prometheus.NewCounter(prometheus.CounterOpts{Name: "fanwire_events_received_total", Help: "Broker messages received for fan-out."}),
		EventsInvalid:   prometheus.NewCounter(prometheus.CounterOpts{Name: "fanwire_events_invalid_total", Help: "Broker messages skipped because their data is not JSON."}),
		EventsDropped:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fanwire_events_dropped_total", Help: "Broker messages lost before dispatch, by reason."}, []string{"reason"}),
		Deliveries:      prometheus.NewCounter(prometheus.CounterOpts{Name: "fanwire_deliveries_total", Help: "Events queued to connections (one per event per matching connection)."}),
		Frames:          prometheus.NewCounter(prometheus.CounterOpts{Name: "fanwire_frames_total", Help: "WebSocket text frames written."}),
		BytesSent:       prometheus.NewCounter(prometheus.CounterOpts{Name: "fanwire_bytes_sent_total", Help: "Payload bytes written in frames."}),
		DispatchPaced:   prometheus.NewCounter(prometheus.CounterOpts{Name: "fanwire_dispatch_paced_seconds_total", Help: "Time the dispatcher waited because most clients' mailboxes were over half full (node saturated)."}),
		WriterHandoffs:  prometheus.NewCounter(prometheus.CounterOpts{Name: "fanwire_writer_handoffs_total", Help: "Times a shared flusher handed a connection to a writer goroutine of its own: its socket would have blocked (a client reading slower than it is sent to), the library was writing a control frame, or a close was due."}),
		CommitLag:       prometheus.NewHistogram(prometheus.HistogramOpts{Name: "fanwire_commit_to_dispatch_seconds", Help: "From an ingest event's commit in PostgreSQL (its commit_time) until this node dispatched it to its connections' queues: what a user waits for a change, but for the last hop. Measured on events on --reserved-subjects; the database host's and this node's clocks must agree.", Buckets: []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300}}),
		DispatchLatency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "fanwire_dispatch_latency_seconds", Help: "From a batch's arrival from the broker until all its deliveries are queued.", Buckets: prometheus.ExponentialBuckets(1e-6, 4, 12)}),

		PublishRequests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fanwire_publish_requests_total", Help: "POST /api/publish requests, by result."}, []string{"result"}),
		PublishedEvents: prometheus.NewCounter(prometheus.CounterOpts{Name: "fanwire_published_events_total", Help: "Events published through the gateway: POST /api/publish, client publish messages and the GraphQL publish mutation."}),

		FilterEvaluations: prometheus.NewCounter(prometheus.CounterOpts{Name: "fanwire_filter_evaluations_total", Help: "Filter evaluations by the dispatcher (where and row filters; once per event per distinct filter)."}),
		FilterErrors:      prometheus.NewCounter(prometheus.CounterOpts{Name: "fanwire_filter_errors_total", Help: "Filter evaluations that were errors (a missing field, a type mismatch such as a numeric column's string against a number, the cost limit): each is a rejection."}),
		FilterCost:        prometheus.NewCounter(prometheus.CounterOpts{Name: "fanwire_filter_cost_units_total", Help: "CEL cost units the dispatcher's filter evaluations spent (about 15-100 ns each on a 2-core machine; a regex is priced by its input times its program): its rate is the CPU filters take from delivery."}),
		FilterCompiles:    prometheus.NewCounter(prometheus.CounterOpts{Name: "fanwire_filter_compiles_total", Help: "Distinct filter texts compiled (a where or a row filter the node did not hold already)."}),

		AdminRefused: prometheus.NewCounter(prometheus.CounterOpts{Name: "fanwire_admin_refused_total", Help: "Requests to the admin API (the inspector, --admin-key) refused for a missing or wrong key."}),

		GraphQLRefused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fanwire_graphql_refused_total", Help: "GraphQL requests and operations (HTTP and WebSocket) refused by a limit: the body, a query limit (before validation), the publishes of one HTTP request."}, []string{"limit"}),
	}
	// Every reason of the counters by reason is exported from the start, at
	// 0: a dashboard's rate or an alert's increase then has a series to
	// read before the first drop or refusal, and tells "none" from "not
	// scraped".
	for _, r := range []string{"broker_slow_consumer", "removed_before_read", dropTooLarge, dropSystemSubject} {
		m.EventsDropped.WithLabelValues(r)
	}
	for _, r := range []string{CodeMaxConnections, CodeMaxConnectionsPerIP, CodeConnectRate, CodeShuttingDown, "bad_upgrade", "bad_subprotocol", "unauthorized", "handshake_timeout", "max_handshakes"} {
		m.ConnectionsRejected.WithLabelValues(r)
	}
	for _, r := range []string{"client", "slow_consumer", "policy", "shutdown", "ping_timeout", "write_error", "read_limit", "invalid_utf8", "token_expired", "admin", "init_timeout", "unauthorized", "protocol_error"} {
		m.Disconnects.WithLabelValues(r)
	}
	for _, code := range clientErrorCodes {
		m.ClientErrors.WithLabelValues(code)
	}
	if reg != nil {
		reg.MustRegister(m.Connections, m.ReadersParked, m.ConnectionsAccepted, m.ConnectionsRejected, m.ConnectQueue, m.ConnectWait, m.Disconnects, m.Subscriptions, m.SlowConsumers,
			m.ClientErrors, m.EventsReceived, m.EventsInvalid, m.EventsDropped, m.Deliveries, m.Frames, m.BytesSent,
			m.DispatchLatency, m.CommitLag, m.DispatchPaced, m.WriterHandoffs, m.PublishRequests, m.PublishedEvents, m.GraphQLRefused, m.FilterEvaluations, m.FilterErrors, m.FilterCost, m.FilterCompiles, m.AdminRefused,
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "fanwire_broker_up", Help: "1 while the broker connection is up."}, func() float64 {
				if brokerUp() {
					return 1
				}
				return 0
			}))
	}
	return m
}
