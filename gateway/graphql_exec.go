package gateway

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/99designs/gqlgen/graphql"
	"github.com/99designs/gqlgen/graphql/executor"
	"github.com/99designs/gqlgen/graphql/handler"
	"github.com/99designs/gqlgen/graphql/handler/extension"
	"github.com/99designs/gqlgen/graphql/handler/transport"
	"github.com/fanwire/fanwire/gateway/auth"
	"github.com/fanwire/fanwire/schema"
	"github.com/fanwire/fanwire/subject"
	"github.com/vektah/gqlparser/v2/gqlerror"
)

// gqlgen's side: the resolvers' backend (health, subscribable, events,
// publish), the executor for WebSocket operations and the HTTP handler for
// queries and mutations over HTTP.

// eventStreamKey carries an executor-path subscription's channel to the
// events resolver.
type eventStreamKey struct{}

func withEventStream(ctx context.Context, ch chan *schema.Event) context.Context {
	return context.WithValue(ctx, eventStreamKey{}, ch)
}

// gqlBackend answers the schema's resolvers.
type gqlBackend struct{ s *Server }

func (b gqlBackend) Health(ctx context.Context) *schema.Health {
	why := b.s.notReady()
	return &schema.Health{Status: "ok", Ready: len(why) == 0, Reasons: why, Connections: int(b.s.nconns.Load())}
}

func (b gqlBackend) Subscribable(ctx context.Context) *schema.Subscribable {
	return &schema.Subscribable{
		Patterns:         b.s.cfg.Subjects,
		Broker:           b.s.cfg.Broker.Name(),
		History:          b.s.durable != nil,
		MaxSubjectBytes:  subject.MaxLen,
		MaxSubscriptions: b.s.cfg.MaxSubscriptions,
	}
}

func (b gqlBackend) Events(ctx context.Context, subject string, from, durable, where *string) (<-chan *schema.Event, error) {
	if ch, ok := ctx.Value(eventStreamKey{}).(chan *schema.Event); ok {
		return ch, nil
	}
	return nil, errors.New("events is a subscription: subscribe over WebSocket at /graphql (graphql-transport-ws)")
}

// gqlConnKey carries the WebSocket operation a resolver runs for (a
// *gqlConnOp); gqlRequestKey the HTTP request of one over HTTP (a
// *gqlHTTPRequest).
type (
	gqlConnKey    struct{}
	gqlRequestKey struct{}
)

// gqlConnOp is a WebSocket operation run on the connection's reader,
// which waits for it. A query's fields may run concurrently (gqlgen
// resolves a query's root fields in goroutines): what they share of the
// connection's reader state (its message rate, its client errors) is
// taken under mu.
type gqlConnOp struct {
	c *conn

	mu     sync.Mutex
	fields int // guarded by mu: the rate-counted fields so far (publish, members)
}

// overRate counts one more rate-counted field of the operation: every one
// after its first counts against MaxMessageRate like a message of its
// own, so one message with 1,000 aliased fields is limited as 1,000
// messages would be. It returns the refusal when over.
func (op *gqlConnOp) overRate(s *Server) *presenceRefused {
	op.mu.Lock()
	defer op.mu.Unlock()
	if op.fields++; op.fields > 1 && !op.c.rate.allow(time.Now(), s.cfg.MaxMessageRate) {
		return &presenceRefused{CodeRateLimited, "over " + strconv.Itoa(s.cfg.MaxMessageRate) + " messages per second (--max-message-rate; each publish or members field counts as one): this field was dropped"}
	}
	return nil
}

// refused counts r (nil: none) as a client error of the connection and
// returns it as the field's error.
func (op *gqlConnOp) refused(r *presenceRefused, subject string) error {
	if r == nil {
		return nil
	}
	op.mu.Lock()
	op.c.countClientError(r.code)
	op.mu.Unlock()
	return r.gqlError(subject)
}

// gqlHTTPRequest is a GraphQL request over HTTP: its publisher is found
// once per request, as POST /api/publish does, however many publish
// fields it carries.
type gqlHTTPRequest struct {
	r    *http.Request
	once sync.Once
	pub  publisher
	aerr *apiError

	grantsOnce sync.Once
	g          *auth.Grants
	gerr       error
}

// grants are the request's grants (members): Config.Authenticate with the
// request and no payload, as the native protocol's upgrade; nil (every
// subject) without authentication.
func (q *gqlHTTPRequest) grants(s *Server) (*auth.Grants, error) {
	q.grantsOnce.Do(func() {
		if auth := s.cfg.Authenticate; auth != nil {
			q.g, q.gerr = auth(q.r.Context(), q.r, nil)
		}
	})
	return q.g, q.gerr
}

func (q *gqlHTTPRequest) publisher(s *Server) (publisher, *apiError) {
	q.once.Do(func() { q.pub, _, q.aerr = s.httpPublisher(q.r) })
	return q.pub, q.aerr
}

