package gateway_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/fanwire/fanwire/broker"
	"github.com/fanwire/fanwire/gateway"
	"github.com/fanwire/fanwire/gateway/auth"
)

const eventsQuery = `subscription($s: String!, $f: String) { events(subject: $s, from: $f) { subject cursor data } }`

func (e *env) graphqlURL() string { return "ws" + strings.TrimPrefix(e.http.URL, "http") + "/graphql" }

// dialGQL connects to /graphql offering subprotocols (graphql-transport-ws
// when none are given). It does not initialise.
func (e *env) dialGQL(subprotocols ...string) *client {
	e.t.Helper()
	if subprotocols == nil {
		subprotocols = []string{"graphql-transport-ws"}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, e.graphqlURL(), &websocket.DialOptions{Subprotocols: subprotocols})
	if err != nil {
		e.t.Fatal(err)
	}
	c.SetReadLimit(64 << 20)
	e.t.Cleanup(func() { _ = c.CloseNow() })
	return &client{t: e.t, c: c}
}

// initGQL connects and completes connection_init / connection_ack.
func (e *env) initGQL() *client {
	e.t.Helper()
	cl := e.dialGQL()
	cl.send(`{"type":"connection_init","payload":{}}`)
	if raw := cl.nextRaw(); raw != `{"type":"connection_ack"}` {
		e.t.Fatalf("got %s, want connection_ack", raw)
	}
	return cl
}

// gqlSubscribe sends a subscribe for the events query.
func (cl *client) gqlSubscribe(id, subject string, from *string) {
	cl.t.Helper()
	vars := map[string]any{"s": subject}
	if from != nil {
		vars["f"] = *from
	}
	b, _ := json.Marshal(map[string]any{"id": id, "type": "subscribe", "payload": map[string]any{"query": eventsQuery, "variables": vars}})
	cl.send(string(b))
}

// gqlQuiet asserts nothing is queued: a ping's pong is the next message. A
// subscribe before it is registered when the pong arrives.
func (cl *client) gqlQuiet() {
	cl.t.Helper()
	cl.send(`{"type":"ping"}`)
	if raw := cl.nextRaw(); raw != `{"type":"pong"}` {
		cl.t.Fatalf("unexpected message %s", raw)
	}
}

// gqlErrorCode reads the next message, an error for id, and returns its
// first error's extensions.code.
func (cl *client) gqlErrorCode(id string) string {
	cl.t.Helper()
	m, raw := cl.pop()
	errs, _ := m["payload"].([]any)
	if m["type"] != "error" || m["id"] != id || len(errs) == 0 {
		cl.t.Fatalf("got %s, want an error for %s", raw, id)
	}
	first, _ := errs[0].(map[string]any)
	if msg, _ := first["message"].(string); msg == "" {
		cl.t.Fatalf("error without a message: %s", raw)
	}
	ext, _ := first["extensions"].(map[string]any)
	code, _ := ext["code"].(string)
	return code
}

func strp(s string) *string { return &s }

