package gateway_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/fanwire/fanwire/gateway"
	"github.com/fanwire/fanwire/gateway/auth"
	"github.com/fanwire/fanwire/subject"
	"github.com/golang-jwt/jwt/v5"
)

const testSecret = "0123456789abcdef0123456789abcdef-test-secret"

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func b64(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

// jwksFor writes a JWKS holding the public halves of rk (kid "r1") and ek
// (kid "e1").
func jwksFor(t *testing.T, rk *rsa.PrivateKey, ek *ecdsa.PrivateKey) string {
	t.Helper()
	pad := func(b []byte) []byte { return append(make([]byte, 32-len(b)), b...) }
	set := map[string]any{"keys": []map[string]string{
		{"kty": "RSA", "kid": "r1", "use": "sig", "n": b64(rk.N.Bytes()), "e": b64(big.NewInt(int64(rk.E)).Bytes())},
		{"kty": "EC", "kid": "e1", "crv": "P-256", "x": b64(pad(ek.X.Bytes())), "y": b64(pad(ek.Y.Bytes()))},
	}}
	b, _ := json.Marshal(set)
	return writeFile(t, "jwks.json", string(b))
}

func sign(t *testing.T, method jwt.SigningMethod, key any, kid string, claims jwt.MapClaims) string {
	t.Helper()
	tok := jwt.NewWithClaims(method, claims)
	if kid != "" {
		tok.Header["kid"] = kid
	}
	s, err := tok.SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestJWTAuth: tokens signed with HS256, RS256 and ES256 are verified
// (exp, nbf, iss, aud, algorithm), found in each place a client may put
// them, and their subscribe claim becomes grants with claims substituted.
func TestJWTAuth(t *testing.T) {
	rk, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	ek, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	a, err := auth.NewJWTAuth(auth.JWTConfig{
		SecretFile: writeFile(t, "secret", testSecret+"\n"),
		JWKSFile:   jwksFor(t, rk, ek),
		Issuer:     "https://issuer.example", Audience: "fanwire",
	})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	good := func(extra jwt.MapClaims) jwt.MapClaims {
		c := jwt.MapClaims{"sub": "u1", "tenant": "acme", "iss": "https://issuer.example", "aud": "fanwire",
			"exp": now.Add(time.Hour).Unix(), "subscribe": []any{"orders.{tenant}.>", "public.>", "users.{sub}", "bad.{nope}", "x.{evil}"}, "evil": "a.>",
			"publish": []any{"chat.{tenant}.>", "db.{sub}.*", "bad.{nope}", 7, "x.{evil}"}}
		for k, v := range extra {
			c[k] = v
		}
		return c
	}
	req := func(header, query string) *http.Request {
		r := httptest.NewRequest("GET", "/ws"+query, nil)
		if header != "" {
			r.Header.Set("Authorization", header)
		}
		return r
	}
	hs := sign(t, jwt.SigningMethodHS256, []byte(testSecret), "", good(nil))
	for name, tc := range map[string]struct {
		r       *http.Request
		payload string
	}{
		"bearer header": {req("Bearer "+hs, ""), ""},
		"query":         {req("", "?token="+hs), ""},
		"init payload":  {req("", ""), `{"token":"` + hs + `"}`},
		"authToken":     {req("", ""), `{"authToken":"Bearer ` + hs + `"}`},
	} {
		g, err := a.Grant(context.Background(), tc.r, json.RawMessage(tc.payload))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		want := []string{"orders.acme.>", "public.>", "users.u1"}
		if strings.Join(g.Subscribe, " ") != strings.Join(want, " ") || g.Subject != "u1" || g.Expires.IsZero() || g.Anonymous {
			t.Fatalf("%s: grants %+v, want %v", name, g, want)
		}
		if got := strings.Join(g.Publish, " "); got != "chat.acme.> db.u1.*" {
			t.Fatalf("%s: publish grants %q, want chat.acme.> db.u1.*", name, got)
		}
		for p, ok := range map[string]bool{"orders.acme.*": true, "orders.acme.>": true, "orders.other.1": false, "orders.>": false, "public.x.y": true, "users.u1": true, "users.u2": false, "a.b": false, ">": false} {
			if g.Allows(p) != ok {
				t.Errorf("%s: Allows(%q) = %v, want %v", name, p, !ok, ok)
			}
		}
	}
	for _, tc := range []struct {
		name string
		tok  string
	}{
		{"RS256", sign(t, jwt.SigningMethodRS256, rk, "r1", good(nil))},
		{"ES256", sign(t, jwt.SigningMethodES256, ek, "e1", good(nil))},
	} {
		if _, err := a.Grant(context.Background(), req("Bearer "+tc.tok, ""), nil); err != nil {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
	other, _ := rsa.GenerateKey(rand.Reader, 2048)
	for _, tc := range []struct {
		name string
		tok  string
	}{
		{"expired", sign(t, jwt.SigningMethodHS256, []byte(testSecret), "", good(jwt.MapClaims{"exp": now.Add(-time.Hour).Unix()}))},
		{"no exp", sign(t, jwt.SigningMethodHS256, []byte(testSecret), "", good(jwt.MapClaims{"exp": nil}))},
		{"not yet", sign(t, jwt.SigningMethodHS256, []byte(testSecret), "", good(jwt.MapClaims{"nbf": now.Add(time.Hour).Unix()}))},
		{"issuer", sign(t, jwt.SigningMethodHS256, []byte(testSecret), "", good(jwt.MapClaims{"iss": "https://evil.example"}))},
		{"audience", sign(t, jwt.SigningMethodHS256, []byte(testSecret), "", good(jwt.MapClaims{"aud": "other"}))},
		{"wrong secret", sign(t, jwt.SigningMethodHS256, []byte(testSecret+"x"), "", good(nil))},
		{"unknown key", sign(t, jwt.SigningMethodRS256, other, "r1", good(nil))},
		{"unsupported alg", sign(t, jwt.SigningMethodHS512, []byte(testSecret), "", good(nil))},
		{"alg none", sign(t, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, "", good(nil))},
		{"garbage", "not.a.token"},
	} {
		if _, err := a.Grant(context.Background(), req("Bearer "+tc.tok, ""), nil); err == nil {
			t.Errorf("%s: accepted", tc.name)
		}
	}
	if _, err := a.Grant(context.Background(), req("", ""), nil); err == nil {
		t.Error("no token: accepted without AllowAnonymous")
	}
	anon, err := auth.NewJWTAuth(auth.JWTConfig{SecretFile: writeFile(t, "s", testSecret), AllowAnonymous: true, AnonymousGrants: []string{"public.>"}})
	if err != nil {
		t.Fatal(err)
	}
	g, err := anon.Grant(context.Background(), req("", ""), nil)
	if err != nil || !g.Allows("public.news") || g.Allows("orders.1") || !g.Anonymous || g.Publish != nil {
		t.Fatalf("anonymous grants %+v, %v", g, err)
	}
	if _, err := auth.NewJWTAuth(auth.JWTConfig{SecretFile: writeFile(t, "short", "short")}); err == nil {
		t.Error("a 5-byte secret accepted")
	}
}

// TestGrantsEnforced: on a gateway with token authentication, a
// subscription outside the token's grants is refused with forbidden and
// the connection stays; one inside is served; a connection without a token
// is refused before the upgrade (native) or with 4403 (GraphQL).
func TestGrantsEnforced(t *testing.T) {
	a, err := auth.NewJWTAuth(auth.JWTConfig{SecretFile: writeFile(t, "secret", testSecret)})
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, func(c *gateway.Config) { c.Authenticate = a.Grant })
	tok := sign(t, jwt.SigningMethodHS256, []byte(testSecret), "", jwt.MapClaims{"sub": "u1", "tenant": "acme", "exp": time.Now().Add(time.Hour).Unix(), "subscribe": []any{"orders.{tenant}.>"}})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	expectRefused(t, ctx, e.wsURL(), "unauthorized: ")
	c, _, err := websocket.Dial(ctx, e.wsURL()+"?token="+tok, nil)
	if err != nil {
		t.Fatal(err)
	}
	cl := &client{t: t, c: c}
	t.Cleanup(func() { _ = c.CloseNow() })
	cl.expect(map[string]any{"type": "ready"})
	cl.send(`{"type":"subscribe","id":"x","subject":"orders.other.>"}`)
	cl.expect(map[string]any{"type": "error", "id": "x", "code": gateway.CodeForbidden})
	cl.subscribe("ok", "orders.acme.*")
	e.publish("orders.acme.1", `{"n":1}`)
	cl.expect(map[string]any{"type": "event", "subject": "orders.acme.1"})
	// GraphQL: the token in connection_init; forbidden is an operation error.
	g := e.dialGQL()
	g.send(`{"type":"connection_init","payload":{"token":"` + tok + `"}}`)
	if raw := g.nextRaw(); raw != `{"type":"connection_ack"}` {
		t.Fatalf("got %s", raw)
	}
	g.gqlSubscribe("f", "orders.>", nil)
	if code := g.gqlErrorCode("f"); code != gateway.CodeForbidden {
		t.Fatalf("code %q", code)
	}
	g.gqlQuiet()
	n := e.dialGQL()
	n.send(`{"type":"connection_init","payload":{}}`)
	if got := n.closeStatus(5 * time.Second); got != gateway.CloseForbidden {
		t.Fatalf("GraphQL without a token: close %d, want 4403", got)
	}
}

// TestTokenExpiryAndRefresh: a connection whose token expires is closed
// with 4001, unless it sent a refresh with a new token in time; a refused
// refresh is an unauthorized error and changes nothing. The reply and the
// error carry the refresh's id when it had one.
func TestTokenExpiryAndRefresh(t *testing.T) {
	if testing.Short() {
		t.Skip("-short (make test-quick) leaves out the slow tests: make test runs them")
	}
	a, err := auth.NewJWTAuth(auth.JWTConfig{SecretFile: writeFile(t, "secret", testSecret)})
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, func(c *gateway.Config) { c.Authenticate = a.Grant })
	token := func(exp time.Time, grants ...any) string {
		return sign(t, jwt.SigningMethodHS256, []byte(testSecret), "", jwt.MapClaims{"sub": "u1", "exp": exp.Unix(), "subscribe": grants})
	}
	dial := func(tok string) *client {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, _, err := websocket.Dial(ctx, e.wsURL()+"?token="+tok, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.CloseNow() })
		cl := &client{t: t, c: c}
		cl.expect(map[string]any{"type": "ready"})
		return cl
	}
	// JWT exp has second precision: expire 2 s from now.
	soon := time.Now().Add(2 * time.Second).Truncate(time.Second).Add(time.Second)
	expiring := dial(token(soon, "orders.>"))
	if got := expiring.closeStatus(5 * time.Second); got != gateway.CloseTokenExpired {
		t.Fatalf("close %d, want %d", got, gateway.CloseTokenExpired)
	}
	soon = time.Now().Add(2 * time.Second).Truncate(time.Second).Add(time.Second)
	refreshed := dial(token(soon, "orders.>"))
	refreshed.send(`{"type":"refresh","id":"r0","token":"garbage"}`)
	refreshed.expect(map[string]any{"type": "error", "id": "r0", "code": gateway.CodeUnauthorized})
	refreshed.send(`{"type":"refresh","token":"garbage"}`)
	if m := refreshed.expect(map[string]any{"type": "error", "code": gateway.CodeUnauthorized}); m["id"] != nil {
		t.Fatalf("error for a refresh without an id: %v", m)
	}
	later := time.Now().Add(time.Hour).Truncate(time.Second)
	refreshed.send(`{"type":"refresh","id":"r1","token":"` + token(later, "orders.>", "users.>") + `"}`)
	refreshed.expect(map[string]any{"type": "refreshed", "id": "r1", "expires": later.UTC().Format(time.RFC3339)})
	refreshed.send(`{"type":"refresh","token":"` + token(later, "orders.>", "users.>") + `"}`)
	if m := refreshed.expect(map[string]any{"type": "refreshed", "expires": later.UTC().Format(time.RFC3339)}); m["id"] != nil {
		t.Fatalf("refreshed for a refresh without an id: %v", m)
	}
	refreshed.subscribe("u", "users.*") // the new grants apply
	time.Sleep(time.Until(soon) + 500*time.Millisecond)
	refreshed.quiet() // still open past the first token's expiry
}

// TestConnectionCaps: one address's connections over MaxConnectionsPerIP
// get 429 with Retry-After, counted by reason; /readyz turns not ready at
// 90% of MaxConnections, before the cap refuses anyone.
func TestConnectionCaps(t *testing.T) {
	e := newEnv(t, func(c *gateway.Config) {
		c.MaxConnectionsPerIP = 2
		c.MaxConnections = 3
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for range 2 {
		c, _, err := websocket.Dial(ctx, e.wsURL(), nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.CloseNow() })
	}
	_, resp, err := websocket.Dial(ctx, e.wsURL(), nil)
	if err == nil || resp == nil || resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("a third connection from one address: %v %v, want 429 with Retry-After", resp, err)
	}
	if got := e.metric("fanwire_connections_rejected_total", map[string]string{"reason": "max_connections_per_ip"}); got != 1 {
		t.Fatalf("rejections counted %v", got)
	}
	// 2 of 3: under 90%, ready. The GraphQL endpoint counts too.
	if !e.ready() {
		t.Fatal("not ready at 2 of 3 connections")
	}
	g, _, err := websocket.Dial(ctx, e.graphqlURL(), &websocket.DialOptions{Subprotocols: []string{"graphql-transport-ws"}})
	if err == nil {
		t.Cleanup(func() { _ = g.CloseNow() })
		t.Fatal("a GraphQL connection from the same address passed the per-address cap")
	}
	e2 := newEnv(t, func(c *gateway.Config) { c.MaxConnections = 10 })
	for i := range 9 {
		if i == 8 && !e2.ready() {
			t.Fatal("not ready at 8 of 10 connections")
		}
		c, _, err := websocket.Dial(ctx, e2.wsURL(), nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.CloseNow() })
	}
	waitFor(t, "not ready at 9 of 10 connections", func() bool { return !e2.ready() })
}

