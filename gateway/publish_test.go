package gateway_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/fanwire/fanwire/gateway"
	"github.com/fanwire/fanwire/gateway/auth"
	"github.com/golang-jwt/jwt/v5"
)

// Publishing through the gateway, closed by default: POST /api/publish,
// the native publish message and the GraphQL publish mutation, each
// refusal and each success against a real gateway.

// publishReply is POST /api/publish's answer, success or refusal.
type publishReply struct {
	status int
	Error  string   `json:"error"`
	Code   string   `json:"code"`
	Rule   string   `json:"rule"`
	Subj   string   `json:"subject"`
	Count  int      `json:"published"`
	Curs   []string `json:"cursors"`
	raw    string
}

// postPublish POSTs body to /api/publish with "Authorization: Bearer
// <bearer>" (none when empty).
func (e *env) postPublish(bearer, body string) publishReply {
	e.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, e.http.URL+"/api/publish", strings.NewReader(body))
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var r publishReply
	if err := json.Unmarshal(b, &r); err != nil {
		e.t.Fatalf("answer %q is not JSON: %v", b, err)
	}
	r.status, r.raw = resp.StatusCode, string(b)
	return r
}

// postGraphQL POSTs a GraphQL operation to /graphql with a bearer.
func (e *env) postGraphQL(bearer, query string) map[string]any {
	e.t.Helper()
	body, _ := json.Marshal(map[string]any{"query": query})
	req, _ := http.NewRequest(http.MethodPost, e.http.URL+"/graphql", strings.NewReader(string(body)))
	req.Header.Set("Content-Type", "application/json")
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	var m map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
		e.t.Fatal(err)
	}
	return m
}

// gqlFirstError returns the first error's extensions of a GraphQL response
// (nil when it has none).
func gqlFirstError(m map[string]any) map[string]any {
	errs, _ := m["errors"].([]any)
	if len(errs) == 0 {
		return nil
	}
	first, _ := errs[0].(map[string]any)
	ext, _ := first["extensions"].(map[string]any)
	if ext == nil {
		ext = map[string]any{}
	}
	ext["message"] = first["message"]
	return ext
}

