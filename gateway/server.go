package gateway

import (
	"context"
	"embed"
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fanwire/fanwire/gateway/internal/admission"
	"github.com/fanwire/fanwire/gateway/internal/fanout"
	"github.com/fanwire/fanwire/gateway/internal/filter"
	"github.com/fanwire/fanwire/gateway/internal/flush"
	"github.com/fanwire/fanwire/gateway/internal/idlepark"
	"github.com/fanwire/fanwire/gateway/internal/presence"

	"github.com/99designs/gqlgen/graphql/executor"
	"github.com/fanwire/fanwire/broker"
	"github.com/fanwire/fanwire/subject"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
)

//go:embed console
var consoleFS embed.FS

// Server is the ws role: it consumes the broker, fans events out to
// WebSocket clients and serves the HTTP API. See doc.go for its lifecycle.
type Server struct {
	cfg          Config             // static after New
	durable      broker.Durable     // static: the broker, if it keeps history (nil for Core NATS)
	snapshots    broker.Snapshots   // static: the broker, if it reads each subject's newest message (from: "latest")
	exprs        *filter.Cache      // static: compiled filters
	filters      *filter.Set        // static: the filters subscriptions hold, one per distinct filter
	consumers    broker.Consumers   // static: the broker, if it keeps per-subscription consumers (JetStream)
	replayEvents *eventCache        // events shared by replays and feeds; nil without history
	hub          *fanout.Hub        // static
	flush        *flush.Pool        // static: the shared flushers (package internal/flush)
	pres         *presence.Presence // static: presence (package internal/presence)
	metrics      *Metrics           // static
	log          *zap.Logger
	mux          *http.ServeMux

	gqlExec         *executor.Executor // static: runs GraphQL operations received over WebSocket
	gqlHTTP         http.Handler       // static: GraphQL over HTTP
	gqlExecutorOnly bool               // static: tests: serve every subscription through the executor
	readyLimits     []byte             // static: the "limits" member of every native "ready"

	ctx    context.Context // cancelled by Shutdown when its deadline passes
	cancel context.CancelFunc

	idle       *idlepark.Poller // parked readers (package internal/idlepark)
	nconns     atomic.Int64
	perIP      admission.IPCounts
	handshakes handshakes
	admit      *admission.Admission     // static: the connect rate and its queue
	admin      *adminAuth               // static: nil without Config.AdminKey (admin.go)
	adminMux   *http.ServeMux           // static: the inspector's own handler; nil unless Config.AdminApart (admin_listener.go)
	proxies    admission.TrustedProxies // static: Config.TrustedProxies
	consuming  atomic.Bool

	mu       sync.Mutex
	conns    map[*conn]struct{} // guarded by mu
	draining bool               // guarded by mu
	durables map[string]bool    // guarded by mu: durables bound on this node, by their name on the broker
	wg       sync.WaitGroup     // one per connection being served

	// owned by the Run goroutine
	events       []*fanout.Event
	invalidLogs  rateLimiter
	tooLargeLogs rateLimiter
}

