package gateway_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/fanwire/fanwire/gateway"
	"github.com/fanwire/fanwire/gateway/auth"
	"github.com/golang-jwt/jwt/v5"
)

// hostileQuery is the overlapping-fields exploit: n pairs of fields under
// one alias, which gqlgen's validation compares pairwise (one error per
// conflicting pair: 16M for n = 4000).
func hostileQuery(n int) string {
	return "{" + strings.Repeat(" a:health{status} a:subscribable{broker}", n) + " }"
}

// serveAllocated serves req through the gateway's handler in this process
// and returns the response and the bytes allocated meanwhile.
func serveAllocated(h http.Handler, req *http.Request) (*httptest.ResponseRecorder, uint64) {
	rec := httptest.NewRecorder()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	h.ServeHTTP(rec, req)
	runtime.ReadMemStats(&after)
	return rec, after.TotalAlloc - before.TotalAlloc
}

// gqlResponseError decodes a GraphQL response over HTTP and returns its
// first error's message and extensions.code.
func gqlResponseError(t *testing.T, body []byte) (msg, code string) {
	t.Helper()
	var m struct {
		Errors []struct {
			Message    string         `json:"message"`
			Extensions map[string]any `json:"extensions"`
		} `json:"errors"`
	}
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatalf("response is not JSON (%v): %.300s", err, body)
	}
	if len(m.Errors) == 0 {
		t.Fatalf("no errors in %.300s", body)
	}
	code, _ = m.Errors[0].Extensions["code"].(string)
	return m.Errors[0].Message, code
}

// maxHostileAlloc bounds what refusing the exploit may allocate, the
// whole gateway included (before the limits: 4.8 GiB).
const maxHostileAlloc = 10 << 20

// TestGraphQLHostileQuery: the overlapping-fields exploit over HTTP (POST
// with 4,000 repeats, GET with 1,500, which fits in the header limit) is
// refused before validation, with a bounded allocation.
func TestGraphQLHostileQuery(t *testing.T) {
	e := newEnv(t, nil)
	post := func() *http.Request {
		body, _ := json.Marshal(map[string]string{"query": hostileQuery(4000)})
		r := httptest.NewRequest(http.MethodPost, "/graphql", strings.NewReader(string(body)))
		r.Header.Set("Content-Type", "application/json")
		return r
	}
	get := func() *http.Request {
		return httptest.NewRequest(http.MethodGet, "/graphql?query="+url.QueryEscape(hostileQuery(1500)), nil)
	}
	for _, tc := range []struct {
		name string
		req  func() *http.Request
	}{{"POST", post}, {"GET", get}} {
		t.Run(tc.name, func(t *testing.T) {
			rec, alloc := serveAllocated(e.srv.Handler(), tc.req())
			msg, code := gqlResponseError(t, rec.Body.Bytes())
			if code != "query_limit" || !strings.Contains(msg, "--graphql-max-") {
				t.Errorf("error %q (code %q), want a query_limit naming its flag", msg, code)
			}
			if rec.Code == http.StatusOK {
				t.Errorf("status 200, want a refusal")
			}
			if alloc > maxHostileAlloc {
				t.Errorf("allocated %d MiB refusing it, want under %d MiB", alloc>>20, maxHostileAlloc>>20)
			}
		})
	}
}