// TestGraphQLSubscribe: the whole life of a subscription on NATS Core, with
// the next messages checked byte for byte.
func TestGraphQLSubscribe(t *testing.T) {
	e := newEnv(t, nil)
	cl := e.initGQL()
	cl.send(`{"id":"a","type":"subscribe","payload":{"query":"subscription { o: events(subject: \"orders.*\") { __typename d: data subject cursor } }"}}`)
	cl.gqlQuiet()
	if got := e.metric("fanwire_subscriptions", nil); got != 1 {
		t.Fatalf("fanwire_subscriptions = %v, want 1", got)
	}
	e.publish("orders.1", `{"n":1, "html":"<&>"}`)
	e.publish("other.1", `{"n":0}`)
	e.publish("orders.2", `[2]`)
	want := []string{
		`{"id":"a","type":"next","payload":{"data":{"o":{"__typename":"Event","d":{"n":1,"html":"<&>"},"subject":"orders.1","cursor":null}}}}`,
		`{"id":"a","type":"next","payload":{"data":{"o":{"__typename":"Event","d":[2],"subject":"orders.2","cursor":null}}}}`,
	}
	for _, w := range want {
		if got := cl.nextRaw(); got != w {
			t.Fatalf("got  %s\nwant %s", got, w)
		}
	}
	cl.send(`{"id":"a","type":"complete"}`)
	cl.gqlQuiet()
	e.publish("orders.3", `{"n":3}`)
	cl.gqlQuiet() // nothing for a completed subscription, and no reply to complete
	waitFor(t, "the subscription removed", func() bool { return e.metric("fanwire_subscriptions", nil) == 0 })
	// A complete for an id that is not active is ignored, as the protocol allows.
	cl.send(`{"id":"a","type":"complete"}`)
	// The id is free again. (On orders.4 alone: orders.3 may still be on
	// its way through a loaded node, and must not count against it.)
	cl.gqlSubscribe("a", "orders.4", nil)
	cl.gqlQuiet()
	e.publish("orders.4", `{"n":4}`)
	if got := cl.nextRaw(); got != `{"id":"a","type":"next","payload":{"data":{"events":{"subject":"orders.4","cursor":null,"data":{"n":4}}}}}` {
		t.Fatalf("got %s", got)
	}
}

// TestGraphQLCloseCodes: every protocol violation closes with the code
// graphql-transport-ws specifies.
func TestGraphQLCloseCodes(t *testing.T) {
	auth := func(ctx context.Context, r *http.Request, payload json.RawMessage) (*auth.Grants, error) {
		var p struct{ Token string }
		if err := json.Unmarshal(payload, &p); err != nil || p.Token != "good" {
			return nil, errors.New("bad token")
		}
		return nil, nil
	}
	e := newEnv(t, func(c *gateway.Config) {
		c.GraphQLInitTimeout = time.Second
		c.Authenticate = auth
	})
	const initGood = `{"type":"connection_init","payload":{"token":"good"}}`
	ack := func(cl *client) {
		t.Helper()
		if raw := cl.nextRaw(); raw != `{"type":"connection_ack"}` {
			t.Fatalf("got %s, want connection_ack", raw)
		}
	}
	cases := []struct {
		name string
		run  func(cl *client)
		code websocket.StatusCode
	}{
		{"init timeout", func(cl *client) {}, gateway.CloseInitTimeout},
		{"subscribe before ack", func(cl *client) { cl.gqlSubscribe("1", "orders.*", nil) }, gateway.CloseUnauthorized},
		{"second init", func(cl *client) { cl.send(initGood); ack(cl); cl.send(initGood) }, gateway.CloseTooManyInitialise},
		{"refused init", func(cl *client) { cl.send(`{"type":"connection_init","payload":{"token":"bad"}}`) }, gateway.CloseForbidden},
		{"init without payload refused", func(cl *client) { cl.send(`{"type":"connection_init"}`) }, gateway.CloseForbidden},
		{"duplicate id", func(cl *client) {
			cl.send(initGood)
			ack(cl)
			cl.gqlSubscribe("1", "orders.*", nil)
			cl.gqlSubscribe("1", "orders.*", nil)
		}, gateway.CloseSubscriberExists},
		{"not JSON", func(cl *client) { cl.send(`{"type":`) }, gateway.CloseBadRequest},
		{"not an object", func(cl *client) { cl.send(`[1]`) }, gateway.CloseBadRequest},
		{"unknown type", func(cl *client) { cl.send(`{"type":"hello"}`) }, gateway.CloseBadRequest},
		{"missing type", func(cl *client) { cl.send(`{"id":"1"}`) }, gateway.CloseBadRequest},
		{"unknown field", func(cl *client) { cl.send(`{"type":"ping","extra":1}`) }, gateway.CloseBadRequest},
		{"binary message", func(cl *client) {
			if err := cl.c.Write(context.Background(), websocket.MessageBinary, []byte(initGood)); err != nil {
				t.Fatal(err)
			}
		}, gateway.CloseBadRequest},
		{"subscribe without id", func(cl *client) {
			cl.send(initGood)
			ack(cl)
			cl.send(`{"type":"subscribe","payload":{"query":"{ health { status } }"}}`)
		}, gateway.CloseBadRequest},
		{"subscribe without query", func(cl *client) {
			cl.send(initGood)
			ack(cl)
			cl.send(`{"id":"1","type":"subscribe","payload":{"variables":{}}}`)
		}, gateway.CloseBadRequest},
		{"legacy message on graphql-transport-ws", func(cl *client) {
			cl.send(initGood)
			ack(cl)
			cl.send(`{"id":"1","type":"start","payload":{"query":"{ health { status } }"}}`)
		}, gateway.CloseBadRequest},
		{"init payload not an object", func(cl *client) { cl.send(`{"type":"connection_init","payload":"x"}`) }, gateway.CloseBadRequest},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cl := e.dialGQL()
			cl.t = t
			tc.run(cl)
			if got := cl.closeStatus(5 * time.Second); got != tc.code {
				t.Fatalf("close %d, want %d", got, tc.code)
			}
		})
	}
	t.Run("no subprotocol", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, _, err := websocket.Dial(ctx, e.graphqlURL(), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer c.CloseNow()
		_, _, err = c.Read(ctx)
		if got := websocket.CloseStatus(err); got != gateway.CloseSubprotocol {
			t.Fatalf("close %d (%v), want %d", got, err, gateway.CloseSubprotocol)
		}
	})
	t.Run("accepted init then ping", func(t *testing.T) {
		cl := e.dialGQL()
		cl.t = t
		cl.send(initGood)
		ack(cl)
		cl.gqlQuiet()
	})
}