// TestMessageRateLimit: a native client over the message rate gets
// rate_limited errors (the messages are dropped, the connection stays
// until the abuse limit); a GraphQL client is closed with 1008.
func TestMessageRateLimit(t *testing.T) {
	e := newEnv(t, func(c *gateway.Config) { c.MaxMessageRate = 5; c.MaxClientErrors = 1000 })
	cl := e.dial()
	for range 30 {
		cl.send(`{"type":"ping"}`)
	}
	pongs, limited := 0, 0
	for pongs+limited < 30 {
		m := cl.next()
		switch {
		case m["type"] == "pong":
			pongs++
		case m["type"] == "error" && m["code"] == gateway.CodeRateLimited:
			limited++
		default:
			t.Fatalf("unexpected %v", m)
		}
	}
	if pongs < 10 || pongs > 12 || limited == 0 {
		t.Fatalf("%d pongs and %d rate_limited for 30 pings at 5/s (burst 10)", pongs, limited)
	}
	if got := e.metric("fanwire_client_errors_total", map[string]string{"code": "rate_limited"}); got != float64(limited) {
		t.Fatalf("rate_limited counted %v, want %d", got, limited)
	}
	g := e.initGQL()
	for range 30 {
		g.send(`{"type":"ping"}`)
	}
	if got := g.closeStatus(5 * time.Second); got != gateway.ClosePolicy {
		t.Fatalf("GraphQL close %d, want 1008", got)
	}
}