// Publish is the publish mutation: with the connection's grants over
// WebSocket, with the request's credential over HTTP (as POST
// /api/publish, origin check included). Refusals are GraphQL errors with
// extensions code, rule and subject, counted like the transport's others:
// as client errors over WebSocket (fanwire_client_errors_total, and
// towards MaxClientErrors), fanwire_publish_requests_total over HTTP.
// Over WebSocket every publish of an operation after its first counts
// against MaxMessageRate like a message of its own: one message with 1,000
// aliased publishes is limited as 1,000 publish messages would be. Over
// HTTP, a request carries at most maxPublishBatch of them (see
// gqlLimits.MutateOperationContext).
func (b gqlBackend) Publish(ctx context.Context, subject string, data schema.JSON) (*schema.Published, error) {
	s := b.s
	var pub publisher
	allowed := true
	var count func(result string)
	switch {
	case ctx.Value(gqlConnKey{}) != nil:
		op := ctx.Value(gqlConnKey{}).(*gqlConnOp)
		c := op.c
		count = c.countClientError // a mutation's fields run one at a time
		if r := op.overRate(s); r != nil {
			return nil, op.refused(r, subject)
		}
		pub, allowed = s.grantsPublisher(c.grants)
	case ctx.Value(gqlRequestKey{}) != nil:
		q := ctx.Value(gqlRequestKey{}).(*gqlHTTPRequest)
		count = func(result string) { s.metrics.PublishRequests.WithLabelValues(result).Inc() }
		if origin := q.r.Header.Get("Origin"); origin != "" && !s.originAllowed(origin, q.r.Host) {
			count("forbidden_origin")
			return nil, &gqlerror.Error{Message: "origin " + origin + " is not allowed (see --allowed-origins)", Extensions: map[string]any{"code": "forbidden_origin"}}
		}
		var aerr *apiError
		if pub, aerr = q.publisher(s); aerr != nil {
			count(aerr.Code)
			return nil, &gqlerror.Error{Message: aerr.Error, Extensions: map[string]any{"code": aerr.Code}}
		}
	default:
		return nil, errors.New("publish: no connection or request to publish for")
	}
	cursor, ref := s.clientPublish(ctx, pub, allowed, subject, data)
	if ref != nil {
		count(ref.code)
		ext := map[string]any{"code": ref.code, "subject": subject}
		if ref.rule != "" {
			ext["rule"] = ref.rule
		}
		return nil, &gqlerror.Error{Message: ref.msg, Extensions: ext}
	}
	if ctx.Value(gqlConnKey{}) == nil {
		count("ok")
	}
	p := &schema.Published{Subject: subject}
	if cursor != "" {
		p.Cursor = &cursor
	}
	return p, nil
}

// newGraphQL builds the executor for WebSocket operations and the handler
// for queries over HTTP (POST, and GET for queries).
func (s *Server) newGraphQL() http.Handler {
	es := schema.NewExecutableSchema(schema.Config{Resolvers: &schema.Resolver{Backend: gqlBackend{s}}})
	limits := newGQLLimits(s) // one check for HTTP and WebSocket alike
	s.gqlExec = executor.New(es)
	s.gqlExec.Use(extension.Introspection{})
	s.gqlExec.Use(limits)
	h := handler.New(es)
	h.AddTransport(transport.Options{})
	h.AddTransport(transport.GET{})
	h.AddTransport(transport.POST{})
	h.Use(extension.Introspection{})
	h.Use(limits)
	return h
}

// serveGraphQL serves /graphql: WebSocket upgrades (subscriptions and
// queries) here, everything else to gqlgen's HTTP transports.
func (s *Server) serveGraphQL(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet && isWebSocketUpgrade(r) {
		s.serveConn(w, r, true)
		return
	}
	if r.Method == http.MethodPost && !s.readGraphQLBody(w, r) {
		return
	}
	s.gqlHTTP.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), gqlRequestKey{}, &gqlHTTPRequest{r: r})))
}

// readGraphQLBody reads a POST body of at most GraphQLMaxBodyBytes into
// r.Body (gqlgen's transport reads a body whole, with no bound), or
// answers the refusal as a GraphQL response: 413 too_large, 408
// body_timeout (see HTTPServer), 400 bad_request.
func (s *Server) readGraphQLBody(w http.ResponseWriter, r *http.Request) bool {
	max := s.cfg.GraphQLMaxBodyBytes
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, max))
	if err == nil {
		r.Body = io.NopCloser(bytes.NewReader(body))
		return true
	}
	status, code, msg := http.StatusBadRequest, "bad_request", "read body: "+err.Error()
	if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
		s.metrics.GraphQLRefused.WithLabelValues(limitBody).Inc()
		status, code, msg = http.StatusRequestEntityTooLarge, CodeTooLarge, "request body over "+strconv.FormatInt(max, 10)+" bytes (--graphql-max-body-bytes)"
	} else if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
		status, code, msg = http.StatusRequestTimeout, "body_timeout", "request body not received within "+s.cfg.HandshakeTimeout.String()+" (--handshake-timeout)"
	}
	writeJSON(w, status, &graphql.Response{Errors: gqlerror.List{{Message: msg, Extensions: map[string]any{"code": code}}}})
	return false
}
