package gateway_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fanwire/fanwire/gateway"
	"github.com/fanwire/fanwire/gateway/auth"
	"github.com/golang-jwt/jwt/v5"
)

// hsToken signs an HS256 token for sub with testSecret, expiring at exp
// (zero: no exp claim), granting the subscribe patterns.
func hsToken(t *testing.T, sub string, exp time.Time, subscribe ...any) string {
	t.Helper()
	c := jwt.MapClaims{"sub": sub, "subscribe": subscribe}
	if !exp.IsZero() {
		c["exp"] = exp.Unix()
	}
	return sign(t, jwt.SigningMethodHS256, []byte(testSecret), "", c)
}

// jwtEnv is a gateway on kind whose connections authenticate with HS256
// tokens (testSecret); mutate adjusts the rest.
func jwtEnv(t *testing.T, kind string, jcfg auth.JWTConfig, mutate func(*gateway.Config)) *env {
	t.Helper()
	jcfg.SecretFile = writeFile(t, "secret", testSecret)
	a, err := auth.NewJWTAuth(jcfg)
	if err != nil {
		t.Fatal(err)
	}
	return newEnvOn(t, kind, func(c *gateway.Config) {
		c.Authenticate = a.Grant
		if kind == "jetstream" {
			c.Subjects = []string{"orders.>", "app.>"}
		}
		if mutate != nil {
			mutate(c)
		}
	})
}

// TestRefreshRefusesWhatWouldLiftItsToken: a refresh must bring a token of
// the connection's own principal that expires when the connection's did.
// An empty token ("Bearer ") is refused, never taken for an anonymous
// connection (which has no expiry: the connection's subscriptions used to
// outlive its token); so is a token of another sub, or an anonymous
// connection's refresh to a token. Each refusal is unauthorized, names the
// rule, changes nothing (the subscription keeps its events, the expiry
// stays armed) and is counted.
func TestRefreshRefusesWhatWouldLiftItsToken(t *testing.T) {
	e := jwtEnv(t, "nats", auth.JWTConfig{AllowAnonymous: true, AnonymousGrants: []string{"orders.>"}}, nil)
	hour := time.Now().Add(time.Hour)
	cl := e.dialToken(hsToken(t, "u1", hour, "orders.>"))
	cl.subscribe("s", "orders.*")
	for i, tc := range []struct {
		token, want string
	}{
		{"Bearer ", "empty"},
		{"bearer    ", "empty"},
		{" ", "empty"},
		{"Bearer " + hsToken(t, "u2", hour, "orders.>"), `sub`},
	} {
		id := "r" + strconv.Itoa(i)
		b, _ := json.Marshal(map[string]string{"type": "refresh", "id": id, "token": tc.token})
		cl.send(string(b))
		m := cl.expect(map[string]any{"type": "error", "id": id, "code": gateway.CodeUnauthorized})
		if msg, _ := m["message"].(string); !strings.Contains(msg, tc.want) {
			t.Fatalf("refresh with %q: message %q, want it to name %q", tc.token, msg, tc.want)
		}
	}
	if got := e.metric("fanwire_client_errors_total", map[string]string{"code": gateway.CodeUnauthorized}); got != 4 {
		t.Fatalf("refused refreshes counted %v, want 4", got)
	}
	e.publish("orders.1", `{"n":1}`)
	cl.expect(map[string]any{"type": "event", "subject": "orders.1", "subs": []any{"s"}})

	// An anonymous connection stays anonymous: a token is for a new
	// connection (its durables and publish grants are the token's sub's).
	anon := e.dialToken("")
	anon.send(`{"type":"refresh","id":"a","token":"` + hsToken(t, "u1", hour, "orders.>") + `"}`)
	m := anon.expect(map[string]any{"type": "error", "id": "a", "code": gateway.CodeUnauthorized})
	if msg, _ := m["message"].(string); !strings.Contains(msg, "anonymous") {
		t.Fatalf("anonymous refresh: message %q, want it to say the connection is anonymous", msg)
	}

	// The expiry is still armed: a token of the same sub whose exp has
	// passed (accepted within the 30 s leeway) replaces it and ends the
	// connection at once, with no wait on a clock.
	past := time.Now().Add(-2 * time.Second)
	cl.send(`{"type":"refresh","id":"late","token":"` + hsToken(t, "u1", past, "orders.>") + `"}`)
	if got := cl.closeStatus(10 * time.Second); got != gateway.CloseTokenExpired {
		t.Fatalf("refreshed with a token past its exp: close %d, want %d", got, gateway.CloseTokenExpired)
	}
}

