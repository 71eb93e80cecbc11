package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/99designs/gqlgen/graphql"
	"github.com/99designs/gqlgen/graphql/executor"
	"github.com/99designs/gqlgen/graphql/handler"
	"github.com/99designs/gqlgen/graphql/handler/extension"
	"github.com/99designs/gqlgen/graphql/handler/transport"
	"github.com/fanwire/fanwire/schema"
	"github.com/vektah/gqlparser/v2/ast"
	"github.com/vektah/gqlparser/v2/gqlerror"
)

// GraphQL over WebSocket at /graphql: the graphql-transport-ws protocol
// (preferred) and the legacy graphql-ws (subscriptions-transport-ws) one, on
// the same connections, hub and mailboxes as the native protocol. gqlgen
// parses and validates every operation; an events subscription whose
// selection is made of Event's own fields is then served by splicing each
// event's shared bytes into a next-frame template computed when it
// subscribed (gqlOp), with no resolver and no marshalling per delivery.
// Anything else runs through gqlgen's executor, which gives the same bytes.
//
// gqlgen's own WebSocket transport is not used: it marshals per subscriber
// per event, writes without a deadline under one mutex per connection, and
// deviates from the protocol's close codes (as of gqlgen v0.17.98: an init
// timeout closes with 1002 where graphql-transport-ws says 4408, a
// subscribe before the ack with 1002 instead of 4401, a second init with
// 1002 instead of 4429, an unknown message type with 1000 instead of 4400,
// a duplicate id is not closed with 4409, and it sends complete after
// error).

// Subprotocols, in order of preference.
const (
	subprotoTransportWS = "graphql-transport-ws"
	subprotoLegacy      = "graphql-ws"
)

// Close codes of graphql-transport-ws (the graphql-ws npm package's
// PROTOCOL.md). The legacy protocol gets the same ones.
const (
	CloseBadRequest        = 4400 // malformed or unexpected message
	CloseUnauthorized      = 4401 // subscribe before connection_ack
	CloseForbidden         = 4403 // connection_init refused by authentication
	CloseSubprotocol       = 4406 // no subprotocol the server speaks
	CloseInitTimeout       = 4408 // no connection_init in time
	CloseSubscriberExists  = 4409 // subscribe with an id already in use
	CloseTooManyInitialise = 4429 // a second connection_init
)

// Authenticator decides whether a connection may proceed, and what it may
// subscribe to (nil grants: everything), on both protocols: for GraphQL it
// is called with the connection_init payload (JSON, nil when absent) and
// the upgrade request, and an error closes the connection with 4403; for
// the native protocol, which has no init message, with the upgrade request
// and a nil payload, and an error refuses the upgrade with 401.
// JWTAuth.Grant is one.
type Authenticator func(ctx context.Context, r *http.Request, initPayload json.RawMessage) (*Grants, error)

// gqlField kinds: which of an event's values a selected field takes.
const (
	fieldSubject = iota
	fieldCursor
	fieldData
	fieldTypename
)

// gqlOp is one GraphQL subscription of a connection. It is immutable after
// it is registered, but for done.
type gqlOp struct {
	id string
	// Fast path: pieces[0], value kinds[0], pieces[1], ..., pieces[len(kinds)].
	pieces [][]byte
	kinds  []uint8
	// Executor path (fast == false): the executor's response stream, fed one
	// event at a time through ch by the writer.
	fast bool
	next graphql.ResponseHandler
	ctx  context.Context
	ch   chan *schema.Event
	head []byte // {"id":...,"type":"next","payload":

	overhead int // bytes a delivery adds to the event's (mailbox accounting); fast path: the pieces' total length
	done     atomic.Bool
}

// appendNext appends the operation's next message for ev.
func (op *gqlOp) appendNext(dst []byte, ev *Event) []byte {
	if !op.fast {
		return op.appendExecuted(dst, ev)
	}
	for i, k := range op.kinds {
		dst = append(dst, op.pieces[i]...)
		switch k {
		case fieldSubject:
			dst = append(dst, ev.subjectJSON()...)
		case fieldCursor:
			if c := ev.cursorJSON(); c != nil {
				dst = append(dst, c...)
			} else {
				dst = append(dst, "null"...)
			}
		case fieldData:
			dst = append(dst, ev.dataJSON()...)
		case fieldTypename:
			dst = append(dst, `"Event"`...)
		}
	}
	return append(dst, op.pieces[len(op.kinds)]...)
}