// dialToken connects to /ws with a token (none when empty).
func (e *env) dialToken(tok string) *client {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	u := e.wsURL()
	if tok != "" {
		u += "?token=" + tok
	}
	c, _, err := websocket.Dial(ctx, u, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	c.SetReadLimit(64 << 20)
	e.t.Cleanup(func() { _ = c.CloseNow() })
	cl := &client{t: e.t, c: c}
	cl.expect(map[string]any{"type": "ready"})
	return cl
}

// publishWS sends a native publish and returns the reply (published, or
// an error), which must carry the message's id.
func (cl *client) publishWS(id, subject, data string) map[string]any {
	cl.t.Helper()
	b, _ := json.Marshal(map[string]any{"type": "publish", "id": id, "subject": subject, "data": json.RawMessage(data)})
	cl.send(string(b))
	m := cl.next()
	if m["id"] != id || (m["type"] != "published" && m["type"] != "error") {
		cl.t.Fatalf("publish %s: reply %v, want published or an error with id %s", id, m, id)
	}
	return m
}

// wantRefused checks an error reply's code and that its message names
// the subject.
func wantRefused(t *testing.T, m map[string]any, code, subject string) {
	t.Helper()
	msg, _ := m["message"].(string)
	if m["type"] != "error" || m["code"] != code || !strings.Contains(msg, subject) {
		t.Fatalf("reply %v, want error %s naming %s", m, code, subject)
	}
}

// TestPublishClosedByDefault: with no publish credential and no
// --allow-anonymous-publish, POST /api/publish is 403 publish_disabled
// naming the flags (whatever bearer comes with it), a connection's publish
// is forbidden, and so is the mutation; nothing is published.
func TestPublishClosedByDefault(t *testing.T) {
	e := newEnv(t, nil)
	watcher := e.dial()
	watcher.subscribe("all", ">")
	for _, bearer := range []string{"", "some-key"} {
		r := e.postPublish(bearer, `{"subject":"orders.1","data":1}`)
		if r.status != http.StatusForbidden || r.Code != gateway.CodePublishDisabled {
			t.Fatalf("bearer %q: %d %s, want 403 publish_disabled", bearer, r.status, r.raw)
		}
		for _, flag := range []string{"--api-key", "--api-keys-file", "--allow-anonymous-publish", "--jwt-secret-file"} {
			if !strings.Contains(r.Error, flag) {
				t.Errorf("refusal %q does not name %s", r.Error, flag)
			}
		}
	}
	if n := e.metric("fanwire_publish_requests_total", map[string]string{"result": gateway.CodePublishDisabled}); n != 2 {
		t.Fatalf("publish_disabled counted %v, want 2", n)
	}
	cl := e.dial()
	m := cl.publishWS("p1", "orders.1", `{"n":1}`)
	if m["code"] != gateway.CodeForbidden || !strings.Contains(m["message"].(string), "--allow-anonymous-publish") {
		t.Fatalf("anonymous connection's publish: %v, want forbidden naming --allow-anonymous-publish", m)
	}
	if ext := gqlFirstError(e.postGraphQL("", `mutation { publish(subject: "orders.1", data: 1) { subject } }`)); ext["code"] != gateway.CodePublishDisabled {
		t.Fatalf("mutation: %v, want publish_disabled", ext)
	}
	watcher.quiet()
}

// TestPublishAnonymous: --allow-anonymous-publish opens publishing to
// anyone (HTTP without a credential, connections without a token), but
// never on the reserved subjects.
func TestPublishAnonymous(t *testing.T) {
	e := newEnv(t, func(c *gateway.Config) { c.AllowAnonymousPublish = true })
	watcher := e.dial()
	watcher.subscribe("all", ">")
	if r := e.postPublish("", `{"subject":"orders.1","data":1}`); r.status != 200 || r.Count != 1 {
		t.Fatalf("anonymous HTTP publish: %d %s", r.status, r.raw)
	}
	watcher.expect(map[string]any{"type": "event", "subject": "orders.1"})
	r := e.postPublish("", `[{"subject":"orders.2","data":2},{"subject":"db.orders.42","data":{"status":"refunded"}}]`)
	if r.status != http.StatusForbidden || r.Code != gateway.CodeForbidden || r.Rule != "reserved_subjects" || r.Subj != "db.orders.42" || !strings.Contains(r.Error, "db.>") {
		t.Fatalf("anonymous publish on db.orders.42: %d %s, want 403 naming the subject and the reserved_subjects rule", r.status, r.raw)
	}
	cl := e.dial()
	if m := cl.publishWS("p1", "orders.3", `{"n":3}`); m["type"] != "published" {
		t.Fatalf("anonymous connection's publish: %v", m)
	}
	wantRefused(t, cl.publishWS("p2", "db.orders.42", `{}`), gateway.CodeForbidden, "db.orders.42")
	watcher.expect(map[string]any{"type": "event", "subject": "orders.3"})
	watcher.quiet() // nothing of the refused publishes
}

// TestPublishKeysAndReservedSubjects: API keys publish inside their
// patterns; a reserved subject (db.>) only through a key pattern that
// lies inside the reserved space, never through a key without patterns,
// ">" or "*.orders.>"; a wrong or missing key is 401. With no reserved
// subjects, a key publishing anywhere reaches db.> too.
func TestPublishKeysAndReservedSubjects(t *testing.T) {
	keys := []gateway.APIKey{
		{Name: "admin", Key: "k-admin-0123456789"},
		{Name: "wide", Key: "k-wide-0123456789", Publish: []string{">"}},
		{Name: "star", Key: "k-star-0123456789", Publish: []string{"*.orders.>"}},
		{Name: "audit", Key: "k-audit-0123456789", Publish: []string{"db.audit.>", "app.*"}},
	}
	e := newEnv(t, func(c *gateway.Config) { c.APIKeys = keys })
	watcher := e.dial()
	watcher.subscribe("all", ">")
	for _, tc := range []struct {
		key, subject string
		status       int
		code, rule   string
	}{
		{"", "app.1", 401, "unauthorized", ""},
		{"k-wrong", "app.1", 401, "unauthorized", ""},
		{"k-admin-0123456789", "db.orders.1", 403, "forbidden", "reserved_subjects"},
		{"k-wide-0123456789", "db.orders.1", 403, "forbidden", "reserved_subjects"},
		{"k-star-0123456789", "db.orders.1", 403, "forbidden", "reserved_subjects"},
		{"k-audit-0123456789", "db.orders.1", 403, "forbidden", "reserved_subjects"},
		{"k-audit-0123456789", "billing.1", 403, "forbidden", "publish_patterns"},
		{"k-audit-0123456789", "app.1.2", 403, "forbidden", "publish_patterns"},
		{"k-admin-0123456789", "app.*", 400, "bad_subject", "subject_syntax"},
		{"k-admin-0123456789", "app.ok", 200, "", ""},
		{"k-wide-0123456789", "billing.ok", 200, "", ""},
		{"k-star-0123456789", "x.orders.ok", 200, "", ""},
		{"k-audit-0123456789", "db.audit.ok", 200, "", ""},
		{"k-audit-0123456789", "app.ok2", 200, "", ""},
	} {
		r := e.postPublish(tc.key, `{"subject":"`+tc.subject+`","data":{}}`)
		if r.status != tc.status || r.Code != tc.code || r.Rule != tc.rule {
			t.Errorf("key %q → %s: %d %s, want %d %s %s", tc.key, tc.subject, r.status, r.raw, tc.status, tc.code, tc.rule)
		}
		if tc.status == 403 && (r.Subj != tc.subject || !strings.Contains(r.Error, tc.subject) || strings.Contains(r.raw, "k-")) {
			t.Errorf("key %q → %s: refusal %s must name the subject, never the key", tc.key, tc.subject, r.raw)
		}
	}
	for _, s := range []string{"app.ok", "billing.ok", "x.orders.ok", "db.audit.ok", "app.ok2"} {
		watcher.expect(map[string]any{"type": "event", "subject": s})
	}
	watcher.quiet()
	if n := e.metric("fanwire_publish_requests_total", map[string]string{"result": "forbidden"}); n != 6 {
		t.Fatalf("forbidden counted %v, want 6", n)
	}

	open := newEnv(t, func(c *gateway.Config) { c.APIKeys = keys; c.ReservedSubjects = []string{} })
	if r := open.postPublish("k-admin-0123456789", `{"subject":"db.orders.1","data":{}}`); r.status != 200 {
		t.Fatalf("no reserved subjects: %d %s", r.status, r.raw)
	}
}

// publishTokens is a gateway with JWT authentication whose tokens may
// publish, and a token maker.
func publishTokens(t *testing.T, mutate func(*gateway.Config)) (*env, func(claims jwt.MapClaims) string) {
	t.Helper()
	a, err := auth.NewJWTAuth(auth.JWTConfig{SecretFile: writeFile(t, "secret", testSecret), AllowAnonymous: true})
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, func(c *gateway.Config) {
		c.Authenticate = a.Grant
		c.PublishTokens = true
		c.MaxPublishBytes = 1024
		if mutate != nil {
			mutate(c)
		}
	})
	token := func(claims jwt.MapClaims) string {
		c := jwt.MapClaims{"sub": "u1", "tenant": "acme", "exp": time.Now().Add(time.Hour).Unix(), "subscribe": []any{">"}}
		for k, v := range claims {
			c[k] = v
		}
		return sign(t, jwt.SigningMethodHS256, []byte(testSecret), "", c)
	}
	return e, token
}