// TestRefreshWithoutExpiryIsRefused: a connection whose token expires
// cannot refresh to one without an expiry (an authenticator other than
// JWTAuth, which requires exp, may grant one): the refusal names exp and
// the connection keeps its expiring token.
func TestRefreshWithoutExpiryIsRefused(t *testing.T) {
	expires := time.Now().Add(time.Hour)
	auth := func(_ context.Context, r *http.Request, payload json.RawMessage) (*auth.Grants, error) {
		var p struct{ Token string }
		_ = json.Unmarshal(payload, &p)
		if p.Token == "" {
			p.Token = r.URL.Query().Get("token")
		}
		switch p.Token {
		case "expiring":
			return &auth.Grants{Subject: "u1", Subscribe: []string{">"}, Expires: expires}, nil
		case "forever":
			return &auth.Grants{Subject: "u1", Subscribe: []string{">"}}, nil
		}
		return nil, auth.ErrNoToken
	}
	e := newEnv(t, func(c *gateway.Config) { c.Authenticate = auth })
	cl := e.dialToken("expiring")
	cl.send(`{"type":"refresh","id":"r","token":"forever"}`)
	m := cl.expect(map[string]any{"type": "error", "id": "r", "code": gateway.CodeUnauthorized})
	if msg, _ := m["message"].(string); !strings.Contains(msg, "exp") {
		t.Fatalf("message %q, want it to name exp", msg)
	}
	cl.send(`{"type":"refresh","id":"r2","token":"expiring"}`)
	cl.expect(map[string]any{"type": "refreshed", "id": "r2", "expires": expires.UTC().Format(time.RFC3339)})
	// Without an expiry to keep, a token without one is fine.
	open := e.dialToken("forever")
	open.send(`{"type":"refresh","id":"r","token":"forever"}`)
	if m := open.expect(map[string]any{"type": "refreshed", "id": "r"}); m["expires"] != nil {
		t.Fatalf("refreshed %v: an expiry from a token without one", m)
	}
}

// TestRefreshRevokesUncoveredSubscriptions: a refreshed token's grants
// re-check every subscription. Those it no longer covers end with an error
// revoked naming their id and pattern, before refreshed, and no event lists
// them after it: a live one, a resume and a durable feed alike (the durable
// is kept: it is the principal's, like one left by a closed connection).
// The covered subscription goes on untouched while events are published
// throughout: every one of them, in order, once.
func TestRefreshRevokesUncoveredSubscriptions(t *testing.T) {
	e := jwtEnv(t, "jetstream", auth.JWTConfig{}, nil)
	hour := time.Now().Add(time.Hour)
	cl := e.dialToken(hsToken(t, "u1", hour, "orders.>", "app.>"))
	cl.subscribe("keep", "orders.*")
	cl.subscribe("live", "app.*")
	cl.send(`{"type":"subscribe","id":"replay","subject":"app.x","from":"first"}`)
	cl.expect(map[string]any{"type": "subscribed", "id": "replay"})
	cl.send(`{"type":"subscribe","id":"feed","subject":"app.>","durable":"inbox"}`)
	cl.expect(map[string]any{"type": "subscribed", "id": "feed"})
	waitFor(t, "4 live subscriptions", func() bool { return e.metric("fanwire_subscriptions", nil) == 4 })
	const n = 300
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 1; i <= n; i++ {
			e.publishN("orders.x", i, 1)
			e.publishN("app.x", i, 1)
		}
	})
	t.Cleanup(wg.Wait) // before the broker stops, should the test fail
	cl.send(`{"type":"refresh","id":"r","token":"` + hsToken(t, "u1", hour, "orders.>") + `"}`)
	next := 1
	revoked := map[string]bool{}
	refreshed := false
	for next <= n || !refreshed {
		m := cl.next()
		switch m["type"] {
		case "event":
			var subs []string
			for _, s := range m["subs"].([]any) {
				subs = append(subs, s.(string))
			}
			if m["subject"] == "orders.x" {
				if strings.Join(subs, ",") != "keep" || int(m["data"].(float64)) != next {
					t.Fatalf("event %v, want orders.x %d for keep", m, next)
				}
				next++
				continue
			}
			for _, s := range subs {
				if revoked[s] || refreshed {
					t.Fatalf("event %v lists %s after it was revoked", m, s)
				}
			}
		case "error":
			id, _ := m["id"].(string)
			msg, _ := m["message"].(string)
			want := map[string]string{"live": `"app.*"`, "replay": `"app.x"`, "feed": `"app.>"`}[id]
			if m["code"] != gateway.CodeRevoked || want == "" || revoked[id] || refreshed ||
				!strings.Contains(msg, strconv.Quote(id)) || !strings.Contains(msg, want) {
				t.Fatalf("error %v, want one revoked per uncovered subscription, naming its id and pattern, before refreshed", m)
			}
			revoked[id] = true
		case "refreshed":
			if len(revoked) != 3 {
				t.Fatalf("refreshed after revoking %v, want live, replay and feed", revoked)
			}
			refreshed = true
		default:
			t.Fatalf("unexpected %v", m)
		}
	}
	wg.Wait()
	cl.quiet()
	if got := e.metric("fanwire_subscriptions", nil); got != 1 {
		t.Fatalf("fanwire_subscriptions = %v after the refresh, want 1", got)
	}
	if got := e.metric("fanwire_client_errors_total", map[string]string{"code": gateway.CodeRevoked}); got != 3 {
		t.Fatalf("revocations counted %v, want 3", got)
	}
	if got := e.consumers(); len(got) != 1 {
		t.Fatalf("consumers after revoking the durable's subscription: %v, want the durable kept", got)
	}
	// The revoked ids are free; the new grants apply.
	cl.send(`{"type":"subscribe","id":"live","subject":"app.*"}`)
	cl.expect(map[string]any{"type": "error", "id": "live", "code": gateway.CodeForbidden})
	cl.subscribe("live", "orders.y")
}
