package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"strconv"
	"sync"
	"time"

	"github.com/99designs/gqlgen/graphql"
	"github.com/99designs/gqlgen/graphql/executor"
	"github.com/fanwire/fanwire/gateway/internal/fanout"
	"github.com/fanwire/fanwire/jsonstr"
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
// A presence subscription is a presence watch of the connection, served
// the same way (graphql_presence.go).
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
func (g *gqlConn) encode(ids []string) *fanout.SubsList {
	ops := make([]*gqlOp, 0, len(ids))
	size := 0
	g.opsMu.Lock()
	for _, id := range ids {
		if op := g.ops[id]; op != nil {
			ops = append(ops, op)
			size += op.overhead
		}
	}
	g.opsMu.Unlock()
	return &fanout.SubsList{Ext: ops, Size: size}
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
		b = jsonstr.Append(b, id)
		b = append(b, ',')
	}
	b = append(b, `"type":`...)
	b = jsonstr.Append(b, typ)
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
		c.setGrants(grants) // the reader's: subscribes run after it
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
		h, octx := g.exec.DispatchOperation(context.WithValue(ctx, gqlConnKey{}, &gqlConnOp{c: c}), opCtx)
		resp := h(octx)
		if resp == nil {
			resp = &graphql.Response{}
		}
		b := append(appendResponse(nextHead(id, g.legacy), resp), '}')
		if c.cl.NeverFits(len(b)) { // refused, not sent: sending it would close the connection
			b = append(appendResponse(nextHead(id, g.legacy), tooLargeResponse(len(b), c.s.cfg.MailboxBytes)), '}')
		}
		c.send(b)
		c.send(gqlMessage("complete", id, nil))
		c.closeOnTooManyErrors() // its publishes' refusals counted
		return
	}
	root := graphql.CollectFields(opCtx, opCtx.Operation.SelectionSet, []string{"Subscription"})
	if len(root) != 1 || root[0].Name != "events" && root[0].Name != "presence" {
		c.gqlOperationErrors(id, gqlerror.List{gqlerror.Errorf("subscribe to exactly one field: events or presence")})
		return
	}
	if root[0].Name == "presence" {
		c.gqlWatchPresence(ctx, id, opCtx, root[0])
		return
	}
	args := root[0].ArgumentMap(opCtx.Variables)
	subject, _ := args["subject"].(string)
	var from *string
	if f, ok := args["from"].(string); ok {
		from = &f
	}
	if from != nil && *from == "" {
		c.clientError(id, CodeBadCursor, `"from" must be a cursor, "first" or "latest"`)
		return
	}
	var durable, where *string
	if d, ok := args["durable"].(string); ok {
		durable = &d
	}
	if w, ok := args["where"].(string); ok {
		where = &w
	}
	if from != nil && *from == "latest" && durable != nil {
		c.clientError(id, CodeBadFrame, `a durable starts where it left off: "from": "latest" takes no "durable"`)
		return
	}
	op := c.s.newGQLOp(ctx, id, g.legacy, opCtx, root[0], c.s.gqlExecutorOnly)
	g.opsMu.Lock()
	g.ops[id] = op
	g.opsMu.Unlock()
	c.subscribe(id, subject, from, durable, where, false)
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

// tooLargeResponse replaces a query's result of n bytes that no mailbox
// of max bytes could hold (several members fields, aliases).
func tooLargeResponse(n, max int) *graphql.Response {
	return &graphql.Response{Errors: gqlerror.List{{
		Message:    "the result is " + strconv.Itoa(n) + " bytes, more than this connection's queue holds (--mailbox-bytes " + strconv.Itoa(max) + "): ask for less in one operation (fewer members fields, a smaller limit)",
		Extensions: map[string]any{"code": CodeTooLarge},
	}}}
}

// gqlOperationErrors ends operation id with GraphQL errors (parse,
// validation): an error message, and no complete after it. They count
// towards MaxClientErrors like the gateway's own codes.
func (c *conn) gqlOperationErrors(id string, errs gqlerror.List) {
	code := "graphql_validation"
	if len(errs) > 0 {
		switch s, _ := errs[0].Extensions["code"].(string); s {
		case "GRAPHQL_PARSE_FAILED":
			code = "graphql_parse"
		case CodeQueryLimit:
			code = CodeQueryLimit
		}
	}
	c.gql.forget(id)
	if c.gql.legacy {
		c.sendClientError(code, gqlMessage("error", id, errs[0]))
		return
	}
	c.sendClientError(code, gqlMessage("error", id, errs))
}
