package gateway_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fanwire/fanwire/broker"
	"github.com/fanwire/fanwire/gateway"
	"github.com/fanwire/fanwire/gateway/auth"
	"github.com/golang-jwt/jwt/v5"
)

// Publish ids (POST /api/publish "id") are scoped to their publisher: on
// the brokers that deduplicate (JetStream, Redis Streams) an id only ever
// suppresses a repeat of the same credential's event, never another
// publisher's nor the ingest's, and never sets the ingest's high-water
// mark.

// idKinds are the brokers with a duplicate window (Core NATS has none).
var idKinds = []string{"jetstream", "redis"}

// scopedEnv is a gateway on kind with two API keys, token publishing and
// anonymous publishing, and a token maker.
func scopedEnv(t *testing.T, kind string) (*env, func(claims jwt.MapClaims) string) {
	t.Helper()
	a, err := auth.NewJWTAuth(auth.JWTConfig{SecretFile: writeFile(t, "secret", testSecret)})
	if err != nil {
		t.Fatal(err)
	}
	e := newEnvJS(t, kind, func(c *broker.JetStreamConfig) { c.Subjects = []string{"orders.>", "chat.>", "db.>"} }, func(c *gateway.Config) {
		c.Authenticate = a.Grant
		c.PublishTokens = true
		c.AllowAnonymousPublish = true
		c.APIKeys = []gateway.APIKey{
			{Name: "svc", Key: "k-svc-0123456789", Publish: []string{"orders.>"}},
			{Name: "audit", Key: "k-audit-0123456789", Publish: []string{"db.audit.>"}},
		}
	})
	token := func(claims jwt.MapClaims) string {
		c := jwt.MapClaims{"exp": time.Now().Add(time.Hour).Unix(), "subscribe": []any{">"}}
		for k, v := range claims {
			c[k] = v
		}
		return sign(t, jwt.SigningMethodHS256, []byte(testSecret), "", c)
	}
	return e, token
}

// TestPublishIDsAreScoped: two tokens, an API key and anonymous
// publishers use the same id; each one's event is stored, and only a
// repeat by the same publisher is dropped as a duplicate.
func TestPublishIDsAreScoped(t *testing.T) {
	for _, kind := range idKinds {
		t.Run(kind, func(t *testing.T) {
			e, token := scopedEnv(t, kind)
			u1 := token(jwt.MapClaims{"sub": "u1", "publish": []any{"chat.u1.>"}})
			u2 := token(jwt.MapClaims{"sub": "u2", "publish": []any{"chat.u2.>", "orders.>"}})
			u1again := token(jwt.MapClaims{"sub": "u1", "publish": []any{"chat.u1.>"}, "iat": time.Now().Unix() - 5})
			nosub := token(jwt.MapClaims{"publish": []any{"chat.>"}})
			watcher := e.dialToken(u1)
			watcher.subscribe("all", ">")

			const id = `"id":"order-42-paid"`
			for _, tc := range []struct {
				name, bearer, subject string
			}{
				{"token u1", u1, "chat.u1.x"},
				{"API key svc", "k-svc-0123456789", "orders.42"},
				{"token u2", u2, "orders.43"},
				{"anonymous", "", "chat.anon"},
			} {
				if r := e.postPublish(tc.bearer, `{"subject":"`+tc.subject+`",`+id+`,"data":{}}`); r.status != 200 {
					t.Fatalf("%s: %d %s", tc.name, r.status, r.raw)
				}
			}
			if got, want := eventsUntil(e, watcher, "orders.mark1"), "chat.u1.x orders.42 orders.43 chat.anon"; got != want {
				t.Fatalf("delivered %q, want %q: an id suppressed another publisher's event", got, want)
			}

			// Repeats by the same publisher (a token with the same sub,
			// the same key, anonymous publishers: one namespace) are
			// dropped, whatever their subject.
			for _, tc := range []struct {
				name, bearer, subject string
			}{
				{"token u1 again", u1again, "chat.u1.y"},
				{"API key svc again", "k-svc-0123456789", "orders.44"},
				{"anonymous again", "", "chat.anon2"},
			} {
				if r := e.postPublish(tc.bearer, `{"subject":"`+tc.subject+`",`+id+`,"data":{}}`); r.status != 200 {
					t.Fatalf("%s: %d %s", tc.name, r.status, r.raw)
				}
			}
			if got := eventsUntil(e, watcher, "orders.mark2"); got != "" {
				t.Fatalf("repeats delivered: %q, want none", got)
			}

			// A token without a sub has no namespace: it publishes, but
			// without an id.
			r := e.postPublish(nosub, `{"subject":"chat.x",`+id+`,"data":{}}`)
			if r.status != 403 || r.Code != gateway.CodeForbidden || r.Rule != "publish_id_scope" || !strings.Contains(r.Error, `"sub"`) {
				t.Fatalf("id from a token without sub: %d %s", r.status, r.raw)
			}
			if r := e.postPublish(nosub, `{"subject":"chat.x","data":{}}`); r.status != 200 {
				t.Fatalf("no id, token without sub: %d %s", r.status, r.raw)
			}
			watcher.expect(map[string]any{"type": "event", "subject": "chat.x"})

			// Ids are printable ASCII of bounded length: they become a
			// header (Nats-Msg-Id) and a key.
			for _, bad := range []string{`"a\r\nNats-Expected-Stream: X"`, `"a b"`, `"` + strings.Repeat("x", 129) + `"`, `"é"`} {
				r := e.postPublish("k-svc-0123456789", `{"subject":"orders.1","id":`+bad+`,"data":{}}`)
				if r.status != 400 || r.Code != "bad_request" || !strings.Contains(r.raw, `"field":"id"`) {
					t.Errorf("id %s: %d %s, want 400 bad_request on field id", bad, r.status, r.raw)
				}
			}
			watcher.quiet()
		})
	}
}