// TestPublishTokenGrants: a token's publish claim ({claim} substituted)
// publishes over HTTP, over the native protocol and through the GraphQL
// mutation (WebSocket and HTTP); a token without the claim, a subject
// outside it, a reserved subject outside it, a wildcard and oversized data
// are refused, each with its code, the subject and the message's id.
func TestPublishTokenGrants(t *testing.T) {
	e, token := publishTokens(t, nil)
	pub := token(jwt.MapClaims{"publish": []any{"chat.{tenant}.>", "db.{tenant}.>"}})
	none := token(nil)
	watcher := e.dialToken(pub)
	watcher.subscribe("all", ">")

	// HTTP.
	for _, tc := range []struct {
		bearer, subject string
		status          int
		code, rule      string
	}{
		{"", "chat.acme.1", 401, "unauthorized", ""},
		{"not-a-token", "chat.acme.1", 401, "unauthorized", ""},
		{none, "chat.acme.1", 403, "forbidden", "no_publish_grant"},
		{pub, "chat.other.1", 403, "forbidden", "publish_patterns"},
		{pub, "db.other.1", 403, "forbidden", "reserved_subjects"},
		{pub, "chat.acme.http", 200, "", ""},
		{pub, "db.acme.http", 200, "", ""}, // db.acme.> lies inside db.>: explicit
	} {
		r := e.postPublish(tc.bearer, `{"subject":"`+tc.subject+`","data":{"via":"http"}}`)
		if r.status != tc.status || r.Code != tc.code || r.Rule != tc.rule {
			t.Errorf("bearer %.12s… → %s: %d %s, want %d %s %s", tc.bearer, tc.subject, r.status, r.raw, tc.status, tc.code, tc.rule)
		}
	}
	if r := e.postPublish(pub, `{"subject":"chat.acme.big","data":"`+strings.Repeat("x", 2048)+`"}`); r.status != http.StatusRequestEntityTooLarge || r.Code != "too_large" {
		t.Errorf("oversized body: %d %s", r.status, r.raw)
	}
	watcher.expect(map[string]any{"type": "event", "subject": "chat.acme.http"})
	watcher.expect(map[string]any{"type": "event", "subject": "db.acme.http"})

	// The native protocol.
	cl := e.dialToken(pub)
	if m := cl.publishWS("p1", "chat.acme.ws", `{"via":"ws"}`); m["type"] != "published" {
		t.Fatalf("publish inside the grant: %v", m)
	}
	if m := cl.publishWS("p2", "db.acme.ws", `[1,2,3]`); m["type"] != "published" {
		t.Fatalf("publish on a reserved subject the grant names: %v", m)
	}
	wantRefused(t, cl.publishWS("p3", "chat.other.ws", `1`), gateway.CodeForbidden, "chat.other.ws")
	wantRefused(t, cl.publishWS("p4", "db.orders.ws", `1`), gateway.CodeForbidden, "db.orders.ws")
	wantRefused(t, cl.publishWS("p5", "chat.acme.*", `1`), gateway.CodeBadSubject, "chat.acme.*")
	wantRefused(t, cl.publishWS("p6", "chat.acme.big", `"`+strings.Repeat("x", 2048)+`"`), gateway.CodeTooLarge, "")
	nogrant := e.dialToken(none)
	wantRefused(t, nogrant.publishWS("n1", "chat.acme.ws", `1`), gateway.CodeForbidden, "chat.acme.ws")
	anon := e.dialToken("")
	wantRefused(t, anon.publishWS("a1", "chat.acme.ws", `1`), gateway.CodeForbidden, "--allow-anonymous-publish")
	watcher.expect(map[string]any{"type": "event", "subject": "chat.acme.ws", "data": map[string]any{"via": "ws"}})
	watcher.expect(map[string]any{"type": "event", "subject": "db.acme.ws", "data": []int{1, 2, 3}})

	// GraphQL over WebSocket: the connection's token.
	g := e.dialGQL()
	g.send(`{"type":"connection_init","payload":{"token":"` + pub + `"}}`)
	if raw := g.nextRaw(); raw != `{"type":"connection_ack"}` {
		t.Fatalf("got %s", raw)
	}
	g.send(`{"id":"m1","type":"subscribe","payload":{"query":"mutation($d: JSON!) { publish(subject: \"chat.acme.gql\", data: $d) { subject cursor } }","variables":{"d":{"via":"gql","n":1.5}}}}`)
	if got := g.nextRaw(); got != `{"id":"m1","type":"next","payload":{"data":{"publish":{"subject":"chat.acme.gql","cursor":null}}}}` {
		t.Fatalf("mutation: %s", got)
	}
	if got := g.nextRaw(); got != `{"id":"m1","type":"complete"}` {
		t.Fatalf("mutation: %s", got)
	}
	g.send(`{"id":"m2","type":"subscribe","payload":{"query":"mutation { publish(subject: \"db.orders.1\", data: {status: \"refunded\"}) { subject } }"}}`)
	m, raw := g.pop()
	payload, _ := m["payload"].(map[string]any)
	if ext := gqlFirstError(payload); m["type"] != "next" || ext["code"] != gateway.CodeForbidden || ext["rule"] != "reserved_subjects" || ext["subject"] != "db.orders.1" {
		t.Fatalf("mutation on a reserved subject: %s", raw)
	}
	if got := g.nextRaw(); got != `{"id":"m2","type":"complete"}` {
		t.Fatalf("got %s", got)
	}
	watcher.expect(map[string]any{"type": "event", "subject": "chat.acme.gql", "data": map[string]any{"via": "gql", "n": 1.5}})

	// GraphQL over HTTP: the request's bearer.
	mut := `mutation { publish(subject: "chat.acme.post", data: [true]) { subject } }`
	if m := e.postGraphQL(pub, mut); !jsonEqual(m, map[string]any{"data": map[string]any{"publish": map[string]any{"subject": "chat.acme.post"}}}) {
		t.Fatalf("mutation over HTTP: %v", m)
	}
	if ext := gqlFirstError(e.postGraphQL(none, mut)); ext["code"] != gateway.CodeForbidden || ext["rule"] != "no_publish_grant" {
		t.Fatalf("mutation with a token without publish: %v", ext)
	}
	if ext := gqlFirstError(e.postGraphQL("", mut)); ext["code"] != "unauthorized" {
		t.Fatalf("mutation without a credential: %v", ext)
	}
	if ext := gqlFirstError(e.postGraphQL(pub, `mutation { publish(subject: "chat.acme.big", data: "`+strings.Repeat("x", 2048)+`") { subject } }`)); ext["code"] != gateway.CodeTooLarge {
		t.Fatalf("oversized mutation: %v", ext)
	}
	watcher.expect(map[string]any{"type": "event", "subject": "chat.acme.post", "data": []bool{true}})
	watcher.quiet()
	if n := e.metric("fanwire_published_events_total", nil); n != 6 {
		t.Fatalf("published events counted %v, want 6", n)
	}
}