// nextLen is len(op.appendNext(nil, ev)) on the fast path, so the message
// can be framed before it is built.
func (op *gqlOp) nextLen(ev *Event) int {
	n := op.overhead
	for _, k := range op.kinds {
		switch k {
		case fieldSubject:
			n += int(ev.subjEnd) - len(headPrefix)
		case fieldCursor:
			if ev.curEnd == 0 {
				n += len("null")
			} else {
				n += int(ev.curEnd) - int(ev.subjEnd) - len(cursorField)
			}
		case fieldData:
			n += len(ev.buf) - 1 - ev.split - len(dataField)
		case fieldTypename:
			n += len(`"Event"`)
		}
	}
	return n
}

// appendExecuted runs the executor for ev (on the writer's goroutine: the
// channel has room for the one event the response handler takes). A
// response may come without taking the event (gqlgen's one-shot error
// response does), so what is left is taken back after every response: the
// channel is empty again for the next delivery, whose send never blocks.
func (op *gqlOp) appendExecuted(dst []byte, ev *Event) []byte {
	e := &schema.Event{Subject: ev.Subject, Data: schema.JSON(ev.dataJSON())}
	if ev.Cursor != "" {
		c := ev.Cursor
		e.Cursor = &c
	}
	select {
	case op.ch <- e:
	default: // not reached: the writer is the only sender and empties it
		return dst
	}
	resp := op.next(op.ctx)
	select {
	case <-op.ch: // not taken
	default:
	}
	if resp == nil { // the operation is over
		return dst
	}
	dst = append(dst, op.head...)
	dst = appendResponse(dst, resp)
	return append(dst, '}')
}