// TestGraphQLRateLimitCloseReason: a GraphQL connection over MaxMessageRate
// is closed with 1008 and the rate limit's own reason, not the one of too
// many protocol errors (which also closes with 1008).
func TestGraphQLRateLimitCloseReason(t *testing.T) {
	e := newEnv(t, func(c *gateway.Config) { c.MaxMessageRate = 5 })
	cl := e.initGQL()
	for range 30 { // the burst is 10, connection_init included
		cl.send(`{"type":"ping"}`)
	}
	for {
		err := cl.readFrame(5 * time.Second)
		if err == nil {
			continue // the pongs within the burst
		}
		var ce websocket.CloseError
		if !errors.As(err, &ce) {
			t.Fatalf("read: %v, want a close", err)
		}
		if ce.Code != websocket.StatusPolicyViolation || ce.Reason != "message rate over the limit" {
			t.Fatalf("close %d %q, want 1008 %q", ce.Code, ce.Reason, "message rate over the limit")
		}
		return
	}
}

// TestGraphQLOperationErrors: errors end one operation, never the
// connection, and carry extensions.code; no complete follows an error.
func TestGraphQLOperationErrors(t *testing.T) {
	e := newEnv(t, func(c *gateway.Config) {
		c.Subjects = []string{"orders.>"}
		c.MaxSubscriptions = 2
	})
	cl := e.initGQL()
	// Validation: an unknown field, a missing argument, a wrong type.
	cl.send(`{"id":"v1","type":"subscribe","payload":{"query":"subscription { events(subject: \"orders.*\") { nope } }"}}`)
	if code := cl.gqlErrorCode("v1"); code != "GRAPHQL_VALIDATION_FAILED" {
		t.Fatalf("code %q", code)
	}
	cl.send(`{"id":"v2","type":"subscribe","payload":{"query":"subscription { events { data } }"}}`)
	if code := cl.gqlErrorCode("v2"); code != "GRAPHQL_VALIDATION_FAILED" {
		t.Fatalf("code %q", code)
	}
	cl.send(`{"id":"v3","type":"subscribe","payload":{"query":"subscription($s: String!) { events(subject: $s) { data } }","variables":{"s":5}}}`)
	if code := cl.gqlErrorCode("v3"); code != "GRAPHQL_VALIDATION_FAILED" {
		t.Fatalf("code %q", code)
	}
	cl.send(`{"id":"v4","type":"subscribe","payload":{"query":"subscription {"}}`)
	if code := cl.gqlErrorCode("v4"); code != "GRAPHQL_PARSE_FAILED" {
		t.Fatalf("code %q", code)
	}
	// The gateway's own checks.
	cl.gqlSubscribe("p1", "orders..x", nil)
	if code := cl.gqlErrorCode("p1"); code != gateway.CodeBadPattern {
		t.Fatalf("code %q", code)
	}
	cl.gqlSubscribe("p2", "billing.>", nil) // outside the subject space
	if code := cl.gqlErrorCode("p2"); code != gateway.CodeBadPattern {
		t.Fatalf("code %q", code)
	}
	cl.gqlSubscribe("c1", "orders.*", strp("first")) // NATS Core keeps no history
	if code := cl.gqlErrorCode("c1"); code != gateway.CodeBadCursor {
		t.Fatalf("code %q", code)
	}
	cl.gqlSubscribe("c2", "orders.*", strp(""))
	if code := cl.gqlErrorCode("c2"); code != gateway.CodeBadCursor {
		t.Fatalf("code %q", code)
	}
	cl.gqlSubscribe("s1", "orders.a", nil)
	cl.gqlSubscribe("s2", "orders.b", nil)
	cl.gqlSubscribe("s3", "orders.c", nil)
	if code := cl.gqlErrorCode("s3"); code != gateway.CodeTooManySubscriptions {
		t.Fatalf("code %q", code)
	}
	cl.gqlQuiet() // no complete after any error, and the connection lives
	// An id that failed is free; the live ones deliver.
	cl.send(`{"id":"s2","type":"complete"}`)
	cl.gqlSubscribe("p1", "orders.c", nil)
	cl.gqlQuiet()
	e.publish("orders.c", `{"c":1}`)
	if got := cl.nextRaw(); got != `{"id":"p1","type":"next","payload":{"data":{"events":{"subject":"orders.c","cursor":null,"data":{"c":1}}}}}` {
		t.Fatalf("got %s", got)
	}
	if got := e.metric("fanwire_client_errors_total", map[string]string{"code": "bad_pattern"}); got != 2 {
		t.Fatalf("bad_pattern errors counted %v, want 2", got)
	}
}

