package gateway

import (
	"context"
	"errors"
	"net/http"

	"github.com/99designs/gqlgen/graphql/executor"
	"github.com/99designs/gqlgen/graphql/handler"
	"github.com/99designs/gqlgen/graphql/handler/extension"
	"github.com/99designs/gqlgen/graphql/handler/transport"
	"github.com/fanwire/fanwire/schema"
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
		MaxSubjectBytes:  maxSubjectLen,
		MaxSubscriptions: b.s.cfg.MaxSubscriptions,
	}
}

func (b gqlBackend) Events(ctx context.Context, subject string, from, durable *string) (<-chan *schema.Event, error) {
	if ch, ok := ctx.Value(eventStreamKey{}).(chan *schema.Event); ok {
		return ch, nil
	}
	return nil, errors.New("events is a subscription: subscribe over WebSocket at /graphql (graphql-transport-ws)")
}

// gqlConnKey carries the connection a WebSocket operation runs for (its
// grants publish); gqlRequestKey the HTTP request of one over HTTP.
type (
	gqlConnKey    struct{}
	gqlRequestKey struct{}
)

// Publish is the publish mutation: with the connection's grants over
// WebSocket, with the request's credential over HTTP (as POST
// /api/publish, origin check included). Refusals are GraphQL errors with
// extensions code, rule and subject, counted like the transport's others:
// fanwire_client_errors_total over WebSocket, fanwire_publish_requests_total
// over HTTP.
func (b gqlBackend) Publish(ctx context.Context, subject string, data schema.JSON) (*schema.Published, error) {
	s := b.s
	var pub publisher
	allowed := true
	var count func(result string)
	switch {
	case ctx.Value(gqlConnKey{}) != nil:
		c := ctx.Value(gqlConnKey{}).(*conn)
		pub, allowed = s.grantsPublisher(c.grants)
		count = func(code string) { s.metrics.ClientErrors.WithLabelValues(code).Inc() }
	case ctx.Value(gqlRequestKey{}) != nil:
		r := ctx.Value(gqlRequestKey{}).(*http.Request)
		count = func(result string) { s.metrics.PublishRequests.WithLabelValues(result).Inc() }
		if origin := r.Header.Get("Origin"); origin != "" && !s.originAllowed(origin, r.Host) {
			count("forbidden_origin")
			return nil, &gqlerror.Error{Message: "origin " + origin + " is not allowed (see --allowed-origins)", Extensions: map[string]any{"code": "forbidden_origin"}}
		}
		var aerr *apiError
		if pub, _, aerr = s.httpPublisher(r); aerr != nil {
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
	s.gqlExec = executor.New(es)
	s.gqlExec.Use(extension.Introspection{})
	h := handler.New(es)
	h.AddTransport(transport.Options{})
	h.AddTransport(transport.GET{})
	h.AddTransport(transport.POST{})
	h.Use(extension.Introspection{})
	return h
}

// serveGraphQL serves /graphql: WebSocket upgrades (subscriptions and
// queries) here, everything else to gqlgen's HTTP transports.
func (s *Server) serveGraphQL(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet && isWebSocketUpgrade(r) {
		s.serveConn(w, r, true)
		return
	}
	s.gqlHTTP.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), gqlRequestKey{}, r)))
}