// appendResponse appends a GraphQL response as JSON, with no HTML escaping
// (as the fast path writes it).
func appendResponse(dst []byte, resp *graphql.Response) []byte {
	if len(resp.Errors) == 0 && resp.Extensions == nil && resp.Label == "" && resp.Path == nil && resp.HasNext == nil {
		dst = append(dst, `{"data":`...)
		if len(resp.Data) == 0 {
			dst = append(dst, "null"...)
		} else {
			dst = append(dst, resp.Data...)
		}
		return append(dst, '}')
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(resp); err != nil {
		return append(dst, `{"errors":[{"message":"response could not be encoded"}]}`...)
	}
	return append(dst, bytes.TrimRight(b.Bytes(), "\n")...)
}

// newFastOp builds the next-frame template of an events subscription whose
// selection (as gqlgen collects it: fragments merged, @skip/@include
// applied, in the executor's order) is made of Event's own fields. It
// returns nil when the selection needs the executor.
func newFastOp(id string, legacy bool, rootAlias string, fields []graphql.CollectedField) *gqlOp {
	op := &gqlOp{id: id, fast: true}
	cur := append(nextHead(id, legacy), `{"data":{`...)
	cur = appendJSONString(cur, rootAlias)
	cur = append(cur, ":{"...)
	for i, f := range fields {
		if len(f.Deferrables) > 0 || len(f.Selections) > 0 {
			return nil
		}
		var k uint8
		switch f.Name {
		case "subject":
			k = fieldSubject
		case "cursor":
			k = fieldCursor
		case "data":
			k = fieldData
		case "__typename":
			k = fieldTypename
		default:
			return nil
		}
		if i > 0 {
			cur = append(cur, ',')
		}
		cur = appendJSONString(cur, f.Alias)
		cur = append(cur, ':')
		op.pieces = append(op.pieces, cur)
		op.kinds = append(op.kinds, k)
		op.overhead += len(cur)
		cur = nil
	}
	cur = append(cur, "}}}}"...)
	op.pieces = append(op.pieces, cur)
	op.overhead += len(cur)
	return op
}

// newGQLOp builds the operation serving the events subscription root of
// opCtx: the fast path when its selection allows (and !executorOnly), else
// the executor.
func (s *Server) newGQLOp(ctx context.Context, id string, legacy bool, opCtx *graphql.OperationContext, root graphql.CollectedField, executorOnly bool) *gqlOp {
	if !executorOnly {
		if op := newFastOp(id, legacy, root.Alias, graphql.CollectFields(opCtx, root.Selections, []string{"Event"})); op != nil {
			return op
		}
	}
	ch := make(chan *schema.Event, 1)
	h, octx := s.gqlExec.DispatchOperation(withEventStream(ctx, ch), opCtx)
	op := &gqlOp{id: id, next: h, ctx: octx, ch: ch, head: nextHead(id, legacy)}
	op.overhead = len(op.head) + 64
	return op
}

// nextHead is a next (legacy: data) message up to its payload.
func nextHead(id string, legacy bool) []byte {
	b := append([]byte(`{"id":`), appendJSONString(nil, id)...)
	if legacy {
		return append(b, `,"type":"data","payload":`...)
	}
	return append(b, `,"type":"next","payload":`...)
}

// gqlConn is the GraphQL state of a connection.
type gqlConn struct {
	legacy bool
	exec   *executor.Executor

	initTimer *time.Timer // guarded by conn.mu
	// owned by the reader
	initialised bool
	acked       bool
	ctx         context.Context // operations' context, set by connection_init

	opsMu sync.Mutex
	ops   map[string]*gqlOp // guarded by opsMu: subscriptions by id
}

// encode is the client's subscription-list encoder: the operations of ids.
func (g *gqlConn) encode(ids []string) *subsList {
	l := &subsList{ops: make([]*gqlOp, 0, len(ids))}
	g.opsMu.Lock()
	for _, id := range ids {
		if op := g.ops[id]; op != nil {
			l.ops = append(l.ops, op)
			l.size += op.overhead
		}
	}
	g.opsMu.Unlock()
	return l
}

func (g *gqlConn) op(id string) *gqlOp {
	g.opsMu.Lock()
	defer g.opsMu.Unlock()
	return g.ops[id]
}

// forget ends the operation id: no more next messages are written for it.
func (g *gqlConn) forget(id string) {
	g.opsMu.Lock()
	op := g.ops[id]
	delete(g.ops, id)
	g.opsMu.Unlock()
	if op != nil {
		op.done.Store(true)
	}
}

// errorMessage is the error message ending operation id, with the gateway's
// error code in extensions.code.
func (g *gqlConn) errorMessage(id, code, msg string) []byte {
	e := gqlerror.Error{Message: msg, Extensions: map[string]any{"code": code}}
	if g.legacy {
		return gqlMessage("error", id, e)
	}
	return gqlMessage("error", id, gqlerror.List{&e})
}

// gqlMessage encodes a server message; payload nil is omitted.
func gqlMessage(typ, id string, payload any) []byte {
	b := []byte(`{`)
	if id != "" {
		b = append(b, `"id":`...)
		b = appendJSONString(b, id)
		b = append(b, ',')
	}
	b = append(b, `"type":`...)
	b = appendJSONString(b, typ)
	if payload != nil {
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(payload); err == nil {
			b = append(b, `,"payload":`...)
			b = append(b, bytes.TrimRight(buf.Bytes(), "\n")...)
		}
	}
	return append(b, '}')
}

// gqlClientMessage is one client → server message of either protocol.
type gqlClientMessage struct {
	ID      *string         `json:"id"`
	Type    string          `json:"type"`
	Payload json.RawMessage `json:"payload"`
}

// gqlSubscribePayload is a subscribe (legacy: start) payload.
type gqlSubscribePayload struct {
	Query         *string        `json:"query"`
	OperationName string         `json:"operationName"`
	Variables     map[string]any `json:"variables"`
	Extensions    map[string]any `json:"extensions"`
}

// closeWith asks the writer to close with code and reason; the reader
// ignores everything after it.
func (c *conn) closeWith(code int, reason string) {
	reason = closeReason(reason)
	c.requestCloseReason(code, &reason)
}

// maxCloseReason is the longest close reason a control frame can carry.
const maxCloseReason = 123

// closeReason cuts reason to what a close frame carries, on a UTF-8
// boundary.
func closeReason(reason string) string {
	if len(reason) > maxCloseReason {
		reason = reason[:maxCloseReason]
		for !utf8.ValidString(reason) {
			reason = reason[:len(reason)-1]
		}
	}
	return reason
}

// gqlHandle handles one client message of a GraphQL connection.
func (c *conn) gqlHandle(text bool, data []byte) {
	g := c.gql
	if c.closeCode.Load() != 0 {
		return
	}
	if !text {
		c.closeWith(CloseBadRequest, "binary messages are not supported")
		return
	}
	var m gqlClientMessage
	if err := decodeObject(data, &m, "id", "type", "payload"); err != nil {
		c.closeWith(CloseBadRequest, "invalid message: "+err.Error())
		return
	}
	switch m.Type {
	case "connection_init":
		c.gqlInit(m.Payload)
	case "ping":
		if !g.legacy {
			c.send(gqlMessage("pong", "", nil))
			return
		}
		c.closeWith(CloseBadRequest, `unexpected message of type "ping"`)
	case "pong":
		if g.legacy {
			c.closeWith(CloseBadRequest, `unexpected message of type "pong"`)
		}
	case "subscribe", "start":
		if (m.Type == "start") != g.legacy {
			c.closeWith(CloseBadRequest, "unexpected message of type "+strconv.Quote(m.Type))
			return
		}
		if m.ID == nil || *m.ID == "" || len(*m.ID) > maxIDLen {
			c.closeWith(CloseBadRequest, m.Type+` needs an "id" of 1 to `+strconv.Itoa(maxIDLen)+" bytes")
			return
		}
		var p gqlSubscribePayload
		if err := decodeObject(m.Payload, &p, "query", "operationName", "variables", "extensions"); err != nil {
			c.closeWith(CloseBadRequest, m.Type+" payload: "+err.Error())
			return
		}
		if p.Query == nil {
			c.closeWith(CloseBadRequest, m.Type+` payload needs "query"`)
			return
		}
		if !g.acked {
			c.closeWith(CloseUnauthorized, "Unauthorized")
			return
		}
		c.gqlSubscribe(*m.ID, &p)
	case "complete", "stop":
		if (m.Type == "stop") != g.legacy {
			c.closeWith(CloseBadRequest, "unexpected message of type "+strconv.Quote(m.Type))
			return
		}
		if m.ID == nil || *m.ID == "" {
			c.closeWith(CloseBadRequest, m.Type+` needs an "id"`)
			return
		}
		c.gqlComplete(*m.ID)
	case "connection_terminate":
		if !g.legacy {
			c.closeWith(CloseBadRequest, `unexpected message of type "connection_terminate"`)
			return
		}
		c.closeWith(1000, "terminated")
	case "":
		c.closeWith(CloseBadRequest, `invalid message: missing "type"`)
	default:
		c.closeWith(CloseBadRequest, "unexpected message of type "+strconv.Quote(m.Type))
	}
}

// gqlInit handles connection_init: once, authenticated, acknowledged.
func (c *conn) gqlInit(payload json.RawMessage) {
	g := c.gql
	if g.initialised {
		c.closeWith(CloseTooManyInitialise, "Too many initialisation requests")
		return
	}
	g.initialised = true
	c.mu.Lock()
	if g.initTimer != nil {
		g.initTimer.Stop()
	}
	c.mu.Unlock()
	if t := bytes.TrimSpace(payload); len(t) > 0 && !bytes.Equal(t, []byte("null")) && t[0] != '{' {
		c.closeWith(CloseBadRequest, "connection_init payload must be an object")
		return
	}
	if auth := c.s.cfg.Authenticate; auth != nil {
		grants, err := auth(c.runCtx, c.req, payload)
		if err != nil {
			c.s.metrics.ConnectionsRejected.WithLabelValues("unauthorized").Inc()
			if g.legacy {
				c.send(gqlMessage("connection_error", "", map[string]string{"message": "Forbidden"}))
			}
			c.closeWith(CloseForbidden, "Forbidden")
			return
		}
		c.grants = grants // the reader's: subscribes run after it
		c.armExpiry()
	}
	g.ctx = c.runCtx
	g.acked = true
	c.send(gqlMessage("connection_ack", "", nil))
}

// gqlSubscribe runs a subscribe (legacy: start) message: gqlgen parses and
// validates the operation; a query runs at once, an events subscription
// joins the hub like a native subscription.
func (c *conn) gqlSubscribe(id string, p *gqlSubscribePayload) {
	g := c.gql
	c.subsMu.Lock()
	_, dup := c.subs[id]
	c.subsMu.Unlock()
	if dup || g.op(id) != nil {
		c.closeWith(CloseSubscriberExists, "Subscriber for "+id+" already exists")
		return
	}
	ctx := graphql.StartOperationTrace(g.ctx)
	opCtx, errs := g.exec.CreateOperationContext(ctx, &graphql.RawParams{
		Query:         *p.Query,
		OperationName: p.OperationName,
		Variables:     p.Variables,
		Extensions:    p.Extensions,
		ReadTime:      graphql.TraceTiming{Start: graphql.Now(), End: graphql.Now()},
	})
	if errs != nil {
		c.gqlOperationErrors(id, errs)
		return
	}
	if opCtx.Operation.Operation != ast.Subscription {
		// Runs here, on the reader: a publish mutation uses the
		// connection's grants (the reader's) and waits for the broker.
		h, octx := g.exec.DispatchOperation(context.WithValue(ctx, gqlConnKey{}, c), opCtx)
		resp := h(octx)
		if resp == nil {
			resp = &graphql.Response{}
		}
		c.send(append(appendResponse(nextHead(id, g.legacy), resp), '}'))
		c.send(gqlMessage("complete", id, nil))
		return
	}
	root := graphql.CollectFields(opCtx, opCtx.Operation.SelectionSet, []string{"Subscription"})
	if len(root) != 1 || root[0].Name != "events" {
		c.gqlOperationErrors(id, gqlerror.List{gqlerror.Errorf("subscribe to exactly one field: events")})
		return
	}
	args := root[0].ArgumentMap(opCtx.Variables)
	subject, _ := args["subject"].(string)
	var from *string
	if f, ok := args["from"].(string); ok {
		from = &f
	}
	if from != nil && *from == "" {
		c.clientError(id, CodeBadCursor, `"from" must be a cursor or "first"`)
		return
	}
	var durable *string
	if d, ok := args["durable"].(string); ok {
		durable = &d
	}
	op := c.s.newGQLOp(ctx, id, g.legacy, opCtx, root[0], c.s.gqlExecutorOnly)
	g.opsMu.Lock()
	g.ops[id] = op
	g.opsMu.Unlock()
	c.subscribe(id, subject, from, durable)
}

// gqlComplete ends operation id at the client's request (no reply).
func (c *conn) gqlComplete(id string) {
	c.subsMu.Lock()
	_, ok := c.subs[id]
	c.subsMu.Unlock()
	c.gql.forget(id)
	if ok {
		c.unsubscribe(id)
	}
}

// gqlOperationErrors ends operation id with GraphQL errors (parse,
// validation): an error message, and no complete after it. They count
// towards MaxClientErrors like the gateway's own codes.
func (c *conn) gqlOperationErrors(id string, errs gqlerror.List) {
	code := "graphql_validation"
	if len(errs) > 0 {
		if s, ok := errs[0].Extensions["code"].(string); ok && s == "GRAPHQL_PARSE_FAILED" {
			code = "graphql_parse"
		}
	}
	c.gql.forget(id)
	if c.gql.legacy {
		c.sendClientError(code, gqlMessage("error", id, errs[0]))
		return
	}
	c.sendClientError(code, gqlMessage("error", id, errs))
}

// writeBatchGQL writes each delivery as its own message (the protocol's
// framing), batched: it frames the messages itself, straight into the
// socket writer's batch buffer (a fast-path delivery is spliced there, with
// no intermediate copy), which leaves in one write per batchLimit. While a
// library frame is partway through (rare: a ping), it writes through the
// library instead.
func (c *conn) writeBatchGQL(bt *batch) error {
	fw := c.fw
	batched := fw.beginBatch()
	var bp *[]byte
	var buf []byte
	var frames, bytes int
	var err error
	write := func(b []byte) error { // a prebuilt message
		if !batched {
			return c.writeFrame(b)
		}
		frames, bytes = frames+1, bytes+len(b)
		return fw.appendText(b)
	}
items:
	for s := bt.head; s != nil; s = bt.next(s) {
		for _, it := range bt.used(s) {
			if it.subs == nil {
				if err = write(it.ev.buf); err != nil {
					break items
				}
				continue
			}
			for _, op := range it.subs.ops {
				if op.done.Load() {
					continue
				}
				if batched && op.fast {
					n := op.nextLen(it.ev)
					fw.appendHeader(n)
					fw.out = op.appendNext(fw.out, it.ev)
					frames, bytes = frames+1, bytes+n
					if err = fw.flushIfFull(); err != nil {
						break items
					}
					continue
				}
				if bp == nil {
					bp = getFrameBuf()
					buf = (*bp)[:0]
				}
				buf = op.appendNext(buf[:0], it.ev)
				if len(buf) == 0 { // the operation ended
					continue
				}
				if err = write(buf); err != nil {
					break items
				}
			}
		}
	}
	if batched {
		if eerr := fw.endBatch(); err == nil {
			err = eerr
		}
	}
	if bp != nil {
		*bp = buf
		putFrameBuf(bp)
	}
	c.s.metrics.Frames.Add(float64(frames))
	c.s.metrics.BytesSent.Add(float64(bytes))
	return err
}

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

// isWebSocketUpgrade reports whether r asks for a WebSocket upgrade.
func isWebSocketUpgrade(r *http.Request) bool {
	return headerContainsToken(r.Header, "Connection", "upgrade") && headerContainsToken(r.Header, "Upgrade", "websocket")
}

// headerContainsToken reports whether the comma-separated header name holds
// token (case-insensitive), as an upgrade request's Connection: keep-alive,
// Upgrade does.
func headerContainsToken(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for t := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}