// TestGraphQLQueries: queries over WebSocket (next, then complete) and over
// HTTP; a subscription over HTTP is refused with a clear error.
func TestGraphQLQueries(t *testing.T) {
	e := newEnv(t, func(c *gateway.Config) { c.Subjects = []string{"orders.>", "app.>"} })
	cl := e.initGQL()
	cl.send(`{"id":"q","type":"subscribe","payload":{"query":"{ subscribable { patterns broker history maxSubscriptions } }"}}`)
	if got := cl.nextRaw(); got != `{"id":"q","type":"next","payload":{"data":{"subscribable":{"patterns":["orders.>","app.>"],"broker":"nats","history":false,"maxSubscriptions":256}}}}` {
		t.Fatalf("got %s", got)
	}
	if got := cl.nextRaw(); got != `{"id":"q","type":"complete"}` {
		t.Fatalf("got %s", got)
	}
	post := func(body string) map[string]any {
		t.Helper()
		resp, err := http.Post(e.http.URL+"/graphql", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var m map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	m := post(`{"query":"{ health { status ready reasons connections } }"}`)
	if !jsonEqual(m, map[string]any{"data": map[string]any{"health": map[string]any{"status": "ok", "ready": true, "reasons": []any{}, "connections": 1}}}) {
		t.Fatalf("health: %v", m)
	}
	m = post(`{"query":"subscription { events(subject: \"orders.*\") { data } }"}`)
	if errs, _ := m["errors"].([]any); len(errs) == 0 {
		t.Fatalf("a subscription over POST: %v, want an error", m)
	}
	resp, err := http.Get(e.http.URL + "/graphql?query=" + url.QueryEscape("{ __schema { subscriptionType { name } } }"))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != `{"data":{"__schema":{"subscriptionType":{"name":"Subscription"}}}}` {
		t.Fatalf("introspection over GET: %s", b)
	}
}

// TestGraphQLLegacyProtocol: the graphql-ws (subscriptions-transport-ws)
// subprotocol: connection_ack, start, data, stop, and errors as objects.
func TestGraphQLLegacyProtocol(t *testing.T) {
	e := newEnv(t, nil)
	cl := e.dialGQL("graphql-ws")
	if got := cl.c.Subprotocol(); got != "graphql-ws" {
		t.Fatalf("subprotocol %q", got)
	}
	cl.send(`{"type":"connection_init","payload":{}}`)
	if raw := cl.nextRaw(); raw != `{"type":"connection_ack"}` {
		t.Fatalf("got %s", raw)
	}
	cl.send(`{"id":"1","type":"start","payload":{"query":"subscription { events(subject: \"orders.*\") { subject data } }"}}`)
	cl.send(`{"id":"2","type":"start","payload":{"query":"subscription { events(subject: \"orders..\") { data } }"}}`)
	m, raw := cl.pop()
	p, _ := m["payload"].(map[string]any)
	ext, _ := p["extensions"].(map[string]any)
	if m["type"] != "error" || m["id"] != "2" || ext["code"] != gateway.CodeBadPattern {
		t.Fatalf("got %s, want an error object for 2", raw)
	}
	e.publish("orders.1", `{"n":1}`)
	if got := cl.nextRaw(); got != `{"id":"1","type":"data","payload":{"data":{"events":{"subject":"orders.1","data":{"n":1}}}}}` {
		t.Fatalf("got %s", got)
	}
	cl.send(`{"id":"1","type":"stop"}`)
	waitFor(t, "the subscription stopped", func() bool { return e.metric("fanwire_subscriptions", nil) == 0 })
	cl.send(`{"type":"connection_terminate"}`)
	if got := cl.closeStatus(5 * time.Second); got != websocket.StatusNormalClosure {
		t.Fatalf("close %d", got)
	}
}

// TestGraphQLPrefersTransportWS: a client offering both subprotocols gets
// graphql-transport-ws, whatever its order.
func TestGraphQLPrefersTransportWS(t *testing.T) {
	e := newEnv(t, nil)
	cl := e.dialGQL("graphql-ws", "graphql-transport-ws")
	if got := cl.c.Subprotocol(); got != "graphql-transport-ws" {
		t.Fatalf("subprotocol %q, want graphql-transport-ws", got)
	}
}

// TestGraphQLResume: from replays after a cursor then goes on live, on both
// brokers that keep history; a cursor the broker no longer holds is
// cursor_expired.
func TestGraphQLResume(t *testing.T) {
	for _, kind := range []string{"jetstream", "redis"} {
		t.Run(kind, func(t *testing.T) {
			e := newEnvOn(t, kind, func(c *gateway.Config) { c.Subjects = []string{"orders.>", "app.>"} })
			var cursors []string
			for i := 1; i <= 5; i++ {
				cs, err := e.b.Publish(context.Background(), []broker.Outgoing{{Subject: "orders.x", Data: []byte(`{"i":` + strconv.Itoa(i) + `}`)}})
				if err != nil {
					t.Fatal(err)
				}
				cursors = append(cursors, cs[0])
			}
			cl := e.initGQL()
			cl.gqlSubscribe("r", "orders.*", &cursors[1])
			for i := 3; i <= 5; i++ {
				want := `{"id":"r","type":"next","payload":{"data":{"events":{"subject":"orders.x","cursor":"` + cursors[i-1] + `","data":{"i":` + strconv.Itoa(i) + `}}}}}`
				if got := cl.nextRaw(); got != want {
					t.Fatalf("got  %s\nwant %s", got, want)
				}
			}
			cs, err := e.b.Publish(context.Background(), []broker.Outgoing{{Subject: "orders.y", Data: []byte(`{"i":6}`)}})
			if err != nil {
				t.Fatal(err)
			}
			want := `{"id":"r","type":"next","payload":{"data":{"events":{"subject":"orders.y","cursor":"` + cs[0] + `","data":{"i":6}}}}}`
			if got := cl.nextRaw(); got != want {
				t.Fatalf("got  %s\nwant %s", got, want)
			}
			cl.gqlSubscribe("bad", "orders.*", strp("nonsense"))
			if code := cl.gqlErrorCode("bad"); code != gateway.CodeBadCursor {
				t.Fatalf("code %q", code)
			}
		})
	}
	t.Run("expired", func(t *testing.T) {
		e := newEnvJS(t, "jetstream", func(c *broker.JetStreamConfig) { c.MaxBytes = 4096 }, nil)
		for i := range 100 {
			if _, err := e.b.Publish(context.Background(), []broker.Outgoing{{Subject: "orders.x", Data: []byte(`{"i":` + strconv.Itoa(i) + `,"pad":"` + strings.Repeat("p", 100) + `"}`)}}); err != nil {
				t.Fatal(err)
			}
		}
		cl := e.initGQL()
		cl.gqlSubscribe("s", "orders.*", strp("js:1"))
		if code := cl.gqlErrorCode("s"); code != gateway.CodeCursorExpired {
			t.Fatalf("code %q", code)
		}
		cl.gqlQuiet()
	})
}

// TestGraphQLSlowConsumer: a GraphQL client that stops reading is closed
// with 4008 like a native one, and the others keep receiving.
func TestGraphQLSlowConsumer(t *testing.T) {
	e := newEnv(t, func(c *gateway.Config) {
		c.MailboxMessages = 512
		c.CloseTimeout = 200 * time.Millisecond
	})
	slow := e.initGQL()
	slow.gqlSubscribe("s", "orders.*", nil)
	slow.gqlQuiet()
	good := e.initGQL()
	good.gqlSubscribe("g", "orders.*", nil)
	good.gqlQuiet()
	pad := strings.Repeat("x", 4<<10)
	const n, chunk = 4000, 100 // 16 MiB: beyond socket buffers and the mailbox
	var got atomic.Int64
	done := make(chan error, 1)
	go func() {
		for got.Load() < n {
			if _, _, err := good.c.Read(context.Background()); err != nil {
				done <- err
				return
			}
			got.Add(1)
		}
		done <- nil
	}()
	for i := range n {
		if err := e.nc.Publish("orders.x", []byte(`{"i":`+strconv.Itoa(i)+`,"pad":"`+pad+`"}`)); err != nil {
			t.Fatal(err)
		}
		if i%chunk == chunk-1 { // the reading client keeps up; the other does not read at all
			waitFor(t, "the reading client", func() bool { return got.Load() > int64(i-chunk) })
		}
	}
	if err := <-done; err != nil {
		t.Fatalf("the reading client: %v after %d events", err, got.Load())
	}
	waitFor(t, "the slow consumer found", func() bool { return e.metric("fanwire_slow_consumers_total", nil) == 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		if _, _, err := slow.c.Read(ctx); err != nil {
			if code := websocket.CloseStatus(err); code != gateway.CloseSlowConsumer && !errors.Is(err, io.EOF) && code != -1 {
				t.Fatalf("close %v (%v), want 4008", code, err)
			}
			break
		}
	}
}

// TestGraphQLShutdownDrains: on shutdown a GraphQL client gets what was
// queued for it, then 1001.
func TestGraphQLShutdownDrains(t *testing.T) {
	e := newEnv(t, nil)
	cl := e.initGQL()
	cl.gqlSubscribe("s", "orders.*", nil)
	cl.gqlQuiet()
	e.publish("orders.1", `{"n":1}`)
	waitFor(t, "the delivery", func() bool { return e.metric("fanwire_deliveries_total", nil) == 1 })
	go e.stop()
	if got := cl.nextRaw(); !strings.Contains(got, `"data":{"n":1}`) {
		t.Fatalf("got %s", got)
	}
	if got := cl.closeStatus(5 * time.Second); got != websocket.StatusGoingAway {
		t.Fatalf("close %d, want 1001", got)
	}
}

// TestGraphQLExecutorPathOverTheWire: with every subscription on the
// executor path, clients get the same bytes as on the fast path (the
// internal TestGraphQLFastPathMatchesExecutor compares the two per event).
func TestGraphQLExecutorPathOverTheWire(t *testing.T) {
	e := newEnv(t, nil)
	gateway.ForceGraphQLExecutor(e.srv)
	cl := e.initGQL()
	cl.send(`{"id":"a","type":"subscribe","payload":{"query":"subscription { o: events(subject: \"orders.*\") { __typename d: data subject cursor } }"}}`)
	cl.gqlQuiet()
	e.publish("orders.1", `{"n":1, "html":"<&>"}`)
	want := `{"id":"a","type":"next","payload":{"data":{"o":{"__typename":"Event","d":{"n":1,"html":"<&>"},"subject":"orders.1","cursor":null}}}}`
	if got := cl.nextRaw(); got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
	cl.send(`{"id":"a","type":"complete"}`)
	cl.gqlQuiet()
	e.publish("orders.2", `{"n":2}`)
	cl.gqlQuiet()
}

// TestFramesSentWithTheUpgrade: a client may send its first frames right
// behind its upgrade request, before it reads the 101; net/http has then
// read them already. They must reach the protocol intact, on both
// endpoints. (They were lost, and the stream misread, before
// PrefixConn.)
func TestFramesSentWithTheUpgrade(t *testing.T) {
	e := newEnv(t, nil)
	mask := func(msg string) []byte { // a masked client text frame, mask key 0
		return append([]byte{0x81, 0x80 | byte(len(msg)), 0, 0, 0, 0}, msg...)
	}
	for _, tc := range []struct{ path, proto, frames, want string }{
		{"/ws", "", `{"type":"subscribe","id":"s","subject":"orders.*"}`, `{"type":"subscribed","id":"s"}`},
		{"/graphql", "graphql-transport-ws", `{"type":"connection_init","payload":{}}`, `{"type":"connection_ack"}`},
	} {
		t.Run(tc.path, func(t *testing.T) {
			nc, err := net.Dial("tcp", strings.TrimPrefix(e.http.URL, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			req := "GET " + tc.path + " HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
			if tc.proto != "" {
				req += "Sec-WebSocket-Protocol: " + tc.proto + "\r\n"
			}
			out := append([]byte(req+"\r\n"), mask(tc.frames)...)
			out = append(out, mask(`{"type":"ping"}`)...)
			if _, err := nc.Write(out); err != nil { // one write: the frames arrive with the request
				t.Fatal(err)
			}
			_ = nc.SetReadDeadline(time.Now().Add(5 * time.Second))
			br := bufio.NewReader(nc)
			resp, err := http.ReadResponse(br, nil)
			if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
				t.Fatalf("upgrade: %v %v", resp, err)
			}
			n := 2
			if tc.path == "/ws" {
				n = 3 // ready first
			}
			var got []string
			for len(got) < n {
				var h [2]byte
				if _, err := io.ReadFull(br, h[:]); err != nil {
					t.Fatalf("after %q: %v", got, err)
				}
				if h[0] != 0x81 || h[1] > 126 {
					t.Fatalf("after %q: frame header % x", got, h)
				}
				size := int(h[1])
				if size == 126 { // a 16-bit length follows (ready with its limits is over 125 bytes)
					var l [2]byte
					if _, err := io.ReadFull(br, l[:]); err != nil {
						t.Fatal(err)
					}
					size = int(binary.BigEndian.Uint16(l[:]))
				}
				b := make([]byte, size)
				if _, err := io.ReadFull(br, b); err != nil {
					t.Fatal(err)
				}
				for line := range strings.SplitSeq(string(b), "\n") {
					got = append(got, line)
				}
			}
			if tc.path == "/ws" {
				got = got[1:] // ready
			}
			if got[0] != tc.want || got[1] != `{"type":"pong"}` {
				t.Fatalf("got %q, want %s then a pong", got, tc.want)
			}
		})
	}
}

// TestGraphQLPerConnectionConsumers: with --consumer per-connection a
// GraphQL subscription gets its own JetStream consumer, paced and acked like
// a native one, and deleted when the client completes it.
func TestGraphQLPerConnectionConsumers(t *testing.T) {
	e := perConnEnv(t)
	cl := e.initGQL()
	cl.gqlSubscribe("a", "orders.*", strp("first"))
	cl.gqlQuiet()
	e.publishN("orders.x", 1, 3)
	for i := 1; i <= 3; i++ {
		m := cl.next()
		ev := m["payload"].(map[string]any)["data"].(map[string]any)["events"].(map[string]any)
		if m["type"] != "next" || ev["cursor"] != "js:"+strconv.Itoa(i) || !jsonEqual(ev["data"], i) {
			t.Fatalf("event %d: %v", i, m)
		}
	}
	waitFor(t, "one subscription consumer", func() bool { return len(e.consumers()) == 1 })
	cl.send(`{"id":"a","type":"complete"}`)
	waitFor(t, "the consumer deleted", func() bool { return len(e.consumers()) == 0 })
	cl.gqlQuiet()
}

// TestGraphQLDurableSubscription: a GraphQL subscription with durable binds
// a named JetStream consumer; after a disconnect, subscribing again with the
// same name continues after what was written, with no cursor.
func TestGraphQLDurableSubscription(t *testing.T) {
	e := durableEnv(t)
	const q = `{"id":"d","type":"subscribe","payload":{"query":"subscription { events(subject: \"orders.*\", durable: \"dash-1\") { data } }"}}`
	expectData := func(cl *client, first, last int) {
		t.Helper()
		for i := first; i <= last; i++ {
			if got, want := cl.nextRaw(), `{"id":"d","type":"next","payload":{"data":{"events":{"data":`+strconv.Itoa(i)+`}}}}`; got != want {
				t.Fatalf("got %s, want %s", got, want)
			}
		}
	}
	cl := e.initGQL()
	cl.send(q)
	// GraphQL has no "subscribed": the consumer is open once it exists.
	waitFor(t, "the durable consumer", func() bool { return len(e.consumers()) == 1 })
	e.publishN("orders.x", 1, 100)
	expectData(cl, 1, 100)
	other := e.initGQL()
	other.send(q) // bound on this node already
	if code := other.gqlErrorCode("d"); code != gateway.CodeDurableInUse {
		t.Fatalf("code %q", code)
	}
	_ = cl.c.CloseNow()
	waitFor(t, "the connection to end", func() bool { return e.metric("fanwire_connections", nil) == 1 })
	e.publishN("orders.x", 101, 50)
	other.send(q)
	expectData(other, 101, 150)
	other.send(`{"id":"d","type":"complete"}`)
	waitFor(t, "the durable deleted", func() bool { return len(e.consumers()) == 0 })
}

// TestAuthenticateBothProtocols: one authentication hook serves both
// protocols: GraphQL hands it the connection_init payload (refused: 4403),
// the native protocol the upgrade request (refused: a 4401 close right
// after the upgrade).
func TestAuthenticateBothProtocols(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	e := newEnv(t, func(c *gateway.Config) {
		c.Authenticate = func(ctx context.Context, r *http.Request, payload json.RawMessage) (*auth.Grants, error) {
			tok := r.URL.Query().Get("token")
			if payload != nil {
				var p struct{ Token string }
				_ = json.Unmarshal(payload, &p)
				tok = p.Token
			}
			mu.Lock()
			seen = append(seen, r.URL.Path+" "+tok)
			mu.Unlock()
			if tok != "good" {
				return nil, errors.New("bad token")
			}
			return nil, nil
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	expectRefused(t, ctx, e.wsURL()+"?token=bad", "unauthorized: bad token")
	c, _, err := websocket.Dial(ctx, e.wsURL()+"?token=good", nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.CloseNow()
	cl := e.dialGQL()
	cl.send(`{"type":"connection_init","payload":{"token":"good"}}`)
	if raw := cl.nextRaw(); raw != `{"type":"connection_ack"}` {
		t.Fatalf("got %s", raw)
	}
	want := []string{"/ws bad", "/ws good", "/graphql good"}
	mu.Lock()
	defer mu.Unlock()
	if !jsonEqual(seen, want) {
		t.Fatalf("the hook saw %q, want %q", seen, want)
	}
	if got := e.metric("fanwire_connections_rejected_total", map[string]string{"reason": "unauthorized"}); got != 1 {
		t.Fatalf("rejections counted %v, want 1", got)
	}
}