// FuzzTokenGrant: whatever a client sends as a token or an init payload,
// Grant never panics, and accepted grants are valid patterns.
func FuzzTokenGrant(f *testing.F) {
	good := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": "u", "exp": time.Now().Add(time.Hour).Unix(), "subscribe": []any{"a.{sub}.>", "b.*"}})
	tok, _ := good.SignedString([]byte(testSecret))
	f.Add(tok, []byte(nil))
	f.Add("", []byte(`{"token":"`+tok+`"}`))
	f.Add("a.b.c", []byte(`{"token":5}`))
	f.Add("eyJhbGciOiJub25lIn0.e30.", []byte(`[1]`))
	secret := filepath.Join(f.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte(testSecret), 0o600); err != nil {
		f.Fatal(err)
	}
	a, err := auth.NewJWTAuth(auth.JWTConfig{SecretFile: secret})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, token string, payload []byte) {
		r := httptest.NewRequest("GET", "/ws", nil)
		r.Header.Set("Authorization", "Bearer "+token)
		g, err := a.Grant(context.Background(), r, json.RawMessage(payload))
		if err != nil {
			return
		}
		if g == nil {
			t.Fatal("no grants and no error")
		}
		for _, p := range g.Subscribe {
			if subject.ValidatePattern(p) != nil {
				t.Fatalf("granted invalid pattern %q", p)
			}
		}
	})
}