// New validates cfg and builds a Server. It starts nothing: call Run to
// consume the broker and serve Handler over HTTP.
func New(cfg Config) (*Server, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("gateway config: %w", err)
	}
	m := newMetrics(cfg.Registry, cfg.Broker.Ready)
	s := &Server{
		cfg:     cfg,
		flush:   flush.New(runtime.GOMAXPROCS(0)),
		metrics: m,
		log:     cfg.Logger,
		conns:   make(map[*conn]struct{}),
	}
	s.durables = make(map[string]bool)
	s.readyLimits = readyLimits(&s.cfg)
	s.consumers, _ = cfg.Broker.(broker.Consumers)
	s.durable, _ = cfg.Broker.(broker.Durable)
	s.snapshots, _ = cfg.Broker.(broker.Snapshots)
	s.hub = fanout.NewHub(fanout.HubConfig{
		Metrics:     m.dispatch(),
		MaxPace:     cfg.MaxPace,
		Wakes:       s.flush,
		KeepRecent:  s.durable != nil,
		MaxConnCost: uint64(cfg.MaxFilterCostPerEvent),
		HeldPerConn: int64(cfg.MaxViewDocumentsPerConnection),
		HeldPerNode: int64(cfg.MaxViewDocuments),
		Clock:       cfg.filterClock,
	})
	s.exprs = filter.NewCache(uint64(cfg.MaxFilterCost), m.FilterCompiles.Inc)
	s.filters = filter.NewSet()
	bus, _ := cfg.Broker.(broker.Bus)
	s.pres = presence.New(presence.Config{
		Bus: bus, Registry: cfg.Registry, Log: s.log,
		MaxMembers: cfg.MaxPresenceMembers, ListLimit: cfg.PresenceListLimit,
		Heartbeat: cfg.PresenceHeartbeat, Interval: cfg.PresenceInterval, Timeout: cfg.PresenceTimeout,
		PieceBytes: s.pageBytes(), MailboxBytes: cfg.MailboxBytes,
		Parts: func(count int, changes []presence.Change) any { return newPresParts(count, changes) },
	})
	if cfg.Registry != nil {
		cfg.Registry.MustRegister(
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "fanwire_views", Help: "Filtered subscriptions (a where or a row filter) live in the dispatcher's view index."}, func() float64 { return float64(s.hub.Views()) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "fanwire_view_documents", Help: "Documents those subscriptions hold (each costs a set entry: see docs/benchmarks.md, \"Live views\")."}, func() float64 { return float64(s.hub.Held()) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "fanwire_filters", Help: "Distinct filters the node's subscriptions hold (equal filters are one, evaluated once per event)."}, func() float64 { return float64(s.filters.Len()) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "fanwire_filter_programs_bytes", Help: "Estimated memory of the compiled filter expressions alive: those subscriptions hold, and the recently used ones kept for reuse (at most 8 MiB of those)."}, func() float64 { return float64(s.exprs.Live()) }))
	}
	if s.durable != nil {
		s.replayEvents = new(eventCache)
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.invalidLogs = rateLimiter{every: 10 * time.Second}
	s.tooLargeLogs = rateLimiter{every: 10 * time.Second}
	s.idle = idlepark.New(m.ReadersParked.Add)
	s.admit = admission.New(admission.Config{Rate: cfg.MaxConnectRate, Burst: cfg.ConnectBurst, Queue: cfg.ConnectQueue,
		QueueWait: cfg.ConnectQueueWait, Queued: m.ConnectQueue, Waited: m.ConnectWait})
	s.proxies = admission.TrustedProxies(cfg.TrustedProxies)
	s.handshakes = handshakes{timeout: cfg.HandshakeTimeout, max: cfg.MaxHandshakes, rejected: func(reason string) {
		m.ConnectionsRejected.WithLabelValues(reason).Inc()
	}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /ws", s.serveWS)
	s.gqlHTTP = s.newGraphQL()
	mux.HandleFunc("GET /graphql", s.serveGraphQL)
	mux.HandleFunc("POST /graphql", s.serveGraphQL)
	mux.HandleFunc("OPTIONS /graphql", s.serveGraphQL)
	mux.HandleFunc("POST /api/publish", s.servePublish)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", s.serveReady)
	if !cfg.MetricsApart {
		mux.Handle("GET /metrics", promhttp.HandlerFor(cfg.Registry, promhttp.HandlerOpts{Registry: cfg.Registry}))
	}
	mux.HandleFunc("GET /fanwire.js", clientFileHandler(clientJS, "text/javascript; charset=utf-8"))
	mux.HandleFunc("GET /fanwire.d.ts", clientFileHandler(clientDTS, "application/typescript; charset=utf-8"))
	s.routeAdmin(mux)
	if cfg.Console {
		sub, _ := fs.Sub(consoleFS, "console")
		mux.Handle("GET /", http.FileServerFS(sub))
	}
	s.mux = mux
	return s, nil
}

// dropTooLarge is the fanwire_events_dropped_total reason of an event over
// MailboxBytes, which no mailbox could hold.
const dropTooLarge = "too_large"

// dropSystemSubject is the fanwire_events_dropped_total reason of a
// broker message on a system subject no --allow-system-subjects pattern
// opens (system.go).
const dropSystemSubject = "system_subject"

// CountDropped counts n events lost before dispatch (e.g. the broker
// client's buffer overflowed); brokers report through this.
func (s *Server) CountDropped(reason string, n int) {
	s.metrics.EventsDropped.WithLabelValues(reason).Add(float64(n))
}

// Handler returns the HTTP handler serving every endpoint. Serve it with
// HTTPServer, which bounds the handshake.
func (s *Server) Handler() http.Handler { return s.mux }

// Metrics returns the server's metrics (for tests).
func (s *Server) Metrics() *Metrics { return s.metrics }

// Run consumes the broker and dispatches until ctx is done or the broker
// fails; it returns nil on a clean stop. Run one at a time.
func (s *Server) Run(ctx context.Context) error {
	defer s.consuming.Store(false)
	// Presence runs beside the consumer and stops with it (after its bye).
	pctx, stop := context.WithCancel(ctx)
	presDone := make(chan struct{})
	go func() {
		defer close(presDone)
		s.pres.Run(pctx)
	}()
	defer func() {
		stop()
		<-presDone
	}()
	err := s.cfg.Broker.Consume(ctx, s.dispatch, func(start string) {
		s.hub.SetStart(start)
		s.consuming.Store(true)
	})
	if ctx.Err() != nil {
		return nil
	}
	return fmt.Errorf("consume: %w", err)
}

// dispatch is the broker handler: it validates each message once, builds the
// shared event and hands the batch to the hub.
func (s *Server) dispatch(batch []broker.Message, arrived time.Time) {
	evs := s.events[:0]
	system := 0
	for _, m := range batch {
		if subject.IsSystem(m.Subject) && !s.systemAllowed(m.Subject) {
			// The NATS server's API traffic and replies that a Core NATS
			// subscription to > receives: no subscription may match them
			// (system.go).
			system++
			continue
		}
		ev, err := s.newEvent(m)
		if err != nil {
			s.metrics.EventsInvalid.Inc()
			if s.invalidLogs.allow() {
				s.log.Warn("skipping broker message that is not JSON (logged at most every 10s)",
					zap.String("subject", m.Subject), zap.Int("bytes", len(m.Data)), zap.Int64("skipped_since_last_log", s.invalidLogs.suppressed()))
			}
			continue
		}
		if len(ev.Bytes()) > s.cfg.MailboxBytes {
			// It would overflow every subscriber's mailbox (4008), and
			// again on each resume: it is delivered to no one.
			s.metrics.EventsDropped.WithLabelValues(dropTooLarge).Inc()
			if s.tooLargeLogs.allow() {
				s.log.Warn("skipping broker message larger than a connection's queue (--mailbox-bytes; logged at most every 10s)",
					zap.String("subject", m.Subject), zap.Int("bytes", len(ev.Bytes())), zap.Int("mailbox_bytes", s.cfg.MailboxBytes), zap.Int64("skipped_since_last_log", s.tooLargeLogs.suppressed()))
			}
			continue
		}
		evs = append(evs, ev)
	}
	s.metrics.EventsReceived.Add(float64(len(batch)))
	if system > 0 {
		s.metrics.EventsDropped.WithLabelValues(dropSystemSubject).Add(float64(system))
	}
	last := ""
	if len(batch) > 0 {
		last = batch[len(batch)-1].Cursor
	}
	s.observeCommitLag(evs) // before: a client that has an event finds it counted
	s.hub.Dispatch(evs, last, arrived)
	clear(evs)
	s.events = evs
}

// checkPattern validates a client pattern and that it can ever match an
// event of the node's subject space.
func (s *Server) checkPattern(p string) error {
	if err := subject.ValidatePattern(p); err != nil {
		return err
	}
	return s.inSubjectSpace(p)
}

// inSubjectSpace reports an error unless the valid pattern (or subject) p
// intersects the node's subject space.
func (s *Server) inSubjectSpace(p string) error {
	for _, space := range s.cfg.Subjects {
		if subject.Overlap(p, space) {
			return nil
		}
	}
	return fmt.Errorf("%w: %q is outside this gateway's subject space %s", ErrBadPattern, p, strings.Join(s.cfg.Subjects, ","))
}

// replayFilters returns the broker filters that cover pattern: the pattern
// itself when a subject-space pattern contains it, else the space patterns
// it intersects (replayed events are then matched against the pattern).
func (s *Server) replayFilters(pattern string) []string {
	for _, sp := range s.cfg.Subjects {
		if subject.Contains(sp, pattern) {
			return []string{pattern}
		}
	}
	var f []string
	for _, sp := range s.cfg.Subjects {
		if subject.Overlap(sp, pattern) {
			f = append(f, sp)
		}
	}
	return f
}

func (s *Server) serveReady(w http.ResponseWriter, r *http.Request) {
	if why := s.notReady(); len(why) > 0 {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": "not ready", "reasons": why})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}

// notReady lists why the gateway is not ready; empty when it is.
func (s *Server) notReady() []string {
	s.mu.Lock()
	draining := s.draining
	s.mu.Unlock()
	var why []string
	if draining {
		why = append(why, "draining")
	}
	if !s.cfg.Broker.Ready() {
		why = append(why, "broker disconnected")
	}
	if !s.consuming.Load() {
		why = append(why, "not consuming")
	}
	// Near the connection cap a load balancer should steer new clients to
	// other nodes before this one starts refusing them.
	if n := s.nconns.Load(); 10*n >= 9*int64(s.cfg.MaxConnections) {
		why = append(why, fmt.Sprintf("%d connections: at 90%% of --max-connections", n))
	}
	return why
}

// Shutdown drains the server: new upgrades are refused, every connection
// gets what is queued for it and then a 1001 close (so clients reconnect
// elsewhere), and Shutdown waits until every connection has ended. When ctx
// expires first, remaining sockets are cut. Stop Run (cancel its context)
// after Shutdown so no event is lost for connections still draining.
func (s *Server) Shutdown(ctx context.Context) error {
	// Presence first: this node's members stay on the other nodes for
	// their clients to resume there, instead of leaving as each
	// connection closes.
	s.pres.Drain()
	s.admit.Close()
	s.mu.Lock()
	s.draining = true
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		c.requestClose(CloseGoingAway)
	}
	done := make(chan struct{})
	go func() { // owned here: ends when the last connection does, which the cancel below forces
		s.wg.Wait()
		close(done)
	}()
	defer s.flush.Stop() // once every connection has ended
	select {
	case <-done:
		s.cancel()
		s.idle.Stop()
		return nil
	case <-ctx.Done():
		s.cancel()
		s.mu.Lock()
		for c := range s.conns {
			_ = c.ws.CloseNow()
			c.wakeReader()
		}
		s.mu.Unlock()
		<-done
		s.idle.Stop()
		return fmt.Errorf("gateway shutdown: %w", ctx.Err())
	}
}

type apiError struct {
	Error   string `json:"error"`
	Code    string `json:"code,omitempty"`
	Field   string `json:"field,omitempty"`
	Index   *int   `json:"index,omitempty"`
	Subject string `json:"subject,omitempty"` // a refused publish: the subject
	Rule    string `json:"rule,omitempty"`    // a refused publish: the rule that refused it (publishauth.go)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// rateLimiter lets one log line through per period and counts the rest.
// Owned by one goroutine.
type rateLimiter struct {
	every time.Duration
	last  time.Time
	n     int64
}

func (r *rateLimiter) allow() bool {
	if now := time.Now(); now.Sub(r.last) >= r.every {
		r.last = now
		return true
	}
	r.n++
	return false
}

func (r *rateLimiter) suppressed() int64 {
	n := r.n
	r.n = 0
	return n
}