// TestClientPublishRateLimit: publishes count against the connection's
// message rate like any message; one over it is dropped with rate_limited
// carrying its id, and the connection goes on.
func TestClientPublishRateLimit(t *testing.T) {
	e := newEnv(t, func(c *gateway.Config) {
		c.AllowAnonymousPublish = true
		c.MaxMessageRate = 5
		c.MaxClientErrors = 1000
	})
	watcher := e.dial()
	watcher.subscribe("all", "burst.>")
	cl := e.dial()
	const n = 30
	start := time.Now()
	for i := range n {
		b, _ := json.Marshal(map[string]any{"type": "publish", "id": "p" + strconv.Itoa(i), "subject": "burst." + strconv.Itoa(i), "data": i})
		cl.send(string(b))
	}
	published, limited := 0, 0
	seen := map[string]bool{}
	for published+limited < n {
		m := cl.next()
		id, _ := m["id"].(string)
		if seen[id] || !strings.HasPrefix(id, "p") {
			t.Fatalf("reply %v: id missing or repeated", m)
		}
		seen[id] = true
		switch {
		case m["type"] == "published":
			published++
		case m["type"] == "error" && m["code"] == gateway.CodeRateLimited:
			limited++
		default:
			t.Fatalf("unexpected %v", m)
		}
	}
	// A burst of 10, then 5 a second for as long as the burst took.
	if most := 10 + int(5*time.Since(start).Seconds()) + 1; published < 10 || published > most || limited == 0 {
		t.Fatalf("%d published and %d rate_limited of %d at 5/s (burst 10), want 10 to %d published", published, limited, n, most)
	}
	for range published {
		watcher.expect(map[string]any{"type": "event"})
	}
	watcher.quiet()
}