// TestPublishAPIKeys: several publish keys, each limited to its patterns;
// a wrong key is 401, a subject outside the key's grants 403 naming the
// key (never the secret), and nothing of a refused request is published.
func TestPublishAPIKeys(t *testing.T) {
	e := newEnv(t, func(c *gateway.Config) {
		c.APIKeys = []gateway.APIKey{
			{Name: "orders-service", Key: "k-orders-0123456789", Publish: []string{"orders.>"}},
			{Name: "admin", Key: "k-admin-0123456789"},
		}
	})
	post := func(key, body string) (int, string) {
		req, _ := http.NewRequest("POST", e.http.URL+"/api/publish", strings.NewReader(body))
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	cl := e.dial()
	cl.subscribe("s", ">")
	if code, _ := post("", `{"subject":"orders.1","data":1}`); code != http.StatusUnauthorized {
		t.Fatalf("no key: %d", code)
	}
	if code, _ := post("k-wrong", `{"subject":"orders.1","data":1}`); code != http.StatusUnauthorized {
		t.Fatalf("wrong key: %d", code)
	}
	code, body := post("k-orders-0123456789", `[{"subject":"orders.1","data":1},{"subject":"billing.1","data":2}]`)
	if code != http.StatusForbidden || !strings.Contains(body, "orders-service") || strings.Contains(body, "k-orders") {
		t.Fatalf("outside the grants: %d %s", code, body)
	}
	if code, body := post("k-orders-0123456789", `{"subject":"orders.2","data":2}`); code != http.StatusOK {
		t.Fatalf("inside the grants: %d %s", code, body)
	}
	if code, body := post("k-admin-0123456789", `{"subject":"billing.3","data":3}`); code != http.StatusOK {
		t.Fatalf("admin: %d %s", code, body)
	}
	cl.expect(map[string]any{"type": "event", "subject": "orders.2"}) // nothing of the refused batch
	cl.expect(map[string]any{"type": "event", "subject": "billing.3"})
}

// expectRefused dials url and wants the upgrade accepted and the connection
// closed at once with 4401 and a reason starting with reason: a refused
// token is told where a browser can see it, not as an HTTP 401.
func expectRefused(t *testing.T, ctx context.Context, url, reason string) {
	t.Helper()
	c, _, err := websocket.Dial(ctx, url, nil)
	if err != nil {
		t.Fatalf("dial %s: %v, want an upgrade then a 4401 close", url, err)
	}
	defer c.CloseNow()
	_, msg, err := c.Read(ctx)
	var ce websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != gateway.CloseUnauthorized || !strings.HasPrefix(ce.Reason, reason) {
		t.Fatalf("first read: %q, %v; want a close 4401 with a reason starting %q", msg, err, reason)
	}
}