// TestPublishIDsNeverReachTheIngest: a publisher allowed on the ingest's
// subjects (db.audit.>) sends an event with an id shaped like the
// ingest's; the ingest's own event with that id is stored all the same,
// and a later writer-shaped id from the gateway is never taken as the
// ingest's high-water mark.
func TestPublishIDsNeverReachTheIngest(t *testing.T) {
	for _, kind := range idKinds {
		t.Run(kind, func(t *testing.T) {
			e, token := scopedEnv(t, kind)
			watcher := e.dialToken(token(jwt.MapClaims{"sub": "w"}))
			watcher.subscribe("db", "db.>")
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			const writer = "fanwire_slot.3kq9x0"
			ingest := func(subject, id, data string) {
				t.Helper()
				err := e.b.(broker.Appender).Append(ctx, []broker.Outgoing{{Subject: subject, Data: []byte(data), ID: id}}, broker.AppendOptions{Writer: writer})
				if err != nil {
					t.Fatal(err)
				}
			}
			first := broker.WriterID(writer, "16b3a28-0")
			if r := e.postPublish("k-audit-0123456789", `{"subject":"db.audit.1","id":"`+first+`","data":{"by":"gateway"}}`); r.status != 200 {
				t.Fatalf("gateway publish: %d %s", r.status, r.raw)
			}
			ingest("db.audit.1", first, `{"by":"ingest"}`)
			ingest("db.audit.end", "", `{}`)
			var got []string
			for {
				m := watcher.next()
				if m["subject"] == "db.audit.end" {
					break
				}
				data, _ := m["data"].(map[string]any)
				got = append(got, data["by"].(string))
			}
			if strings.Join(got, " ") != "gateway ingest" {
				t.Errorf("events on db.audit.1 by %v, want the gateway's then the ingest's: the gateway's id suppressed the ingest's event", got)
			}

			mark := broker.WriterID(writer, "16b3b00-0")
			ingest("db.orders.1", mark, `{"by":"ingest"}`)
			forged := broker.WriterID(writer, "ffffffff-0")
			if r := e.postPublish("k-audit-0123456789", `{"subject":"db.audit.2","id":"`+forged+`","data":{"by":"gateway"}}`); r.status != 200 {
				t.Fatalf("gateway publish: %d %s", r.status, r.raw)
			}
			watcher.expect(map[string]any{"type": "event", "subject": "db.orders.1"})
			watcher.expect(map[string]any{"type": "event", "subject": "db.audit.2"})
			last, err := e.b.(broker.HighWater).LastID(ctx, writer, []string{"db.audit.*", "db.orders.*"})
			if err != nil {
				t.Fatal(err)
			}
			if last != mark {
				t.Fatalf("the ingest's mark is %q, want its own last id %q", last, mark)
			}
			watcher.quiet()
		})
	}
}

// eventsUntil publishes an event on marker (API key svc, no id) and
// returns the subjects of the events the client gets before it.
func eventsUntil(e *env, cl *client, marker string) string {
	e.t.Helper()
	if r := e.postPublish("k-svc-0123456789", `{"subject":"`+marker+`","data":{}}`); r.status != 200 {
		e.t.Fatalf("marker: %d %s", r.status, r.raw)
	}
	var got []string
	for {
		m := cl.next()
		if m["type"] != "event" {
			e.t.Fatalf("unexpected message %v", m)
		}
		if m["subject"] == marker {
			return strings.Join(got, " ")
		}
		got = append(got, m["subject"].(string))
	}
}