// TestClientPublishCursor: on durable brokers published carries the
// event's cursor, the one its delivery carries.
func TestClientPublishCursor(t *testing.T) {
	for _, kind := range []string{"jetstream", "redis"} {
		t.Run(kind, func(t *testing.T) {
			e := newEnvOn(t, kind, func(c *gateway.Config) {
				c.Subjects = []string{"orders.>", "app.>"}
				c.AllowAnonymousPublish = true
			})
			watcher := e.dial()
			watcher.subscribe("s", "app.>")
			cl := e.dial()
			m := cl.publishWS("p1", "app.1", `{"n":1}`)
			cursor, _ := m["cursor"].(string)
			if m["type"] != "published" || cursor == "" {
				t.Fatalf("publish on %s: %v, want a cursor", kind, m)
			}
			watcher.expect(map[string]any{"type": "event", "subject": "app.1", "cursor": cursor})
		})
	}
}

// TestPublishOverMailboxBytes: an event that would not fit in an empty
// mailbox (MailboxBytes) is refused at publish, naming the limit, over
// every way to publish; before, it was published and every subscriber was
// closed with 4008 (and met it again on every resume). A body within
// MaxPublishBytes can make such an event: the event's framing is larger
// than the request's.
func TestPublishOverMailboxBytes(t *testing.T) {
	e := newEnv(t, func(c *gateway.Config) {
		c.MailboxBytes, c.MaxPublishBytes = 4096, 4096
		c.AllowAnonymousPublish = true
	})
	watcher := e.dial()
	watcher.subscribe("w", ">")
	big := `"` + strings.Repeat("x", 4058) + `"` // 4,060 bytes: a 4,089-byte body, a 4,112-byte event

	r := e.postPublish("", `{"subject":"big.http","data":`+big+`}`)
	if r.status != http.StatusRequestEntityTooLarge || r.Code != "too_large" || !strings.Contains(r.Error, "4096") || !strings.Contains(r.Error, "--mailbox-bytes") {
		t.Errorf("POST /api/publish: %d %s, want 413 too_large naming the 4096 bytes of --mailbox-bytes", r.status, r.raw)
	}
	if r := e.postPublish("", `[{"subject":"ok.http","data":1},{"subject":"big.http","data":`+big+`}]`); r.status != http.StatusRequestEntityTooLarge || r.Code != "too_large" {
		t.Errorf("POST /api/publish of a batch: %d %s, want 413 too_large", r.status, r.raw)
	}

	cl := e.dial()
	wantRefused(t, cl.publishWS("p1", "big.ws", big), gateway.CodeTooLarge, "--mailbox-bytes")

	if ext := gqlFirstError(e.postGraphQL("", `mutation { publish(subject: "big.gql", data: `+big+`) { subject } }`)); ext["code"] != gateway.CodeTooLarge {
		t.Errorf("GraphQL publish mutation: %v, want too_large", ext)
	}

	// Nothing was published; the watcher is still here and gets the next.
	if r := e.postPublish("", `{"subject":"small","data":1}`); r.status != http.StatusOK {
		t.Fatalf("small publish: %d %s", r.status, r.raw)
	}
	watcher.expect(map[string]any{"type": "event", "subject": "small"})
	watcher.quiet()
}