// TestGraphQLHostileQueryWS: the same exploit over graphql-transport-ws
// (1,500 repeats: a 60 KB message, under the 64 KiB read limit) gets an
// error message for its operation id, with a bounded allocation; the
// connection lives on.
func TestGraphQLHostileQueryWS(t *testing.T) {
	e := newEnv(t, nil)
	cl := e.initGQL()
	b, _ := json.Marshal(map[string]any{"id": "x", "type": "subscribe", "payload": map[string]any{"query": hostileQuery(1500)}})
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	cl.send(string(b))
	m, raw := cl.pop()
	runtime.ReadMemStats(&after)
	errs, _ := m["payload"].([]any)
	if m["type"] != "error" || m["id"] != "x" || len(errs) != 1 {
		t.Fatalf("got %.300s, want one error for x", raw)
	}
	first, _ := errs[0].(map[string]any)
	ext, _ := first["extensions"].(map[string]any)
	if msg, _ := first["message"].(string); ext["code"] != "query_limit" || !strings.Contains(msg, "--graphql-max-") {
		t.Errorf("error %.300s, want a query_limit naming its flag", raw)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > maxHostileAlloc {
		t.Errorf("allocated %d MiB refusing it, want under %d MiB", alloc>>20, maxHostileAlloc>>20)
	}
	cl.gqlQuiet()
}

// gqlOutcome is what a GraphQL operation came to, whatever its transport:
// its data, or its first error's message, code and limit.
type gqlOutcome struct {
	data        string
	msg, code   string
	limit       string
	httpStatus  int
	wsErrorType bool // over WebSocket: an error message (not next)
}

// runGQL runs query over transport: POST, GET, graphql-transport-ws or
// graphql-ws.
func runGQL(t *testing.T, e *env, transport, query string) gqlOutcome {
	t.Helper()
	var m map[string]any
	var out gqlOutcome
	switch transport {
	case "POST", "GET":
		var resp *http.Response
		var err error
		if transport == "POST" {
			body, _ := json.Marshal(map[string]string{"query": query})
			resp, err = http.Post(e.http.URL+"/graphql", "application/json", strings.NewReader(string(body)))
		} else {
			resp, err = http.Get(e.http.URL + "/graphql?query=" + url.QueryEscape(query))
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		out.httpStatus = resp.StatusCode
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatalf("%s: not JSON (%v): %s", transport, err, b)
		}
	default:
		cl := e.dialGQL(transport)
		cl.send(`{"type":"connection_init"}`)
		cl.pop()
		start, typ := "subscribe", "next"
		if transport == "graphql-ws" {
			start, typ = "start", "data"
		}
		b, _ := json.Marshal(map[string]any{"id": "q", "type": start, "payload": map[string]any{"query": query}})
		cl.send(string(b))
		msg, raw := cl.pop()
		if msg["id"] != "q" {
			t.Fatalf("%s: got %s, want a message for q", transport, raw)
		}
		switch msg["type"] {
		case typ:
			m, _ = msg["payload"].(map[string]any)
		case "error":
			out.wsErrorType = true
			m = map[string]any{"errors": msg["payload"]}
			if obj, ok := msg["payload"].(map[string]any); ok { // graphql-ws: one error object
				m = map[string]any{"errors": []any{obj}}
			}
		default:
			t.Fatalf("%s: got %s", transport, raw)
		}
	}
	if errs, _ := m["errors"].([]any); len(errs) > 0 {
		first, _ := errs[0].(map[string]any)
		ext, _ := first["extensions"].(map[string]any)
		out.msg, _ = first["message"].(string)
		out.code, _ = ext["code"].(string)
		out.limit, _ = ext["limit"].(string)
		return out
	}
	d, _ := json.Marshal(m["data"])
	out.data = string(d)
	return out
}

var gqlTransports = []string{"POST", "GET", "graphql-transport-ws", "graphql-ws"}

// TestGraphQLQueryLimits: each query limit, set low, refuses a query one
// over it and lets one at it through, over HTTP POST and GET and both
// WebSocket subprotocols, with extensions code query_limit and limit, a
// message naming the flag, and a count in fanwire_graphql_refused_total.
func TestGraphQLQueryLimits(t *testing.T) {
	pad := func(q string, n int) string { return q + strings.Repeat(" ", n-len(q)) }
	for _, tc := range []struct {
		limit, flag string
		set         func(*gateway.Config)
		under, over string
	}{
		{"bytes", "--graphql-max-query-bytes", func(c *gateway.Config) { c.GraphQLMaxQueryBytes = 64 },
			pad("{ health { status } }", 64), pad("{ health { status } }", 65)},
		{"tokens", "--graphql-max-tokens", func(c *gateway.Config) { c.GraphQLMaxTokens = 6 },
			"{ health { status } }", "{ health { status ready } }"},
		{"depth", "--graphql-max-depth", func(c *gateway.Config) { c.GraphQLMaxDepth = 2 },
			"{ health { status } }", "{ __schema { queryType { name } } }"},
		{"depth through a fragment", "--graphql-max-depth", func(c *gateway.Config) { c.GraphQLMaxDepth = 2 },
			"{ ...F } fragment F on Query { health { status } }", "{ __schema { ...F } } fragment F on __Schema { queryType { name } }"},
		{"aliases", "--graphql-max-aliases", func(c *gateway.Config) { c.GraphQLMaxAliases = 2 },
			"{ a: health { status } b: health { ready } }", "{ a: health { status } b: health { ready } c: __typename }"},
		// health, status, ready: 3.
		{"complexity", "--graphql-max-complexity", func(c *gateway.Config) { c.GraphQLMaxComplexity = 3 },
			"{ health { status ready } }", "{ health { status ready connections } }"},
		// 2 health + 1 pair, 2 status + 1 pair: 6; with ready, 7.
		{"complexity of repeats", "--graphql-max-complexity", func(c *gateway.Config) { c.GraphQLMaxComplexity = 6 },
			"{ health { status } health { status } }", "{ health { status ready } health { status } }"},
		// The fragment's 2 fields, spread twice: 4 fields + 2 pairs.
		{"complexity of spreads", "--graphql-max-complexity", func(c *gateway.Config) { c.GraphQLMaxComplexity = 5 },
			"{ ...F } fragment F on Query { health { status } }", "{ ...F ...F } fragment F on Query { health { status } }"},
	} {
		t.Run(tc.limit, func(t *testing.T) {
			e := newEnv(t, tc.set)
			label := strings.Fields(tc.limit)[0]
			for _, tr := range gqlTransports {
				if got := runGQL(t, e, tr, tc.under); got.data == "" || got.code != "" {
					t.Errorf("%s, at the limit: %+v, want data", tr, got)
				}
				got := runGQL(t, e, tr, tc.over)
				if got.code != gateway.CodeQueryLimit || got.limit != label || !strings.Contains(got.msg, tc.flag) {
					t.Errorf("%s, over the limit: %+v, want query_limit %s naming %s", tr, got, label, tc.flag)
				}
				if tr == "POST" || tr == "GET" {
					if got.httpStatus != http.StatusUnprocessableEntity {
						t.Errorf("%s: status %d, want 422", tr, got.httpStatus)
					}
				} else if !got.wsErrorType {
					t.Errorf("%s: a next message, want an error message", tr)
				}
			}
			if n := e.metric("fanwire_graphql_refused_total", map[string]string{"limit": label}); n != float64(len(gqlTransports)) {
				t.Errorf("fanwire_graphql_refused_total{limit=%q} = %v, want %d", label, n, len(gqlTransports))
			}
			if n := e.metric("fanwire_client_errors_total", map[string]string{"code": gateway.CodeQueryLimit}); n != 2 {
				t.Errorf("fanwire_client_errors_total{code=query_limit} = %v, want 2", n)
			}
		})
	}
}

// TestGraphQLIntrospectionWithinDefaults: the full introspection query of
// graphql-js (every option on: what GraphiQL and graphql-ws tooling send)
// passes the default limits.
func TestGraphQLIntrospectionWithinDefaults(t *testing.T) {
	e := newEnv(t, nil)
	q, err := os.ReadFile("testdata/introspection.graphql")
	if err != nil {
		t.Fatal(err)
	}
	for _, tr := range gqlTransports {
		if got := runGQL(t, e, tr, string(q)); !strings.Contains(got.data, `"__schema"`) || got.code != "" {
			t.Errorf("%s: %+v, want the schema", tr, got)
		}
	}
}

// TestGraphQLBodyLimit: a POST /graphql body over GraphQLMaxBodyBytes gets
// 413 and a GraphQL error, code too_large, naming the flag; one at it is
// served.
func TestGraphQLBodyLimit(t *testing.T) {
	e := newEnv(t, func(c *gateway.Config) { c.GraphQLMaxBodyBytes = 100 })
	post := func(n int) (int, []byte) {
		body := `{"query":"{ health { status } }"` + strings.Repeat(" ", n-len(`{"query":"{ health { status } }"}`)) + `}`
		resp, err := http.Post(e.http.URL+"/graphql", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	if status, b := post(100); status != http.StatusOK || string(b) != `{"data":{"health":{"status":"ok"}}}` {
		t.Errorf("at the limit: %d %s", status, b)
	}
	status, b := post(101)
	msg, code := gqlResponseError(t, b)
	if status != http.StatusRequestEntityTooLarge || code != gateway.CodeTooLarge || !strings.Contains(msg, "--graphql-max-body-bytes") {
		t.Errorf("over the limit: %d %s", status, b)
	}
	if n := e.metric("fanwire_graphql_refused_total", map[string]string{"limit": "body"}); n != 1 {
		t.Errorf(`fanwire_graphql_refused_total{limit="body"} = %v, want 1`, n)
	}
}

// publishAliases is a mutation of n aliased publishes to subject.
func publishAliases(n int, subject string) string {
	var b strings.Builder
	b.WriteString("mutation {")
	for i := range n {
		fmt.Fprintf(&b, ` p%d:publish(subject:%q,data:%d){subject}`, i, subject, i)
	}
	b.WriteString(" }")
	return b.String()
}

// TestGraphQLPublishesCountAgainstTheMessageRate: over WebSocket, each
// publish of a mutation counts against --max-message-rate as a publish
// message would: 1,000 aliased publishes in one message at 1/s (burst 2,
// which connection_init and the message itself take) publish about one,
// and the others get rate_limited errors at their paths, in the
// operation's next message; that many client errors then close the
// connection with 1008, as the native protocol's would.
func TestGraphQLPublishesCountAgainstTheMessageRate(t *testing.T) {
	const n = 1000
	e := newEnv(t, func(c *gateway.Config) {
		c.MaxMessageRate = 1
		c.AllowAnonymousPublish = true
		c.GraphQLMaxAliases = n
		c.GraphQLMaxComplexity = 4 * n
		c.GraphQLMaxTokens = 20 * n
		c.GraphQLMaxQueryBytes = 64 << 10
	})
	cl := e.initGQL()
	b, _ := json.Marshal(map[string]any{"id": "m", "type": "subscribe", "payload": map[string]any{"query": publishAliases(n, "chat.x")}})
	start := time.Now()
	cl.send(string(b))
	m, raw := cl.popWithin(30 * time.Second)
	elapsed := time.Since(start)
	payload, _ := m["payload"].(map[string]any)
	errs, _ := payload["errors"].([]any)
	if m["type"] != "next" || m["id"] != "m" || len(errs) == 0 {
		t.Fatalf("got %.300s, want a next message for m with errors", raw)
	}
	for _, x := range errs {
		e, _ := x.(map[string]any)
		ext, _ := e["extensions"].(map[string]any)
		path, _ := e["path"].([]any)
		if ext["code"] != gateway.CodeRateLimited || len(path) != 1 || !strings.Contains(e["message"].(string), "--max-message-rate") {
			t.Fatalf("error %v, want rate_limited at an alias naming --max-message-rate", e)
		}
	}
	// The first publish rides on the message; the rest need a token each,
	// and the bucket is empty: one more per second elapsed at most.
	if published := n - len(errs); published > 1+int(elapsed.Seconds())+1 {
		t.Errorf("%d of %d publishes went through in %v at 1 message/s", published, n, elapsed)
	}
	if got := cl.nextRaw(); got != `{"id":"m","type":"complete"}` {
		t.Fatalf("got %s, want complete", got)
	}
	if code := cl.closeStatus(10 * time.Second); code != websocket.StatusPolicyViolation {
		t.Errorf("close %v, want 1008 (too many client errors)", code)
	}
	if got := e.metric("fanwire_client_errors_total", map[string]string{"code": gateway.CodeRateLimited}); got != float64(len(errs)) {
		t.Errorf("rate_limited counted %v, want %d", got, len(errs))
	}
}

// TestGraphQLPublishBatchOverHTTP: over HTTP a mutation carries at most
// as many publishes as a POST /api/publish request carries events
// (10,000): one more refuses the whole operation before any publish, and
// the request's credential is verified once, not once per publish.
func TestGraphQLPublishBatchOverHTTP(t *testing.T) {
	var auths atomic.Int64
	e, token := publishTokens(t, func(c *gateway.Config) {
		grant := c.Authenticate
		c.Authenticate = func(ctx context.Context, r *http.Request, p json.RawMessage) (*auth.Grants, error) {
			auths.Add(1)
			return grant(ctx, r, p)
		}
		c.GraphQLMaxAliases = 20_000
		c.GraphQLMaxComplexity = 50_000
		c.GraphQLMaxTokens = 200_000
		c.GraphQLMaxQueryBytes = 1 << 20
	})
	pub := token(jwt.MapClaims{"publish": []any{"chat.>"}})
	ext := gqlFirstError(e.postGraphQL(pub, publishAliases(10_001, "chat.x")))
	if ext["code"] != "bad_request" || ext["limit"] != "publishes" || !strings.Contains(fmt.Sprint(ext["message"]), "10000") {
		t.Errorf("10,001 publishes: %v, want bad_request naming 10000", ext)
	}
	if n := e.metric("fanwire_published_events_total", nil); n != 0 {
		t.Errorf("%v events published, want none", n)
	}
	auths.Store(0)
	m := e.postGraphQL(pub, publishAliases(50, "chat.x"))
	if ext := gqlFirstError(m); ext != nil {
		t.Fatalf("50 publishes: %v", ext)
	}
	if n := e.metric("fanwire_published_events_total", nil); n != 50 {
		t.Errorf("%v events published, want 50", n)
	}
	if n := auths.Load(); n != 1 {
		t.Errorf("credential verified %d times for one request, want once", n)
	}
}
